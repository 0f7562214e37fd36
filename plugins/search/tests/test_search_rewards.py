"""Reward shapers on hand-built trajectories: answers, aliases, format, and process rewards read
from observation info or parsed from result text."""

from __future__ import annotations

import pytest

from agent_r1 import Action, Observation, Step, Task, ToolCall, ToolResult, Trajectory
from agent_r1_plugin_search.rewards import (
    AnswerFormatReward,
    ExactMatchReward,
    F1Reward,
    GoldRetrievalReward,
    SubstringReward,
    ValidSearchReward,
    final_answer,
)
from agent_r1_plugin_search.tool import format_hits, titles_from_text

GOLD = ["Miquette Giraudy", "Giraudy"]


def _task(answer=GOLD, titles=("A (film)", "B")) -> Task:
    return Task(
        id="t",
        messages=[{"role": "user", "content": "q"}],
        answer=answer,
        metadata={"supporting_titles": list(titles)},
    )


def _search_step(turn: int, query: str, titles: list[str], *, ok: bool = True, info: bool = True) -> Step:
    call = ToolCall(id=f"c{turn}", name="search", arguments={"query": query})
    content = (
        "\n".join(f"Doc {i} (Title: {t}) text" for i, t in enumerate(titles, 1)) if ok else "Error: boom"
    )
    result = ToolResult(call_id=call.id, name="search", content=content, ok=ok)
    records = [{"query": query, "ids": titles, "titles": titles, "scores": [1.0] * len(titles)}] if ok else []
    observation = Observation(tool_results=[result], info={"search": records} if info else {})
    return Step(
        turn=turn, action=Action(text=f"<search>{query}</search>", tool_calls=[call]), observation=observation
    )


def _answer_step(
    turn: int, answer: str | None, text: str | None = None, errors: list[str] | None = None
) -> Step:
    action = Action(text=text if text is not None else f"<answer>{answer}</answer>", answer=answer)
    action.parse_errors = errors or []
    return Step(turn=turn, action=action, observation=Observation(done=True, termination="answer"))


def _trajectory(*steps: Step) -> Trajectory:
    return Trajectory(id="x", task_id="t", steps=list(steps))


def _values(shaper, trajectory: Trajectory, task: Task | None = None) -> list[tuple[int | None, float]]:
    signals = shaper.score(trajectory, task or _task())
    assert all(s.source == shaper.name and s.name == shaper.name for s in signals)
    return [(s.turn, s.value) for s in signals]


@pytest.mark.parametrize(
    ("answer", "em", "f1", "sub"),
    [
        ("Miquette Giraudy", 1.0, 1.0, 1.0),
        ("the giraudy.", 1.0, 1.0, 1.0),  # article, case, punctuation; second alias
        ("Miquette", 0.0, pytest.approx(2 / 3), 0.0),  # best alias: 'miquette giraudy' -> P=1, R=1/2
        ("It is Miquette Giraudy", 0.0, pytest.approx(2 / 3), 1.0),
        ("", 0.0, 0.0, 0.0),
    ],
)
def test_answer_rewards(answer: str, em: float, f1, sub: float) -> None:
    trajectory = _trajectory(_answer_step(0, answer))
    assert _values(ExactMatchReward(), trajectory) == [(None, em)]
    assert _values(F1Reward(), trajectory) == [(None, f1)]
    assert _values(SubstringReward(), trajectory) == [(None, sub)]
    assert all(s.kind == "outcome" for s in F1Reward().score(trajectory, _task()))


def test_no_answer_scores_zero_and_no_gold_gives_no_signal() -> None:
    trajectory = _trajectory(_search_step(0, "q", ["B"]))
    assert _values(ExactMatchReward(), trajectory) == [(None, 0.0)]
    assert _values(AnswerFormatReward(), trajectory) == [(None, 0.0)]
    assert _values(ExactMatchReward(), _trajectory(_answer_step(0, "x")), _task(answer=None)) == []


def test_final_answer_is_the_last_actions() -> None:
    # the format's parsed answer of the last step (agent_r1.rewards.final_answer); tags in the text
    # that no format parsed are not an answer
    assert final_answer(_trajectory(_answer_step(0, "parsed", text="<answer>text</answer>"))) == "parsed"
    unparsed = _trajectory(_answer_step(0, None, text="<answer>one</answer> then <answer> two </answer>"))
    assert final_answer(unparsed) is None
    assert final_answer(_trajectory()) is None


def test_normalization_and_accents_options() -> None:
    trajectory = _trajectory(_answer_step(0, "Rene"))
    task = _task(answer=["René"])
    assert _values(ExactMatchReward(), trajectory, task) == [(None, 0.0)]  # official: accents kept
    assert _values(ExactMatchReward({"normalization": "robust"}), trajectory, task) == [(None, 1.0)]
    robust_with_accents = ExactMatchReward({"normalization": "robust", "keep_accents": True})
    assert _values(robust_with_accents, trajectory, task) == [(None, 0.0)]


def test_no_process_reward_for_a_search_the_agent_never_saw() -> None:
    # The last turn allowed (max_turns) runs its search, but the episode ends there: the agent never
    # reads the results, so neither process reward pays for it.
    last = _search_step(1, "Miquette Giraudy", ["A (film)", "B"])
    last.observation.done, last.observation.termination = True, "max_turns"
    trajectory = _trajectory(_search_step(0, "Green album", ["Other"]), last)
    assert _values(ValidSearchReward(), trajectory) == [(0, 1.0)]
    assert _values(GoldRetrievalReward(), trajectory) == []


def test_format_reward() -> None:
    good = _trajectory(_search_step(0, "q", ["B"]), _answer_step(1, "Giraudy"))
    assert _values(AnswerFormatReward(), good) == [(None, 1.0)]
    long_answer = _trajectory(_answer_step(0, " ".join(["word"] * 21)))
    assert _values(AnswerFormatReward(), long_answer) == [(None, 0.0)]
    assert _values(AnswerFormatReward({"max_answer_words": 30}), long_answer) == [(None, 1.0)]
    messy = _trajectory(_answer_step(0, "Giraudy", errors=["tool call 1: invalid JSON"]))
    assert _values(AnswerFormatReward(), messy) == [(None, 0.0)]
    assert _values(AnswerFormatReward({"allow_parse_errors": True}), messy) == [(None, 1.0)]
    assert _values(AnswerFormatReward(), _trajectory(_answer_step(0, "  "))) == [(None, 0.0)]


def test_valid_search_rewards_new_queries_only_and_is_capped() -> None:
    trajectory = _trajectory(
        _search_step(0, "Green album", ["X"]),
        _search_step(1, "green  ALBUM?", ["X"]),  # the same query again: no reward
        _search_step(2, "Steve Hillage spouse", [], ok=False),  # failed call: no reward
        _search_step(3, "Steve Hillage", ["Y"]),
        _search_step(4, "Miquette Giraudy", ["Z"]),
        _answer_step(5, "Giraudy"),
    )
    assert _values(ValidSearchReward(), trajectory) == [(0, 1.0), (3, 1.0), (4, 1.0)]
    assert _values(ValidSearchReward({"max_rewarded_turns": 2}), trajectory) == [(0, 1.0), (3, 1.0)]
    assert all(s.kind == "process" for s in ValidSearchReward().score(trajectory, _task()))


def test_gold_retrieval_counts_each_gold_paragraph_once() -> None:
    trajectory = _trajectory(
        _search_step(0, "q0", ["Other", "a (FILM)"]),  # title match ignores case and spacing
        _search_step(1, "q1", ["A (film)"]),  # already found: nothing new
        _search_step(2, "q2", ["B", "A (film)"]),
        _answer_step(3, "x"),
    )
    assert _values(GoldRetrievalReward(), trajectory) == [(0, 0.5), (2, 0.5)]
    assert _values(GoldRetrievalReward(), trajectory, _task(titles=())) == []


def test_gold_retrieval_falls_back_to_result_text() -> None:
    steps = [_search_step(0, "q", ["A (film)", "B"], info=False)]
    assert "search" not in steps[0].observation.info
    assert _values(GoldRetrievalReward(), _trajectory(*steps)) == [(0, 1.0)]


def test_result_text_round_trip() -> None:
    from agent_r1_plugin_search.corpus import Hit

    hits = [Hit("1", "Tinted Windows (band)", "Text  with\nnewlines.", 3.0), Hit("2", "Solo", "x" * 50, 1.0)]
    text = format_hits(hits, max_passage_chars=20)
    assert text.splitlines() == [
        "Doc 1 (Title: Tinted Windows (band)) Text with newlines.",
        "Doc 2 (Title: Solo) xxxxxxxxxxxxxxxxxxxx ...",
    ]
    assert titles_from_text(text) == ["Tinted Windows (band)", "Solo"]
    assert format_hits([]) == "No results found. Try different keywords."
