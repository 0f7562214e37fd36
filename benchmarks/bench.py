"""``make bench``: how fast agent-r1 turns compute into a trained agent, side by side with TRL.

One command, three sections (``--only`` picks some) and an overhead table, one report
(``bench.json``, ``bench.md`` and ``bench_*.png`` in ``--out``):

* ``trl``: agent-r1 and TRL's ``GRPOTrainer`` (``benchmarks/bench_trl.py``, run with the
  interpreter of ``--trl-python``) train the same model on the same prompts, in the same order,
  with the same group size, token budgets, learning rate, optimizer, clipping and loss
  normalisation (GRPO with group-std scaling, token-mean loss, beta = 0), alternating the two arms
  (A B B A ...) so that machine noise hits both. Every arm runs in a subprocess of its own, so that
  its peak memory (RSS high-water mark) is its own. Two tasks: single-turn GRPO on arithmetic
  prompts, and a multi-turn tool task (look up two codes with an ``async`` tool, then stop) run by
  TRL's ``environment_factory`` and by agent-r1's engine over the very same environment class
  (:class:`CodeBook`, through :class:`agent_r1.integrations.trl.TRLEnvironment`).
* ``tools``: the engine's tool concurrency: a real :class:`~agent_r1.Tool` that sleeps 200 ms,
  64 trajectories, 3 turns, a scripted policy that always calls it; the tool wall time of the
  rollout against one call per turn.
* ``scaling``: step time against tasks per step, group size, number of turns and context length,
  with the step's time split into generation, tool waiting, training passes and the rest.
* the agent-r1 runs of ``trl`` and ``scaling`` also give the share of step time that is neither
  model compute nor tool waiting (the overhead table).

Run from the repository root (``make bench`` builds both environments first)::

    .venv/bin/python benchmarks/bench.py                      # everything (about 20 min, 2 idle cores)
    .venv/bin/python benchmarks/bench.py --only tools,scaling # no TRL environment needed
    .venv/bin/python benchmarks/bench.py --smoke --out runs/bench-smoke   # seconds: checks it runs

``--update`` merges what a run measured into an existing report (a ``trl`` case by name, a
``scaling`` model, the ``tools`` section), ``--from-json`` only rewrites the report and plots.
``bench.py arm SPEC.json OUT.json`` runs one agent-r1 arm (what the ``trl`` section starts in a
subprocess). Models, arm outputs and scratch files go to ``--work`` (default ``runs/bench``).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import hashlib
import json
import math
import os
import platform
import random
import re
import resource
import statistics
import subprocess
import sys
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import Field

from agent_r1.contracts import ComponentConfig, Environment, EpisodeStart, Tool
from agent_r1.mdp import Action, Message, Observation, Task, Trajectory

REPO = Path(__file__).resolve().parent.parent
SECTIONS = ("trl", "tools", "scaling")
DEFAULT_TRL_PYTHON = ".venv-integrations/bin/python"

# --------------------------------------------------------------------------------------------
# The tasks, shared by both arms (plain data, so that a subprocess in another environment can
# rebuild exactly the same list from the same arguments)
# --------------------------------------------------------------------------------------------

KEY_ALPHABET = "abcdefghjkmnpqrstuvwxyz"


def code_of(key: str) -> int:
    """The code :class:`CodeBook` stores under ``key``: three digits, fixed by the key."""
    return int(hashlib.sha1(key.encode("utf-8")).hexdigest()[:6], 16) % 900 + 100


def tool_call_message(key: str) -> Message:
    """An assistant message calling ``lookup(key)`` (the chat template writes it as Hermes)."""
    call = {"type": "function", "function": {"name": "lookup", "arguments": {"key": key}}}
    return {"role": "assistant", "content": "", "tool_calls": [call]}


def _tool_task_request(keys: Sequence[str]) -> str:
    return f"Look up the codes of {keys[0]} and {keys[1]}, one call each, then say done."


ONE_SHOT_KEYS = ("zq4", "mm2")
ONE_SHOT: list[Message] = [
    {"role": "user", "content": _tool_task_request(ONE_SHOT_KEYS)},
    tool_call_message(ONE_SHOT_KEYS[0]),
    {"role": "tool", "name": "lookup", "content": f"code {code_of(ONE_SHOT_KEYS[0])}"},
    tool_call_message(ONE_SHOT_KEYS[1]),
    {"role": "tool", "name": "lookup", "content": f"code {code_of(ONE_SHOT_KEYS[1])}"},
    {"role": "assistant", "content": "done"},
]
"""The tool task's worked example, put before every request: SmolLM2-135M-Instruct writes no tool
call without one."""

FILLER = [
    *("river", "stone", "cloud", "lamp", "seven", "orange", "garden", "window", "paper", "bridge"),
    *("quiet", "candle", "silver", "forest", "number", "table", "winter", "market", "yellow", "engine"),
]


def make_tasks(kind: str, count: int, seed: int, *, prompt_words: int = 0) -> list[dict[str, Any]]:
    """``count`` tasks of ``kind`` as plain dicts (``id``, ``messages``, ``answer``, ``metadata``):

    * ``single``: "What is a + b?" (two-digit numbers), answered in one turn;
    * ``tools``: the :class:`CodeBook` task, after the worked example :data:`ONE_SHOT`;
    * ``turns``: "Write numbers." after ``prompt_words`` filler words, for the scaling runs (the
      environment keeps the episode going until ``max_turns``).
    """
    rng = random.Random(f"{kind}-{seed}")
    tasks = []
    for index in range(count):
        metadata: dict[str, Any] = {}
        if kind == "single":
            a, b = rng.randint(10, 99), rng.randint(10, 99)
            messages: list[Message] = [
                {"role": "user", "content": f"What is {a} + {b}? Reply with the number."}
            ]
            answer: Any = str(a + b)
        elif kind == "tools":
            keys: list[str] = []
            while len(keys) < 2:
                key = "".join(rng.choice(KEY_ALPHABET) for _ in range(2)) + str(rng.randint(1, 9))
                if key not in keys and key not in ONE_SHOT_KEYS:
                    keys.append(key)
            messages = [*ONE_SHOT, {"role": "user", "content": _tool_task_request(keys)}]
            answer = " ".join(str(code_of(key)) for key in keys)
            metadata = {"keys": keys}
        elif kind == "turns":
            filler = " ".join(rng.choice(FILLER) for _ in range(prompt_words))
            messages = [{"role": "user", "content": f"{filler}\nWrite numbers.".strip()}]
            answer = str(rng.randint(10, 99))
        else:
            raise ValueError(f"unknown task kind {kind!r} (single, tools, turns)")
        tasks.append(
            {"id": f"{kind}-{seed}-{index}", "messages": messages, "answer": answer, "metadata": metadata}
        )
    return tasks


def bench_tasks(
    split: str, kind: str = "single", count: int = 8, seed: int = 0, prompt_words: int = 0
) -> list[Task]:
    """The agent-r1 dataset (a Python-path dataset function) of :func:`make_tasks`."""
    return [Task(**task) for task in make_tasks(kind, count, seed, prompt_words=prompt_words)]


# --------------------------------------------------------------------------------------------
# Rewards (the same function on both sides)
# --------------------------------------------------------------------------------------------

SPECIAL = re.compile(r"<\|[^|>]*\|>")


def text_reward(text: str, answer: Any) -> float:
    """1 when the reply's last number is ``answer``, plus 0.2 × the share of digits among its
    characters (special tokens removed): the dense part gives a random model's replies different
    scores, so that GRPO's advantages are not all zero."""
    text = SPECIAL.sub("", text)
    numbers = re.findall(r"\d+", text)
    correct = 1.0 if answer is not None and numbers and numbers[-1] == str(answer) else 0.0
    return correct + 0.2 * sum(c.isdigit() for c in text) / max(len(text), 1)


def actions_text(trajectory: Trajectory) -> str:
    """Everything the policy wrote in ``trajectory``, turn after turn."""
    return "".join(step.action.text for step in trajectory.steps)


def bench_text_reward(trajectory: Trajectory, task: Task) -> float:
    """:func:`text_reward` as an agent-r1 reward function (given by Python path)."""
    return text_reward(actions_text(trajectory), task.answer)


def bench_hash_reward(trajectory: Trajectory, task: Task) -> float:
    """A score in [0, 1) fixed by the trajectory's tokens: samples that differ score differently,
    so every group has non-zero advantages and every step trains on every trajectory (the scaling
    runs measure the cost of a full update, not what a random model happens to earn)."""
    digest = hashlib.sha1(json.dumps(trajectory.token_ids).encode("ascii")).hexdigest()
    return int(digest[:8], 16) / 16**8


# --------------------------------------------------------------------------------------------
# The tool task's environment, in TRL's environment_factory contract (used by both arms)
# --------------------------------------------------------------------------------------------

CALLS: list[tuple[float, float]] = []
"""(start, end) of every ``CodeBook.lookup`` call in this process (``time.perf_counter``)."""


def interval_union(intervals: Sequence[tuple[float, float]]) -> float:
    """The time covered by at least one of ``intervals``: the tool wall time of a step."""
    total, end = 0.0, -math.inf
    for start, stop in sorted(intervals):
        if start > end:
            total += stop - start
            end = stop
        elif stop > end:
            total += stop - end
            end = stop
    return total


class CodeBook:
    """The tool task: look up the codes of the two keys in the request with the ``lookup`` tool.

    A TRL ``environment_factory`` class (``reset``, public tool methods with docstrings,
    ``get_reward``). ``lookup`` is ``async`` and waits ``latency_s`` like a remote service would;
    every call's (start, end) goes to :data:`CALLS`. ``get_reward`` = 0.25 per lookup (two at
    most) + 0.25 per key of the request looked up: 1.0 for the right two calls.
    """

    def __init__(self, latency_s: float = 0.0) -> None:
        self.latency_s = latency_s
        self.keys: list[str] = []
        self.looked_up: list[str] = []

    def reset(self, **row: Any) -> None:
        """Start an episode from a dataset row (its ``keys`` column)."""
        self.keys = list(row.get("keys") or [])
        self.looked_up = []

    async def lookup(self, key: str) -> str:
        """Look up the code stored under a key.

        Args:
            key: the key to look up
        """
        started = time.perf_counter()
        if self.latency_s > 0:
            await asyncio.sleep(self.latency_s)
        CALLS.append((started, time.perf_counter()))
        self.looked_up.append(str(key))
        return f"code {code_of(str(key))}"

    def get_reward(self) -> float:
        """0.25 per lookup (two at most) + 0.25 per requested key that was looked up."""
        calls = min(len(self.looked_up), len(self.keys))
        right = len(set(self.looked_up) & set(self.keys))
        return 0.25 * calls + 0.25 * right


# --------------------------------------------------------------------------------------------
# agent-r1 environments (given to the run config by Python path, e.g. "bench:SingleTurnEnv")
# --------------------------------------------------------------------------------------------


class SingleTurnEnv(Environment):
    """One reply per episode: the prompt is the task's messages, any reply ends the episode (what
    TRL's GRPOTrainer does without tools)."""

    name = "bench_single_turn"

    async def reset(self, task: Task) -> EpisodeStart:
        return EpisodeStart(messages=[dict(message) for message in task.messages])

    async def step(self, action: Action, turn: int) -> Observation:
        return Observation(done=True, termination="answer", answer=action.text)


class TurnsEnv(Environment):
    """Never ends an episode itself: each reply is answered with a short user message, so that an
    episode takes exactly ``rollout.max_turns`` turns (the scaling runs' turns axis)."""

    name = "bench_turns"

    class Config(ComponentConfig):
        reply: str = Field("Go on.", description="the observation after every turn")

    config: Config

    async def reset(self, task: Task) -> EpisodeStart:
        return EpisodeStart(messages=[dict(message) for message in task.messages])

    async def step(self, action: Action, turn: int) -> Observation:
        return Observation(messages=[{"role": "user", "content": self.config.reply}])


class CodeBookEnv(Environment):
    """:class:`CodeBook` run by agent-r1's engine through
    :class:`agent_r1.integrations.trl.TRLEnvironment` (imported on first use: it needs trl)."""

    name = "bench_codebook"

    class Config(ComponentConfig):
        latency_s: float = Field(0.0, ge=0.0, description="seconds each lookup waits")
        max_turns: int = Field(3, ge=1, description="turns; the last one's calls still run")

    config: Config

    def __init__(self, config: ComponentConfig | dict[str, Any] | None = None) -> None:
        super().__init__(config)
        from agent_r1.integrations.trl import TRLEnvironment

        self.inner = TRLEnvironment(
            functools.partial(CodeBook, self.config.latency_s),
            max_turns=self.config.max_turns,
            reward_name="codebook",
        )

    @property
    def stop_sequences(self) -> list[str]:
        return self.inner.stop_sequences

    async def reset(self, task: Task) -> EpisodeStart:
        return await self.inner.reset(task)

    async def step(self, action: Action, turn: int) -> Observation:
        return await self.inner.step(action, turn)


# --------------------------------------------------------------------------------------------
# Tools for the concurrency section
# --------------------------------------------------------------------------------------------


class _LookupArguments(Tool.Arguments):
    key: str = Field(description="the key to look up")


class SlowLookup(Tool):
    """A synchronous tool that sleeps ``latency_s`` (a blocking client of a slow service); runs in
    the tool runner's worker threads."""

    name = "slow_lookup"
    description = "Look up the code stored under a key."
    Arguments = _LookupArguments

    class Config(ComponentConfig):
        latency_s: float = Field(0.2, ge=0.0, description="seconds each call sleeps")

    config: Config

    def run(self, arguments: Any) -> str:
        started = time.perf_counter()
        time.sleep(self.config.latency_s)
        CALLS.append((started, time.perf_counter()))
        return f"code {code_of(arguments.key)}"


class AsyncSlowLookup(SlowLookup):
    """The same tool written with ``async def run`` (an asyncio client); runs on the event loop."""

    name = "async_slow_lookup"

    async def run(self, arguments: Any) -> str:  # type: ignore[override]
        started = time.perf_counter()
        await asyncio.sleep(self.config.latency_s)
        CALLS.append((started, time.perf_counter()))
        return f"code {code_of(arguments.key)}"


# --------------------------------------------------------------------------------------------
# Models
# --------------------------------------------------------------------------------------------

SFT_VERSION = 1  # bump when the tool model's recipe changes, so that cached copies are rebuilt


def prepare_models(work: Path, names: Sequence[str], *, smoke: bool) -> dict[str, dict[str, Any]]:
    """Checkpoint directories (and chat templates) of the models the sections use:

    * ``tiny``: the random tiny Llama-shaped model of the tests;
    * ``tiny-tools``: the same model fine-tuned for a few seconds on the tool task's conversations
      (a random model never writes a tool call, so the multi-turn path would not run);
    * ``smollm2``: SmolLM2-135M-Instruct, prepared offline by ``agent-r1 models prepare``. Its own
      chat template cannot render tools, so the tool task gives it the tiny tokenizer's ChatML
      template (the same special tokens), on both sides.
    """
    from agent_r1.testing.models import CHATML_TEMPLATE, save_tiny_model

    models: dict[str, dict[str, Any]] = {}
    for name in names:
        if name == "tiny":
            directory = work / "models" / "tiny"
            if not (directory / "config.json").exists():
                save_tiny_model(directory, seed=0)
            models[name] = {
                "dir": str(directory),
                "tools_template": None,
                "label": "tiny random Llama (~0.2M)",
            }
        elif name == "tiny-tools":
            steps = 20 if smoke else 150
            directory = work / "models" / f"tiny-tools-v{SFT_VERSION}-{steps}"
            info = directory / "sft.json"
            if not info.exists():
                sft_tool_model(directory, steps=steps)
            models[name] = {
                "dir": str(directory),
                "tools_template": None,
                "label": "tiny Llama fine-tuned on tool calls",
                "sft": json.loads(info.read_text(encoding="utf-8")),
            }
        elif name == "smollm2":
            from agent_r1.engine.models import resolve_model_path

            models[name] = {
                "dir": str(resolve_model_path("smollm2-135m-instruct")),
                "tools_template": CHATML_TEMPLATE,
                "label": "SmolLM2-135M-Instruct",
            }
        else:
            raise ValueError(f"unknown model {name!r} (tiny, tiny-tools, smollm2)")
    return models


def sft_tool_model(directory: Path, *, steps: int, seed: int = 0) -> dict[str, Any]:
    """Fine-tune the tiny model on complete tool-task conversations (two lookups, their results,
    "done"), the loss on the request's answer turns only; save it with ``sft.json`` (loss, and the
    share of sampled first replies that hold a well-formed ``lookup`` call)."""
    import torch
    from transformers.utils import get_json_schema

    from agent_r1.testing.models import save_tiny_model, tiny_model, tiny_tokenizer

    tokenizer = tiny_tokenizer()
    model = tiny_model(tokenizer, seed=0)
    tools = [get_json_schema(CodeBook().lookup)]
    rows: list[tuple[list[int], int]] = []
    for task in make_tasks("tools", 256, seed=10_000 + seed):
        keys = task["metadata"]["keys"]
        answer_turns: list[Message] = []
        for key in keys:
            answer_turns += [
                tool_call_message(key),
                {"role": "tool", "name": "lookup", "content": f"code {code_of(key)}"},
            ]
        answer_turns.append({"role": "assistant", "content": "done"})
        prompt = tokenizer.apply_chat_template(
            task["messages"], tools=tools, add_generation_prompt=True, return_dict=False
        )
        full = tokenizer.apply_chat_template(task["messages"] + answer_turns, tools=tools, return_dict=False)
        rows.append((list(full), len(prompt)))
    torch.manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-3)
    model.train()
    batch, losses = 8, []
    rng = random.Random(seed)
    for _ in range(steps):
        chosen = rng.sample(rows, batch)
        width = max(len(ids) for ids, _ in chosen)
        input_ids = torch.zeros(batch, width, dtype=torch.long)
        labels = torch.full((batch, width), -100, dtype=torch.long)
        attention = torch.zeros(batch, width, dtype=torch.long)
        for i, (ids, prompt_length) in enumerate(chosen):
            input_ids[i, : len(ids)] = torch.tensor(ids)
            labels[i, prompt_length : len(ids)] = torch.tensor(ids[prompt_length:])
            attention[i, : len(ids)] = 1
        loss = model(input_ids=input_ids, attention_mask=attention, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    model.eval()
    probe = make_tasks("tools", 8, seed=20_000 + seed)
    prompts = [
        tokenizer.apply_chat_template(
            t["messages"], tools=tools, add_generation_prompt=True, return_dict=False
        )
        for t in probe
    ]
    well_formed = 0
    with torch.no_grad():
        for prompt in prompts:
            out = model.generate(
                torch.tensor([prompt]),
                do_sample=True,
                temperature=1.0,
                top_k=0,
                max_new_tokens=40,
                pad_token_id=tokenizer.pad_token_id,
            )
            text = tokenizer.decode(out[0, len(prompt) :])
            well_formed += bool(
                re.search(r'<tool_call>\s*\{"name": "lookup", "arguments": \{"key": "[^"]*"\}\}', text)
            )
    info = {
        "steps": steps,
        "loss_first": losses[0],
        "loss_last": statistics.fmean(losses[-10:]),
        "probe_call_rate": well_formed / len(prompts),
    }
    save_tiny_model(directory, model, tokenizer)
    (directory / "sft.json").write_text(json.dumps(info, indent=2), encoding="utf-8")
    return info


# --------------------------------------------------------------------------------------------
# One agent-r1 arm: the run config, then train_step by train_step
# --------------------------------------------------------------------------------------------


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
        "single": {"name": "bench:SingleTurnEnv"},
        "turns": {"name": "bench:TurnsEnv"},
        "tools": {
            "name": "bench:CodeBookEnv",
            "latency_s": spec.get("tool_latency_s", 0.0),
            "max_turns": turns,
        },
    }[task]
    reward = {"text": "bench:bench_text_reward", "hash": "bench:bench_hash_reward"}[
        spec.get("reward", "text")
    ]
    rewards = [] if task == "tools" else [{"name": reward, "weight": 1.0}]
    batch = spec["tasks_per_step"] * spec["group_size"]
    config: dict[str, Any] = {
        "seed": spec.get("seed", 0),
        "output_dir": spec["run_dir"],
        "model": {"path": model["dir"], "dtype": "float32", "device": "cpu", "freeze_embeddings": False},
        "data": {
            "name": "bench:bench_tasks",
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


def _rss_mib() -> float:
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
    engines: list[Any],
    calls: Sequence[tuple[float, float]],
    wall_s: float,
) -> dict[str, float]:
    """One agent-r1 step's figures: its wall time, the batch-level generation and environment
    time of its rollouts, the learner's phases, tokens, scores and tool wall time."""
    generation = sum(e.last_metrics.get("rollout/generation_s", 0.0) for e in engines)
    environment = sum(e.last_metrics.get("rollout/env_s", 0.0) for e in engines)
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
    rss_start = _rss_mib()
    config = RunConfig.model_validate(arm_config(spec, spec["model"]))
    components = validate_components(config)
    Path(spec["run_dir"]).mkdir(parents=True, exist_ok=True)
    session = build_session(config, components, spec["run_dir"])
    tasks = session.dataset.load("train")
    session.stream = OrderedStream(tasks)  # type: ignore[assignment]
    engines: list[Any] = []
    build_engine = session.rollout_engine

    def recording_engine(**options: Any) -> Any:
        engine = build_engine(**options)
        engines.append(engine)
        return engine

    session.rollout_engine = recording_engine  # type: ignore[method-assign]
    load_s = time.perf_counter() - started
    rss_loaded = _rss_mib()
    steps = []
    for _ in range(spec["steps"]):
        engines.clear()
        CALLS.clear()
        step_started = time.perf_counter()
        result = train_step(session)
        wall = time.perf_counter() - step_started
        steps.append(step_record(result.metrics, result.trajectories, engines, list(CALLS), wall))
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


# --------------------------------------------------------------------------------------------
# Section "trl": agent-r1 and TRL side by side
# --------------------------------------------------------------------------------------------


def trl_cases(smoke: bool, models: Sequence[str]) -> list[dict[str, Any]]:
    """The side-by-side cases (task × model) with their sizes. Both arms get every field."""
    if smoke:
        base = {"steps": 2, "tasks_per_step": 2, "group_size": 2, "repeats": 1}
        cases = [
            {
                **base,
                "case": "single-tiny",
                "task": "single",
                "model_name": "tiny",
                "max_new_tokens": 8,
                "lr": 1e-3,
            },
            {  # the random model (no fine-tuning in smoke mode): the tool path runs, few calls are made
                **base,
                "case": "tools-tiny-50ms",
                "task": "tools",
                "model_name": "tiny",
                "max_new_tokens": 16,
                "max_turns": 3,
                "tool_latency_s": 0.05,
                "lr": 2e-4,
            },
        ]
    else:
        tiny = {"steps": 12, "tasks_per_step": 4, "group_size": 4, "repeats": 2}
        smol = {"steps": 4, "tasks_per_step": 2, "group_size": 4, "repeats": 2}
        cases = [
            {
                **tiny,
                "case": "single-tiny",
                "task": "single",
                "model_name": "tiny",
                "max_new_tokens": 24,
                "lr": 1e-3,
            },
            {
                **tiny,
                "case": "tools-tiny-0ms",
                "task": "tools",
                "model_name": "tiny-tools",
                "max_new_tokens": 32,
                "max_turns": 3,
                "tool_latency_s": 0.0,
                "lr": 2e-4,
            },
            {
                **tiny,
                "case": "tools-tiny-50ms",
                "task": "tools",
                "model_name": "tiny-tools",
                "max_new_tokens": 32,
                "max_turns": 3,
                "tool_latency_s": 0.05,
                "lr": 2e-4,
            },
            {
                **smol,
                "case": "single-smollm2",
                "task": "single",
                "model_name": "smollm2",
                "max_new_tokens": 24,
                "lr": 1e-5,
            },
            {
                **smol,
                "case": "tools-smollm2-50ms",
                "task": "tools",
                "model_name": "smollm2",
                "max_new_tokens": 32,
                "max_turns": 3,
                "tool_latency_s": 0.05,
                "lr": 1e-5,
                "group_size": 2,
                "steps": 3,
            },
            {  # the learning check: long enough for the reward to move, latency 0 to keep it short
                **tiny,
                "case": "learn-tools-tiny",
                "task": "tools",
                "model_name": "tiny-tools",
                "max_new_tokens": 32,
                "max_turns": 3,
                "tool_latency_s": 0.0,
                "lr": 1e-3,
                "steps": 40,
                "repeats": 1,
            },
        ]
    return [
        case for case in cases if case["model_name"].split("-")[0] in models or case["model_name"] in models
    ]


def completion_budget(case: dict[str, Any]) -> int:
    """Tokens after the prompt, all turns together: TRL's ``max_completion_length``. A tool turn
    adds its result message (about 16 tokens here) to the actions' budgets."""
    turns = case.get("max_turns", 1)
    return case["max_new_tokens"] * turns + 16 * (turns - 1)


def prompt_tokens(case: dict[str, Any], model: dict[str, Any]) -> int:
    """The longest rendered prompt of the case's tasks (both arms render the same way)."""
    from transformers import AutoTokenizer
    from transformers.utils import get_json_schema

    tokenizer = AutoTokenizer.from_pretrained(model["dir"])
    tools = None
    if case["task"] == "tools":
        tools = [get_json_schema(CodeBook().lookup)]
        if model.get("tools_template"):
            tokenizer.chat_template = model["tools_template"]
    tasks = make_tasks(case["task"], case["num_tasks"], case.get("seed", 0))
    return max(
        len(
            tokenizer.apply_chat_template(
                t["messages"], tools=tools, add_generation_prompt=True, return_dict=False
            )
        )
        for t in tasks
    )


def run_arm_subprocess(
    python: str, script: Path, spec: dict[str, Any], work: Path, label: str, timeout_s: float
) -> dict[str, Any]:
    """Run one arm (``script arm SPEC OUT`` for agent-r1, ``script SPEC OUT`` for TRL) in a fresh
    process; its result, or ``{"error": ...}`` with the end of its output."""
    work.mkdir(parents=True, exist_ok=True)
    spec_path, out_path, log_path = work / f"{label}.spec.json", work / f"{label}.json", work / f"{label}.log"
    spec_path.write_text(json.dumps(spec, indent=2), encoding="utf-8")
    out_path.unlink(missing_ok=True)
    command = [python, str(script)]
    if script.name == "bench.py":
        command.append("arm")
    command += [str(spec_path), str(out_path)]
    env = {**os.environ, "OMP_NUM_THREADS": str(spec.get("threads", 1)), "TRL_EXPERIMENTAL_SILENCE": "1"}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "benchmarks"), env.get("PYTHONPATH", "")]).rstrip(
        os.pathsep
    )
    started = time.perf_counter()
    with log_path.open("w", encoding="utf-8") as log:
        try:
            process = subprocess.run(
                command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO, timeout=timeout_s
            )
            code: int | str = process.returncode
        except subprocess.TimeoutExpired:
            code = f"timed out after {timeout_s:.0f} s"
    wall = time.perf_counter() - started
    if code == 0 and out_path.exists():
        result: dict[str, Any] = json.loads(out_path.read_text(encoding="utf-8"))
        result["process_wall_s"] = wall
        return result
    tail = log_path.read_text(encoding="utf-8", errors="replace").splitlines()[-15:]
    return {"error": f"{label}: exit {code}", "log_tail": tail, "log": str(log_path), "process_wall_s": wall}


def run_trl_section(args: argparse.Namespace, models: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Every case, arms alternating (A B, then B A, ...), each in its own subprocess."""
    python = args.trl_python
    section: dict[str, Any] = {"python": python, "cases": []}
    for case in trl_cases(args.smoke, list(models)):
        if args.cases and case["case"] not in args.cases:
            continue
        model = models[case["model_name"]]
        case = {**case, "seed": 0, "threads": args.threads}
        case["num_tasks"] = case["steps"] * case["tasks_per_step"]
        case["max_completion"] = completion_budget(case)
        case["prompt_tokens_max"] = prompt_tokens(case, model)
        case["max_context"] = case["prompt_tokens_max"] + case["max_completion"]
        print(
            f"== trl: {case['case']} ({model['label']}), {case['steps']} steps x {case['repeats']} repeats",
            flush=True,
        )
        runs: list[dict[str, Any]] = []
        for repeat in range(case["repeats"]):
            order = ["agent-r1", "trl"] if repeat % 2 == 0 else ["trl", "agent-r1"]
            for arm in order:
                spec = {**case, "model": model, "arm": arm, "repeat": repeat}
                spec["run_dir"] = str(args.work / "trl" / case["case"] / f"{arm}-{repeat}")
                script = REPO / "benchmarks" / ("bench.py" if arm == "agent-r1" else "bench_trl.py")
                result = run_arm_subprocess(
                    python,
                    script,
                    spec,
                    args.work / "trl" / case["case"],
                    f"{arm}-{repeat}",
                    args.arm_timeout,
                )
                result.update(arm=arm, repeat=repeat)
                runs.append(result)
                print(f"   {arm} #{repeat}: {describe_run(result)}", flush=True)
        case_out = {key: value for key, value in case.items() if key != "model"}
        case_out["model_label"] = model["label"]
        case_out["runs"] = runs
        case_out["summary"] = summarise_case(runs)
        section["cases"].append(case_out)
    return section


def describe_run(result: dict[str, Any]) -> str:
    if "error" in result:
        return f"FAILED ({result['error']}; see {result.get('log')})"
    summary = arm_summary(result)
    return (
        f"{summary['step_s']:.2f} s/step, {summary['tokens_per_s']:.0f} tok/s, "
        f"reward {summary['reward_mean']:.3f}, peak RSS {summary['peak_rss_mib']:.0f} MiB"
    )


def _median(values: Sequence[float]) -> float:
    kept = [v for v in values if v is not None and math.isfinite(v)]
    return statistics.median(kept) if kept else math.nan


def _mean(values: Sequence[float]) -> float:
    kept = [v for v in values if v is not None and math.isfinite(v)]
    return statistics.fmean(kept) if kept else math.nan


def timed_steps(steps: Sequence[dict[str, float]]) -> list[dict[str, float]]:
    """The steps that count for speed: all but the first (which pays one-off warm-up costs) when
    there are at least two."""
    return list(steps[1:]) if len(steps) > 1 else list(steps)


def arm_summary(result: dict[str, Any]) -> dict[str, float]:
    """Speed figures of one arm run (over :func:`timed_steps`) and its memory."""
    steps = timed_steps(result["steps"])
    seconds = sum(s["wall_s"] for s in steps)
    return {
        "step_s": seconds / max(len(steps), 1),
        "steps_per_s": len(steps) / seconds if seconds else math.nan,
        "trajectories_per_s": sum(s["trajectories"] for s in steps) / seconds if seconds else math.nan,
        "tokens_per_s": sum(s["generated_tokens"] for s in steps) / seconds if seconds else math.nan,
        "generation_s": _mean([s.get("generation_s", math.nan) for s in steps]),
        "tool_wall_s": _mean([s.get("tool_wall_s", math.nan) for s in steps]),
        "first_step_s": result["steps"][0]["wall_s"] if result["steps"] else math.nan,
        "reward_mean": _mean([s["reward_mean"] for s in result["steps"]]),
        "zero_variance_groups": _mean([s.get("zero_variance_groups", math.nan) for s in result["steps"]]),
        "tool_calls_per_trajectory": sum(s.get("tool_calls", 0.0) for s in result["steps"])
        / max(sum(s["trajectories"] for s in result["steps"]), 1),
        "generated_tokens_per_trajectory": sum(s["generated_tokens"] for s in result["steps"])
        / max(sum(s["trajectories"] for s in result["steps"]), 1),
        "load_s": result.get("load_s", math.nan),
        "peak_rss_mib": result.get("peak_rss_mib", math.nan),
        "rss_loaded_mib": result.get("rss_loaded_mib", math.nan),
    }


SPEED_KEYS = (
    "steps_per_s",
    "trajectories_per_s",
    "tokens_per_s",
    "step_s",
    "generation_s",
    "tool_wall_s",
    "peak_rss_mib",
)


def summarise_case(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Per arm: the mean of each figure over its repeats; and agent-r1 / TRL ratios."""
    per_arm: dict[str, dict[str, float]] = {}
    for arm in ("agent-r1", "trl"):
        summaries = [arm_summary(r) for r in runs if r.get("arm") == arm and "error" not in r]
        keys = summaries[0].keys() if summaries else []
        per_arm[arm] = {key: _mean([s[key] for s in summaries]) for key in keys}
        per_arm[arm]["runs"] = len(summaries)
    ratios = {}
    for key in SPEED_KEYS:
        ours, theirs = per_arm["agent-r1"].get(key, math.nan), per_arm["trl"].get(key, math.nan)
        ratios[key] = ours / theirs if theirs and math.isfinite(ours) and math.isfinite(theirs) else math.nan
    curves: dict[str, list[float]] = {}
    for arm in ("agent-r1", "trl"):
        series = [
            [s["reward_mean"] for s in r["steps"]] for r in runs if r.get("arm") == arm and "error" not in r
        ]
        length = max((len(s) for s in series), default=0)
        curves[arm] = [_mean([s[i] for s in series if i < len(s)]) for i in range(length)]
    return {"per_arm": per_arm, "ratio_agent_r1_over_trl": ratios, "reward_curves": curves}


# --------------------------------------------------------------------------------------------
# Section "tools": the engine's tool concurrency
# --------------------------------------------------------------------------------------------


def run_tools_section(args: argparse.Namespace) -> dict[str, Any]:
    """Scripted rollouts through the real engine, ToolEnv and tool runner: every action calls the
    slow tool, so each episode makes one call per turn; the rollout's tool wall time is measured
    three ways (the engine's ``rollout/env_s``, the union of the calls' own intervals, the whole
    rollout) against the ideal of one call per turn."""
    from agent_r1.builtins.tool_env import ToolEnv
    from agent_r1.engine.rollout import RolloutEngine
    from agent_r1.testing.models import tiny_tokenizer
    from agent_r1.testing.scripted import ScriptedBackend

    latency = 0.05 if args.smoke else 0.2
    turns = 3
    sizes = [8] if args.smoke else [64, 128]
    repeats = 1 if args.smoke else 3
    tokenizer = tiny_tokenizer()
    rows = []
    for tool in ("bench:SlowLookup", "bench:AsyncSlowLookup"):
        for size in sizes:
            config = {
                "tools": [{"name": tool, "latency_s": latency}],
                "format": {"name": "hermes", "answer_tag": None},
                "max_turns": turns,
                "call_timeout_s": 60.0,
            }
            tool_name = "async_slow_lookup" if "Async" in tool else "slow_lookup"
            script = [
                f'<tool_call>\n{{"name": "{tool_name}", "arguments": {{"key": "k{turn}"}}}}\n</tool_call>'
                for turn in range(turns)
            ]
            measurements = []
            for _ in range(repeats):
                engine = RolloutEngine(
                    ScriptedBackend(tokenizer=tokenizer, responses=script),
                    tokenizer,
                    lambda config=config: ToolEnv(config),
                    max_turns=turns,
                    max_new_tokens=64,
                    max_context=4096,
                )
                tasks = [
                    Task(id=f"t{i}", messages=[{"role": "user", "content": "Look up k0, k1 and k2."}])
                    for i in range(size // 4)
                ]
                CALLS.clear()
                started = time.perf_counter()
                trajectories = engine.collect(tasks, 4, seed=0)
                wall = time.perf_counter() - started
                calls = sum(t.metrics["tool_calls"] for t in trajectories)
                errors = sum(t.metrics["tool_errors"] for t in trajectories)
                measurements.append(
                    {
                        "env_s": engine.last_metrics["rollout/env_s"],
                        "tool_wall_s": interval_union(CALLS),
                        "rollout_wall_s": wall,
                        "calls": calls,
                        "tool_errors": errors,
                    }
                )
            ideal = turns * latency
            env_s = _median([m["env_s"] for m in measurements])
            rows.append(
                {
                    "tool": tool.split(":")[1],
                    "trajectories": size,
                    "turns": turns,
                    "latency_s": latency,
                    "calls": measurements[-1]["calls"],
                    "tool_errors": measurements[-1]["tool_errors"],
                    "env_s": env_s,
                    "env_s_max": max(m["env_s"] for m in measurements),
                    "tool_wall_s": _median([m["tool_wall_s"] for m in measurements]),
                    "rollout_wall_s": _median([m["rollout_wall_s"] for m in measurements]),
                    "ideal_s": ideal,
                    "serial_s": size * turns * latency,
                    "target_s": 1.5 * ideal,
                    "ratio_to_ideal": env_s / ideal,
                    "meets_target": env_s <= 1.5 * ideal,
                    "measurements": measurements,
                }
            )
            print(
                f"   {rows[-1]['tool']} x{size}: env {env_s:.3f} s "
                f"(ideal {ideal:.2f} s, serial {size * turns * latency:.1f} s)",
                flush=True,
            )
    from agent_r1.builtins import tool_runner

    return {"rows": rows, "thread_pool_workers": tool_runner.MAX_WORKER_THREADS}


# --------------------------------------------------------------------------------------------
# Section "scaling": step time against the size of the work
# --------------------------------------------------------------------------------------------


def scaling_axes(smoke: bool, model: str) -> dict[str, list[int]]:
    """The values of each axis; every other setting stays at the base point (2 tasks, group of 4,
    one turn, a short prompt)."""
    if smoke:
        return {"tasks_per_step": [1, 2], "group_size": [2, 4], "max_turns": [1, 2], "prompt_words": [0, 60]}
    if model == "smollm2":
        return {"tasks_per_step": [1, 2, 4]}
    return {
        "tasks_per_step": [1, 2, 4, 8, 16],
        "group_size": [2, 4, 8, 16],
        "max_turns": [1, 2, 4, 8],
        "prompt_words": [0, 50, 150, 400],  # about 30 to 1550 tokens: within the tiny model's 2048
    }


def run_scaling_section(args: argparse.Namespace, models: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """For each model and axis, a few agent-r1 steps per value, in this process, one after the
    other; the median over the steps after the first is the point."""
    import gc

    section: dict[str, Any] = {"models": {}}
    for name in args.scaling_models:
        model = models[name]
        base = {"tasks_per_step": 2, "group_size": 4, "max_turns": 1, "prompt_words": 0}
        steps = 2 if args.smoke else (3 if name == "smollm2" else 4)
        new_tokens = 8 if args.smoke else 16
        lr = 1e-5 if name == "smollm2" else 1e-3
        points = []
        warm_up = [("warm-up", base["tasks_per_step"])]
        for axis, values in [*warm_up, *scaling_axes(args.smoke, name).items()]:
            for value in values if isinstance(values, list) else [values]:
                setting = {**base, axis: value} if axis != "warm-up" else dict(base)
                spec = {
                    "task": "turns",
                    "reward": "hash",
                    "model": model,
                    "steps": steps,
                    "num_tasks": steps * setting["tasks_per_step"],
                    "tasks_per_step": setting["tasks_per_step"],
                    "group_size": setting["group_size"],
                    "max_turns": setting["max_turns"],
                    "prompt_words": setting["prompt_words"],
                    "max_new_tokens": new_tokens,
                    "max_context": 4096 if name == "smollm2" else 2048,
                    "lr": lr,
                    "seed": 0,
                    "threads": args.threads,
                    "run_dir": str(args.work / "scaling" / name / f"{axis}-{value}"),
                }
                try:
                    result = run_agent_r1_arm(spec)
                except Exception as exc:  # one point's failure is reported; the others go on
                    traceback.print_exc()
                    points.append({"axis": axis, "value": value, "error": f"{type(exc).__name__}: {exc}"})
                    continue
                finally:
                    gc.collect()
                if axis == "warm-up":  # the first run in a process pays one-off costs: not a point
                    continue
                kept = timed_steps(result["steps"])
                point = {"axis": axis, "value": value, "setting": setting, "steps": result["steps"]}
                for key in (
                    "wall_s",
                    "generation_s",
                    "env_s",
                    "no_grad_s",
                    "forward_backward_s",
                    "optimizer_s",
                    "overhead_s",
                    "other_s",
                    "generated_tokens",
                    "trajectories",
                    "context_tokens_mean",
                    "prompt_tokens_mean",
                    "turns_mean",
                ):
                    point[key] = _median([s[key] for s in kept])
                points.append(point)
                print(
                    f"   {name} {axis}={value}: {point['wall_s']:.2f} s/step "
                    f"({point['trajectories']:.0f} traj, {point['context_tokens_mean']:.0f} ctx tokens)",
                    flush=True,
                )
        section["models"][name] = {
            "label": model["label"],
            "base": base,
            "steps": steps,
            "max_new_tokens": new_tokens,
            "points": points,
        }
    return section


# --------------------------------------------------------------------------------------------
# Overhead: what is neither model compute nor tool waiting
# --------------------------------------------------------------------------------------------


def overhead_rows(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Per agent-r1 run of the other sections: the mean share of step time in ``time/other_s``
    (the engine's own remainder) and in everything but model compute and tool waiting."""
    rows = []
    for case in results.get("trl", {}).get("cases", []):
        for run in case["runs"]:
            if run.get("arm") == "agent-r1" and "error" not in run:
                rows.append(_overhead_row(f"trl/{case['case']} #{run['repeat']}", run["steps"]))
    for name, model in results.get("scaling", {}).get("models", {}).items():
        for point in model["points"]:
            if "error" not in point:
                rows.append(_overhead_row(f"scaling/{name} {point['axis']}={point['value']}", point["steps"]))
    return rows


def _num(value: Any) -> float:
    """A figure as a float (NaN for a missing one, which bench.json stores as null)."""
    return math.nan if value is None else float(value)


def _overhead_row(label: str, steps: Sequence[dict[str, float]]) -> dict[str, Any]:
    kept = timed_steps(steps)
    wall = sum(s["wall_s"] for s in kept)

    def share(key: str) -> float:
        return sum(_num(s.get(key)) for s in kept) / wall if wall else math.nan

    return {
        "run": label,
        "step_s": wall / max(len(kept), 1),
        "other_share": share("other_s"),
        "overhead_share": share("overhead_s"),
        "rewards_share": share("rewards_s"),
        "advantages_share": share("advantages_s"),
    }


# --------------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------------


def machine() -> dict[str, Any]:
    """What the figures ran on: CPU model and count, memory, OS, Python."""
    info: dict[str, Any] = {
        "nproc": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
    }
    try:
        # nproc obeys OMP_NUM_THREADS, which the benchmark sets to 1: ask it without
        plain = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "OMP_THREAD_LIMIT")}
        info["nproc"] = int(
            subprocess.run(["nproc"], capture_output=True, text=True, check=True, env=plain).stdout.strip()
        )
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        for line in lscpu.splitlines():
            if line.startswith("Model name:"):
                info["cpu"] = line.split(":", 1)[1].strip()
    except (OSError, subprocess.CalledProcessError, ValueError):
        info["cpu"] = platform.processor() or "unknown"  # no nproc/lscpu: what Python knows
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                info["memory_gib"] = round(int(line.split()[1]) / 1024**2, 1)
    except OSError:
        pass  # not Linux: memory is left out of the report
    try:
        import torch

        info["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
    except ImportError:
        info["gpu"] = "unknown"
    return info


def _fmt(value: Any, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "n/a"
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    return str(value)


def _row(*cells: Any) -> str:
    """A Markdown table row."""
    return "| " + " | ".join(str(cell) for cell in cells) + " |"


def _header(*names: str) -> list[str]:
    """A Markdown table header and its rule."""
    return [_row(*names), _row(*(["---"] * len(names)))]


def markdown(results: dict[str, Any]) -> str:
    """``bench.md``: every section's tables, with the setup they ran under."""
    m = results["machine"]
    runs = results.get("history") or [_run_entry(results)]
    lines = [
        "# agent-r1 benchmarks",
        "",
        *[f"- `{run['command']}`: {run['date']}, {_num(run['wall_s']) / 60:.1f} min" for run in runs],
        f"- machine: {m.get('cpu', '?')}, {m.get('nproc', '?')} cores (`nproc`), "
        + f"{m.get('memory_gib', '?')} GiB memory, GPU: {m.get('gpu', '?')}",
        f"- torch threads per run: {results['threads']}",
        f"- this interpreter: {_versions_text(results['versions'])}",
    ]
    if "trl" in results:
        lines += _trl_markdown(results["trl"])
    if "tools" in results:
        lines += _tools_markdown(results["tools"])
    if "scaling" in results:
        lines += _scaling_markdown(results["scaling"])
    if results.get("overhead"):
        lines += _overhead_markdown(results["overhead"])
    failures = results.get("failures", [])
    if failures:
        lines += ["", "## Failures", "", *[f"- {f}" for f in failures]]
    if results.get("notes"):
        lines += ["", "## Notes", "", *[f"- {n}" for n in results["notes"]]]
    return "\n".join(lines) + "\n"


def _overhead_markdown(rows: Sequence[dict[str, Any]]) -> list[str]:
    lines = [
        "",
        "## Step time outside model compute and tool waiting (agent-r1 runs)",
        "",
        "`other` is the engine's `time/other_s` (step time not in rollout, no-grad passes, advantages,",
        "forward/backward or optimizer); `outside compute+tools` is step time minus generation, no-grad",
        "passes, forward/backward, optimizer and the rollout's environment time (so it holds rewards,",
        "advantages, collation, rendering and the Python around them). Mean over the steps after the",
        "first.",
        "",
        *_header("run", "s/step", "other", "outside compute+tools", "rewards", "advantages"),
    ]
    for row in rows:
        lines.append(
            _row(
                row["run"],
                _fmt(row["step_s"]),
                _pct(row["other_share"]),
                _pct(row["overhead_share"]),
                _pct(row["rewards_share"]),
                _pct(row["advantages_share"]),
            )
        )
    worst = max(rows, key=lambda r: r["overhead_share"] if math.isfinite(_num(r["overhead_share"])) else -1)
    share = _pct(worst["overhead_share"])
    return [*lines, "", f"Largest share outside compute+tools: {share} ({worst['run']}); target <= 5%."]


def _pct(value: float) -> str:
    return f"{100 * value:.1f}%" if value is not None and math.isfinite(value) else "n/a"


def _versions_text(versions: dict[str, str]) -> str:
    return ", ".join(f"{k} {v}" for k, v in versions.items())


TRL_COLUMNS = (
    "case",
    "model",
    "T x G",
    "steps x repeats",
    "new tokens (per action / all turns)",
    "arm",
    "steps/s",
    "trajectories/s",
    "generated tokens/s",
    "s/step",
    "generation s/step",
    "tool wall s/step",
    "peak RSS MiB",
    "reward (mean over steps)",
    "tool calls / trajectory",
    "zero-variance groups",
)


def _trl_markdown(section: dict[str, Any]) -> list[str]:
    lines = ["", "## Side by side with TRL", ""]
    if section.get("skipped"):
        return [*lines, f"Skipped: {section['skipped']}"]
    versions = next((r["versions"] for c in section["cases"] for r in c["runs"] if "versions" in r), {})
    lines += [
        f"Both arms run with `{section['python']}` ({_versions_text(versions)}), each in a subprocess of",
        "its own, alternating (agent-r1 first in even repeats, TRL first in odd ones). Speed is over the",
        "steps after the first (warm-up); `peak RSS` is the arm process's high-water mark (model,",
        "optimizer, libraries). Ratios are agent-r1 / TRL (above 1: agent-r1 faster, except for s/step,",
        "generation and tool time and memory, where below 1 is better).",
        "",
        *_header(*TRL_COLUMNS),
    ]
    for case in section["cases"]:
        summary = case["summary"]
        setup = (
            case["case"],
            case["model_label"],
            f"{case['tasks_per_step']} x {case['group_size']}",
            f"{case['steps']} x {case['repeats']}",
            f"{case['max_new_tokens']} / {case['max_completion']}",
        )
        for arm in ("agent-r1", "trl"):
            s = summary["per_arm"][arm]
            if not s.get("runs"):
                lines.append(_row(*setup, arm, "failed", *([""] * (len(TRL_COLUMNS) - 7))))
                continue
            figures = [_fmt(s[k]) for k in ("steps_per_s", "trajectories_per_s", "tokens_per_s", "step_s")]
            figures += [_fmt(s["generation_s"]), _fmt(s["tool_wall_s"]), _fmt(s["peak_rss_mib"], 4)]
            figures += [_fmt(s["reward_mean"]), _fmt(s["tool_calls_per_trajectory"])]
            lines.append(_row(*setup, arm, *figures, _pct(s["zero_variance_groups"])))
        r = summary["ratio_agent_r1_over_trl"]
        ratios = [f"**{_fmt(r['steps_per_s'])}**"]
        ratios += [_fmt(r[k]) for k in ("trajectories_per_s", "tokens_per_s", "step_s", "generation_s")]
        ratios += [_fmt(r["tool_wall_s"]), _fmt(r["peak_rss_mib"])]
        lines.append(_row(case["case"], "", "", "", "", "**ratio**", *ratios, "", "", ""))
    lines += ["", "Reward per step (mean over repeats), agent-r1 / TRL:", ""]
    for case in section["cases"]:
        curves = case["summary"]["reward_curves"]
        pairs = [
            f"{_fmt(a, 2)} / {_fmt(b, 2)}"
            for a, b in zip(curves.get("agent-r1", []), curves.get("trl", []), strict=False)
        ]
        lines.append(f"- {case['case']}: " + ", ".join(pairs))
    failed = [r for c in section["cases"] for r in c["runs"] if "error" in r]
    if failed:
        lines += ["", "Failed arm runs:", ""]
        lines += [f"- {r['error']}: {' / '.join(r.get('log_tail', [])[-3:])}" for r in failed]
    return lines


def _tools_markdown(section: dict[str, Any]) -> list[str]:
    lines = [
        "",
        "## Tool concurrency",
        "",
        "A scripted policy calls the tool in every action; `ToolEnv` (hermes format) runs it; each episode",
        "takes 3 turns, so it waits for 3 calls. `env s` is the engine's `rollout/env_s` (wall time of the",
        "environment steps, all turns; median over repeats), `calls' union` the time at least one call was",
        "running. Target: at most 1.5 x one call per turn. Synchronous tools run in a pool of",
        f"{section['thread_pool_workers']} worker threads.",
        "",
        *_header(
            "tool",
            "trajectories",
            "calls",
            "latency",
            "env s",
            "calls' union s",
            "one call per turn s",
            "target s",
            "serial s",
            "meets target",
        ),
    ]
    for row in section["rows"]:
        lines.append(
            _row(
                row["tool"],
                row["trajectories"],
                f"{row['calls']:.0f}",
                f"{row['latency_s'] * 1000:.0f} ms",
                _fmt(row["env_s"]),
                _fmt(row["tool_wall_s"]),
                _fmt(row["ideal_s"]),
                _fmt(row["target_s"]),
                _fmt(row["serial_s"]),
                "yes" if row["meets_target"] else "no",
            )
        )
    return lines


SCALING_COLUMNS = (
    "axis",
    "value",
    "trajectories",
    "context tokens",
    "s/step",
    "x base",
    "work x",
    "generation",
    "tools",
    "fwd+bwd",
    "optimizer",
    "outside compute+tools",
)


def _scaling_markdown(section: dict[str, Any]) -> list[str]:
    lines = ["", "## Scaling", ""]
    for model in section["models"].values():
        base = model["base"]
        lines += [
            f"### {model['label']}",
            "",
            f"Base point: {base['tasks_per_step']} tasks x group {base['group_size']}, "
            f"{base['max_turns']} turn,",
            f"{model['max_new_tokens']} new tokens per action; one axis changes at a time. Median of steps",
            f"2..{model['steps']}. `x base` is the step time over that of the axis's base value (measured in",
            "the same sweep); `work x` how many more tokens the point's trajectories hold in all",
            "(trajectories x mean length). Times in seconds per step.",
            "",
            *_header(*SCALING_COLUMNS),
        ]
        for point in model["points"]:
            if "error" in point:
                lines.append(_row(point["axis"], point["value"], f"failed: {point['error']}"))
                continue
            base_point = next(
                (
                    p
                    for p in model["points"]
                    if "error" not in p and p["axis"] == point["axis"] and p["setting"] == base
                ),
                None,
            )
            ratio = point["wall_s"] / base_point["wall_s"] if base_point else math.nan
            work = _work(point) / _work(base_point) if base_point else math.nan
            times = [
                point[k] for k in ("generation_s", "env_s", "forward_backward_s", "optimizer_s", "overhead_s")
            ]
            lines.append(
                _row(
                    point["axis"],
                    point["value"],
                    f"{point['trajectories']:.0f}",
                    f"{point['context_tokens_mean']:.0f}",
                    _fmt(point["wall_s"]),
                    _fmt(ratio),
                    _fmt(work),
                    *(_fmt(t) for t in times),
                )
            )
        lines.append("")
    return lines


def _work(point: dict[str, Any]) -> float:
    """Trajectories x their mean length in tokens: the token work of a point."""
    return point["trajectories"] * max(point["context_tokens_mean"], 1.0)


def plot_all(results: dict[str, Any], out: Path) -> list[str]:
    """The PNGs: reward curves and speed of the TRL comparison, and the scaling curves."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    written = []
    cases = [c for c in results.get("trl", {}).get("cases", [])]
    if cases:
        fig, axes = plt.subplots(1, len(cases), figsize=(4 * len(cases), 3.2), squeeze=False)
        for ax, case in zip(axes[0], cases, strict=True):
            for arm, color in (("agent-r1", "tab:blue"), ("trl", "tab:orange")):
                for run in case["runs"]:
                    if run.get("arm") == arm and "error" not in run:
                        rewards = [_num(s["reward_mean"]) for s in run["steps"]]
                        ax.plot(rewards, color=color, alpha=0.3, linewidth=0.8)
                curve = case["summary"]["reward_curves"].get(arm, [])
                ax.plot(curve, color=color, linewidth=2, label=arm)
            ax.set_title(case["case"], fontsize=9)
            ax.set_xlabel("step")
            ax.grid(alpha=0.3)
        axes[0][0].set_ylabel("mean reward")
        axes[0][0].legend(fontsize=8)
        fig.suptitle("Reward per step: agent-r1 and TRL on the same task (thin: each repeat)", fontsize=10)
        fig.tight_layout()
        fig.savefig(out / "bench_trl_rewards.png", dpi=100)
        plt.close(fig)
        written.append("bench_trl_rewards.png")

        fig, axes = plt.subplots(1, 3, figsize=(13, 3.4))
        labels = [c["case"] for c in cases]
        for ax, (key, title) in zip(
            axes,
            (
                ("step_s", "seconds per step"),
                ("tokens_per_s", "generated tokens / s"),
                ("peak_rss_mib", "peak RSS (MiB)"),
            ),
            strict=True,
        ):
            for offset, (arm, color) in zip(
                (-0.2, 0.2), (("agent-r1", "tab:blue"), ("trl", "tab:orange")), strict=True
            ):
                values = [c["summary"]["per_arm"][arm].get(key, math.nan) for c in cases]
                ax.bar([i + offset for i in range(len(cases))], values, width=0.4, color=color, label=arm)
            ax.set_xticks(range(len(cases)))
            ax.set_xticklabels(labels, rotation=20, ha="right", fontsize=8)
            ax.set_title(title, fontsize=9)
            if key != "peak_rss_mib":  # the tiny and the 135M model differ by orders of magnitude
                ax.set_yscale("log")
            ax.grid(alpha=0.3, axis="y")
        axes[0].legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out / "bench_trl_speed.png", dpi=100)
        plt.close(fig)
        written.append("bench_trl_speed.png")

    for name, model in results.get("scaling", {}).get("models", {}).items():
        axes_names = list(dict.fromkeys(p["axis"] for p in model["points"]))
        fig, axes = plt.subplots(1, len(axes_names), figsize=(3.6 * len(axes_names), 3.3), squeeze=False)
        for ax, axis in zip(axes[0], axes_names, strict=True):
            points = [p for p in model["points"] if p["axis"] == axis and "error" not in p]
            if not points:
                continue
            x = [p["context_tokens_mean"] if axis == "prompt_words" else p["value"] for p in points]
            ax.plot(x, [p["wall_s"] for p in points], "o-", color="black", label="step")
            ax.plot(x, [p["generation_s"] for p in points], "s--", color="tab:blue", label="generation")
            ax.plot(
                x,
                [p["forward_backward_s"] + p["optimizer_s"] for p in points],
                "^--",
                color="tab:green",
                label="fwd+bwd+opt",
            )
            ax.plot(
                x, [p["overhead_s"] for p in points], "x:", color="tab:red", label="outside compute+tools"
            )
            first = points[0]
            ax.plot(
                x,
                [first["wall_s"] * v / x[0] for v in x],
                color="gray",
                alpha=0.5,
                linewidth=1,
                label="linear from first",
            )
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel({"prompt_words": "context tokens", "max_turns": "turns"}.get(axis, axis))
            ax.grid(alpha=0.3, which="both")
        axes[0][0].set_ylabel("seconds per step")
        axes[0][0].legend(fontsize=7)
        fig.suptitle(f"Step time against the work per step: {model['label']}", fontsize=10)
        fig.tight_layout()
        fig.savefig(out / f"bench_scaling_{name}.png", dpi=100)
        plt.close(fig)
        written.append(f"bench_scaling_{name}.png")
    return written


def _jsonable(value: Any) -> Any:
    """Plain JSON data: NaN and infinities become null, floats keep 6 significant digits (timings
    are not more precise than that), and paths name no machine: the repository is ``.``, the
    home directory ``~``."""
    if isinstance(value, float):
        return float(f"{value:.6g}") if math.isfinite(value) else None
    if isinstance(value, str) and value.startswith("/"):
        return value.replace(str(REPO), ".").replace(str(Path.home()), "~")
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def _run_entry(results: dict[str, Any]) -> dict[str, Any]:
    return {key: results.get(key) for key in ("command", "date", "wall_s", "sections")}


def merge_results(previous: dict[str, Any], current: dict[str, Any]) -> dict[str, Any]:
    """``previous`` with what ``current`` ran put in its place: ``trl`` cases by name, ``scaling``
    by model, ``tools`` whole. The runs that made the merged report are listed in ``history``."""
    merged = {
        **previous,
        **{k: current[k] for k in ("machine", "versions", "threads", "smoke") if k in current},
    }
    merged["history"] = [*previous.get("history", [_run_entry(previous)]), _run_entry(current)]
    merged["wall_s"] = sum(_num(run.get("wall_s")) for run in merged["history"])
    rerun: list[str] = []
    if "trl" in current:
        old = previous.get("trl", {}).get("cases", [])
        new = current["trl"].get("cases", [])
        names = {case["case"] for case in new}
        rerun += [f"trl/{name}" for name in names]
        merged["trl"] = {**current["trl"], "cases": [c for c in old if c["case"] not in names] + new}
    if "tools" in current:
        merged["tools"] = current["tools"]
        rerun.append("tools")
    if "scaling" in current:
        models = {**previous.get("scaling", {}).get("models", {}), **current["scaling"]["models"]}
        merged["scaling"] = {"models": models}
        rerun += [f"scaling/{name}" for name in current["scaling"]["models"]]
    merged["models"] = {**previous.get("models", {}), **current.get("models", {})}
    kept = [f for f in previous.get("failures", []) if not any(f.startswith(prefix) for prefix in rerun)]
    merged["failures"] = kept + current.get("failures", [])
    return merged


def write_reports(results: dict[str, Any], out: Path) -> None:
    """``bench.json``, ``bench.md`` and the PNGs into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    results["overhead"] = overhead_rows(results)
    try:
        results["plots"] = plot_all(results, out)
    except ImportError as exc:  # an environment without matplotlib (the trl one): tables only
        results["plots"] = []
        results["notes"] = [f"no plots: {exc} (install matplotlib, e.g. agent-r1[plots])"]
        print(f"warning: {results['notes'][0]}", flush=True)
    except Exception as exc:  # a plotting problem must not lose the figures
        results.setdefault("failures", []).append(f"plots: {type(exc).__name__}: {exc}")
    (out / "bench.json").write_text(json.dumps(_jsonable(results)), encoding="utf-8")
    (out / "bench.md").write_text(markdown(results), encoding="utf-8")


# --------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=(__doc__ or "").splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--only", default=",".join(SECTIONS), help=f"comma-separated sections ({', '.join(SECTIONS)})"
    )
    parser.add_argument(
        "--smoke", action="store_true", help="tiny sizes, a few seconds per section: checks that it runs"
    )
    parser.add_argument(
        "--out", type=Path, default=Path("benchmarks/results"), help="where bench.json/.md/.png go"
    )
    parser.add_argument("--work", type=Path, default=Path("runs/bench"), help="models, arm outputs, logs")
    parser.add_argument(
        "--models",
        default="tiny,smollm2",
        help="models of the trl section (tiny, smollm2); tiny includes tiny-tools",
    )
    parser.add_argument(
        "--cases", default="", help="only these cases of the trl section (comma-separated names)"
    )
    parser.add_argument("--scaling-models", default="tiny,smollm2", help="models of the scaling section")
    parser.add_argument(
        "--trl-python",
        default=DEFAULT_TRL_PYTHON,
        help="interpreter with trl (both arms of the trl section run with it)",
    )
    parser.add_argument("--threads", type=int, default=1, help="torch threads per run (default 1)")
    parser.add_argument(
        "--update",
        action="store_true",
        help="merge into --out's bench.json: the cases and sections run now replace their old figures",
    )
    parser.add_argument(
        "--from-json", type=Path, help="only rewrite bench.md and the plots from this bench.json (no runs)"
    )
    parser.add_argument(
        "--arm-timeout", type=float, default=1800.0, help="seconds before an arm process is stopped"
    )
    args = parser.parse_args(argv)
    args.only = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = sorted(set(args.only) - set(SECTIONS))
    if unknown:
        parser.error(f"--only: unknown section(s) {', '.join(unknown)}; choose from {', '.join(SECTIONS)}")
    args.models = [m.strip() for m in args.models.split(",") if m.strip()]
    args.scaling_models = [m.strip() for m in args.scaling_models.split(",") if m.strip()]
    args.cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    for name in [*args.models, *args.scaling_models]:
        if name not in ("tiny", "smollm2"):
            parser.error(f"unknown model {name!r}: choose tiny or smollm2")
    if args.smoke:
        args.models = ["tiny"]
        args.scaling_models = ["tiny"]
    return args


def main(argv: Sequence[str] | None = None) -> int:
    if argv is None and len(sys.argv) > 1 and sys.argv[1] == "arm":
        return arm_main(sys.argv[2:])
    args = parse_args(argv)
    if args.from_json:
        results = json.loads(args.from_json.read_text(encoding="utf-8"))
        for case in results.get("trl", {}).get("cases", []):
            case["summary"] = summarise_case(case["runs"])
        write_reports(results, args.out)
        print(f"written: {args.out / 'bench.md'}, {args.out / 'bench.json'}, {', '.join(results['plots'])}")
        return 0
    import torch
    from transformers.utils import logging as hf_logging

    torch.set_num_threads(args.threads)
    hf_logging.disable_progress_bar()
    args.work = args.work.resolve()
    previous = None
    if args.update:
        existing = args.out / "bench.json"
        if not existing.is_file():
            print(f"error: --update: {existing} does not exist; run without --update first", file=sys.stderr)
            return 2
        previous = json.loads(existing.read_text(encoding="utf-8"))
    started = time.perf_counter()
    results: dict[str, Any] = {
        "command": " ".join(["benchmarks/bench.py", *(argv if argv is not None else sys.argv[1:])]),
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "machine": machine(),
        "versions": library_versions(),
        "threads": args.threads,
        "smoke": args.smoke,
        "sections": args.only,
        "failures": [],
    }
    names: set[str] = set()
    if "trl" in args.only:
        if "tiny" in args.models:
            names |= {"tiny"} if args.smoke else {"tiny", "tiny-tools"}
        if "smollm2" in args.models:
            names.add("smollm2")
    if "scaling" in args.only:
        names |= set(args.scaling_models)
    models = prepare_models(args.work, sorted(names), smoke=args.smoke)
    results["models"] = {
        k: {kk: vv for kk, vv in v.items() if kk != "tools_template"} for k, v in models.items()
    }
    for section in args.only:
        print(f"== section {section}", flush=True)
        try:
            if section == "trl":
                if not Path(args.trl_python).exists():
                    results["trl"] = {
                        "skipped": f"no interpreter at {args.trl_python}: run `make venv-integrations` "
                        "(trl 1.16) or pass --trl-python"
                    }
                    results["failures"].append(f"trl: {results['trl']['skipped']}")
                else:
                    results["trl"] = run_trl_section(args, models)
                    for case in results["trl"]["cases"]:
                        for run in case["runs"]:
                            if "error" in run:
                                results["failures"].append(f"trl/{case['case']}: {run['error']}")
            elif section == "tools":
                results["tools"] = run_tools_section(args)
            elif section == "scaling":
                results["scaling"] = run_scaling_section(args, models)
                for name, model in results["scaling"]["models"].items():
                    results["failures"] += [
                        f"scaling/{name} {p['axis']}={p['value']}: {p['error']}"
                        for p in model["points"]
                        if "error" in p
                    ]
        except Exception as exc:  # a section's failure is reported; the other sections go on
            traceback.print_exc()
            results["failures"].append(f"{section}: {type(exc).__name__}: {exc}")
        results["wall_s"] = time.perf_counter() - started
        report = merge_results(previous, results) if previous is not None else results
        write_reports(report, args.out)  # after every section: a crash later loses nothing
    print((args.out / "bench.md").read_text(encoding="utf-8"))
    plots = report.get("plots", []) if args.only else []
    print(f"written: {args.out / 'bench.md'}, {args.out / 'bench.json'}, {', '.join(plots)}")
    return 1 if results["failures"] else 0


def arm_main(argv: Sequence[str]) -> int:
    """``bench.py arm SPEC.json OUT.json``: one agent-r1 arm, in this process."""
    if len(argv) != 2:
        print("error: usage: bench.py arm SPEC.json OUT.json", file=sys.stderr)
        return 2
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    spec = json.loads(Path(argv[0]).read_text(encoding="utf-8"))
    result = run_agent_r1_arm(spec)
    Path(argv[1]).write_text(json.dumps(_jsonable(result), indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    # Python paths in the run configs ("bench:SingleTurnEnv") must find this very module, not a
    # second copy of it imported under its file name.
    sys.modules.setdefault("bench", sys.modules[__name__])
    raise SystemExit(main())
