"""One agent-r1 arm: its run config (matched to TRL's ``GRPOTrainer``), then ``train_step`` by
``train_step``, with each step's figures and the process's memory."""

from __future__ import annotations

import math
import platform
import resource
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agent_r1.mdp import Task, Trajectory
from benchsuite.codebook import CALLS, interval_union


class OrderedStream:
    """The tasks in their list order (TRL's ``shuffle_dataset=False``), so that both arms see the
    same prompts at every step."""

    def __init__(self, tasks: Sequence[Task]) -> None:
        self.tasks = list(tasks)
        self.index = 0

    def take(self, count: int) -> list[Task]:
        out = [self.tasks[(self.index + i) % len(self.tasks)] for i in range(count)]
        self.index += count
        return out

    def state(self) -> dict[str, int]:
        return {"epoch": 0, "index": self.index}


def arm_config(spec: dict[str, Any], model: dict[str, Any]) -> dict[str, Any]:
    """The agent-r1 run config of an arm ``spec`` (see :func:`run_agent_r1_arm`), matched to
    TRL's GRPOTrainer: GRPO advantages with the group std (+1e-4), the clipped surrogate without
    dual clipping, token-mean aggregation, one optimizer step per batch, beta = 0, constant LR,
    gradient clipping at 1.0, sampling at temperature 1 without top-p/top-k."""
    task = spec["task"]
    turns = spec.get("max_turns", 1)
    environment: dict[str, Any] = {
        "single": {"name": "benchsuite.environments:SingleTurnEnv"},
        "turns": {"name": "benchsuite.environments:TurnsEnv"},
        "tools": {
            "name": "benchsuite.environments:CodeBookEnv",
            "latency_s": spec.get("tool_latency_s", 0.0),
            "max_turns": turns,
        },
    }[task]
    reward = {"text": "benchsuite.rewards:bench_text_reward", "hash": "benchsuite.rewards:bench_hash_reward"}[
        spec.get("reward", "text")
    ]
    rewards = [] if task == "tools" else [{"name": reward, "weight": 1.0}]
    batch = spec["tasks_per_step"] * spec["group_size"]
    config: dict[str, Any] = {
        "seed": spec.get("seed", 0),
        "output_dir": spec["run_dir"],
        "model": {"path": model["dir"], "dtype": "float32", "device": "cpu", "freeze_embeddings": False},
        "data": {
            "name": "benchsuite.tasks:bench_tasks",
            "kind": task,
            "count": spec["num_tasks"],
            "seed": spec.get("seed", 0),
            "prompt_words": spec.get("prompt_words", 0),
        },
        "environment": environment,
        "rollout": {
            "group_size": spec["group_size"],
            "max_turns": turns,
            "max_new_tokens": spec["max_new_tokens"],
            "max_context": spec["max_context"],
            "temperature": spec.get("temperature", 1.0),
            "top_p": 1.0,
            "top_k": 0,
        },
        "rewards": rewards,
        "algorithm": {
            "name": "grpo",
            "estimator": {"name": "grpo", "eps": 1e-4},
            "loss": {"name": "ppo_clip", "clip_low": 0.2, "clip_high": 0.2, "dual_clip": None},
            "aggregation": "token-mean",
            "kl": {"coef": 0.0},
            "entropy_coef": 0.0,
        },
        "trainer": {
            "steps": spec["steps"],
            "tasks_per_step": spec["tasks_per_step"],
            "micro_batch_size": batch,
            "epochs": 1,
            "mini_batches": 1,
            "lr": spec["lr"],
            "schedule": "constant",
            "warmup_steps": 0,
            "weight_decay": 0.0,
            "grad_clip": 1.0,
            "checkpoint_every": 0,
        },
        "trackers": [],
    }
    if task == "tools" and model.get("tools_template"):
        config["model"]["chat_template"] = model["tools_template"]
    return config


def rss_mib() -> float:
    """This process's resident set size now (MiB), from /proc (0 where there is none)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass  # not Linux: the high-water mark below is still reported
    return 0.0


def peak_rss_mib() -> float:
    """This process's RSS high-water mark (MiB): ``VmHWM`` of /proc, which starts afresh at exec.
    (``ru_maxrss`` would not do: Linux carries the parent's high-water mark over fork and exec.)"""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass  # not Linux: ru_maxrss is the best there is (KiB on Linux, bytes on macOS)
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def step_record(
    metrics: dict[str, float],
    trajectories: Sequence[Trajectory],
    rollouts: list[dict[str, float]],
    calls: Sequence[tuple[float, float]],
    wall_s: float,
) -> dict[str, float]:
    """One agent-r1 step's figures: its wall time, the batch-level generation and environment
    time of its rollouts, the learner's phases, tokens, scores and tool wall time."""
    generation = sum(r.get("rollout/generation_s", 0.0) for r in rollouts)
    environment = sum(r.get("rollout/env_s", 0.0) for r in rollouts)
    compute = generation + sum(
        metrics.get(key, 0.0)
        for key in ("time/no_grad_passes_s", "time/forward_backward_s", "time/optimizer_s")
    )
    record = {
        "wall_s": wall_s,
        "step_s": metrics.get("time/step_s", wall_s),
        "generation_s": generation,
        "env_s": environment,
        "tool_wall_s": interval_union(calls),
        "rollout_s": metrics.get("time/rollout_s", math.nan),
        "rewards_s": metrics.get("time/rewards_s", math.nan),
        "no_grad_s": metrics.get("time/no_grad_passes_s", 0.0),
        "advantages_s": metrics.get("time/advantages_s", math.nan),
        "forward_backward_s": metrics.get("time/forward_backward_s", 0.0),
        "optimizer_s": metrics.get("time/optimizer_s", 0.0),
        "other_s": metrics.get("time/other_s", math.nan),
        "model_compute_s": compute,
        # neither model compute nor tool waiting: collation, rewards, advantages, Python around them
        "overhead_s": max(wall_s - compute - environment, 0.0),
        "trajectories": float(len(trajectories)),
        "generated_tokens": float(sum(t.num_policy_tokens for t in trajectories)),
        "reward_mean": statistics.fmean(t.score for t in trajectories) if trajectories else math.nan,
        "zero_variance_groups": metrics.get("batch/zero_variance_groups", math.nan),
        "tool_calls": float(sum(t.metrics.get("tool_calls", 0.0) for t in trajectories)),
        "turns_mean": statistics.fmean(t.num_turns for t in trajectories) if trajectories else math.nan,
        "prompt_tokens_mean": statistics.fmean(t.prompt_length for t in trajectories)
        if trajectories
        else math.nan,
        "context_tokens_mean": statistics.fmean(len(t) for t in trajectories) if trajectories else math.nan,
    }
    return record


def run_agent_r1_arm(spec: dict[str, Any]) -> dict[str, Any]:
    """Train one agent-r1 arm described by ``spec`` (task, model, sizes, steps...) and return its
    per-step records, load time and memory figures."""
    import torch

    from agent_r1.config import RunConfig, validate_components
    from agent_r1.engine.session import build_session
    from agent_r1.engine.trainer import train_step

    torch.set_num_threads(int(spec.get("threads", 1)))
    started = time.perf_counter()
    rss_start = rss_mib()
    config = RunConfig.model_validate(arm_config(spec, spec["model"]))
    components = validate_components(config)
    Path(spec["run_dir"]).mkdir(parents=True, exist_ok=True)
    session = build_session(config, components, spec["run_dir"])
    tasks = session.dataset.load("train")
    session.stream = OrderedStream(tasks)  # type: ignore[assignment]
    rollouts: list[dict[str, float]] = []  # the agent loop's figures of each rollout of a step
    source: Any = session.source
    plain_rollout = source.rollout

    def recording_rollout(*args: Any, **kwargs: Any) -> Any:
        trajectories = plain_rollout(*args, **kwargs)
        rollouts.append(dict(source.engine.last_metrics))
        return trajectories

    source.rollout = recording_rollout
    load_s = time.perf_counter() - started
    rss_loaded = rss_mib()
    steps = []
    for _ in range(spec["steps"]):
        rollouts.clear()
        CALLS.clear()
        step_started = time.perf_counter()
        result = train_step(session)
        wall = time.perf_counter() - step_started
        steps.append(step_record(result.metrics, result.trajectories, rollouts, list(CALLS), wall))
    return {
        "arm": "agent-r1",
        "load_s": load_s,
        "steps": steps,
        "rss_start_mib": rss_start,
        "rss_loaded_mib": rss_loaded,
        "peak_rss_mib": peak_rss_mib(),
        "versions": library_versions(),
    }


def library_versions() -> dict[str, str]:
    """Versions of the libraries the figures depend on, in this interpreter."""
    from importlib import metadata

    out = {"python": platform.python_version()}
    for name in ("agent-r1", "torch", "transformers", "trl", "accelerate"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue  # not installed in this environment (trl in .venv): simply not listed
    return out
