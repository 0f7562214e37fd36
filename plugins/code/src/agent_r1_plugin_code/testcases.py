"""Test cases of code tasks: how a task stores them, how a solution is assembled, how it is judged.

A code task (``humaneval``, ``mbpp``) keeps its tests in ``task.metadata``:

* ``tests``: the hidden test statements (each a ``assert ...`` statement, or a compound statement
  holding asserts), all of which the outcome reward runs; a test may also be a ``{"stdin": ...,
  "stdout": ...}`` pair: the solution runs as a program on that input and its output must match;
* ``visible_tests``: the statements the agent's ``run_tests`` tool runs (and the prompt shows);
* ``test_setup``: code run before the tests in the tests' namespace (imports, helpers);
* ``check_setup``: statements of HumanEval's ``check`` function that are not tests (``import
  math``, ``rng = random.Random(42)``), run after ``test_setup``;
* ``entry_point``: the function the task asks for; with ``candidate: true`` (HumanEval) the tests
  call it as ``candidate``, otherwise (MBPP) by its name;
* ``prompt``: for HumanEval, the signature and docstring the solution completes.

A test passes when its statement raises nothing, so a solution passes every test exactly when
HumanEval's own harness (``prompt + completion + test + check(entry_point)``) raises nothing. The
statements run outside the sandbox, on the values the solution's calls return (plain data only);
see :mod:`agent_r1_plugin_code.harness`.
"""

from __future__ import annotations

import ast
import hashlib
import re
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from agent_r1 import Task, Trajectory
from agent_r1_plugin_code.harness import judge_solution
from agent_r1_plugin_code.pool import SandboxGroup
from agent_r1_plugin_code.sandbox import ExecutionResult, SandboxConfig
from agent_r1_plugin_code.split import TestPlan, cached_plan

_FENCE = re.compile(r"```(?:python|py|Python)?[ \t]*\n(.*?)```", re.DOTALL)


def strip_fences(code: str) -> str:
    """The code inside Markdown fences (all fenced blocks joined), or the text as it is."""
    blocks = _FENCE.findall(code)
    return "\n".join(block.strip("\n") for block in blocks) if blocks else code.strip("\n")


def humaneval_statements(test_code: str) -> tuple[str, list[str], list[str]]:
    """Split a HumanEval ``test`` field into ``(setup, check_setup, tests)``.

    ``setup`` is every top-level statement but ``def check``; the statements of ``check``'s body
    that contain an ``assert`` are the tests (``assert True`` placeholders are left out), the others
    are ``check_setup``.
    """
    tree = ast.parse(test_code)
    setup: list[str] = []
    check_setup: list[str] = []
    tests: list[str] = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == "check":
            for statement in node.body:
                source = ast.unparse(statement)
                asserts = [n for n in ast.walk(statement) if isinstance(n, ast.Assert)]
                if not asserts:
                    check_setup.append(source)
                elif not all(isinstance(a.test, ast.Constant) and a.test.value is True for a in asserts):
                    tests.append(source)
        else:
            setup.append(ast.unparse(node))
    return "\n".join(setup), check_setup, tests


def assemble_solution(code: str, task: Task) -> str:
    """The program to test: the code without fences; for a task with a ``prompt`` (HumanEval) whose
    entry point the code does not define, ``prompt + code`` (the code is then a completion)."""
    code = strip_fences(code)
    prompt = task.metadata.get("prompt")
    entry = task.metadata.get("entry_point")
    if prompt and entry and not re.search(rf"^\s*(async\s+)?def\s+{re.escape(entry)}\s*\(", code, re.M):
        return f"{prompt}{code}"
    return code


@dataclass
class Verdict:
    """The verdict on one solution: tests passed, tests run, and the sandbox result."""

    passed: int
    total: int
    result: ExecutionResult

    @property
    def share(self) -> float:
        return self.passed / self.total if self.total else 0.0

    @property
    def solved(self) -> bool:
        return self.total > 0 and self.passed == self.total


def task_plan(task: Task, *, hidden: bool = True) -> TestPlan:
    """The task's hidden (or visible) tests split for the trusted harness (remembered per task)."""
    metadata = task.metadata
    return cached_plan(
        list(metadata.get("tests" if hidden else "visible_tests") or []),
        setup=metadata.get("test_setup", "") or "",
        check_setup=tuple(metadata.get("check_setup") or ()),
        prompt=metadata.get("prompt"),
        entry_point=metadata.get("entry_point"),
        candidate=bool(metadata.get("candidate")),
    )


def judge(
    code: str,
    task: Task,
    *,
    hidden: bool = True,
    sandbox: SandboxConfig | None = None,
    per_test_timeout_s: float | None = 3.0,
    group: SandboxGroup | None = None,
) -> Verdict:
    """Run the task's hidden (or visible) tests against ``code``: the code in a fresh sandbox, the
    tests outside it (:func:`~agent_r1_plugin_code.harness.judge_solution`). Tests passed before
    the sandbox ended count; ``group`` owns the sandboxes while they run."""
    plan = task_plan(task, hidden=hidden)
    result = judge_solution(
        assemble_solution(code, task), plan, sandbox, per_test_timeout_s=per_test_timeout_s, group=group
    )
    passed = sum(bool(t.get("passed")) for t in result.tests)
    return Verdict(passed=passed, total=len(plan.tests), result=result)


_CACHE: OrderedDict[tuple[str, str, str], Verdict] = OrderedDict()
_CACHE_LOCK = threading.Lock()
_CACHE_SIZE = 4096


def judge_cached(code: str, task: Task, sandbox: SandboxConfig | None = None) -> Verdict:
    """:func:`judge` on the hidden tests, remembered per (task, tests, code), so that the shapers
    ``code_tests`` and ``code_solved`` run a solution once between them."""
    tests_key = hashlib.sha256(repr(task.metadata.get("tests")).encode()).hexdigest()
    key = (task.id, tests_key, hashlib.sha256(code.encode()).hexdigest())
    with _CACHE_LOCK:
        if key in _CACHE:
            _CACHE.move_to_end(key)
            return _CACHE[key]
    outcome = judge(code, task, sandbox=sandbox)
    if outcome.result.status != "timeout":  # a timeout may be the machine's load: judge it again
        with _CACHE_LOCK:
            _CACHE[key] = outcome
            while len(_CACHE) > _CACHE_SIZE:
                _CACHE.popitem(last=False)
    return outcome


def submitted_solution(trajectory: Trajectory, *, fall_back_to_tested: bool = True) -> str | None:
    """The solution an episode submitted: the final answer (``<answer>code</answer>``) of the last
    step; when that is missing or empty and ``fall_back_to_tested``, the code of the episode's last
    ``run_tests`` call; else ``None``."""
    if trajectory.steps:
        answer = trajectory.steps[-1].action.answer
        if answer is not None and strip_fences(answer).strip():
            return answer
    if not fall_back_to_tested:
        return None
    for step in reversed(trajectory.steps):
        for call in reversed(step.action.tool_calls):
            if call.name == "run_tests" and str(call.arguments.get("code", "")).strip():
                return str(call.arguments["code"])
    return None


def first_error_line(error: str | None) -> str:
    """The last line of a traceback (``AssertionError: ...``), for short reports."""
    if not error:
        return ""
    lines = [line for line in error.strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else ""


def short_test(statement: str, limit: int = 200) -> str:
    text = " ".join(statement.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def metadata_tests(metadata: dict[str, Any]) -> list[str]:
    return list(metadata.get("tests") or [])


OPERATOR_FLIPS = (
    ("<=", "<"),
    (">=", ">"),
    ("==", "!="),
    (" < ", " > "),
    (" > ", " < "),
    (" + ", " - "),
    (" - ", " + "),
    ("True", "False"),
    ("return ", "return not "),
)
"""Edits that turn a right solution into a wrong one, tried in this order (cross-checks of the
verdicts against another harness, and the judging benchmark)."""


def mutant(code: str) -> str | None:
    """``code`` with the first applicable edit of :data:`OPERATOR_FLIPS` (one occurrence), or
    ``None`` when none applies."""
    for old, new in OPERATOR_FLIPS:
        if old in code:
            return code.replace(old, new, 1)
    return None
