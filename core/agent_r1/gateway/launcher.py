"""Launching the user's agent program, once per episode.

The agent program is any executable (``rollout.agent.command``) or a Python function
(``rollout.agent.callable``, ``module:function``, run as ``fn(task)`` in a fresh process by
:mod:`agent_r1.gateway.run_callable`, whose return value is the final answer). Each episode
runs it in a process of its own, in a process group of its own, with:

* ``OPENAI_BASE_URL``: the episode's own base URL on the gateway (``.../episodes/{id}/v1``), which
  the official ``openai`` client (and the frameworks built on it) read by default;
* ``OPENAI_API_KEY``: a placeholder (the client insists on one; the gateway ignores it);
* ``AGENT_R1_MODEL``: the model name to send; ``AGENT_R1_EPISODE_ID``; ``AGENT_R1_GATEWAY_URL``
  (the server's root, for ``POST /episodes/{id}/reward``);
* ``AGENT_R1_TASK`` and stdin: the task as JSON (``id``, ``messages``, ``category``,
  ``metadata``; never its reference ``answer``).

The final answer is the last non-empty line of the program's stdout; a line holding a JSON object
with an ``answer`` key gives that value. A program that exits with a non-zero status is a failed
episode (its trajectories carry the error and are not trained on, counted like environment
failures); one that runs past ``timeout_s`` is killed with its whole process group and its episode
fails the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import os
import shutil
import signal
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent_r1.config import AgentProgramConfig
from agent_r1.errors import AgentR1Error
from agent_r1.mdp import Task

__all__ = ["AgentLauncher", "AgentOutcome", "check_agent_program", "final_answer_of", "task_payload"]

_KEEP_OUTPUT = 64 * 1024
"""Bytes of stdout and stderr kept per episode (the tail)."""


@dataclass
class AgentOutcome:
    """How one episode's program ended: exit status (``None`` when killed at the timeout), the
    final answer it printed, its wall time, the tail of its stderr, and the error that makes the
    episode a failure (``None`` for a clean exit)."""

    episode_id: str
    exit_code: int | None
    timed_out: bool
    answer: str | None
    wall_s: float
    stderr_tail: str
    error: str | None

    @property
    def termination(self) -> str:
        """``agent_done``, ``agent_error`` or ``agent_timeout``."""
        if self.timed_out:
            return "agent_timeout"
        return "agent_error" if self.error else "agent_done"


def task_payload(task: Task) -> dict[str, Any]:
    """What the agent program is told about its task: everything but the reference answer."""
    return {"id": task.id, "messages": task.messages, "category": task.category, "metadata": task.metadata}


def final_answer_of(stdout: str) -> str | None:
    """The last non-empty line of ``stdout``; a JSON object with an ``answer`` key gives its value
    (as text). ``None`` when the program printed nothing."""
    lines = [line.strip() for line in stdout.splitlines() if line.strip()]
    if not lines:
        return None
    last = lines[-1]
    if last.startswith("{"):
        try:
            value = json.loads(last)
        except json.JSONDecodeError:
            return last
        if isinstance(value, dict) and "answer" in value:
            answer = value["answer"]
            return None if answer is None else answer if isinstance(answer, str) else json.dumps(answer)
    return last


def _argv(config: AgentProgramConfig) -> list[str]:
    if config.callable is not None:  # the runner as a script: the agent's process skips agent-r1's imports
        return [sys.executable, str(Path(__file__).with_name("run_callable.py")), config.callable]
    assert config.command is not None
    return list(config.command)


def check_agent_program(config: AgentProgramConfig) -> str:
    """Check, without running it, that the agent program can start: the command's program exists
    (on ``PATH``, or as a file relative to ``cwd``) and is executable, or the callable's module can
    be found. Returns a description; raises :class:`~agent_r1.AgentR1Error` naming the setting."""
    cwd = Path(config.cwd).expanduser() if config.cwd else Path.cwd()
    if config.cwd and not cwd.is_dir():
        raise AgentR1Error(f"rollout.agent.cwd: {config.cwd!r} is not a directory")
    if config.callable is not None:
        module, _, attribute = config.callable.partition(":")
        if not module or not attribute:
            raise AgentR1Error(
                f"rollout.agent.callable: {config.callable!r} is not 'module:function' (e.g. my_agent:run)"
            )
        sys.path.insert(0, str(cwd))
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            found = False
        finally:
            sys.path.remove(str(cwd))
        if not found:
            raise AgentR1Error(
                f"rollout.agent.callable: module {module!r} cannot be found from {str(cwd)!r} or the Python "
                "path; put it next to the run config (or set rollout.agent.cwd) or install it"
            )
        return f"callable {config.callable} (module found)"
    assert config.command is not None
    program = config.command[0]
    path_env = {**os.environ, **config.env}.get("PATH")
    if os.sep in program or (os.altsep and os.altsep in program):
        candidate = Path(program).expanduser()
        candidate = candidate if candidate.is_absolute() else cwd / candidate
        if not candidate.is_file():
            raise AgentR1Error(f"rollout.agent.command: the program {program!r} does not exist ({candidate})")
        if not os.access(candidate, os.X_OK):
            raise AgentR1Error(
                f"rollout.agent.command: {str(candidate)!r} is not executable (chmod +x it, or run it "
                "through its interpreter, e.g. [python, script.py])"
            )
        resolved = str(candidate)
    else:
        found_at = shutil.which(program, path=path_env)
        if found_at is None:
            raise AgentR1Error(
                f"rollout.agent.command: the program {program!r} is not on PATH; give its path or install it"
            )
        resolved = found_at
    script = next((arg for arg in config.command[1:] if arg.endswith(".py")), None)
    if script is not None and not (cwd / script).is_file() and not Path(script).is_file():
        raise AgentR1Error(
            f"rollout.agent.command: the script {script!r} does not exist (looked in {str(cwd)!r})"
        )
    return f"command {' '.join(config.command)} ({resolved})"


class AgentLauncher:
    """Runs the agent program for many episodes concurrently (see the module docstring)."""

    def __init__(self, config: AgentProgramConfig, *, model_name: str, gateway_url: str) -> None:
        self.config = config
        self.model_name = model_name
        self.gateway_url = gateway_url
        self.argv = _argv(config)
        self.label = config.callable or " ".join(config.command or [])

    def environment(self, episode_id: str, episode_url: str, payload: str) -> dict[str, str]:
        """The program's environment variables for one episode."""
        return {
            **os.environ,
            **self.config.env,
            "OPENAI_BASE_URL": episode_url,
            "OPENAI_API_KEY": "agent-r1",
            "AGENT_R1_MODEL": self.model_name,
            "AGENT_R1_EPISODE_ID": episode_id,
            "AGENT_R1_GATEWAY_URL": self.gateway_url,
            "AGENT_R1_TASK": payload,
        }

    async def run(self, episode_id: str, episode_url: str, task: Task) -> AgentOutcome:
        """Run the program for one episode and wait for it (killing it at the timeout)."""
        payload = json.dumps(task_payload(task), ensure_ascii=False, default=str)
        started = time.perf_counter()
        try:
            process = await asyncio.create_subprocess_exec(
                *self.argv,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=self.environment(episode_id, episode_url, payload),
                cwd=self.config.cwd,
                start_new_session=True,  # its own process group: a timeout kills its children too
            )
        except OSError as exc:  # the program cannot start at all: every episode would fail alike
            raise AgentR1Error(
                f"rollout.agent: cannot start {self.label!r}: {type(exc).__name__}: {exc}"
            ) from None
        communicate = asyncio.ensure_future(process.communicate(payload.encode() + b"\n"))
        timed_out = False
        try:
            stdout, stderr = await asyncio.wait_for(asyncio.shield(communicate), self.config.timeout_s)
        except asyncio.TimeoutError:
            timed_out = True
            await _kill_group(process)
            try:
                stdout, stderr = await asyncio.wait_for(communicate, 10)
            except asyncio.TimeoutError:  # a grandchild that left the group holds the pipes open
                communicate.cancel()
                stdout, stderr = b"", b""
        wall = time.perf_counter() - started
        out = stdout[-_KEEP_OUTPUT:].decode("utf-8", "replace")
        err = stderr[-_KEEP_OUTPUT:].decode("utf-8", "replace")
        code = None if timed_out else process.returncode
        where = f"episode {episode_id}, task {task.id!r}"
        error = None
        if timed_out:
            error = (
                f"agent {self.label!r} did not finish within rollout.agent.timeout_s="
                f"{self.config.timeout_s:g} s and was killed ({where})"
            )
        elif code != 0:
            last = next((line for line in reversed(err.splitlines()) if line.strip()), "(no stderr)")
            error = f"agent {self.label!r} exited with status {code} ({where}): {last.strip()}"
        return AgentOutcome(
            episode_id=episode_id,
            exit_code=code,
            timed_out=timed_out,
            answer=None if error else final_answer_of(out),
            wall_s=wall,
            stderr_tail=err[-2000:],
            error=error,
        )

    async def run_many(
        self,
        jobs: Sequence[tuple[str, str, Task]],
        *,
        on_done: Callable[[int, int], None] | None = None,
    ) -> list[AgentOutcome]:
        """Run ``(episode_id, episode_url, task)`` jobs, at most ``max_concurrent`` at once; results
        in the order of ``jobs``. ``on_done(finished, total)`` follows progress."""
        limit = asyncio.Semaphore(self.config.max_concurrent or max(len(jobs), 1))
        finished = 0

        async def one(job: tuple[str, str, Task]) -> AgentOutcome:
            nonlocal finished
            async with limit:
                outcome = await self.run(*job)
            finished += 1
            if on_done is not None:
                on_done(finished, len(jobs))
            return outcome

        return list(await asyncio.gather(*(one(job) for job in jobs)))


async def _kill_group(process: Any) -> None:
    """SIGTERM the program's process group, give the program two seconds, then SIGKILL whatever is
    left of the group (children included)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):  # the group is already gone
        os.killpg(process.pid, signal.SIGTERM)
    with contextlib.suppress(asyncio.TimeoutError):  # still running: the SIGKILL below ends it
        await asyncio.wait_for(process.wait(), 2.0)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
