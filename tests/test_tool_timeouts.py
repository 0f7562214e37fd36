"""Tool calls past their timeout really stop (agent_r1.builtins.tool_runner through ToolEnv), and
infrastructure failures of tools fail the environment step instead of reaching the policy.

The hung tools (tests/hung_tools.py) block for 60 s or more with timeouts of a second or less: the
bounds below are far from both, so they test that nothing waits for the hung call, not speed.
Processes are real: the process-isolated tools run in child Python processes, which start helper
processes of their own, and the interrupt test sends a real SIGINT to a real Python process.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hung_tools import Hang, HungToolsPlugin

import agent_r1.builtins
from agent_r1.builtins import tool_runner
from agent_r1.builtins.tool_env import ToolEnv
from agent_r1.errors import EnvironmentFatalError, ToolInfrastructureError
from agent_r1.mdp import Action, Observation, Task
from agent_r1.registry import Registry, get_registry, reset_registry

TESTS = Path(__file__).resolve().parent


@pytest.fixture
def registry() -> Iterator[Registry]:
    previous = get_registry()
    registry = Registry(entry_points=False)
    registry.register_plugin(agent_r1.builtins, "builtins")
    registry.register_plugin(HungToolsPlugin(), "hung_tools")
    reset_registry(registry)
    yield registry
    reset_registry(previous)


@pytest.fixture
def hang() -> Iterator[type[Hang]]:
    """The thread-blocking tool, released at the end so that its abandoned threads finish."""
    Hang.release.clear()
    Hang.finished.clear()
    yield Hang
    Hang.release.set()


def step(env: ToolEnv, text: str) -> tuple[Observation, float]:
    started = time.monotonic()
    observation = asyncio.run(env.step(Action(text=text), 0))
    return observation, time.monotonic() - started


def wait_until(condition: Callable[[], bool], seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return condition()


def alive(pid: int) -> bool:
    """Whether ``pid`` still runs (a zombie waiting to be reaped runs nothing: not alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # pragma: no cover - the pid was reused by another user's process
        return True
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False  # gone between the two checks
    return state != "Z"


def marked_pids(directory: Path) -> list[int]:
    return sorted(int(path.stem) for path in directory.glob("*.pid"))


# --------------------------------------------------------------------------------------------
# Threads: a hung call is abandoned at the timeout
# --------------------------------------------------------------------------------------------


def test_a_hung_sync_call_is_abandoned_at_the_timeout(registry: Registry, hang: type[Hang]) -> None:
    env = ToolEnv({"tools": ["hang"], "call_timeout_s": 0.5})
    observation, elapsed = step(env, '<hang>{"seconds": 60}</hang>')
    assert elapsed < 10, f"the step waited {elapsed:.1f} s for a call that blocks 60 s"
    (result,) = observation.tool_results
    assert (result.ok, result.error) == (False, "timeout")
    assert result.content == "Error: the call took longer than 0.5 s and was stopped"
    assert 0.5 <= result.duration_s < 5  # the recorded time is the timeout, not the thread's
    assert hang.finished == []  # the call still runs in its abandoned thread
    pool = tool_runner.thread_pool()
    assert pool.abandoned >= 1
    hang.release.set()
    assert wait_until(lambda: hang.finished != [] and pool.abandoned == 0)


def test_hung_calls_do_not_starve_other_calls_until_too_many_hang(
    registry: Registry, hang: type[Hang], monkeypatch: pytest.MonkeyPatch
) -> None:
    pool = tool_runner.DaemonThreadPool(max_workers=1, max_abandoned=2)
    monkeypatch.setattr(tool_runner, "_pool", pool)
    env = ToolEnv({"tools": ["hang", "calculator"], "call_timeout_s": 0.3})
    observation, _ = step(env, '<hang>{"seconds": 60}</hang>')
    assert observation.tool_results[0].error == "timeout"
    # one worker thread at most, but the hung one no longer counts: the next call runs
    observation, _ = step(env, "<calculator>6*7</calculator>")
    assert observation.tool_results[0].content == "42"
    step(env, '<hang>{"seconds": 60}</hang>')
    assert pool.abandoned == 2
    with pytest.raises(
        ToolInfrastructureError,
        match=r"tool 'calculator' \(call call_0_0\) failed: 2 calls are still running in threads after "
        r"their timeout \(a thread cannot be stopped\): 'hang' \(2\); those tools probably hang: "
        r"fix them, or set isolation = 'process'",
    ):
        step(env, "<calculator>6*7</calculator>")
    hang.release.set()
    assert wait_until(lambda: pool.abandoned == 0)
    assert step(env, "<calculator>6*7</calculator>")[0].tool_results[0].content == "42"


def test_a_call_that_never_got_a_worker_says_so(
    registry: Registry, hang: type[Hang], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tool_runner, "_pool", tool_runner.DaemonThreadPool(max_workers=1))
    env = ToolEnv({"tools": ["hang"], "call_timeout_s": 0.3, "max_calls_per_turn": 2})
    observation, _ = step(env, '<hang>{"seconds": 60}</hang>' * 2)
    first, second = observation.tool_results
    assert first.content == "Error: the call took longer than 0.3 s and was stopped"
    assert second.content == "Error: the call waited 0.3 s for a free worker and never started"
    hang.release.set()
    assert wait_until(lambda: len(hang.finished) == 1)
    time.sleep(0.1)
    assert len(hang.finished) == 1  # the call that never started never ran


def test_sys_exit_in_a_thread_tool_is_an_error_result(
    registry: Registry, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tool_runner, "_pool", tool_runner.DaemonThreadPool(max_workers=1))
    env = ToolEnv({"tools": ["quit", "calculator"]})
    observation, _ = step(env, "<quit>{}</quit>")
    assert (observation.tool_results[0].error, observation.tool_results[0].content) == (
        "exception",
        "Error: SystemExit: 3",
    )
    assert step(env, "<calculator>2*3</calculator>")[0].tool_results[0].content == "6"  # the worker lives


def test_the_rollout_goes_on_at_the_timeout_and_records_true_times(
    registry: Registry, hang: type[Hang], tiny_tokenizer: Any
) -> None:
    from agent_r1.rollout.loop import RolloutEngine
    from agent_r1.testing.scripted import ScriptedBackend

    backend = ScriptedBackend(
        tokenizer=tiny_tokenizer, responses=['<hang>{"seconds": 60}</hang>', "<answer>4</answer>"]
    )
    engine = RolloutEngine(
        backend, tiny_tokenizer, lambda: ToolEnv({"tools": ["hang"], "call_timeout_s": 0.5}), max_turns=3
    )
    task = Task(id="t", messages=[{"role": "user", "content": "2+2?"}])
    started = time.monotonic()
    [trajectory] = engine.collect([task], group_size=1, seed=0)
    assert time.monotonic() - started < 10
    first = trajectory.steps[0]
    assert first.observation is not None
    assert first.observation.tool_results[0].error == "timeout"
    assert 0.5 <= first.tool_s < 5  # Step.tool_s is the time the step took, about the timeout
    assert trajectory.termination == "answer"


# --------------------------------------------------------------------------------------------
# Processes: a hung call is killed with everything it started
# --------------------------------------------------------------------------------------------


def test_a_hung_process_call_is_killed_with_its_process_group(registry: Registry, tmp_path: Path) -> None:
    env = ToolEnv({"tools": [{"name": "hang_in_process", "marker_dir": str(tmp_path)}], "call_timeout_s": 4})
    observation, elapsed = step(env, '<hang_in_process>{"seconds": 60}</hang_in_process>')
    assert elapsed < 20, f"the step waited {elapsed:.1f} s for a call that sleeps 60 s"
    (result,) = observation.tool_results
    assert (result.error, result.content) == (
        "timeout",
        "Error: the call took longer than 4 s and was stopped",
    )
    assert 4 <= result.duration_s < 10
    pids = marked_pids(tmp_path)
    assert len(pids) == 2, "the tool's process and its helper should have started within 4 s"
    assert os.getpid() not in pids  # the call ran in a child process
    assert wait_until(lambda: not any(alive(pid) for pid in pids)), "a process of the call survived"
    assert not tool_runner._children


def test_process_isolated_calls_return_results_and_errors(registry: Registry) -> None:
    env = ToolEnv(
        {"tools": ["work_in_process", "async_in_process"], "call_timeout_s": 30, "max_calls_per_turn": 6}
    )
    modes = ["pid", "tool_error", "crash", "exit", "die"]
    text = "".join(f'<work_in_process>{{"mode": "{mode}"}}</work_in_process>' for mode in modes)
    observation, _ = step(env, text + '<async_in_process>{"seconds": 0}</async_in_process>')
    pid, tool_error, crash, exits, dies, awaited = observation.tool_results
    assert pid.ok and pid.content.isdigit() and int(pid.content) != os.getpid()  # stdout noise kept out
    assert (tool_error.error, tool_error.content) == ("exception", "Error: nothing found for that")
    assert (crash.error, crash.content) == ("exception", "Error: ZeroDivisionError: division by zero")
    assert (exits.error, exits.content) == ("exception", "Error: SystemExit: 3")  # the parent goes on
    assert dies.error == "exception"
    assert dies.content == "Error: the tool's process exited with code 7 without an answer"
    assert awaited.ok and awaited.content.startswith("awaited in ")


def test_process_isolated_infrastructure_and_fatal_errors_cross_the_process_boundary(
    registry: Registry,
) -> None:
    env = ToolEnv({"tools": ["work_in_process"], "call_timeout_s": 30})
    with pytest.raises(ToolInfrastructureError, match="the corpus file is missing"):
        step(env, '<work_in_process>{"mode": "infrastructure"}</work_in_process>')
    with pytest.raises(EnvironmentFatalError, match="the index is corrupt"):
        step(env, '<work_in_process>{"mode": "fatal"}</work_in_process>')


# --------------------------------------------------------------------------------------------
# Ctrl-C while a call hangs
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("tool", "processes"), [("hang", 1), ("hang_in_process", 2)])
def test_sigint_during_a_hung_call_exits_promptly(tool: str, processes: int, tmp_path: Path) -> None:
    # Python leaves SIGINT ignored when it starts with it ignored (a suite launched in the background
    # by a non-interactive shell): install the default handler, as an interactive session has it.
    program = (
        "import signal, sys, hung_tools; signal.signal(signal.SIGINT, signal.default_int_handler); "
        "hung_tools.interrupt_me(sys.argv[1], sys.argv[2])"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    runner = subprocess.Popen(
        [sys.executable, "-c", program, tool, str(tmp_path)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        started = wait_until(lambda: len(marked_pids(tmp_path)) == processes or runner.poll() is not None, 60)
        assert started and runner.poll() is None, (
            f"the program did not reach the call: {runner.communicate()}"
        )
        interrupted = time.monotonic()
        runner.send_signal(signal.SIGINT)
        stdout, stderr = runner.communicate(timeout=60)  # the call itself would block 300 s
    finally:
        if runner.poll() is None:
            runner.kill()
            runner.communicate()
    assert time.monotonic() - interrupted < 30
    assert runner.returncode != 0 and "KeyboardInterrupt" in stderr
    assert "the hung call returned" not in stdout
    if tool == "hang_in_process":
        assert wait_until(lambda: not any(alive(pid) for pid in marked_pids(tmp_path)))


# --------------------------------------------------------------------------------------------
# Infrastructure errors are not observations
# --------------------------------------------------------------------------------------------


def test_an_infrastructure_error_fails_the_step_and_cancels_the_other_calls(
    registry: Registry, hang: type[Hang]
) -> None:
    env = ToolEnv({"tools": ["backend", "hang", "calculator"], "call_timeout_s": 60})
    started = time.monotonic()
    with pytest.raises(ToolInfrastructureError) as raised:
        step(env, '<calculator>1+1</calculator><hang>{"seconds": 60}</hang><backend>{}</backend>')
    assert time.monotonic() - started < 10  # the hung call was abandoned, not awaited
    assert str(raised.value) == (
        "tool 'backend' (call call_0_2) failed: the retrieval server at 127.0.0.1:9 is unreachable"
    )
    assert isinstance(raised.value.__cause__, ToolInfrastructureError)


def test_an_agent_visible_infrastructure_error_is_an_error_result(registry: Registry) -> None:
    env = ToolEnv({"tools": ["visible_backend", "calculator"]})
    observation, _ = step(env, "<visible_backend>{}</visible_backend><calculator>1+1</calculator>")
    failed, fine = observation.tool_results
    assert (failed.ok, failed.error) == (False, "infrastructure")
    assert failed.content == "Error: the retrieval server at 127.0.0.1:9 is unreachable"
    assert fine.content == "2"


@pytest.mark.parametrize("tool", ["backend", "visible_backend"])
def test_a_fatal_error_always_fails_the_step(registry: Registry, tool: str) -> None:
    env = ToolEnv({"tools": [tool]})
    with pytest.raises(
        EnvironmentFatalError, match=rf"^tool '{tool}' \(call call_0_0\): the retrieval server refused"
    ):
        step(env, f'<{tool}>{{"fatal": true}}</{tool}>')
