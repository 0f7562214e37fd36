"""Reward shapers on hand-built trajectories: which code counts as submitted, the share of hidden
tests, process rewards from the code records, math answer extraction and numeric comparison; and
the evaluation summary of the core over these signals (success, pass@k, turns and tool calls)."""

from __future__ import annotations

import pytest

from agent_r1 import Action, Observation, RewardSignal, Step, Task, ToolCall, Trajectory
from agent_r1.engine.reports.evaluation import summarize_eval
from agent_r1_plugin_code.rewards import (
    CodeRunsReward,
    CodeSolvedReward,
    CodeTestsReward,
    MathAnswerReward,
    ProgressReward,
)
from agent_r1_plugin_code.sandbox import namespace_prefix
from agent_r1_plugin_code.testcases import submitted_solution

needs_namespaces = pytest.mark.skipif(namespace_prefix() is None, reason="needs Linux namespaces (unshare)")

ADD_TASK = Task(
    id="add",
    messages=[{"role": "user", "content": "Write add(a, b)."}],
    category="toy",
    metadata={
        "entry_point": "add",
        "candidate": False,
        "tests": [
            "assert add(1, 2) == 3",
            "assert add(-1, 1) == 0",
            "assert add(10, 5) == 15",
            "assert add(0, 0) == 0",
        ],
        "visible_tests": ["assert add(1, 2) == 3"],
        "test_setup": "",
        "check_setup": [],
    },
)


def step(turn: int, text: str = "", answer: str | None = None, calls=(), records=None, done=False) -> Step:
    action = Action(text=text, answer=answer, tool_calls=list(calls))
    observation = Observation(done=done, info={"code": records} if records is not None else {})
    return Step(turn=turn, action=action, observation=observation)


def run_tests_call(code: str) -> ToolCall:
    return ToolCall(id="c", name="run_tests", arguments={"code": code})


def trajectory(*steps: Step, task_id: str = "add", index: int = 0) -> Trajectory:
    return Trajectory(id=f"{task_id}/{index}", task_id=task_id, steps=list(steps))


def test_which_code_is_submitted() -> None:
    tested = run_tests_call("def add(a, b):\n    return a + b")
    assert submitted_solution(
        trajectory(step(0, calls=[tested]), step(1, answer="def add(a, b): return 0"))
    ) == ("def add(a, b): return 0")
    assert (
        submitted_solution(trajectory(step(0, calls=[tested]), step(1, answer="  ")))
        == tested.arguments["code"]
    )
    assert submitted_solution(trajectory(step(0, calls=[tested]))) == tested.arguments["code"]
    assert submitted_solution(trajectory(step(0, calls=[tested])), fall_back_to_tested=False) is None
    assert submitted_solution(trajectory(step(0, text="no idea"))) is None


@needs_namespaces
def test_hidden_test_share_and_solved() -> None:
    half = trajectory(step(0, answer="```python\ndef add(a, b):\n    return a + b if a < 5 else 0\n```"))
    assert CodeTestsReward().score(half, ADD_TASK)[0].value == pytest.approx(0.75)
    assert CodeSolvedReward().score(half, ADD_TASK)[0].value == 0.0
    right = trajectory(step(0, answer="def add(a, b):\n    return a + b"))
    assert CodeTestsReward().score(right, ADD_TASK)[0].value == 1.0
    assert CodeSolvedReward().score(right, ADD_TASK)[0].value == 1.0
    assert CodeSolvedReward().score(trajectory(step(0, text="nothing")), ADD_TASK)[0].value == 0.0
    no_tests = ADD_TASK.model_copy(update={"metadata": {}})
    assert CodeTestsReward().score(right, no_tests) == []


TREE_TASK = Task(
    id="tree",
    messages=[{"role": "user", "content": "Write height(node)."}],
    metadata={
        "entry_point": "height",
        "candidate": False,
        # the second test reads ``root.left`` (neither data nor a setup name): it cannot be split,
        # so it is judged inside the sandbox, where a lying value could pass it
        "tests": ["assert height(root) == 3", "assert height(root.left) == 2"],
        "test_setup": (
            "class Node:\n"
            "    def __init__(self, v, left=None, right=None):\n"
            "        self.v, self.left, self.right = v, left, right\n"
            "root = Node(1, Node(2, Node(4)), Node(3))\n"
        ),
        "check_setup": [],
    },
)


@needs_namespaces
def test_reward_resting_on_a_sandbox_verdict_is_flagged_for_the_suspect_alarm() -> None:
    """A rewarded solution some of whose tests were judged inside the sandbox carries the weight-0
    signal ``suspect/sandbox_verdict`` (the core's ``suspect`` alarm counts it); a solution judged
    wholly on the trusted side does not."""
    height = (
        "def height(node):\n    return 0 if node is None else 1 + max(height(node.left), height(node.right))"
    )
    signals = CodeTestsReward().score(trajectory(step(0, answer=height), task_id="tree"), TREE_TASK)
    assert signals[0].value == 1.0
    assert [(s.name, s.value, s.weighted) for s in signals[1:]] == [("suspect/sandbox_verdict", 1.0, 0.0)]
    right = trajectory(step(0, answer="def add(a, b):\n    return a + b"))
    assert [s.name for s in CodeTestsReward().score(right, ADD_TASK)] == ["code_tests"]
    wrong = trajectory(step(0, answer="def height(node):\n    return -1"), task_id="tree")
    assert [s.name for s in CodeSolvedReward().score(wrong, TREE_TASK)] == ["code_solved"]  # unrewarded


def test_process_rewards_read_the_code_records() -> None:
    ok, error = {"tool": "python", "status": "ok"}, {"tool": "python", "status": "error"}
    episode = trajectory(
        step(0, records=[error]),
        step(1, records=[ok]),
        step(2, records=[{"tool": "run_tests", "status": "ok", "passed": 1, "total": 4}]),
        step(3, records=[{"tool": "run_tests", "status": "ok", "passed": 1, "total": 4}, ok]),
        step(4, records=[{"tool": "run_tests", "status": "ok", "passed": 3, "total": 4}]),
        step(5, records=[]),
    )
    runs = CodeRunsReward({"max_rewarded_turns": 2}).score(episode, ADD_TASK)
    assert [(s.turn, s.value, s.kind) for s in runs] == [(1, 1.0, "process"), (2, 1.0, "process")]
    progress = ProgressReward().score(episode, ADD_TASK)
    assert [(s.turn, s.value) for s in progress] == [(2, 0.25), (4, 0.5)]
    assert sum(s.value for s in progress) <= 1.0
    assert CodeRunsReward().score(trajectory(step(0, records=None)), ADD_TASK) == []


@pytest.mark.parametrize(
    ("answer", "text", "fallback", "expected"),
    [
        ("18", "", [], 1.0),
        ("$18.00", "", [], 1.0),
        ("She earns 18 dollars", "", [], 1.0),
        ("1,018", "", [], 0.0),
        ("17", "", [], 0.0),
        (None, "so the answer is \\boxed{18}", ["boxed"], 1.0),
        (None, "so the answer is \\boxed{18}", [], 0.0),
        (None, "work...\n#### 18", ["hash"], 1.0),
        (None, "", ["boxed", "hash"], 0.0),
    ],
)
def test_math_answers(answer: str | None, text: str, fallback: list[str], expected: float) -> None:
    task = Task(id="m", messages=[{"role": "user", "content": "?"}], answer="18")
    [signal] = MathAnswerReward({"fallback": fallback}).score(
        trajectory(step(0, text=text, answer=answer)), task
    )
    assert signal.name == "math_correct" and signal.kind == "outcome" and signal.value == expected
    assert (
        MathAnswerReward().score(trajectory(step(0, answer="1")), task.model_copy(update={"answer": None}))
        == []
    )


def test_the_core_summary_gives_pass_at_k_turns_and_tool_calls_over_code_solved() -> None:
    # task "add": 1 of 2 samples solved; task "sub": 0 of 2. pass@1 = (1/2 + 0) / 2, pass@2 = (1 + 0) / 2
    tasks = {"add": ADD_TASK, "sub": ADD_TASK.model_copy(update={"id": "sub", "category": "other"})}
    episodes = []
    for task_id, solved in (("add", [1.0, 0.0]), ("sub", [0.0, 0.0])):
        for index, value in enumerate(solved):
            episode = trajectory(
                step(0, calls=[run_tests_call("x")], records=[]),
                step(1, answer="code", done=True),
                task_id=task_id,
                index=index,
            )
            episode.steps[0].observation.tool_results.append(
                __import__("agent_r1").ToolResult(call_id="c", name="run_tests", content="1 of 1 passed.")
            )
            episode.rewards = [RewardSignal(name="code_solved", value=value)]
            episodes.append(episode)
    summary = summarize_eval(episodes, tasks, success_signal="code_solved", ks=(1, 2))
    assert summary["pass_at_k"] == pytest.approx({"pass@1": 0.25, "pass@2": 0.5})
    assert summary["success"] == pytest.approx(0.25)
    toy = summary["categories"]["toy"]
    assert toy["pass_at_k"] == pytest.approx({"pass@1": 0.5, "pass@2": 1.0})
    assert toy["turns_mean"] == 2.0 and toy["tool_calls_mean"] == 1.0
