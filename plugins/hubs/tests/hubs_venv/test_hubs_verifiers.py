"""The verifiers family against verifiers 0.4.0: the test environment ``hubs-notebook-arith``
(``vf_envs/``, loaded by id as ``vf-eval`` would) as the ``verifiers`` dataset, environment and
reward shaper; scripted episodes through the real rollout engine; two GRPO steps on the tiny model;
and ``agent-r1 check`` refusing what cannot run, before any model loads."""

from __future__ import annotations

import asyncio
import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from hub_checks import assert_token_fidelity, run_config

from agent_r1 import Task, Trajectory

ENV_ID = "hubs-notebook-arith"


@pytest.fixture(autouse=True)
def _environments(vf_envs: Path) -> None:
    """Every test here loads the test environments by id."""


def taskset(**options: Any) -> dict[str, Any]:
    return {"num_tasks": 4, "broken_every": 4, **options}


def environment(**options: Any) -> dict[str, Any]:
    return {"env_id": ENV_ID, "taskset": taskset(), "format": "tags", "max_turns": 3, **options}


def package_score(
    task: Task, last_reply: str, notes: list[str], additions: int = 0
) -> dict[str, tuple[float, float]]:
    """The test environment's own scoring (``ArithTask.score``) of an episode whose final reply and
    notebook are given, on a trace built here with verifiers' API: {reward: (score, weight)}."""
    import hubs_notebook_arith as env
    import verifiers.v1 as vf
    from verifiers.v1.graph import MessageNode

    data = env.ArithData.model_validate(task.metadata["verifiers"]["data"])
    vf_task = env.ArithTask(data, env.ArithTaskConfig())
    trace = vf.Trace(
        task=vf.TraceTask(type="ArithTask", data=data),
        agent=vf.AgentInfo(config=vf.AgentConfig()),
        state=env.NotebookState(notes=notes, additions=additions),
    )
    trace.nodes.append(MessageNode(message=vf.UserMessage(content=data.prompt)))
    trace.nodes.append(MessageNode(parent=0, message=vf.AssistantMessage(content=last_reply), sampled=True))
    asyncio.run(vf_task.score(trace))
    return {name: (reward.score, reward.weight) for name, reward in trace.rewards.items()}


def shaper_score(trajectory: Trajectory, task: Task) -> dict[str, tuple[float, float]]:
    from agent_r1.registry import get_registry

    shaper = get_registry().build("reward_shapers", "verifiers", {})
    [signals] = shaper.score_batch([trajectory], [task])
    assert not isinstance(signals, Exception), signals
    assert all(s.kind == "outcome" and s.source == "verifiers" for s in signals)
    return {s.name: (s.value, s.weight) for s in signals}


def test_the_dataset_holds_the_tasks_of_the_taskset() -> None:
    from agent_r1.registry import get_registry

    dataset = get_registry().build(
        "datasets",
        "verifiers",
        {"env_id": ENV_ID, "taskset": {"num_tasks": 5}, "num_eval": 2, "num_train": 2},
    )
    evaluated, train = dataset.load("eval"), dataset.load("train")
    assert [t.id for t in evaluated] == [f"{ENV_ID}/arith-0", f"{ENV_ID}/arith-1"]
    assert [t.id for t in train] == [f"{ENV_ID}/arith-2", f"{ENV_ID}/arith-3"]
    assert train[0].messages == [
        {"role": "system", "content": "You are a careful calculator."},
        {"role": "user", "content": "What is 5 + 8? Take a note, then answer."},
    ]
    assert train[0].answer == "13"
    assert train[0].metadata["verifiers"]["data"]["answer"] == "13"
    shuffled = get_registry().build(
        "datasets", "verifiers", {"env_id": ENV_ID, "taskset": {"num_tasks": 5}, "shuffle_seed": 3}
    )
    ids = [t.id for t in shuffled.load("train")]
    assert sorted(ids) == [f"{ENV_ID}/arith-{i}" for i in range(5)] and ids != sorted(ids)


def script(prompt: str) -> str:
    """The policy of the scripted episodes, by task (the question in the prompt) and by how many
    tool results it has read."""
    results = prompt.count("<|im_start|>user\n<result>")
    if "What is 3 + 4?" in prompt:  # a note, the shared calculator, then the answer
        return ["<notebook_note>seven</notebook_note>", '<calc_add>{"a": 3, "b": 4}</calc_add>', "It is 7."][
            results
        ]
    if "What is 4 + 6?" in prompt:  # two notes: the environment's @vf.stop ends the episode
        return ["<notebook_note>one</notebook_note>", "<notebook_note>two</notebook_note>"][results]
    if "What is 5 + 8?" in prompt:  # answers at once, wrongly
        return "It is 12."
    return "<notebook_note>never run: this task's setup raises</notebook_note>"


def test_scripted_episodes_call_the_tools_share_state_stop_and_score(tokenizer: Any) -> None:
    from agent_r1.registry import get_registry
    from agent_r1.rollout.loop import RolloutEngine
    from agent_r1.testing.scripted import ScriptedBackend

    registry = get_registry()
    tasks = registry.build("datasets", "verifiers", {"env_id": ENV_ID, "taskset": taskset()}).load("train")
    engine = RolloutEngine(
        ScriptedBackend(tokenizer=tokenizer, responses=script),
        tokenizer,
        lambda: registry.build("environments", "verifiers", environment()),
        max_turns=3,
        max_new_tokens=64,
        max_context=2048,
        on_env_error="end",  # as training does
    )
    trajectories = engine.collect(tasks, 1, seed=0)
    by_task = {t.task_id.rsplit("-", 1)[-1]: t for t in trajectories}

    # the tools ran in the episode's servers, their results are what the agent read next
    results = {
        i: [r.content for s in t.steps if s.observation for r in s.observation.tool_results]
        for i, t in by_task.items()
    }
    assert results == {"0": ["saved note 1", "7"], "1": ["saved note 1", "saved note 2"], "2": [], "3": []}
    # each episode has a state of its own, the shared calculator's additions included
    states = {i: t.steps[-1].observation.info["verifiers"]["state"] for i, t in by_task.items() if i != "3"}
    assert states == {
        "0": {"artifacts": {}, "notes": ["seven"], "additions": 1},
        "1": {"artifacts": {}, "notes": ["one", "two"], "additions": 0},
        "2": {"artifacts": {}, "notes": [], "additions": 0},
    }
    assert {i: t.termination for i, t in by_task.items()} == {
        "0": "no_tool_call",
        "1": "stop:notebook_full",
        "2": "no_tool_call",
        "3": "env_error",
    }
    # a task whose setup raises is a counted failed episode; the others went on
    assert by_task["3"].metrics["env_errors"] == 1.0
    assert "RuntimeError: task 3 cannot be set up" in by_task["3"].errors[0]
    assert all(not t.errors for i, t in by_task.items() if i != "3")

    # the trajectories hold what the policy said and what the environment answered, token for token
    for trajectory in trajectories:
        assert_token_fidelity(trajectory, tokenizer)
        assert trajectory.metrics["template_drift_tokens"] == 0.0  # re-rendering gives the same tokens
    assert sum(assert_token_fidelity(t, tokenizer) for t in trajectories) > 0

    # the rewards are verifiers' own scoring of the same episodes, weights kept
    task_of = {t.id: t for t in tasks}
    expected = {
        "0": package_score(task_of[by_task["0"].task_id], "It is 7.", ["seven"], 1),
        "1": package_score(task_of[by_task["1"].task_id], "", ["one", "two"]),
        "2": package_score(task_of[by_task["2"].task_id], "It is 12.", []),
    }
    assert expected["0"] == {"correct": (1.0, 1.0), "took_notes": (0.5, 0.5)}
    assert expected["1"] == {"correct": (0.0, 1.0), "took_notes": (1.0, 0.5)}
    for i, scores in expected.items():
        assert shaper_score(by_task[i], task_of[by_task[i].task_id]) == scores


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_two_training_steps_on_the_tiny_model(
    tiny_model_dir: Path, recorder: Any, tmp_path: Path, tokenizer: Any
) -> None:
    from agent_r1.run.training import train

    run_dir = tmp_path / "run"
    config = run_config(
        tiny_model_dir,
        run_dir,
        data={
            "name": "verifiers",
            "env_id": ENV_ID,
            "taskset": taskset(num_tasks=9, broken_every=2),
            "num_eval": 1,
        },
        # a random model writes no call: the environment answers such turns (end_on_no_tool_call off), so
        # that the episodes hold environment tokens
        environment={
            "name": "verifiers",
            **environment(taskset=taskset(num_tasks=9, broken_every=2)),
            "end_on_no_tool_call": False,
            "max_turns": 2,
        },
        rewards=[{"name": "verifiers", "weight": 1.0}],
        success_signal="correct",
        max_turns=3,
    )
    path = tmp_path / "verifiers.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    summary = train(path, [])

    assert summary["steps"] == 2
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == [1, 2]
    assert all("reward/correct" in line and "reward/took_notes" in line for line in lines)
    # the episodes of tasks whose setup raises were counted and set aside; the others were trained on
    failed = sum(line["errors/failed_episodes"] for line in lines)
    assert failed > 0, "the seed no longer draws a task whose setup raises; pick another broken_every"
    trajectories = recorder.trajectories
    assert len(trajectories) + failed == 2 * 2 * 2
    assert all(not t.errors for t in trajectories)

    from agent_r1.registry import get_registry

    options = {key: value for key, value in config["data"].items() if key != "name"}
    dataset = get_registry().build("datasets", "verifiers", options)
    task_of = {t.id: t for t in dataset.load("train")}
    env_tokens = compared = 0
    for trajectory in trajectories:
        env_tokens += assert_token_fidelity(trajectory, tokenizer)
        if trajectory.errors:
            continue
        calls = [c for s in trajectory.steps for c in s.action.tool_calls]
        if calls:  # a random model that wrote a well-formed call: its reply loses the call's span
            continue
        task = task_of[trajectory.task_id]
        recorded = {s.name: (s.value, s.weight) for s in trajectory.rewards}
        assert recorded == package_score(task, trajectory.steps[-1].action.text.strip(), [])
        compared += 1
    assert env_tokens > 0 and compared > 0


def check_config(tmp_path: Path, tiny_model_dir: Path, env_id: str) -> Path:
    config = run_config(
        tiny_model_dir,
        tmp_path / "run",
        data={"name": "verifiers", "env_id": env_id, "num_eval": 1},
        environment={"name": "verifiers", "env_id": env_id},
        rewards=[{"name": "verifiers"}],
        success_signal="correct",
        max_turns=3,
    )
    path = tmp_path / "check.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return path


def agent_r1_check(path: Path) -> tuple[int, list[dict[str, str]]]:
    from typer.testing import CliRunner

    from agent_r1.cli import app

    result = CliRunner().invoke(app, ["check", "--json", str(path)])
    start = result.output.index("[")
    return result.exit_code, json.loads(result.output[start:])


def failures(report: list[dict[str, str]]) -> str:
    return "\n".join(c["message"] for c in report if c["status"] == "fail")


def test_check_stops_on_a_missing_environment_or_package(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    code, report = agent_r1_check(check_config(tmp_path, tiny_model_dir, "someone/hubs-no-such-env"))
    assert code == 2
    message = failures(report)
    assert "the verifiers environment 'someone/hubs-no-such-env' is not installed" in message
    assert "prime env install someone/hubs-no-such-env" in message and "'hubs_no_such_env'" in message
    assert {c["name"] for c in report if c["status"] == "fail"} == {"data", "component"}
    assert not (tmp_path / "run").exists()

    monkeypatch.setitem(sys.modules, "verifiers", None)  # as if verifiers were not installed
    code, report = agent_r1_check(check_config(tmp_path, tiny_model_dir, ENV_ID))
    assert code == 2
    message = failures(report)
    assert "pip install 'agent-r1-plugin-hubs[verifiers]'" in message
    assert re.search(r"environment \(verifiers\) needs the verifiers package", message)
    assert not (tmp_path / "run").exists()


def test_check_refuses_what_agent_r1_cannot_play(tmp_path: Path, tiny_model_dir: Path) -> None:
    code, report = agent_r1_check(check_config(tmp_path, tiny_model_dir, "hubs-sandboxed"))
    assert code == 2
    message = failures(report)
    assert "needs a container (NEEDS_CONTAINER)" in message
    assert "BoxTask.setup needs a runtime" in message
    assert "the rewards ['tests_pass'] need a runtime" in message
    assert "['refused'] act on the model's Request/Response" in message
