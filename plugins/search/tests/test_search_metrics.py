"""The search plugin's answer rewards are the core's answer metrics: ``qa_em`` / ``qa_f1`` /
``qa_substring`` and the core's ``answer_match`` (modes ``exact`` / ``f1`` / ``substring``) give the
same value on the same trajectory, under both normalisations, and the plugin has no metric code of
its own left."""

from __future__ import annotations

import importlib.util

import pytest

from agent_r1 import Action, Observation, Step, Task, ToolCall, ToolResult, Trajectory
from agent_r1.builtins.rewards import AnswerMatchReward
from agent_r1_plugin_search.rewards import ExactMatchReward, F1Reward, SubstringReward

# Answers on which the official and robust normalisations, the old plugin metrics and the core
# disagreed: accents, NFKC forms, Unicode punctuation, article-only and empty answers, yes/no.
CASES = [
    ("Rene Magritte", ["René Magritte"]),
    ("Tokyo", ["Ｔｏｋｙｏ"]),
    ("Quoted", ["“Quoted”"]),
    ("1990-1991", ["1990–1991"]),
    ("", ["The"]),
    ("the the", ["The The"]),
    ("no it is not", ["no"]),
    ("It is Miquette Giraudy", ["Miquette Giraudy", "Giraudy"]),
    ("Miquette", ["Miquette Giraudy"]),
    ("12", ["12.0"]),
]


def _trajectory(answer: str, *, earlier_answer: str | None = None) -> Trajectory:
    """A search turn, then the answer turn (optionally an answer given in the search turn too)."""
    call = ToolCall(id="c0", name="search", arguments={"query": "q"})
    search = Step(
        turn=0,
        action=Action(text="<search>q</search>", tool_calls=[call], answer=earlier_answer),
        observation=Observation(
            tool_results=[ToolResult(call_id="c0", name="search", content="Doc 1 (Title: T) x")]
        ),
    )
    final = Step(
        turn=1,
        action=Action(text=f"<answer>{answer}</answer>", answer=answer),
        observation=Observation(done=True, termination="answer"),
    )
    return Trajectory(id="x", task_id="t", steps=[search, final])


@pytest.mark.parametrize("normalization", ["official", "robust"])
@pytest.mark.parametrize(("answer", "gold"), CASES)
def test_qa_rewards_agree_with_answer_match(normalization: str, answer: str, gold: list[str]) -> None:
    task = Task(id="t", messages=[{"role": "user", "content": "q"}], answer=gold)
    trajectory = _trajectory(answer)
    for plugin_shaper, mode in (
        (ExactMatchReward, "exact"),
        (F1Reward, "f1"),
        (SubstringReward, "substring"),
    ):
        (ours,) = plugin_shaper({"normalization": normalization}).score(trajectory, task)
        (core,) = AnswerMatchReward({"mode": mode, "normalization": normalization}).score(trajectory, task)
        assert ours.value == core.value, (plugin_shaper.name, mode, answer, gold)


def test_defaults_agree_and_are_official() -> None:
    task = Task(id="t", messages=[{"role": "user", "content": "q"}], answer=["René Magritte"])
    trajectory = _trajectory("Rene Magritte")
    assert ExactMatchReward().config.normalization == AnswerMatchReward().config.normalization == "official"
    (ours,) = ExactMatchReward().score(trajectory, task)
    (core,) = AnswerMatchReward().score(trajectory, task)
    assert ours.value == core.value == 0.0  # the official scripts keep accents


def test_the_final_answer_is_the_cores() -> None:
    # An answer in an earlier step that did not end the episode does not count for either shaper.
    task = Task(id="t", messages=[{"role": "user", "content": "q"}], answer=["Paris"])
    trajectory = _trajectory("Lyon", earlier_answer="Paris")
    (ours,) = ExactMatchReward().score(trajectory, task)
    (core,) = AnswerMatchReward().score(trajectory, task)
    assert ours.value == core.value == 0.0


def test_the_plugin_has_no_metric_module_of_its_own() -> None:
    assert importlib.util.find_spec("agent_r1_plugin_search.metrics") is None
    import agent_r1.rewards
    import agent_r1_plugin_search

    assert agent_r1_plugin_search.exact_match is agent_r1.rewards.exact_match
    assert agent_r1_plugin_search.final_answer is agent_r1.rewards.final_answer


def test_eval_report_can_name_the_normalisation() -> None:
    from agent_r1.rewards import answer_normalizations

    shapers = [ExactMatchReward(), F1Reward({"normalization": "robust"}), AnswerMatchReward()]
    assert answer_normalizations(shapers) == {
        "qa_em": "official",
        "qa_f1": "robust",
        "answer_match": "official",
    }
