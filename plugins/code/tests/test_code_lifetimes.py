"""Lifetimes: a sandbox lives no longer than its episode, and the warm pool hands each sandbox out
once.

An episode that the engine ends while a call is still running (the call abandoned at the
environment's ``call_timeout_s``, the episode cut by ``max_turns``) must leave no sandbox process
behind: ``aclose`` kills them at once, not when the call's own timeout comes. Processes are found
by a mark that only the sandboxes of one test carry (in their launch arguments)."""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path

import pytest

from agent_r1 import Task
from agent_r1_plugin_code.pool import SandboxPool, acquire_sandbox, close_pools, sandbox_pool
from agent_r1_plugin_code.sandbox import SandboxConfig, SandboxError, namespace_prefix

pytestmark = [
    pytest.mark.skipif(namespace_prefix() is None, reason="needs Linux namespaces (unshare)"),
    pytest.mark.timeout(120),
]


def marked(mark: str) -> list[int]:
    """Live processes whose command line carries ``mark``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            command = (entry / "cmdline").read_bytes()
        except OSError:
            continue  # the process ended while we looked
        if mark.encode() in command:
            found.append(int(entry.name))
    return found


def gone(mark: str, within_s: float = 3.0) -> bool:
    deadline = time.monotonic() + within_s
    while marked(mark) and time.monotonic() < deadline:
        time.sleep(0.05)
    return marked(mark) == []


def sandbox_options(mark: str, **extra: object) -> dict[str, object]:
    return {"timeout_s": 40.0, "cpu_s": 30.0, "warm_pool": 0, "env": {"AGENT_R1_TEST_MARK": mark}, **extra}


@pytest.mark.parametrize(
    ("tools", "text"),
    [
        (["python", "run_tests"], "<python>import time\ntime.sleep(60)</python>"),
        (
            ["python", {"name": "run_tests", "per_test_timeout_s": 30}],
            "<run_tests>def truncate_number(number):\n    while True:\n        pass\n</run_tests>",
        ),
    ],
    ids=["python call", "run_tests judgement"],
)
def test_an_episode_ended_mid_call_leaves_no_sandbox(
    scripted_episode, humaneval_tasks: list[Task], tools: list, text: str
) -> None:
    task = next(t for t in humaneval_tasks if t.id == "HumanEval/2")
    mark = f"mark-{uuid.uuid4().hex}"
    options = {"call_timeout_s": 1.5, "tools": tools, "sandbox": sandbox_options(mark)}
    started = time.monotonic()
    trajectory = scripted_episode("code", options, task, [text])
    elapsed = time.monotonic() - started
    assert trajectory.termination == "max_turns"
    [result] = trajectory.steps[0].observation.tool_results
    assert result.error == "timeout"  # the engine abandoned the call; the sandbox was still busy
    assert gone(mark), f"sandbox processes outlived their episode: {marked(mark)}"
    assert elapsed < 20  # nobody waited for the call's own 30-60 s


def test_a_call_after_the_episode_ended_starts_nothing() -> None:
    from agent_r1.registry import get_registry

    mark = f"mark-{uuid.uuid4().hex}"
    env = get_registry().build("environments", "code", {"sandbox": sandbox_options(mark)})
    python = env.tools["python"]
    assert "result: 2" in python.run({"code": "1 + 1"})
    assert marked(mark)
    env.close()
    assert gone(mark)
    with pytest.raises(SandboxError, match="episode"):
        python.run({"code": "1 + 1"})  # e.g. a thread the engine abandoned, arriving late
    assert marked(mark) == []


def test_the_pool_keeps_sandboxes_warm_and_hands_each_out_once() -> None:
    mark = f"mark-{uuid.uuid4().hex}"
    config = SandboxConfig(**sandbox_options(mark, warm_pool=2))
    pool = SandboxPool(config, 2)
    try:
        deadline = time.monotonic() + 30
        while pool.started < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert pool.started == 2 and len(marked(mark)) >= 2 * 2  # unshare + runner per sandbox, at least
        first = pool.take()
        assert first.alive and first.starts == 1
        started = time.monotonic()
        assert first.run("6 * 7").value == "42"
        assert time.monotonic() - started < 1.0  # no start to wait for
        second = pool.take()
        assert second is not first
        first.close()
        second.close()
        while pool.started < 4 and time.monotonic() < deadline:  # the pool refills behind them
            time.sleep(0.05)
        assert pool.started == 4 and pool.taken_warm == 2
    finally:
        pool.close()
    assert gone(mark)


def test_acquire_uses_this_processes_pool_and_close_pools_stops_it() -> None:
    mark = f"mark-{uuid.uuid4().hex}"
    config = SandboxConfig(**sandbox_options(mark, warm_pool=1))
    session = acquire_sandbox(config)
    pool = sandbox_pool(config)
    assert pool is not None and pool is sandbox_pool(config)
    assert session.run("print('hi')").stdout == "hi\n"
    session.close()
    close_pools()
    assert gone(mark, within_s=10)
    assert os.getpid() > 0 and sandbox_pool(SandboxConfig(warm_pool=0)) is None
