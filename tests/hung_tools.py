"""Tools that hang, crash or fail on purpose, for tests/test_tool_timeouts.py.

They live in a module of their own because ``isolation = "process"`` tools are pickled to a child
Python process, which must import their class. This module also holds the program
that tests/test_tool_timeouts.py interrupts with SIGINT while it waits on a hung call
(:func:`interrupt_me`).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict

from agent_r1 import hookimpl
from agent_r1.contracts import ComponentConfig, Tool
from agent_r1.errors import EnvironmentFatalError, ToolError, ToolInfrastructureError


class _Marked(ComponentConfig):
    marker_dir: str = ""
    """Where the tool writes ``<pid>.pid`` files (its own process, then any helper it starts)."""


def _mark(config: _Marked, pid: int) -> None:
    if config.marker_dir:
        path = Path(config.marker_dir) / f"{pid}.pid"
        path.write_text(str(pid))


class HangArguments(BaseModel):
    model_config = ConfigDict(extra="forbid")
    seconds: float = 60.0


class Hang(Tool):
    """Sync, in a worker thread: blocks until :attr:`release` is set or ``seconds`` pass."""

    name = "hang"
    description = "Block the thread."
    Config = _Marked
    Arguments = HangArguments
    release: ClassVar[threading.Event] = threading.Event()
    finished: ClassVar[list[float]] = []
    """Monotonic times at which abandoned calls really ended."""

    def run(self, arguments: HangArguments) -> str:
        _mark(self.config, os.getpid())
        self.release.wait(arguments.seconds)
        Hang.finished.append(time.monotonic())
        return "finally done"


class HangInProcess(Tool):
    """Sync, in a child process: starts a helper process of its own, then sleeps."""

    name = "hang_in_process"
    description = "Sleep in a child process."
    isolation = "process"
    Config = _Marked
    Arguments = HangArguments

    def run(self, arguments: HangArguments) -> str:
        _mark(self.config, os.getpid())
        helper = subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({arguments.seconds})"])
        _mark(self.config, helper.pid)
        time.sleep(arguments.seconds)
        return "finally done"


class WorkInProcess(Tool):
    """In a child process: answers, prints, or fails the way ``mode`` says."""

    name = "work_in_process"
    description = "Do something in a child process."
    isolation = "process"

    class Arguments(BaseModel):
        model_config = ConfigDict(extra="forbid")
        mode: str

    def run(self, arguments: Any) -> Any:
        mode = arguments.mode
        if mode == "pid":
            print("noise on stdout that must not spoil the answer")
            return str(os.getpid())
        if mode == "tool_error":
            raise ToolError("nothing found for that")
        if mode == "crash":
            raise ZeroDivisionError("division by zero")
        if mode == "infrastructure":
            raise ToolInfrastructureError("the corpus file is missing")
        if mode == "fatal":
            raise EnvironmentFatalError("the index is corrupt")
        if mode == "exit":
            sys.exit(3)
        if mode == "die":
            os._exit(7)
        raise ValueError(f"unknown mode {mode!r}")


class AsyncInProcess(Tool):
    """``async def run`` with process isolation: the child runs the coroutine."""

    name = "async_in_process"
    description = "Await in a child process."
    isolation = "process"
    Arguments = HangArguments

    async def run(self, arguments: HangArguments) -> str:
        await asyncio.sleep(arguments.seconds)
        return f"awaited in {os.getpid()}"


class Quit(Tool):
    """Sync, in a worker thread: calls ``sys.exit``, which must not end the worker or the rollout."""

    name = "quit"
    description = "Exit."

    class Arguments(BaseModel):
        model_config = ConfigDict(extra="forbid")

    def run(self, arguments: Any) -> str:
        sys.exit(3)


class Backend(Tool):
    """Fails for reasons outside the agent's control."""

    name = "backend"
    description = "Call a backend that is down."

    class Arguments(BaseModel):
        model_config = ConfigDict(extra="forbid")
        fatal: bool = False

    def run(self, arguments: Any) -> str:
        if arguments.fatal:
            raise EnvironmentFatalError("the retrieval server refused the run's credentials")
        raise ToolInfrastructureError("the retrieval server at 127.0.0.1:9 is unreachable")


class VisibleBackend(Backend):
    """The same failure, declared agent-visible."""

    name = "visible_backend"
    infrastructure_errors_visible = True


class HungToolsPlugin:
    @hookimpl
    def register_tools(self) -> list[type[Tool]]:
        return [Hang, HangInProcess, WorkInProcess, AsyncInProcess, Quit, Backend, VisibleBackend]


def interrupt_me(tool: str, marker_dir: str) -> None:
    """Wait on one hung call of ``tool`` (timeout 300 s) until SIGINT arrives."""
    import agent_r1.builtins
    from agent_r1.builtins.tool_env import ToolEnv
    from agent_r1.mdp import Action
    from agent_r1.registry import Registry, reset_registry

    registry = Registry(entry_points=False)
    registry.register_plugin(agent_r1.builtins, "builtins")
    registry.register_plugin(HungToolsPlugin(), "hung_tools")
    reset_registry(registry)
    env = ToolEnv({"tools": [{"name": tool, "marker_dir": marker_dir}], "call_timeout_s": 300})
    action = Action(text=f'<{tool}>{{"seconds": 300}}</{tool}>')
    asyncio.run(env.step(action, 0))
    print("the hung call returned: the interrupt did not stop it", flush=True)
