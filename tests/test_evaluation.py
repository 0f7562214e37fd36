"""Evaluation summaries and Markdown reports (agent_r1.engine.reports.evaluation)."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent_r1.engine.reports.evaluation import (
    compare_markdown,
    eval_markdown,
    pass_at_k,
    summarize_eval,
    write_eval_report,
)
from agent_r1.mdp import (
    Action,
    Observation,
    RewardSignal,
    Step,
    Task,
    TokenSource,
    ToolCall,
    ToolResult,
    Trajectory,
)


def make_trajectory(
    task_id: str,
    index: int = 0,
    *,
    success: float | None = 1.0,
    tool_results: tuple[bool, ...] = (),
    parse_errors: int = 0,
    answered: bool = True,
    policy_tokens: int = 4,
    termination: str | None = "answer",
    truncated: bool = False,
    extra: dict[str, float] | None = None,
) -> Trajectory:
    """One trajectory: a tool turn when ``tool_results`` is given (True = ok), then an answer turn."""
    trajectory = Trajectory(
        id=f"{task_id}#{index}",
        task_id=task_id,
        group_id=task_id,
        sample_index=index,
        termination=termination,
        truncated=truncated,
    )
    trajectory.append(TokenSource.PROMPT, 0, [1, 2, 3])
    turn = 0
    if tool_results:
        calls = [ToolCall(id=f"c{i}", name="calculator") for i in range(len(tool_results))]
        results = [
            ToolResult(call_id=c.id, name="calculator", content="1", ok=ok, error=None if ok else "exception")
            for c, ok in zip(calls, tool_results, strict=True)
        ]
        trajectory.append(TokenSource.POLICY, turn, [7] * policy_tokens)
        trajectory.append(TokenSource.ENV, turn, [8, 8])
        trajectory.steps.append(
            Step(turn=turn, action=Action(tool_calls=calls), observation=Observation(tool_results=results))
        )
        turn += 1
    trajectory.append(TokenSource.POLICY, turn, [7] * policy_tokens)
    action = Action(
        text="<answer>x</answer>",
        answer="x" if answered else None,
        parse_errors=[f"error {i}" for i in range(parse_errors)],
    )
    trajectory.steps.append(Step(turn=turn, action=action, observation=Observation(done=True)))
    if success is not None:
        trajectory.rewards.append(RewardSignal(name="answer_match", value=success, source="answer_match"))
    for name, value in (extra or {}).items():
        trajectory.rewards.append(RewardSignal(name=name, value=value, weight=0.5, source=name))
    return trajectory


def tasks(*specs: tuple[str, str | None]) -> dict[str, Task]:
    return {
        task_id: Task(
            id=task_id, messages=[{"role": "user", "content": task_id}], answer="x", category=category
        )
        for task_id, category in specs
    }


# --------------------------------------------------------------------------------------------
# pass@k
# --------------------------------------------------------------------------------------------


def brute_force_pass_at_k(outcomes: list[bool], k: int) -> float:
    """Share of the k-subsets of the samples that hold at least one success."""
    subsets = list(itertools.combinations(outcomes, k))
    return sum(any(subset) for subset in subsets) / len(subsets)


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_pass_at_k_matches_brute_force(data: st.DataObject) -> None:
    n = data.draw(st.integers(1, 10))
    c = data.draw(st.integers(0, n))
    k = data.draw(st.integers(1, n))
    outcomes = [True] * c + [False] * (n - c)
    assert pass_at_k(n, c, k) == pytest.approx(brute_force_pass_at_k(outcomes, k), abs=1e-12)


def test_pass_at_k_edges() -> None:
    assert pass_at_k(5, 0, 3) == 0.0
    assert pass_at_k(5, 5, 1) == 1.0
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    with pytest.raises(ValueError, match="k <= n"):
        pass_at_k(3, 1, 4)
    with pytest.raises(ValueError, match="c <= n"):
        pass_at_k(3, 4, 1)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.lists(st.booleans(), min_size=1, max_size=5), min_size=1, max_size=5), st.integers(1, 5))
def test_summary_pass_at_k_averages_brute_force_over_tasks(outcomes: list[list[bool]], k: int) -> None:
    trajectories = [
        make_trajectory(f"t{t}", i, success=float(ok))
        for t, oks in enumerate(outcomes)
        for i, ok in enumerate(oks)
    ]
    summary = summarize_eval(trajectories, tasks(*[(f"t{t}", None) for t in range(len(outcomes))]), ks=(1, k))
    eligible = [oks for oks in outcomes if len(oks) >= k]
    if eligible:
        expected = sum(brute_force_pass_at_k(oks, k) for oks in eligible) / len(eligible)
        assert summary["pass_at_k"][f"pass@{k}"] == pytest.approx(expected)
    else:
        assert f"pass@{k}" not in summary["pass_at_k"]
    # pass@1 is the mean over tasks of each task's success rate
    assert summary["pass_at_k"]["pass@1"] == pytest.approx(
        sum(sum(oks) / len(oks) for oks in outcomes) / len(outcomes)
    )


# --------------------------------------------------------------------------------------------
# summarize_eval
# --------------------------------------------------------------------------------------------


@pytest.fixture
def summary() -> dict:
    task_map = tasks(("a1", "add"), ("a2", "add"), ("m1", "mul"), ("u1", None))
    trajectories = [
        make_trajectory("a1", 0, success=1.0, tool_results=(True,), extra={"tool_call": 0.1}),
        make_trajectory("a1", 1, success=0.0, tool_results=(True, False), parse_errors=2),
        make_trajectory("a2", 0, success=1.0, tool_results=(True,)),
        make_trajectory("a2", 1, success=1.0),
        make_trajectory("m1", 0, success=0.0, answered=False, termination="max_turns", truncated=True),
        make_trajectory("m1", 1, success=0.0, parse_errors=1, policy_tokens=12),
        make_trajectory("u1", 0, success=0.5),
        make_trajectory("u1", 1, success=1.0, termination=None),
    ]
    return summarize_eval(trajectories, task_map, ks=(1, 2))


def test_summary_success_and_categories(summary: dict) -> None:
    assert summary["num_trajectories"] == 8
    assert summary["num_tasks"] == 4
    assert summary["samples_per_task"] == {"min": 2, "max": 2}
    assert summary["successes"] == 4
    assert summary["success"] == pytest.approx(0.5)  # 0.5 is below the default threshold 1.0
    assert summary["categories"] == {
        "add": {
            "trajectories": 4,
            "tasks": 2,
            "successes": 3,
            "success": 0.75,
            "pass_at_k": pytest.approx({"pass@1": 0.75, "pass@2": 1.0}),
            "rewards": pytest.approx({"answer_match": 0.75, "tool_call": 0.1 / 4}),
            "turns_mean": 1.75,
            "tool_calls_mean": 1.0,
        },
        "mul": {
            "trajectories": 2,
            "tasks": 1,
            "successes": 0,
            "success": 0.0,
            "pass_at_k": {"pass@1": 0.0, "pass@2": 0.0},
            "rewards": {"answer_match": 0.0, "tool_call": 0.0},  # every signal, 0 where none was given
            "turns_mean": 1.0,
            "tool_calls_mean": 0.0,
        },
        "uncategorized": {
            "trajectories": 2,
            "tasks": 1,
            "successes": 1,
            "success": 0.5,
            "pass_at_k": {"pass@1": 0.5, "pass@2": 1.0},
            "rewards": {"answer_match": 0.75, "tool_call": 0.0},
            "turns_mean": 1.0,
            "tool_calls_mean": 0.0,
        },
    }
    assert summary["datasets"] == {}  # no category reads <dataset>/<type>
    # per task: a1 1/2, a2 2/2, m1 0/2, u1 1/2 -> pass@1 = mean(0.5, 1, 0, 0.5); pass@2 = mean(1, 1, 0, 1)
    assert summary["pass_at_k"] == pytest.approx({"pass@1": 0.5, "pass@2": 0.75})
    assert summary["warnings"] == []


def test_summary_rewards_and_behaviour(summary: dict) -> None:
    assert summary["rewards"] == pytest.approx({"answer_match": 4.5 / 8, "tool_call": 0.1 / 8})
    assert summary["score_mean"] == pytest.approx((4.5 + 0.05) / 8)
    assert summary["tool_use_rate"] == pytest.approx(3 / 8)
    assert summary["tool_calls_mean"] == pytest.approx(4 / 8)
    assert summary["tool_error_rate"] == pytest.approx(1 / 4)
    assert summary["format_error_rate"] == pytest.approx(2 / 8)
    assert summary["format_errors_mean"] == pytest.approx(3 / 8)
    assert summary["turns_mean"] == pytest.approx((2 + 2 + 2 + 1 + 1 + 1 + 1 + 1) / 8)
    assert summary["termination"] == {"answer": 6, "max_turns": 1, "unknown": 1}
    assert summary["truncation_rate"] == pytest.approx(1 / 8)
    # policy tokens: 4 per turn, 12 for the one long answer
    assert summary["response_length_mean"] == pytest.approx((8 + 8 + 8 + 4 + 4 + 12 + 4 + 4) / 8)


def qa_summary() -> dict:
    """Two datasets, one of them with two question types, scored with EM and F1 as QA rewards."""
    task_map = tasks(
        ("b1", "hotpotqa/bridge"),
        ("b2", "hotpotqa/bridge"),
        ("c1", "hotpotqa/comparison"),
        ("n1", "nq"),
    )

    def qa(task_id: str, index: int, em: float, f1: float, searches: int) -> Trajectory:
        trajectory = make_trajectory(task_id, index, success=None, tool_results=(True,) * searches)
        trajectory.rewards.append(RewardSignal(name="qa_em", value=em))
        trajectory.rewards.append(RewardSignal(name="qa_f1", value=f1))
        return trajectory

    trajectories = [
        qa("b1", 0, em=1.0, f1=1.0, searches=2),
        qa("b1", 1, em=0.0, f1=0.5, searches=1),
        qa("b2", 0, em=0.0, f1=0.0, searches=0),
        qa("b2", 1, em=0.0, f1=0.25, searches=3),
        qa("c1", 0, em=1.0, f1=1.0, searches=1),
        qa("c1", 1, em=1.0, f1=1.0, searches=1),
        qa("n1", 0, em=0.0, f1=0.4, searches=4),
        qa("n1", 1, em=1.0, f1=1.0, searches=0),
    ]
    return summarize_eval(trajectories, task_map, success_signal="qa_em", ks=(1, 2))


def test_summary_per_dataset_rewards_turns_and_tool_calls() -> None:
    summary = qa_summary()
    bridge = summary["categories"]["hotpotqa/bridge"]
    assert bridge["rewards"] == pytest.approx({"qa_em": 0.25, "qa_f1": 1.75 / 4})
    assert bridge["tool_calls_mean"] == pytest.approx(6 / 4)
    assert bridge["turns_mean"] == pytest.approx(7 / 4)  # a search turn, then the answer turn
    assert set(summary["datasets"]) == {"hotpotqa", "nq"}
    hotpot, nq = summary["datasets"]["hotpotqa"], summary["datasets"]["nq"]
    assert hotpot["categories"] == ["hotpotqa/bridge", "hotpotqa/comparison"]
    assert nq["categories"] == ["nq"]
    assert (hotpot["tasks"], hotpot["trajectories"], hotpot["successes"]) == (3, 6, 3)
    assert hotpot["success"] == pytest.approx(0.5)
    assert hotpot["rewards"] == pytest.approx({"qa_em": 3 / 6, "qa_f1": 3.75 / 6})
    assert hotpot["pass_at_k"] == pytest.approx({"pass@1": 0.5, "pass@2": 2 / 3})
    assert hotpot["tool_calls_mean"] == pytest.approx(8 / 6)
    assert hotpot["turns_mean"] == pytest.approx(11 / 6)
    assert nq["rewards"] == pytest.approx({"qa_em": 0.5, "qa_f1": 0.7})
    assert (nq["tool_calls_mean"], nq["turns_mean"]) == (2.0, 1.5)
    # the per-dataset means are trajectory-weighted, like the overall ones
    overall_em = sum(d["rewards"]["qa_em"] * d["trajectories"] for d in summary["datasets"].values()) / 8
    assert overall_em == pytest.approx(summary["rewards"]["qa_em"])
    assert json.loads(json.dumps(summary)) == summary


def test_eval_markdown_table_by_dataset() -> None:
    text = eval_markdown(qa_summary())
    lines = text.splitlines()
    header = (
        "| {} | tasks | trajectories | success | qa_em | qa_f1 | turns / episode | tool calls / episode |"
    )
    by_dataset = lines.index("## By dataset")
    by_category = lines.index("## By category")
    assert by_dataset < by_category
    assert lines[by_dataset + 2] == header.format("dataset")
    assert "| hotpotqa | 3 | 6 | 50.0% | 0.500 | 0.625 | 1.83 | 1.33 |" in lines[by_dataset:by_category]
    assert "| nq | 1 | 2 | 50.0% | 0.500 | 0.700 | 1.50 | 2.00 |" in lines[by_dataset:by_category]
    assert lines[by_category + 2] == header.format("category")
    assert "| hotpotqa/bridge | 2 | 4 | 25.0% | 0.250 | 0.438 | 1.75 | 1.50 |" in lines[by_category:]


def test_summary_is_json_ready(summary: dict) -> None:
    assert json.loads(json.dumps(summary)) == summary


def test_success_threshold_and_signal() -> None:
    task_map = tasks(("t", None))
    trajectories = [
        make_trajectory("t", 0, success=0.6, extra={"f1": 0.6}),
        make_trajectory("t", 1, success=0.4, extra={"f1": 0.4}),
    ]
    assert summarize_eval(trajectories, task_map, success_threshold=0.5)["success"] == 0.5
    assert (
        summarize_eval(trajectories, task_map, success_signal="f1", success_threshold=0.3)["success"] == 1.0
    )


def test_missing_signal_and_short_tasks_are_reported() -> None:
    task_map = tasks(("t1", None), ("t2", None))
    trajectories = [
        make_trajectory("t1", 0, success=None),
        make_trajectory("t2", 0),
        make_trajectory("t2", 1),
    ]
    result = summarize_eval(trajectories, task_map, ks=(1, 2, 4))
    assert result["success"] == pytest.approx(2 / 3)
    assert any("1 of 3 trajectories have no 'answer_match'" in w for w in result["warnings"])
    assert any(w.startswith("pass@2: 1 task(s)") for w in result["warnings"])
    assert result["pass_at_k"] == {"pass@1": 0.5, "pass@2": 1.0}  # pass@2 only over t2; no task has 4


def test_unknown_task_and_bad_k() -> None:
    with pytest.raises(KeyError, match="'ghost'"):
        summarize_eval([make_trajectory("ghost")], tasks(("t", None)))
    with pytest.raises(ValueError, match=">= 1"):
        summarize_eval([], {}, ks=(0,))


def test_empty_summary() -> None:
    result = summarize_eval([], {})
    assert result["success"] == 0.0
    assert result["num_trajectories"] == 0
    assert result["pass_at_k"] == {}
    assert result["termination"] == {}
    assert "Success" in eval_markdown(result)


# --------------------------------------------------------------------------------------------
# Markdown and files
# --------------------------------------------------------------------------------------------


def test_eval_markdown(summary: dict) -> None:
    text = eval_markdown(summary)
    assert "**Success (answer_match ≥ 1): 50.0%**" in text
    assert "| pass@1 | pass@2 |" in text
    assert "| add | 2 | 4 | 75.0% | 0.750 | 0.025 | 1.75 | 1.00 |" in text
    assert "## By dataset" not in text  # the categories name no datasets
    assert "| uncategorized | 1 | 2 | 50.0% |" in text
    assert "| tool-use rate | 37.5% |" in text
    assert "| max_turns | 1 |" in text
    assert "| tool_call | 0.013 |" in text


def test_compare_markdown_deltas(summary: dict) -> None:
    after = json.loads(json.dumps(summary))  # as the runner reads eval_before.json back
    before = json.loads(json.dumps(summary))
    before["success"] = 0.25
    before["categories"]["add"]["success"] = 0.5
    del before["categories"]["mul"]
    before["turns_mean"] = 1.0
    text = compare_markdown(before, after)
    lines = text.splitlines()
    assert "| metric | before | after | Δ |" in lines
    assert "| success (overall) | 25.0% | 50.0% | +25.0 pp |" in lines
    assert "| success: add (n=2) | 50.0% | 75.0% | +25.0 pp |" in lines
    assert "| success: mul (n=1) | – | 0.0% | – |" in lines
    assert "| pass@2 | 75.0% | 75.0% | +0.0 pp |" in lines
    assert "| turns per episode | 1.00 | 1.38 | +0.38 |" in lines


def test_write_eval_report(summary: dict, tmp_path: Path) -> None:
    json_path, md_path = write_eval_report(summary, tmp_path / "eval_after")
    assert json.loads(json_path.read_text(encoding="utf-8")) == summary
    assert md_path.read_text(encoding="utf-8") == eval_markdown(summary)
    assert {p.name for p in (tmp_path / "eval_after").iterdir()} == {"eval.json", "eval.md"}


def test_tool_calls_count_what_ran() -> None:
    trajectory = make_trajectory("t", 0)
    # a call written next to the final answer is ignored by the environment (no result): not tool use
    trajectory.steps[-1].action.tool_calls = [ToolCall(id="late", name="calculator")]
    # a step cut short before the environment answered still counts the calls it made
    cut = make_trajectory("t", 1)
    cut.steps[-1].action.tool_calls = [ToolCall(id="c", name="calculator")]
    cut.steps[-1].observation = None
    result = summarize_eval([trajectory, cut], tasks(("t", None)))
    assert result["tool_calls_mean"] == 0.5
    assert result["tool_use_rate"] == 0.5
    assert result["tool_error_rate"] == 0.0


def test_the_report_says_how_answers_were_normalised() -> None:
    from agent_r1.builtins.rewards import AnswerMatchReward
    from agent_r1.rewards import answer_normalizations

    shapers = [AnswerMatchReward({"mode": "exact"}), AnswerMatchReward({"mode": "numeric"})]
    assert answer_normalizations(shapers) == {"answer_match": "official"}  # numeric normalises nothing
    summary = {"success": 0.5, "successes": 1, "num_trajectories": 2, "num_tasks": 2}
    markdown = eval_markdown({**summary, "answer_normalization": {"qa_em": "official"}})
    assert "Answers normalised as: qa_em: official" in markdown
    assert "normalised" not in eval_markdown(summary)


def test_datasets_named_in_task_metadata_get_their_own_table() -> None:
    """Tasks whose categories have no '/' but whose metadata names a dataset (HumanEval, MBPP) are
    summarised per dataset too."""
    from agent_r1.mdp import RewardSignal, Task, Trajectory

    tasks = {
        f"{name}{i}": Task(id=f"{name}{i}", messages=[], category=name, metadata={"dataset": name})
        for name in ("humaneval", "mbpp")
        for i in range(2)
    }
    trajectories = []
    for task_id in tasks:
        for sample in range(2):
            t = Trajectory(id=f"{task_id}/{sample}", task_id=task_id, group_id=task_id, sample_index=sample)
            solved = task_id.startswith("humaneval") and sample == 0
            t.rewards.append(RewardSignal(name="code_solved", value=float(solved)))
            trajectories.append(t)
    summary = summarize_eval(trajectories, tasks, success_signal="code_solved", ks=(1, 2))
    assert set(summary["datasets"]) == {"humaneval", "mbpp"}
    assert summary["datasets"]["humaneval"]["pass_at_k"] == {"pass@1": 0.5, "pass@2": 1.0}
    assert summary["datasets"]["mbpp"]["success"] == 0.0


def test_pass_k_is_configurable_and_greedy_repeats_are_warned_about() -> None:
    from agent_r1.config import EvalConfig

    assert EvalConfig(samples=100, temperature=0.8, pass_k=[1, 10, 100]).pass_k == [1, 10, 100]
    with pytest.warns(UserWarning, match="every sample of a task is the same"):
        EvalConfig(samples=4, temperature=0.0)
