"""Asynchronous rollouts against sync mode: wall time to a fixed number of updates, same learning.

The toy multi-turn task (``toy_multi_turn``: 3 turns per episode, every observation after a
tool-like wait drawn log-normal with median ``--latency`` seconds and p99 10x the median; the
``target_char`` reward, which a random model starts low on and learns within a few updates) on a
random Llama (hidden 256, 4 layers, float32), ``--steps`` updates of 4 tasks x 4 samples, in
three modes: ``sync``, ``async`` with ``max_staleness`` 1 and 2. Each (mode, seed) runs in a
subprocess of its own, modes alternating within each seed. Reported per mode: the median wall
time of the training loop (rollouts, updates; model loading excluded), its ratio to sync, the mean
reward of the last 3 updates and the held-out success after training (mean and spread over
seeds), the trainer's idle share and the staleness seen.

    .venv/bin/python benchmarks/bench_async.py                  # 3 seeds (about 10 min)
    .venv/bin/python benchmarks/bench_async.py --smoke          # seconds (the tests)

Writes ``bench_async.json`` and ``bench_async.md`` to ``--out`` (default benchmarks/results).
On a 2-core CPU the rollout thread and the trainer share the cores; what overlaps for free is
the tools' waiting.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).with_name("results")
MODES = {
    "sync": {"mode": "sync"},
    "async-1": {"mode": "async", "max_staleness": 1},
    "async-2": {"mode": "async", "max_staleness": 2},
    "async-2-one-batch": {"mode": "async", "max_staleness": 2, "async_batches": 1},
    "async-1-process": {"mode": "async", "max_staleness": 1, "async_worker": "process"},
    "async-1-ranks": {"mode": "async", "max_staleness": 1, "async_worker": "ranks"},
    "async-2-ranks": {"mode": "async", "max_staleness": 2, "async_worker": "ranks"},
}
"""The ``-ranks`` modes run ``agent-r1 train`` under torchrun (2 processes: rank 0 trains, rank 1
rolls out); the others run the steps in one process."""


def run_arm(spec: dict[str, Any]) -> dict[str, Any]:
    """One training run in this process: the wall time of its steps and what it learned."""
    import torch

    import agent_r1.testing.toy as toy
    from agent_r1.config import RunConfig, validate_components
    from agent_r1.engine import build_session, train_step
    from agent_r1.registry import get_registry
    from agent_r1.run.commands import run_eval

    torch.set_num_threads(spec.get("threads", 1))
    registry = get_registry()
    registry.load()
    registry.register_plugin(toy, "toy", distribution="agent-r1-bench")
    sigma = math.log(10) / 2.326  # p99 = 10 x median
    config = {
        "seed": spec["seed"],
        "output_dir": str(Path(spec["work"]) / "run"),
        "model": {"path": spec["model"]},
        "data": {"name": "toy_target", "num_train": 64, "num_eval": 16},
        "environment": {
            "name": "toy_multi_turn",
            "turns": 3,
            "latency_s": spec["latency"],
            "latency_sigma": sigma,
        },
        "rollout": {
            "group_size": 4,
            "max_turns": 3,
            "max_new_tokens": 8,
            "max_context": 256,
            **MODES[spec["mode"]],
        },
        "rewards": [{"name": "target_char"}],
        "algorithm": {
            "name": "grpo",
            "rollout_correction": {"mode": "truncate", "level": "token", "cap": 2.0},
        },
        "trainer": {
            "steps": spec["steps"],
            "tasks_per_step": 4,
            "micro_batch_size": 4,
            "lr": 3e-2,
            "checkpoint_every": 0,
        },
        "eval": {"num_tasks": 16, "before_training": False},
        "trackers": [],
    }
    if spec.get("task") == "single":  # single-turn GRPO: generation and training both compute
        config["environment"] = {"name": "toy_single_turn"}
        config["rollout"].update(max_turns=1, max_new_tokens=24)
        config["trainer"].update(lr=1e-5 if "smollm2" in spec["model"] else 3e-2)
    if config["rollout"].get("async_worker") == "ranks":
        return _run_ranks_arm(spec, config)
    run = RunConfig.model_validate(config)
    session = build_session(run, validate_components(run, registry), run.output_dir, registry=registry)
    started = time.perf_counter()
    metrics = [train_step(session).metrics for _ in range(spec["steps"])]
    wall = time.perf_counter() - started
    held_out = run_eval(session, session.dataset.load("eval")[:16], label="after")
    session.close()
    rewards = [m["reward/answer_match"] for m in metrics]
    return {
        "mode": spec["mode"],
        "seed": spec["seed"],
        "wall_s": wall,
        "late_reward": sum(rewards[-3:]) / len(rewards[-3:]),
        "held_out": float(held_out["success"]),
        "trainer_idle_share": statistics.mean(m.get("async/trainer_idle_share", 0.0) for m in metrics),
        "staleness_max": max(m.get("async/staleness_max", 0.0) for m in metrics),
        "partial_share": statistics.mean(m.get("async/partial_share", 0.0) for m in metrics),
    }


def _run_ranks_arm(spec: dict[str, Any], config: dict[str, Any]) -> dict[str, Any]:
    """An arm of ``rollout.async_worker: ranks``: ``agent-r1 train`` under torchrun on 2 processes;
    the wall time is the sum of its steps' ``time/step_s`` (model loading excluded, as in the
    in-process arms), the held-out success its evaluation after training."""
    import os
    import socket
    import subprocess
    import sys

    import yaml

    from agent_r1.testing.plugins import write_plugin_distribution

    work = Path(spec["work"])
    plugin = work / "plugin"
    write_plugin_distribution(
        plugin, "agent-r1-bench-toy", files={}, entry_points={"toy": "agent_r1.testing.toy"}
    )
    config["trackers"] = [{"name": "jsonl"}]
    path = work / "run.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    threads = str(spec.get("threads", 1))
    env = {
        **os.environ,
        "PYTHONPATH": str(plugin),
        "OMP_NUM_THREADS": threads,
        "AGENT_R1_STRICT_PLUGINS": "1",
    }
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node=2",
        "--master_addr=127.0.0.1",
        f"--master_port={port}",
        "-m",
        "agent_r1.cli",
        "train",
        str(path),
    ]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        raise RuntimeError(f"the ranks arm failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}")
    run_dir = Path(config["output_dir"])
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    summary = json.loads((run_dir / "summary.json").read_text())
    rewards = [m["reward/answer_match"] for m in metrics]
    return {
        "mode": spec["mode"],
        "seed": spec["seed"],
        "wall_s": sum(m["time/step_s"] for m in metrics),
        "late_reward": sum(rewards[-3:]) / len(rewards[-3:]),
        "held_out": float(summary["after"]["success"]),
        "trainer_idle_share": statistics.mean(m.get("async/trainer_idle_share", 0.0) for m in metrics),
        "staleness_max": max(m.get("async/staleness_max", 0.0) for m in metrics),
        "partial_share": statistics.mean(m.get("async/partial_share", 0.0) for m in metrics),
    }


def _spawn(spec: dict[str, Any], smoke: bool) -> dict[str, Any]:
    if smoke:
        return run_arm(spec)
    from _ab import run_in_subprocess

    return run_in_subprocess(__file__, spec, f"{spec['mode']} (seed {spec['seed']})", spec.get("threads", 1))


def _spread(rows: list[dict[str, Any]], key: str) -> str:
    values = [r[key] for r in rows]
    return f"{statistics.mean(values):.2f} ± {statistics.pstdev(values):.2f}"


def report(runs: list[dict[str, Any]]) -> str:
    by_mode: dict[str, list[dict[str, Any]]] = {}
    for run in runs:
        by_mode.setdefault(run["mode"], []).append(run)
    sync_wall = statistics.median(r["wall_s"] for r in by_mode["sync"])
    lines = [
        "| mode | seeds | wall s (median) | speed-up vs sync | late reward | held-out success "
        "| trainer idle | max staleness | partial rollouts |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for mode, rows in by_mode.items():
        wall = statistics.median(r["wall_s"] for r in rows)
        idle = statistics.mean(r["trainer_idle_share"] for r in rows)
        partial = statistics.mean(r["partial_share"] for r in rows)
        lines.append(
            f"| {mode} | {len(rows)} | {wall:.1f} | {sync_wall / wall:.2f}x | "
            f"{_spread(rows, 'late_reward')} | {_spread(rows, 'held_out')} | {idle:.0%} | "
            f"{max(r['staleness_max'] for r in rows):.0f} | {partial:.0%} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=8, help="updates per run")
    parser.add_argument("--latency", type=float, default=0.3, help="median tool wait, seconds")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument(
        "--task", choices=["multi", "single"], default="multi", help="multi-turn with tool waits"
    )
    parser.add_argument("--model", default="small", help="small (random Llama) or smollm2")
    parser.add_argument(
        "--modes",
        default="sync,async-1,async-2",
        help="comma-separated: " + ", ".join(MODES),
    )
    parser.add_argument("--smoke", action="store_true", help="tiny model, 2 steps, no waiting, in-process")
    parser.add_argument("--out", default=str(RESULTS))
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(run_arm(json.loads(Path(args.worker).read_text(encoding="utf-8")))))
        return
    from agent_r1.testing.models import save_tiny_model, tiny_model, tiny_tokenizer

    if args.smoke:
        args.seeds, args.steps, args.latency = 1, 3, 0.0
    runs = []
    with tempfile.TemporaryDirectory() as scratch:
        tokenizer = tiny_tokenizer()
        shape = {"hidden": 64, "layers": 2} if args.smoke else {"hidden": 256, "layers": 4, "heads": 4}
        model = str(save_tiny_model(Path(scratch) / "model", tiny_model(tokenizer, **shape), tokenizer))
        if args.model == "smollm2":
            model = "smollm2-135m-instruct"
        modes = args.modes.split(",")
        for seed in range(args.seeds):
            order = modes if seed % 2 == 0 else list(reversed(modes))
            for mode in order:
                print(f"seed {seed}: {mode}...", flush=True)
                spec = {
                    "mode": mode,
                    "seed": seed,
                    "steps": args.steps,
                    "latency": args.latency,
                    "model": model,
                    "work": str(Path(scratch) / f"{mode}-{seed}"),
                    "threads": args.threads,
                    "task": args.task,
                }
                runs.append(_spawn(spec, args.smoke))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench_async.json").write_text(
        json.dumps({"args": vars(args), "runs": runs}, indent=2), encoding="utf-8"
    )
    text = report(runs)
    (out / "bench_async.md").write_text(text, encoding="utf-8")
    print(text)


if __name__ == "__main__":
    main()
