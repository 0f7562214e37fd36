"""The ``code`` and ``math`` environments, episode by episode through the real rollout engine with a
scripted policy: the python session keeps its state across turns, run_tests reports failures, the
submission is judged on the hidden tests, process rewards follow the records, sessions end with
their episodes."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from agent_r1 import Task
from agent_r1.registry import get_registry
from agent_r1_plugin_code.sandbox import namespace_prefix

pytestmark = pytest.mark.skipif(namespace_prefix() is None, reason="needs Linux namespaces (unshare)")


def by_id(tasks: list[Task], task_id: str) -> Task:
    return next(task for task in tasks if task.id == task_id)


WRONG = "def truncate_number(number: float) -> float:\n    return 0.0\n"
RIGHT = "def truncate_number(number: float) -> float:\n    return number % 1.0\n"


def scores(trajectory, task: Task, *names: str) -> dict[str, list[tuple[float, int | None]]]:
    registry = get_registry()
    out = {}
    for name in names:
        shaper = registry.build("reward_shapers", name, {})
        out[name] = [(s.value, s.turn) for s in shaper.score(trajectory, task)]
    return out


def observations(trajectory) -> list[str]:
    return [
        "\n".join(str(m["content"]) for m in step.observation.messages)
        for step in trajectory.steps
        if step.observation is not None
    ]


def test_write_run_test_fix_and_submit(scripted_episode, humaneval_tasks) -> None:
    task = by_id(humaneval_tasks, "HumanEval/2")
    texts = [
        "Let me try.<python>x = 41\nprint('hello')\nx + 1</python>",
        "<python>x * 2</python>",
        f"<run_tests>{WRONG}</run_tests>",
        f"<run_tests>{RIGHT}</run_tests>",
        "<answer></answer>",
    ]
    trajectory = scripted_episode("code", {}, task, texts)
    seen = observations(trajectory)
    assert seen[0] == "<result>stdout:\nhello\nresult: 42</result>"
    assert seen[1] == "<result>result: 82</result>"  # x survived the turn
    assert seen[2].startswith("<result>0 of 3 visible tests passed.\nFAILED: assert candidate(3.5) == 0.5\n")
    assert "AssertionError" in seen[2]
    assert seen[3] == "<result>3 of 3 visible tests passed.</result>"
    assert trajectory.termination == "answer"
    records = [step.observation.info["code"] for step in trajectory.steps]
    assert records[2] == [{"tool": "run_tests", "status": "ok", "passed": 0, "total": 3}]
    got = scores(trajectory, task, "code_tests", "code_solved", "code_runs", "test_progress")
    assert got["code_tests"] == [(1.0, None)] and got["code_solved"] == [(1.0, None)]
    assert got["code_runs"] == [(1.0, 0), (1.0, 1)]  # capped at two turns
    assert got["test_progress"] == [(1.0, 3)]


def test_submitting_wrong_code_scores_the_share_of_hidden_tests(scripted_episode, humaneval_tasks) -> None:
    task = by_id(humaneval_tasks, "HumanEval/0")  # has_close_elements: 7 hidden tests
    # right on the visible ones only by luck: answers True whenever the list has 5 or more numbers
    partial = "def has_close_elements(numbers, threshold):\n    return len(numbers) >= 6\n"
    trajectory = scripted_episode("code", {}, task, [f"<answer>```python\n{partial}```</answer>"])
    got = scores(trajectory, task, "code_tests", "code_solved")
    share = got["code_tests"][0][0]
    assert 0.0 < share < 1.0 and got["code_solved"] == [(0.0, None)]
    canonical = task.metadata["prompt"] + task.metadata["reference_solution"]
    trajectory = scripted_episode("code", {}, task, [f"<answer>{canonical}</answer>"])
    assert scores(trajectory, task, "code_solved")["code_solved"] == [(1.0, None)]


def test_no_submission_scores_zero(scripted_episode, humaneval_tasks) -> None:
    task = by_id(humaneval_tasks, "HumanEval/2")
    trajectory = scripted_episode("code", {}, task, ["I do not know."])
    assert trajectory.termination == "no_tool_call"
    got = scores(trajectory, task, "code_tests", "code_solved", "code_runs", "test_progress")
    assert got == {
        "code_tests": [(0.0, None)],
        "code_solved": [(0.0, None)],
        "code_runs": [],
        "test_progress": [],
    }


def test_errors_are_shown_trimmed_to_the_agents_code(scripted_episode, humaneval_tasks) -> None:
    task = by_id(humaneval_tasks, "HumanEval/2")
    texts = [
        "<python>def f(n):\n    return 1 / n\nf(0)</python>",
        "<run_tests>def truncate_number(:</run_tests>",
    ]
    trajectory = scripted_episode("code", {}, task, texts)
    first, second = observations(trajectory)
    assert 'File "<cell-1>", line 3, in <module>' in first and "ZeroDivisionError: division by zero" in first
    assert "_runner" not in first and "sandbox" not in first
    assert "Your code failed before the tests could run; 0 of 3 passed." in second
    assert "SyntaxError" in second
    assert trajectory.steps[0].observation.info["code"] == [{"tool": "python", "status": "error"}]


@pytest.mark.skipif(__import__("os").geteuid() != 0, reason="finds the session by its user id")
def test_the_session_ends_with_the_episode(humaneval_tasks) -> None:
    import asyncio

    from agent_r1 import Action

    task = by_id(humaneval_tasks, "HumanEval/2")
    env = get_registry().build("environments", "code", {})
    other = get_registry().build("environments", "code", {})
    assert env.tools["python"] is not other.tools["python"]  # one session per episode

    async def episode() -> None:
        await env.reset(task)
        await env.step(Action(text="<python>import time\nx = 1</python>", finish_reason="stop"), 0)
        uid = env.tools["python"]._session.uid
        assert any(_uid_of(pid) == uid for pid in _pids())
        observation = await env.step(Action(text="<answer>pass</answer>", finish_reason="stop"), 1)
        assert observation.done
        deadline = time.monotonic() + 5
        while any(_uid_of(pid) == uid for pid in _pids()) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(_uid_of(pid) == uid for pid in _pids())

    asyncio.run(episode())


def test_an_episode_cut_by_the_engine_closes_its_session(humaneval_tasks) -> None:
    """The engine's max_turns ends the episode (the environment never says done): aclose() ends the
    python session right after the batch, not at garbage collection."""
    from agent_r1.rollout.loop import RolloutEngine
    from agent_r1.testing.models import tiny_tokenizer
    from agent_r1.testing.scripted import ScriptedBackend

    task = by_id(humaneval_tasks, "HumanEval/2")
    envs: list = []

    def factory():
        envs.append(get_registry().build("environments", "code", {}))
        return envs[-1]

    tokenizer = tiny_tokenizer()
    backend = ScriptedBackend(tokenizer=tokenizer, responses=["<python>x = 1</python>"])
    engine = RolloutEngine(backend, tokenizer, factory, max_turns=1, max_context=4096)
    [trajectory] = engine.collect([task], 1, seed=0)
    assert trajectory.termination == "max_turns" and trajectory.metrics["env_close_errors"] == 0
    [result] = trajectory.steps[0].observation.tool_results
    assert result.ok and result.name == "python"  # the session was started by that call
    tool = envs[0].tools["python"]
    assert tool._session is None  # closed by the engine, while the environment is still referenced


def _pids() -> list[int]:
    return [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()]


def _uid_of(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("Uid:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def test_math_episode_with_python_and_calculator(scripted_episode) -> None:
    from agent_r1_plugin_code.datasets import GSM8KDataset

    task = GSM8KDataset().load("eval")[0]  # Janet's ducks: 18
    texts = [
        "<python>eggs = 16 - 3 - 4\nprint(eggs)</python>",
        "<calc>9*2</calc>",
        "She makes <answer>$18</answer> a day.",
    ]
    trajectory = scripted_episode("math", {}, task, texts)
    seen = observations(trajectory)
    assert seen[0] == "<result>stdout:\n9</result>" and seen[1] == "<result>18</result>"
    got = scores(trajectory, task, "math_correct", "code_runs")
    assert got["math_correct"] == [(1.0, None)] and got["code_runs"] == [(1.0, 0)]
    wrong = scripted_episode("math", {}, task, ["<answer>16</answer>"])
    assert scores(wrong, task, "math_correct")["math_correct"] == [(0.0, None)]


def test_sandbox_shortcut_reaches_both_tools() -> None:
    env = get_registry().build("environments", "code", {"sandbox": {"timeout_s": 2.5, "memory_mb": 256}})
    for name in ("python", "run_tests"):
        assert env.tools[name].config.sandbox.timeout_s == 2.5
        assert env.tools[name].config.sandbox.memory_mb == 256
    with pytest.raises(Exception, match="sandbox is given both"):
        get_registry().build(
            "environments",
            "code",
            {
                "sandbox": {"timeout_s": 2},
                "tools": [{"name": "python", "sandbox": {"timeout_s": 3}}, "run_tests"],
            },
        )
