"""Answer metrics (agent_r1.rewards) and the bundled reward shapers (agent_r1.builtins.rewards)."""

from __future__ import annotations

import re
import string
from collections import Counter
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from agent_r1.builtins.rewards import (
    SHAPERS,
    AnswerMatchReward,
    FormatReward,
    OverlongReward,
    ToolCallReward,
)
from agent_r1.mdp import Action, Observation, Step, Task, TokenSource, ToolCall, ToolResult, Trajectory
from agent_r1.rewards import (
    answer_normalizations,
    exact_match,
    f1_score,
    final_answer,
    normalize_answer,
    numeric_match,
    parse_number,
    substring_match,
)

# --------------------------------------------------------------------------------------------
# Hand-built trajectories
# --------------------------------------------------------------------------------------------


def _turn(
    *,
    answer: str | None = None,
    ok: int = 0,
    failed: int = 0,
    parse_errors: int = 0,
    policy_tokens: int = 3,
) -> dict[str, Any]:
    return {
        "answer": answer,
        "ok": ok,
        "failed": failed,
        "parse_errors": parse_errors,
        "policy_tokens": policy_tokens,
    }


def make_trajectory(turns: list[dict[str, Any]], *, truncated: bool = False) -> Trajectory:
    """A trajectory with a 4-token prompt and, per turn, policy tokens, tool calls and results."""
    trajectory = Trajectory(id="tr", task_id="task", truncated=truncated)
    trajectory.append(TokenSource.PROMPT, 0, [1, 2, 3, 4])
    for turn, spec in enumerate(turns):
        n_calls = spec["ok"] + spec["failed"]
        trajectory.append(
            TokenSource.POLICY, turn, [5] * spec["policy_tokens"], [-0.5] * spec["policy_tokens"]
        )
        calls = [ToolCall(id=f"c{turn}.{i}", name="calculator", arguments={"x": i}) for i in range(n_calls)]
        results = [
            ToolResult(
                call_id=call.id,
                name="calculator",
                content="42" if i < spec["ok"] else "error",
                ok=i < spec["ok"],
                error=None if i < spec["ok"] else "exception",
            )
            for i, call in enumerate(calls)
        ]
        action = Action(
            text="...",
            answer=spec["answer"],
            tool_calls=calls,
            parse_errors=[f"bad call {i}" for i in range(spec["parse_errors"])],
        )
        observation = None
        if results or spec["parse_errors"]:
            trajectory.append(TokenSource.ENV, turn, [9, 9])
            observation = Observation(tool_results=results)
        trajectory.steps.append(Step(turn=turn, action=action, observation=observation))
    return trajectory


TASK = Task(id="task", messages=[{"role": "user", "content": "q"}], answer="Paris")


# --------------------------------------------------------------------------------------------
# Normalisation and metrics
# --------------------------------------------------------------------------------------------


# The official HotpotQA / SQuAD v1.1 definitions, transcribed from their evaluation scripts
# (hotpot_evaluate_v1.py; SQuAD's evaluate-v1.1.py has the same normalize_answer and, without the
# yes/no rule, the same f1_score) as the reference the "official" normalisation must equal.


def official_normalize(text: str) -> str:
    text = text.lower()
    text = "".join(ch for ch in text if ch not in set(string.punctuation))
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def official_f1(prediction: str, truth: str) -> float:
    predicted, expected = official_normalize(prediction), official_normalize(truth)
    if predicted in ("yes", "no", "noanswer") and predicted != expected:
        return 0.0
    if expected in ("yes", "no", "noanswer") and predicted != expected:
        return 0.0
    predicted_tokens, expected_tokens = predicted.split(), expected.split()
    same = sum((Counter(predicted_tokens) & Counter(expected_tokens)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(predicted_tokens), same / len(expected_tokens)
    return 2 * precision * recall / (precision + recall)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("The Eiffel Tower!", "eiffel tower"),
        ("  a  cat,   an apple and THE dog. ", "cat apple and dog"),
        ("Paris", "paris"),
        ("１２３", "123"),  # full-width digits (NFKC)
        ("“Quoted” — text…", "quoted text"),  # Unicode punctuation
        ("ﬁne", "fine"),  # ligature (NFKC)
        ("New\u00a0York", "new york"),  # non-breaking space
        ("Galați", "galati"),  # accents folded
        ("Małgorzata Braunek", "małgorzata braunek"),  # ł does not decompose: kept
        ("The The", "the the"),  # made only of articles: keeps them
        ("theatre", "theatre"),  # articles only as whole words
        (None, ""),
        (12, "12"),
    ],
)
def test_normalize_answer_robust(text: Any, expected: str) -> None:
    assert normalize_answer(text, "robust") == expected


def test_robust_can_keep_accents() -> None:
    assert normalize_answer("René", "robust", keep_accents=True) == "rené"
    assert exact_match("Rene", "René", normalization="robust") == 1.0
    assert exact_match("Rene", "René", normalization="robust", keep_accents=True) == 0.0


# Each pair on which the two normalisations disagree, with the official scripts' verdict. These are
# the differences that change scores for a few percent of HotpotQA / 2Wiki / MuSiQue gold answers.
OFFICIAL_VS_ROBUST = [
    # (prediction, gold, official EM, robust EM)
    ("Rene", "René", 0.0, 1.0),  # accents: kept by the scripts
    ("Galati", "Galați", 0.0, 1.0),
    ("Tokyo", "Ｔｏｋｙｏ", 0.0, 1.0),  # full-width letters: no NFKC in the scripts
    ("final", "ﬁnal", 0.0, 1.0),  # ligature
    ("Quoted", "“Quoted”", 0.0, 1.0),  # curly quotes are not in string.punctuation
    ("rock and roll", "rock ’n’ roll", 0.0, 0.0),
    ("1990-1991", "1990–1991", 0.0, 1.0),  # en dash: kept by the scripts, dropped like "-" by robust
    ("", "The", 1.0, 0.0),  # article-only gold: "" in the scripts, so an empty answer matches
    ("", "...", 1.0, 0.0),  # punctuation-only gold
    ("the the", "The The", 1.0, 1.0),  # the band: both normalise the same on each side
    ("", "The The", 1.0, 0.0),
    ("The", "a", 1.0, 0.0),  # two article-only answers: equal in the scripts
]


@pytest.mark.parametrize(("prediction", "gold", "official", "robust"), OFFICIAL_VS_ROBUST)
def test_official_and_robust_exact_match(prediction: str, gold: str, official: float, robust: float) -> None:
    assert exact_match(prediction, gold, normalization="official") == official
    assert exact_match(prediction, gold) == official  # official is the default
    assert official == float(official_normalize(prediction) == official_normalize(gold))
    assert exact_match(prediction, gold, normalization="robust") == robust


@pytest.mark.parametrize(("prediction", "gold", "_official", "_robust"), OFFICIAL_VS_ROBUST)
def test_official_f1_matches_the_script(prediction: str, gold: str, _official: float, _robust: float) -> None:
    assert f1_score(prediction, gold, normalization="official") == pytest.approx(
        official_f1(prediction, gold)
    )


@settings(max_examples=400, deadline=None)
@given(st.text(max_size=40))
def test_official_normalisation_is_the_scripts(text: str) -> None:
    assert normalize_answer(text, "official") == official_normalize(text)


# Text drawn from the characters where the definitions differ: letters with accents, full-width and
# ligature forms, Unicode punctuation and spaces, articles.
_TRICKY = st.text(
    alphabet=st.sampled_from([*"abte nyoAT.,;'\"-", "é", "ț", "ł", "ﬁ", "Ｔ", "“", "”", "—", "–", "\u00a0"]),
    max_size=25,
)


@settings(max_examples=400, deadline=None)
@given(_TRICKY, st.lists(_TRICKY, min_size=1, max_size=3))
def test_official_metrics_equal_the_scripts(prediction: str, aliases: list[str]) -> None:
    expected_em = max(float(official_normalize(prediction) == official_normalize(a)) for a in aliases)
    expected_f1 = max(official_f1(prediction, a) for a in aliases)
    assert exact_match(prediction, aliases, normalization="official") == expected_em
    assert f1_score(prediction, aliases, normalization="official") == pytest.approx(expected_f1)


def test_unknown_normalization_is_an_error() -> None:
    with pytest.raises(ValueError, match="unknown answer normalization 'squad'"):
        normalize_answer("x", "squad")  # type: ignore[arg-type]


@pytest.mark.parametrize("normalization", ["official", "robust"])
@settings(max_examples=300, deadline=None)
@given(text=st.text())
def test_normalize_answer_is_idempotent(normalization: Any, text: str) -> None:
    once = normalize_answer(text, normalization)
    assert normalize_answer(once, normalization) == once
    assert once == once.strip()
    assert "  " not in once


@pytest.mark.parametrize("normalization", ["official", "robust"])
@settings(max_examples=200, deadline=None)
@given(a=st.text(max_size=30), b=st.text(max_size=30))
def test_f1_is_symmetric_and_bounded(normalization: Any, a: str, b: str) -> None:
    forward = f1_score(a, b, normalization=normalization)
    backward = f1_score(b, a, normalization=normalization)
    assert 0.0 <= forward <= 1.0
    assert forward == pytest.approx(backward)


@pytest.mark.parametrize("normalization", ["official", "robust"])
@settings(max_examples=200, deadline=None)
@given(prediction=st.text(max_size=30), aliases=st.lists(st.text(max_size=20), max_size=3))
def test_exact_match_implies_full_f1_and_substring(
    normalization: Any, prediction: str, aliases: list[str]
) -> None:
    if exact_match(prediction, aliases, normalization=normalization) == 1.0 and normalize_answer(
        prediction, normalization
    ):
        assert f1_score(prediction, aliases, normalization=normalization) == pytest.approx(1.0)
        assert substring_match(prediction, aliases, normalization=normalization) == 1.0


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.characters(categories=["L", "N", "Zs"]), min_size=1, max_size=30))
def test_text_matches_itself(text: str) -> None:
    expected = float(bool(normalize_answer(text, "robust")))
    assert exact_match(text, text, normalization="robust") == expected
    assert f1_score(text, text, normalization="robust") == pytest.approx(expected)
    assert exact_match(text, text, normalization="official") == 1.0


def test_exact_match_aliases_and_values() -> None:
    assert exact_match("the paris", ["London", "Paris"]) == 1.0
    assert exact_match("Lyon", ["London", "Paris"]) == 0.0
    assert exact_match("10,063", 10063) == 1.0  # punctuation is dropped
    assert exact_match("12", 12.0) == 1.0  # integer-valued float gold
    assert exact_match("", "", normalization="robust") == 0.0  # robust: an empty answer never matches
    assert exact_match("", ".", normalization="robust") == 0.0
    assert exact_match("", "") == 1.0  # the scripts compare "" with ""
    assert exact_match(None, "Paris") == 0.0  # no answer at all
    assert exact_match("Paris", None) == 0.0


def test_f1_score_values() -> None:
    # prediction "eiffel tower paris" vs "eiffel tower": precision 2/3, recall 1 -> F1 0.8
    assert f1_score("the Eiffel Tower, Paris", "Eiffel Tower") == pytest.approx(0.8)
    assert f1_score("Lyon", "Paris") == 0.0
    assert f1_score("x", ["no", "x y"]) == pytest.approx(2 / 3)  # best alias
    assert f1_score("", "") == 0.0  # no common token, as in the scripts
    assert f1_score("new new york", "new york") == pytest.approx(2 * (2 / 3) / (2 / 3 + 1))


@pytest.mark.parametrize("normalization", ["official", "robust"])
def test_f1_yes_no_is_all_or_nothing(normalization: Any) -> None:
    assert f1_score("yes", "no", normalization=normalization) == 0.0
    assert f1_score("no it is not", "no", normalization=normalization) == 0.0  # HotpotQA's rule
    assert f1_score("No.", "no", normalization=normalization) == 1.0


def test_substring_match_word_boundaries() -> None:
    assert substring_match("Tulsa, Oklahoma", "Tulsa") == 1.0
    assert substring_match("Tulsan", "Tulsa") == 0.0
    assert substring_match("in New York City", ["Boston", "new york"]) == 1.0
    assert substring_match("anything", "the", normalization="robust") == 0.0  # "the" is absent
    assert substring_match("anything", "the") == 0.0  # official: "the" normalises to nothing
    assert substring_match("anything", ".") == 0.0  # an empty alias never matches
    assert substring_match("Galati, Romania", "Galați", normalization="robust") == 1.0
    assert substring_match("Galati, Romania", "Galați") == 0.0


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("42", 42.0),
        ("$1,234.50", 1234.5),
        ("The answer is 10063.", 10063.0),
        ("347 x 29 = 10,063", 10063.0),  # the last number counts
        ("3/4", 0.75),
        ("-5", -5.0),
        ("\u22125 degrees", -5.0),  # Unicode minus
        ("5-10", 10.0),  # a hyphen after a digit is not a sign
        ("12%", 12.0),
        ("1e3", 1000.0),
        ("１２", 12.0),
        ("no number", None),
        ("1/0", None),
        (7, 7.0),
        (True, None),
        (None, None),
        (float("nan"), None),
    ],
)
def test_parse_number(text: Any, expected: float | None) -> None:
    assert parse_number(text) == expected


def test_numeric_match() -> None:
    assert numeric_match("10,063 pencils", 10063) == 1.0
    assert numeric_match("10063.0", "10063") == 1.0
    assert numeric_match("0.3333333", "1/3", rel_tol=1e-6) == 1.0
    assert numeric_match("0.33", "1/3", rel_tol=1e-6) == 0.0
    assert numeric_match("0.33", "1/3", rel_tol=0.05) == 1.0
    assert numeric_match("7", ["six", "7"]) == 1.0
    assert numeric_match("seven", 7) == 0.0
    assert numeric_match(None, 7) == 0.0


def test_final_answer_is_the_last_steps() -> None:
    assert final_answer(make_trajectory([])) is None
    assert final_answer(make_trajectory([_turn(answer="x"), _turn()])) is None
    assert final_answer(make_trajectory([_turn(ok=1), _turn(answer="Paris")])) == "Paris"


# --------------------------------------------------------------------------------------------
# Shapers
# --------------------------------------------------------------------------------------------


def test_shapers_are_registered_with_unique_names() -> None:
    names = [cls.name for cls in SHAPERS]
    assert names == ["answer_match", "format", "tool_call", "overlong"]
    for cls in SHAPERS:
        for field_name, field in cls.Config.model_fields.items():
            assert field.description, f"{cls.name}.{field_name} has no description"

    import agent_r1.builtins
    from agent_r1.registry import Registry

    registry = Registry(entry_points=False)  # only the bundled plugin, not whatever else is installed
    registry.register_plugin(agent_r1.builtins, "builtins")
    for cls in SHAPERS:
        assert registry.get("reward_shapers", cls.name) is cls


@pytest.mark.parametrize(
    ("mode", "answer", "gold", "expected"),
    [
        ("exact", "the Paris.", "Paris", 1.0),
        ("exact", "Paris, France", "Paris", 0.0),
        ("f1", "Paris France", "Paris", pytest.approx(2 / 3)),
        ("substring", "Paris, France", ["Lyon", "Paris"], 1.0),
        ("numeric", "10,063", 10063, 1.0),
        ("numeric", "10,064", 10063, 0.0),
    ],
)
def test_answer_match_modes(mode: str, answer: str, gold: Any, expected: Any) -> None:
    shaper = AnswerMatchReward({"mode": mode})
    task = TASK.model_copy(update={"answer": gold})
    (signal,) = shaper.score(make_trajectory([_turn(ok=1), _turn(answer=answer)]), task)
    assert signal.value == expected
    assert (signal.name, signal.kind, signal.source, signal.weight) == (
        "answer_match",
        "outcome",
        "answer_match",
        1.0,
    )


def test_answer_match_without_answer_or_gold() -> None:
    shaper = AnswerMatchReward({"signal_name": "em"})
    (signal,) = shaper.score(make_trajectory([_turn(ok=1)]), TASK)
    assert (signal.name, signal.value) == ("em", 0.0)
    # an answer given earlier but not in the last step does not count
    (signal,) = shaper.score(make_trajectory([_turn(answer="Paris"), _turn(ok=1)]), TASK)
    assert signal.value == 0.0
    assert (
        shaper.score(make_trajectory([_turn(answer="Paris")]), TASK.model_copy(update={"answer": None})) == []
    )


def test_answer_match_normalization_option() -> None:
    task = TASK.model_copy(update={"answer": ["René Magritte"]})
    trajectory = make_trajectory([_turn(answer="Rene Magritte")])
    assert AnswerMatchReward().config.normalization == "official"
    (official,) = AnswerMatchReward().score(trajectory, task)
    (robust,) = AnswerMatchReward({"normalization": "robust"}).score(trajectory, task)
    (accents,) = AnswerMatchReward({"normalization": "robust", "keep_accents": True}).score(trajectory, task)
    assert (official.value, robust.value, accents.value) == (0.0, 1.0, 0.0)
    (f1,) = AnswerMatchReward({"mode": "f1", "normalization": "robust"}).score(trajectory, task)
    assert f1.value == 1.0
    with pytest.raises(ValidationError, match="normalization"):
        AnswerMatchReward({"normalization": "squad"})


def test_answer_normalizations_for_the_eval_report() -> None:
    shapers = [
        AnswerMatchReward({"signal_name": "em"}),
        AnswerMatchReward({"mode": "f1", "signal_name": "f1", "normalization": "robust"}),
        AnswerMatchReward({"mode": "numeric"}),  # compares numbers: no normalisation to report
        FormatReward(),
    ]
    assert answer_normalizations(shapers) == {"em": "official", "f1": "robust"}


def test_answer_match_config_errors() -> None:
    with pytest.raises(ValidationError, match="mode"):
        AnswerMatchReward({"mode": "fuzzy"})
    with pytest.raises(ValidationError, match="extra"):
        AnswerMatchReward({"weight_typo": 1})


def test_format_reward() -> None:
    shaper = FormatReward({"value": 0.5, "error_penalty": 0.2, "max_penalty": 0.3})
    (clean,) = shaper.score(make_trajectory([_turn(ok=1), _turn(answer="x")]), TASK)
    assert (clean.name, clean.kind, clean.value) == ("format", "outcome", 0.5)
    (one_error,) = shaper.score(make_trajectory([_turn(parse_errors=1), _turn(answer="x")]), TASK)
    assert one_error.value == pytest.approx(-0.2)
    (capped,) = shaper.score(make_trajectory([_turn(parse_errors=3), _turn(answer="x")]), TASK)
    assert capped.value == pytest.approx(-0.3)
    (unanswered,) = shaper.score(make_trajectory([_turn(ok=1)]), TASK)
    assert unanswered.value == 0.0
    (empty,) = shaper.score(make_trajectory([]), TASK)
    assert empty.value == 0.0
    (lenient,) = FormatReward({"require_answer": False}).score(make_trajectory([_turn(ok=1)]), TASK)
    assert lenient.value == 1.0


def test_tool_call_reward_defaults_are_hacking_safe() -> None:
    shaper = ToolCallReward()
    # answered: only the first successful call is rewarded (cap 1), the failure is penalised
    trajectory = make_trajectory([_turn(ok=1), _turn(ok=2, failed=1), _turn(answer="Paris")])
    signals = shaper.score(trajectory, TASK)
    assert [(s.turn, s.kind, s.name, s.source) for s in signals] == [
        (0, "process", "tool_call", "tool_call"),
        (1, "process", "tool_call", "tool_call"),
    ]
    assert [s.value for s in signals] == [pytest.approx(0.1), pytest.approx(-0.1)]
    # never answered (kept calling the tool): no bonus at all, penalties stay
    spam = make_trajectory([_turn(ok=1), _turn(ok=1), _turn(ok=1, parse_errors=1)])
    signals = shaper.score(spam, TASK)
    assert [(s.turn, s.value) for s in signals] == [(2, pytest.approx(-0.1))]


def test_tool_call_reward_unsafe_options() -> None:
    shaper = ToolCallReward(
        {"success": 1.0, "failure": -0.5, "max_rewarded_calls": None, "only_if_answered": False}
    )
    spam = make_trajectory([_turn(ok=2), _turn(ok=1, failed=1), _turn(parse_errors=2)])
    assert [(s.turn, s.value) for s in shaper.score(spam, TASK)] == [(0, 2.0), (1, 0.5), (2, -1.0)]
    quiet = ToolCallReward({"penalize_parse_errors": False, "only_if_answered": False})
    assert quiet.score(make_trajectory([_turn(parse_errors=2)]), TASK) == []
    with pytest.raises(ValidationError):
        ToolCallReward({"failure": 0.5})


@pytest.mark.parametrize(
    ("tokens", "truncated", "expected"),
    [
        (10, False, 0.0),
        (768, False, 0.0),  # max_length - buffer: the ramp starts here
        (896, False, -0.5),  # halfway through the buffer
        (1024, False, -1.0),
        (5000, False, -1.0),
        (10, True, -0.25),
        (1024, True, -1.25),
    ],
)
def test_overlong_reward(tokens: int, truncated: bool, expected: float) -> None:
    shaper = OverlongReward({"max_length": 1024, "buffer": 256, "penalty": 1.0, "truncated_penalty": 0.25})
    (signal,) = shaper.score(make_trajectory([_turn(policy_tokens=tokens)], truncated=truncated), TASK)
    assert (signal.name, signal.kind) == ("overlong", "outcome")
    assert signal.value == pytest.approx(expected)


def test_overlong_counts_policy_tokens_of_all_turns() -> None:
    shaper = OverlongReward({"max_length": 100, "buffer": 50})
    trajectory = make_trajectory([_turn(ok=1, policy_tokens=40), _turn(answer="x", policy_tokens=35)])
    (signal,) = shaper.score(trajectory, TASK)
    assert signal.value == pytest.approx(-0.5)


@settings(max_examples=100, deadline=None)
@given(
    st.integers(1, 2000), st.integers(1, 2000), st.floats(0, 5), st.integers(0, 4000), st.integers(0, 4000)
)
def test_overlong_is_monotone_and_bounded(
    max_length: int, buffer: int, penalty: float, a: int, b: int
) -> None:
    buffer = min(buffer, max_length)
    shaper = OverlongReward({"max_length": max_length, "buffer": buffer, "penalty": penalty})
    short, long = sorted((a, b))
    assert -penalty - 1e-12 <= shaper.penalty_for(long) <= shaper.penalty_for(short) <= 0.0
    if long <= max_length - buffer:
        assert shaper.penalty_for(long) == 0.0
    if short >= max_length:
        assert shaper.penalty_for(short) == pytest.approx(-penalty)


def test_overlong_config_error() -> None:
    with pytest.raises(ValidationError, match="buffer"):
        OverlongReward({"max_length": 10, "buffer": 20})
