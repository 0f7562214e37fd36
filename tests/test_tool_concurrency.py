"""Synchronous tool calls of a whole rollout batch run at once: the process-wide worker pool of
``agent_r1.builtins.tool_runner`` is not the bottleneck for batches beyond 64 trajectories (the
``make bench`` tool-concurrency figures: 128 trajectories of a 200 ms tool waited two latencies per
turn when the pool held 64 workers)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

import pytest

from agent_r1 import hookimpl
from agent_r1.builtins import tool_runner
from agent_r1.builtins.tool_env import ToolEnv
from agent_r1.contracts import Tool
from agent_r1.mdp import ToolCall
from agent_r1.registry import Registry, get_registry, reset_registry

LATENCY_S = 0.3
CALLS = 160  # 2.5 times the former bound of 64 workers: three waves of calls there


async def _batch(seconds: float) -> float:
    """``CALLS`` concurrent synchronous calls of ``time.sleep(seconds)``; their wall time."""
    started = time.perf_counter()
    await asyncio.gather(
        *(tool_runner.run_in_thread(time.sleep, seconds, timeout=30.0) for _ in range(CALLS))
    )
    return time.perf_counter() - started


@pytest.fixture
def warm_pool() -> None:
    """Start the pool's workers first: the first batch of a process also pays for starting its
    threads (about 1 ms each here), which is not what these tests measure."""
    asyncio.run(_batch(0.05))


def test_a_batch_of_synchronous_calls_runs_all_at_once(warm_pool: None) -> None:
    """All CALLS calls are in flight together: each waits on a barrier that opens only when every
    one has arrived (with a pool bound below CALLS, the barrier would time out and break). Checked
    by arrival, not by wall time, so a busy machine cannot make it flaky; the wall time against the
    latency is measured in benchmarks/bench.py (tool concurrency)."""
    barrier = threading.Barrier(CALLS, timeout=60)

    async def batch() -> list[int]:
        calls = [tool_runner.run_in_thread(barrier.wait, timeout=90.0) for _ in range(CALLS)]
        return list(await asyncio.gather(*calls))

    arrivals = asyncio.run(batch())
    assert sorted(arrivals) == list(range(CALLS))  # every call passed the barrier, each in its own thread


class Sleepy(Tool):
    """Sleeps in ``run``, like a blocking client of a slow service."""

    name = "sleepy"
    description = "Wait a while."

    barrier: threading.Barrier | None = None
    """When set, each call waits for every other call of the batch instead of sleeping."""

    def run(self, arguments: Tool.Arguments) -> str:
        if Sleepy.barrier is not None:
            Sleepy.barrier.wait()
        else:
            time.sleep(LATENCY_S)
        return "done"


class SleepyPlugin:
    @hookimpl
    def register_tools(self) -> list[type[Tool]]:
        return [Sleepy]


@pytest.fixture
def registry(monkeypatch: pytest.MonkeyPatch) -> Iterator[Registry]:
    """The bundled plugins plus :class:`Sleepy`, as the process-wide registry for the test."""
    monkeypatch.setenv("AGENT_R1_LOAD_PLUGINS", "builtins")  # third-party plugins stay out
    previous = get_registry()
    registry = Registry(entry_points=True)
    registry.register_plugin(SleepyPlugin(), "test_sleepy")
    reset_registry(registry)
    registry.load()
    yield registry
    reset_registry(previous)


def test_tool_env_calls_of_many_episodes_overlap(registry: Registry, warm_pool: None) -> None:
    """The calls of CALLS episodes' environments are all in flight at once (each waits on a barrier
    that opens only when all have arrived; a call that cannot start in time breaks it and fails)."""
    envs = [ToolEnv({"tools": ["sleepy"], "format": "hermes", "call_timeout_s": 90}) for _ in range(CALLS)]

    async def one_turn() -> None:
        results = await asyncio.gather(
            *(env.call(ToolCall(id=f"c{i}", name="sleepy", arguments={})) for i, env in enumerate(envs))
        )
        assert all(result.ok for result in results), [r.content for r in results if not r.ok][:3]

    Sleepy.barrier = threading.Barrier(CALLS, timeout=60)
    try:
        asyncio.run(one_turn())
    finally:
        Sleepy.barrier = None
