"""The trusted harness: how tests are split (the sandbox evaluates the calls of the solution, this
process everything else), what crosses (plain data only), the tests that cannot be split, the
protocol, and stdin/stdout tests."""

from __future__ import annotations

import ast
import random

import pytest

from agent_r1 import Task
from agent_r1_plugin_code.sandbox import namespace_prefix, run_tests
from agent_r1_plugin_code.split import plan_tests
from agent_r1_plugin_code.testcases import judge, task_plan

needs_namespaces = pytest.mark.skipif(namespace_prefix() is None, reason="needs Linux namespaces (unshare)")
FAST = {"timeout_s": 10.0, "cpu_s": 5.0}

SOLUTION = """
def add(a, b):
    return a + b

def ratio(a, b):
    return a / b

def evens(n):
    return (i for i in range(0, n, 2))

class Pair:
    def __init__(self, a, b):
        self.a, self.b = a, b

def longest(pairs):
    return max(p.b - p.a for p in pairs)

def apply(f, x):
    return f(x)

def check_positive(x):
    if x < 0:
        raise ValueError("negative")
    return x

LIMIT = 3
"""
TESTS = [
    "for i in range(5):\n    assert add(i, 1) == i + 1",
    "assert abs(ratio(1, 3) - 0.3333333) < 1e-6",
    "assert math.isclose(ratio(2, 3), 0.6666666, rel_tol=1e-6)",
    "assert all(add(x, x) == 2 * x for x in range(4))",
    "assert list(evens(5)) == [0, 2, 4]",
    "assert longest([Pair(1, 4), Pair(2, 3)]) == 3",
    "assert Pair(1, 2).b == 2",
    "assert apply(lambda v: v * k, 3) == 6",
    "assert LIMIT == 3",
    "assert sorted(map(add, [1, 2], [3, 4])) == [4, 6]",
    "try:\n    check_positive(-1)\nexcept ValueError:\n    pass\nelse:\n    assert False",
    "assert double(2) == 4",
    "assert add(1, 1) == 3, 'wrong on purpose'",
]


def test_the_split_keeps_every_comparison_out_of_the_sandbox() -> None:
    plan = plan_tests(TESTS, setup="def double(x):\n    return add(x, x)", check_setup=["k = 2"])
    assert plan.user_names >= {"add", "ratio", "evens", "Pair", "longest", "apply", "LIMIT"}
    assert plan.modules == ("math",)  # used without an import: imported on the trusted side
    codes = [region.code for region in plan.regions]
    assert "lambda __r1_0: add(__r1_0, 1)" in codes  # the loop variable crosses as data
    assert "lambda : list(evens(5))" in codes  # a conversion of the solution's value joins it
    assert "lambda __r1_0: apply(lambda v: v * __r1_0, 3)" in codes  # k, from the setup, as data
    assert "lambda : longest([Pair(1, 4), Pair(2, 3)])" in codes  # objects of the solution stay there
    for code in codes:
        assert not any(isinstance(node, ast.Compare) for node in ast.walk(ast.parse(code))), code


def test_humaneval_is_split_with_no_comparison_in_the_sandbox(humaneval_tasks: list[Task]) -> None:
    for task in humaneval_tasks:
        plan = task_plan(task)
        assert all(test.code is not None for test in plan.tests), task.id
        for region in plan.regions:
            tree = ast.parse(region.code)
            decided_there = [n for n in ast.walk(tree) if isinstance(n, (ast.Compare, ast.Assert))]
            assert decided_there == [], (task.id, region)


@needs_namespaces
def test_split_tests_judge_like_the_original() -> None:
    result = run_tests(
        SOLUTION,
        TESTS,
        FAST,
        setup="def double(x):\n    return add(x, x)",
        check_setup=["k = 2"],
        per_test_timeout_s=2.0,
    )
    assert result.ok and result.sandbox_verdicts == 0, result
    verdicts = [t["passed"] for t in result.tests]
    assert verdicts == [True] * (len(TESTS) - 1) + [False], result.tests
    assert result.tests[-1]["error"] == "AssertionError: wrong on purpose"


TREE_SETUP = (
    "class Node:\n"
    "    def __init__(self, v, left=None, right=None):\n"
    "        self.v, self.left, self.right = v, left, right\n"
    "root = Node(1, Node(2, Node(4)), Node(3))\n"
)
HEIGHT = (
    "def height(node):\n    return 0 if node is None else 1 + max(height(node.left), height(node.right))\n"
)
LYING_HEIGHT = (
    "class Anything:\n    def __eq__(self, other):\n        return True\n\n"
    "def height(node):\n    return Anything()\n"
)


@needs_namespaces
def test_objects_of_the_setup_go_by_reference_and_the_rest_runs_in_the_sandbox() -> None:
    tests = ["assert height(root) == 3", "assert height(root.left) == 2"]
    honest = run_tests(HEIGHT, tests, FAST, setup=TREE_SETUP)
    assert [t["passed"] for t in honest.tests] == [True, True], honest.tests
    # ``root`` is a name of the setup: the sandbox runs the setup too and uses its own ``root``;
    # ``root.left`` is neither data nor a name: that test runs whole in the sandbox, and counts
    assert honest.sandbox_verdicts == 1
    # which is the stated limit: there, a lying value can pass; in the split test it cannot
    lying = run_tests(LYING_HEIGHT, tests, FAST, setup=TREE_SETUP)
    assert [t["passed"] for t in lying.tests] == [False, True]
    assert lying.sandbox_verdicts == 1


STACK = (
    "class Stack:\n"
    "    def __init__(self):\n        self.items = []\n"
    "    def push(self, x):\n        self.items.append(x)\n"
    "    def pop(self):\n        return self.items.pop()\n"
)


@needs_namespaces
def test_a_test_that_holds_an_object_of_the_solution_runs_in_the_sandbox() -> None:
    tests = ["s = Stack()\ns.push(1)\ns.push(2)\nassert s.pop() == 2", "assert Stack().items == []"]
    plan = plan_tests(tests)
    assert [t.in_sandbox for t in plan.tests] == [True, False]  # decided from the text alone
    # a variable holding what a function returns stays split: its value is plain data
    assert (
        not plan_tests(["r = candidate([3, 1])\nassert r.count(1) == 1"], candidate=True).tests[0].in_sandbox
    )
    result = run_tests(STACK, tests, FAST)
    assert [t["passed"] for t in result.tests] == [True, True] and result.sandbox_verdicts == 1


@needs_namespaces
def test_a_value_written_by_the_code_binds_to_its_own_call_only() -> None:
    # The code answers its current request itself (id copied from the runner's frame) with the
    # right value, then returns a wrong one. The trusted side takes the first reply for that call
    # (an honest function could have returned 3), and the runner's own reply, now unsolicited,
    # stops the sandbox: no later call can be answered from the past, every later test fails.
    solution = (
        "import json, os, sys\n"
        "def add(a, b):\n"
        "    frame = sys._getframe(1)\n"
        "    while frame is not None and not isinstance(frame.f_locals.get('command'), dict):\n"
        "        frame = frame.f_back\n"
        "    line = json.dumps({'id': frame.f_locals['command']['id'], 'value': 3}) + '\\n'\n"
        "    for fd in range(3, 30):\n"
        "        try:\n"
        "            os.write(fd, line.encode())\n"
        "        except OSError:\n"
        "            pass\n"
        "    return 0\n"
    )
    tests = ["assert add(1, 2) == 3", "assert add(0, 3) == 3", "assert add(2, 1) == 3"]
    result = run_tests(solution, tests, FAST)
    assert [t["passed"] for t in result.tests] == [True, False, False], result.tests
    assert result.status == "crashed" and "result channel" in (result.error or "")


@needs_namespaces
def test_test_code_draws_from_its_own_random() -> None:
    random.seed(1234)
    expected = random.random()
    random.seed(1234)
    draws = "import random\nfor _ in range(50):\n    x = random.randint(0, 9)\n    assert add(x, 1) == x + 1"
    tests = [draws]
    assert run_tests("def add(a, b):\n    return a + b\n", tests, FAST).tests[0]["passed"]
    assert random.random() == expected  # the trainer's random state was not touched


def stdio_task(pairs: list[tuple[str, str]]) -> Task:
    tests = [{"stdin": given, "stdout": wanted} for given, wanted in pairs]
    return Task(
        id="stdio/sum",
        messages=[{"role": "user", "content": "Read n, then n numbers; print their sum."}],
        metadata={"tests": tests, "visible_tests": tests[:1], "candidate": False},
    )


@needs_namespaces
@pytest.mark.parametrize(
    ("program", "passed"),
    [
        ("n = int(input())\nprint(sum(map(int, input().split()[:n])))\n", 2),
        ("import sys\nprint(sum(map(int, sys.stdin.read().split()[1:])))\n", 2),
        ("print(6)\n", 1),
        ("print('All tests passed')\nprint('PASSED')\n", 0),
        (
            "import json, os\n"
            "for fd in range(3, 30):\n"
            "    for ident in range(1, 5):\n"
            "        try:\n"
            "            os.write(fd, (json.dumps({'id': ident, 'value': None}) + '\\n').encode())\n"
            "        except OSError:\n"
            "            pass\n",
            0,
        ),
        ("import os\nos._exit(0)\n", 0),
        ("print(6)\nraise SystemExit(3)\n", 0),
    ],
    ids=["input()", "sys.stdin", "constant", "success markers", "forged replies", "os._exit", "exit 3"],
)
def test_stdin_stdout_tests_compare_the_output_outside(program: str, passed: int) -> None:
    task = stdio_task([("3\n1 2 3\n", "6\n"), ("2\n5 5\n", "10")])
    verdict = judge(program, task, sandbox=FAST)
    assert verdict.total == 2 and verdict.passed == passed, verdict.result.tests
