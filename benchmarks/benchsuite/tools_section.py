"""Section ``tools``: the engine's tool concurrency, a slow tool called in every action of scripted
rollouts, against the ideal of one call per turn."""

from __future__ import annotations

import argparse
import time
from typing import Any

from agent_r1.mdp import Task
from benchsuite.codebook import CALLS, interval_union
from benchsuite.stats import median

TOOLS = ("benchsuite.lookup_tools:SlowLookup", "benchsuite.lookup_tools:AsyncSlowLookup")
"""The tools measured, by the Python path ``ToolEnv`` loads them from."""
TURNS = 3


def run_tools_section(args: argparse.Namespace) -> dict[str, Any]:
    """Scripted rollouts through the real engine, ToolEnv and tool runner: every action calls the
    slow tool, so each episode makes one call per turn; the rollout's tool wall time is measured
    three ways (the engine's ``rollout/env_s``, the union of the calls' own intervals, the whole
    rollout) against the ideal of one call per turn."""
    from agent_r1.builtins import tool_runner
    from agent_r1.testing.models import tiny_tokenizer

    latency = 0.05 if args.smoke else 0.2
    sizes = [8] if args.smoke else [64, 128]
    repeats = 1 if args.smoke else 3
    tokenizer = tiny_tokenizer()
    rows = []
    for tool in TOOLS:
        for size in sizes:
            measurements = [_measure(tokenizer, tool, size, latency) for _ in range(repeats)]
            rows.append(_row(tool, size, latency, measurements))
            print(
                f"   {rows[-1]['tool']} x{size}: env {rows[-1]['env_s']:.3f} s "
                f"(ideal {rows[-1]['ideal_s']:.2f} s, serial {size * TURNS * latency:.1f} s)",
                flush=True,
            )
    return {"rows": rows, "thread_pool_workers": tool_runner.MAX_WORKER_THREADS}


def _measure(tokenizer: Any, tool: str, size: int, latency: float) -> dict[str, Any]:
    """One rollout of ``size`` trajectories (groups of 4), each calling ``tool`` in every turn."""
    from agent_r1.builtins.tool_env import ToolEnv
    from agent_r1.rollout.loop import RolloutEngine
    from agent_r1.testing.scripted import ScriptedBackend

    config = {
        "tools": [{"name": tool, "latency_s": latency}],
        "format": {"name": "hermes", "answer_tag": None},
        "max_turns": TURNS,
        "call_timeout_s": 60.0,
    }
    tool_name = "async_slow_lookup" if "Async" in tool else "slow_lookup"
    script = [
        f'<tool_call>\n{{"name": "{tool_name}", "arguments": {{"key": "k{turn}"}}}}\n</tool_call>'
        for turn in range(TURNS)
    ]
    engine = RolloutEngine(
        ScriptedBackend(tokenizer=tokenizer, responses=script),
        tokenizer,
        lambda: ToolEnv(config),
        max_turns=TURNS,
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
    return {
        "env_s": engine.last_metrics["rollout/env_s"],
        "tool_wall_s": interval_union(CALLS),
        "rollout_wall_s": wall,
        "calls": sum(t.metrics["tool_calls"] for t in trajectories),
        "tool_errors": sum(t.metrics["tool_errors"] for t in trajectories),
    }


def _row(tool: str, size: int, latency: float, measurements: list[dict[str, Any]]) -> dict[str, Any]:
    """A table row: the medians over the repeats, against one call per turn and against serial
    calls."""
    ideal = TURNS * latency
    env_s = median([m["env_s"] for m in measurements])
    return {
        "tool": tool.split(":")[1],
        "trajectories": size,
        "turns": TURNS,
        "latency_s": latency,
        "calls": measurements[-1]["calls"],
        "tool_errors": measurements[-1]["tool_errors"],
        "env_s": env_s,
        "env_s_max": max(m["env_s"] for m in measurements),
        "tool_wall_s": median([m["tool_wall_s"] for m in measurements]),
        "rollout_wall_s": median([m["rollout_wall_s"] for m in measurements]),
        "ideal_s": ideal,
        "serial_s": size * TURNS * latency,
        "target_s": 1.5 * ideal,
        "ratio_to_ideal": env_s / ideal,
        "meets_target": env_s <= 1.5 * ideal,
        "measurements": measurements,
    }
