"""The ``python`` and ``run_tests`` tools.

* ``python``: runs code in the sandbox and returns what it printed, the value of a final expression
  and, on failure, the traceback cut to the code's own frames. By default each environment instance
  (one episode) keeps one sandboxed session, so variables survive between turns; ``persistent:
  false`` runs every call in a fresh sandbox.
* ``run_tests``: judges a complete solution on the task's visible tests with the trusted harness
  (the solution in a fresh sandbox, the tests outside it) and says which failed and why. The code
  environment gives it the task (:meth:`RunTestsTool.bind_task`).

Each tool owns its sandboxes through a :class:`~agent_r1_plugin_code.pool.SandboxGroup`:
:meth:`close` (the environment calls it when the episode ends, whatever ended it) kills them at
once, also a call still running in a thread the engine abandoned, and refuses new ones.

Both append a record per call to their ``records`` list (``{"tool", "status", ...}``); the code
environment copies the records of a turn into ``observation.info["code"]``, where the process
rewards read them.
"""

from __future__ import annotations

import threading
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from agent_r1 import ComponentConfig, Task, Tool, ToolError
from agent_r1_plugin_code.pool import SandboxGroup, acquire_sandbox
from agent_r1_plugin_code.sandbox import ExecutionResult, PythonSession, SandboxConfig, check_isolation
from agent_r1_plugin_code.testcases import first_error_line, judge, short_test, strip_fences


def format_execution(result: ExecutionResult) -> str:
    """What the agent reads after a ``python`` call."""
    parts = []
    if result.stdout:
        parts.append(f"stdout:\n{result.stdout.rstrip()}")
    if result.stderr:
        parts.append(f"stderr:\n{result.stderr.rstrip()}")
    if result.value is not None:
        parts.append(f"result: {result.value}")
    if result.status != "ok":
        parts.append(f"error:\n{result.error or result.status}")
    return "\n".join(parts) if parts else "(no output; print() what you want to see)"


class _SandboxedTool(Tool):
    """A tool whose calls run in sandboxes of its own group, which the episode's end closes."""

    class Arguments(BaseModel):
        model_config = ConfigDict(extra="forbid")

        code: str

    class Config(ComponentConfig):
        sandbox: SandboxConfig = Field(default_factory=SandboxConfig, description="limits and isolation")

    config: Config

    def __init__(self, config: Any = None) -> None:
        super().__init__(config)
        self.records: list[dict[str, Any]] = []
        self._group = SandboxGroup()
        check_isolation(self.config.sandbox)  # a machine that cannot sandbox fails now, not mid-episode

    def close(self) -> None:
        """End the episode's sandboxes now (their processes are killed, a running call included)."""
        self._group.close()

    def reopen(self) -> None:
        """A new episode on this instance: a fresh group (the closed one keeps refusing)."""
        if self._group.closed:
            self._group = SandboxGroup()


class PythonTool(_SandboxedTool):
    """Run Python code in a sandbox (separate process, no network, resource limits)."""

    name = "python"
    per_episode = True  # each episode has its own session
    description = (
        "Run Python code. Variables and functions persist between calls. Returns what the code "
        "printed, the value of its last expression, or the error."
    )

    class Arguments(_SandboxedTool.Arguments):
        code: str = Field(description="Python code to run, e.g. print(sum(range(10)))")

    class Config(_SandboxedTool.Config):
        persistent: bool = Field(True, description="one session per episode (False: fresh sandbox per call)")

    config: Config

    def __init__(self, config: Any = None) -> None:
        self._session: PythonSession | None = None
        self._lock = threading.Lock()
        super().__init__(config)

    def run(self, arguments: Any) -> str:
        if isinstance(arguments, dict):
            arguments = self.Arguments.model_validate(arguments)
        code = strip_fences(arguments.code)
        if not code.strip():
            raise ToolError("the code is empty: write the Python code to run")
        if self.config.persistent:
            with self._lock:
                if self._session is None:
                    self._session = acquire_sandbox(self.config.sandbox, self._group)
                session = self._session
            result = session.run(code)
        else:
            session = acquire_sandbox(self.config.sandbox, self._group)
            try:
                result = session.run(code)
            finally:
                self._group.release(session)
        self.records.append({"tool": self.name, "status": result.status})
        return format_execution(result)

    def close(self) -> None:
        super().close()
        with self._lock:
            self._session = None

    def reopen(self) -> None:
        with self._lock:
            super().reopen()


class RunTestsTool(_SandboxedTool):
    """Run the task's visible tests against a complete solution and report the failures."""

    name = "run_tests"
    per_episode = True  # bound to the episode's task
    description = (
        "Test a complete solution (all of its code) against the task's visible tests. Reports how "
        "many passed and, for each failure, the test and its error."
    )

    class Arguments(_SandboxedTool.Arguments):
        code: str = Field(description="the complete solution, e.g. def add(a, b):\n    return a + b")

    class Config(_SandboxedTool.Config):
        per_test_timeout_s: float = Field(3.0, gt=0, description="a test running longer fails")
        max_failures_shown: int = Field(3, ge=1, description="failures described in the report")

    config: Config

    def __init__(self, config: Any = None) -> None:
        self.task: Task | None = None
        super().__init__(config)

    def bind_task(self, task: Task) -> None:
        """Give the tool the task whose visible tests it runs (the code environment does this)."""
        self.task = task

    def run(self, arguments: Any) -> str:
        if isinstance(arguments, dict):
            arguments = self.Arguments.model_validate(arguments)
        if self.task is None:
            raise ToolError("run_tests has no task: it works in the 'code' environment, which gives it one")
        if not self.task.metadata.get("visible_tests"):
            raise ToolError("this task has no visible tests; test your code with the python tool")
        if not strip_fences(arguments.code).strip():
            raise ToolError("the code is empty: pass the complete solution")
        outcome = judge(
            arguments.code,
            self.task,
            hidden=False,
            sandbox=self.config.sandbox,
            per_test_timeout_s=self.config.per_test_timeout_s,
            group=self._group,
        )
        result = outcome.result
        self.records.append(
            {
                "tool": self.name,
                "status": "error" if result.setup_error else result.status,
                "passed": outcome.passed,
                "total": outcome.total,
            }
        )
        return self.report(outcome.passed, outcome.total, result)

    def report(self, passed: int, total: int, result: ExecutionResult) -> str:
        """The text the agent reads: the count, then each failure (test and error)."""
        tests = list(self.task.metadata.get("visible_tests") or []) if self.task else []
        if result.status != "ok":
            return f"The tests did not finish: {result.error or result.status}\n{passed} of {total} passed."
        if result.setup_error:
            return f"Your code failed before the tests could run; 0 of {total} passed.\n{result.setup_error}"
        lines = [f"{passed} of {total} visible tests passed."]
        failures = [(i, t) for i, t in enumerate(result.tests) if not t.get("passed")]
        for index, test in failures[: self.config.max_failures_shown]:
            shown = short_test(tests[index]) if index < len(tests) else f"test {index + 1}"
            lines.append(f"FAILED: {shown}\n  {first_error_line(test.get('error')) or 'failed'}")
        if len(failures) > self.config.max_failures_shown:
            lines.append(f"... and {len(failures) - self.config.max_failures_shown} more failures")
        if result.stdout:
            lines.append(f"stdout:\n{result.stdout.rstrip()}")
        return "\n".join(lines)


__all__ = ["PythonTool", "RunTestsTool", "format_execution"]
