"""Answer normalisation and answer metrics shared by reward shapers and evaluation.

Plugin authors reuse these instead of writing their own, so that "exact match" means the same thing
in every reward and every report::

    from agent_r1.rewards import exact_match, f1_score, final_answer

Two normalisations, chosen with ``normalization=`` on every metric (and as the ``normalization``
option of the ``answer_match`` shaper and the search plugin's ``qa_*`` shapers):

``"official"`` (the default): exactly the official HotpotQA / SQuAD v1.1 evaluation scripts
(``normalize_answer`` in ``hotpot_evaluate_v1.py`` and SQuAD v1.1's ``evaluate-v1.1.py``): lower-case
(``str.lower``), drop the ASCII punctuation of ``string.punctuation``, replace the articles *a*, *an*,
*the* (whole words) with spaces, collapse whitespace. Nothing else: accents, curly quotes, dashes and
full-width characters are kept as they are, and an answer made only of articles or punctuation
normalises to ``""`` and so equals an empty prediction. Scores computed this way are comparable with
published numbers (Search-R1, HotpotQA leaderboards).

``"robust"``: the same steps with Unicode care, for training rewards on multilingual Wikipedia
answers:

* the text is first normalised with NFKC, so full-width digits, ligatures and non-breaking spaces
  compare equal to their plain forms (``"１２"`` == ``"12"``);
* accents are folded (canonical decomposition, combining marks dropped: ``"René"`` == ``"Rene"``;
  letters that do not decompose, such as ``ł``, are kept), unless ``keep_accents=True``;
* punctuation is every ASCII punctuation character plus every Unicode punctuation character
  (category ``P*``), so typographic quotes and dashes are dropped too;
* after punctuation is removed the text is NFKC-normalised again, so that a letter and a combining
  mark that punctuation used to separate compose (this keeps :func:`normalize_answer` idempotent);
* an answer made only of articles (the band *The The*) keeps its articles, and an empty normalised
  prediction never matches, so an empty answer never earns a reward.

Every metric takes one prediction and a gold answer that is a value or a list of aliases and returns
the best score over the aliases (``metric_max_over_ground_truths`` in the official scripts). F1
follows HotpotQA's script in both modes: when either side normalises to ``yes``, ``no`` or
``noanswer``, only an exact match scores, and two answers with no token in common (two empty ones
included) score 0.

This module imports neither torch nor anything heavy.
"""

from __future__ import annotations

import math
import re
import string
import unicodedata
from collections import Counter
from collections.abc import Iterable
from typing import Any, Literal, get_args

from agent_r1.mdp import Trajectory

Normalization = Literal["official", "robust"]
"""How answers are normalised before they are compared (see the module docstring)."""

NORMALIZATIONS: tuple[str, ...] = get_args(Normalization)

DEFAULT_NORMALIZATION: Normalization = "official"

_ASCII_PUNCTUATION = frozenset(string.punctuation)
# Python 3 str patterns are Unicode-aware: \b is a word boundary for every script, as in the
# official scripts run under Python 3.
_ARTICLES = re.compile(r"\b(a|an|the)\b")
# HotpotQA's F1: a yes/no (or "noanswer") answer scores only when it is exactly right.
_SPECIAL_ANSWERS = frozenset({"yes", "no", "noanswer"})

# A number: optional sign, digits with an optional fraction (or a bare fraction ".5"), an optional
# exponent; or a simple ratio "3/4". Thousands separators are removed before matching.
_NUMBER = re.compile(
    r"(?P<sign>(?<![\w.])[-+])?(?:(?P<num>\d+)\s*/\s*(?P<den>\d+)(?![\d.])"
    r"|(?P<dec>(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?))"
)
_THOUSANDS = re.compile(r"(?<=\d)[,_](?=\d{3}(?!\d))")
_MINUS_SIGNS = str.maketrans({"\u2212": "-", "\u2012": "-", "\u2013": "-", "\u2014": "-", "\ufe63": "-"})


def _is_punctuation(char: str) -> bool:
    return char in _ASCII_PUNCTUATION or unicodedata.category(char).startswith("P")


def fold_accents(text: str) -> str:
    """Drop combining marks after canonical decomposition (``"Galați"`` → ``"Galati"``).

    Letters that do not decompose (``ł``, ``ø``) are kept as they are.
    """
    decomposed = unicodedata.normalize("NFD", text)
    return unicodedata.normalize("NFC", "".join(c for c in decomposed if not unicodedata.combining(c)))


def _check_normalization(normalization: str) -> None:
    if normalization not in NORMALIZATIONS:
        raise ValueError(
            f"unknown answer normalization {normalization!r}; use one of {', '.join(NORMALIZATIONS)}"
        )


def normalize_answer(
    text: Any, normalization: Normalization = DEFAULT_NORMALIZATION, *, keep_accents: bool = False
) -> str:
    """An answer as the metrics compare it, under ``normalization`` (see the module docstring).

    ``None`` normalises to ``""``; other non-strings are converted with ``str`` first.
    ``keep_accents`` applies to ``robust`` only (``official`` never folds accents).
    """
    _check_normalization(normalization)
    if text is None:
        return ""
    text = str(text)
    if normalization == "official":
        text = "".join(c for c in text.lower() if c not in _ASCII_PUNCTUATION)
        return " ".join(_ARTICLES.sub(" ", text).split())
    text = unicodedata.normalize("NFKC", text)
    if not keep_accents:
        text = fold_accents(text)
    text = "".join(c for c in text.lower() if not _is_punctuation(c))
    text = unicodedata.normalize("NFKC", text)
    without_articles = " ".join(_ARTICLES.sub(" ", text).split())
    return without_articles or " ".join(text.split())


def as_aliases(gold: Any) -> list[str]:
    """A gold answer as a list of alias strings.

    ``None`` gives ``[]``; a string or a number gives a one-item list; a list, tuple or set gives one
    alias per item (``None`` items are skipped).
    """
    if gold is None:
        return []
    if isinstance(gold, str | int | float):
        return [_plain(gold)]
    if isinstance(gold, Iterable):
        return [_plain(alias) for alias in gold if alias is not None]
    return [str(gold)]


def _plain(value: Any) -> str:
    # 12.0 -> "12", so that an integer-valued float gold matches the prediction "12".
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def exact_match(
    prediction: str | None,
    gold: Any,
    *,
    normalization: Normalization = DEFAULT_NORMALIZATION,
    keep_accents: bool = False,
) -> float:
    """1.0 when the normalised prediction equals a normalised alias of ``gold``, else 0.0.

    ``None`` (no answer) scores 0. Under ``robust`` an empty normalised prediction scores 0 too;
    under ``official`` it equals a gold answer that also normalises to ``""`` (as the scripts do).
    """
    if prediction is None:
        return 0.0
    predicted = normalize_answer(prediction, normalization, keep_accents=keep_accents)
    if not predicted and normalization == "robust":
        return 0.0
    return float(
        any(
            predicted == normalize_answer(alias, normalization, keep_accents=keep_accents)
            for alias in as_aliases(gold)
        )
    )


def _f1_normalized(predicted: str, expected: str) -> float:
    """HotpotQA's ``f1_score`` on two normalised answers."""
    if (predicted in _SPECIAL_ANSWERS or expected in _SPECIAL_ANSWERS) and predicted != expected:
        return 0.0
    predicted_tokens, expected_tokens = predicted.split(), expected.split()
    overlap = sum((Counter(predicted_tokens) & Counter(expected_tokens)).values())
    if overlap == 0:
        return 0.0
    precision = overlap / len(predicted_tokens)
    recall = overlap / len(expected_tokens)
    return 2 * precision * recall / (precision + recall)


def f1_score(
    prediction: str | None,
    gold: Any,
    *,
    normalization: Normalization = DEFAULT_NORMALIZATION,
    keep_accents: bool = False,
) -> float:
    """Token-level F1 between the normalised prediction and the best alias (HotpotQA's ``f1_score``).

    Tokens are the whitespace-separated words of the normalised strings, counted as multisets. A
    yes/no/noanswer answer on either side scores only when both are equal; no common token (two empty
    answers included, as in the scripts) scores 0.
    """
    if prediction is None:
        return 0.0
    predicted = normalize_answer(prediction, normalization, keep_accents=keep_accents)
    return max(
        (
            _f1_normalized(predicted, normalize_answer(alias, normalization, keep_accents=keep_accents))
            for alias in as_aliases(gold)
        ),
        default=0.0,
    )


def substring_match(
    prediction: str | None,
    gold: Any,
    *,
    normalization: Normalization = DEFAULT_NORMALIZATION,
    keep_accents: bool = False,
) -> float:
    """1.0 when a normalised alias occurs in the normalised prediction at word boundaries.

    ``"Tulsa, Oklahoma"`` contains ``"Tulsa"``; ``"Tulsan"`` does not; an alias that normalises to
    nothing never matches. Lenient by design, and so open to a policy that lists many candidates in
    one answer: prefer ``exact`` or ``f1`` as a training reward.
    """
    if prediction is None:
        return 0.0
    predicted = f" {normalize_answer(prediction, normalization, keep_accents=keep_accents)} "
    for alias in as_aliases(gold):
        expected = normalize_answer(alias, normalization, keep_accents=keep_accents)
        if expected and f" {expected} " in predicted:
            return 1.0
    return 0.0


def parse_number(text: Any) -> float | None:
    """The number a text states, or ``None`` when it states none.

    Numbers (``int``/``float``) are returned as they are (``bool`` is not a number here). In text,
    thousands separators (``1,234``, ``1_234``), currency signs, units and percent signs
    are ignored, Unicode minus signs count as ``-``, and ``3/4`` is a fraction. When a text holds
    several numbers the **last** one counts (the GSM8K convention: "347 × 29 = 10063" states 10063).
    """
    if isinstance(text, bool) or text is None:
        return None
    if isinstance(text, int | float):
        return float(text) if math.isfinite(text) else None
    normalized = unicodedata.normalize("NFKC", str(text)).translate(_MINUS_SIGNS)
    normalized = _THOUSANDS.sub("", normalized)
    matches = list(_NUMBER.finditer(normalized))
    if not matches:
        return None
    match = matches[-1]
    sign = -1.0 if match.group("sign") == "-" else 1.0
    if match.group("den") is not None:
        denominator = int(match.group("den"))
        if denominator == 0:
            return None
        return sign * int(match.group("num")) / denominator
    try:
        value = float(match.group("dec"))
    except ValueError:  # pragma: no cover - the pattern only matches valid floats
        return None
    return sign * value if math.isfinite(value) else None


def numeric_match(
    prediction: str | float | None, gold: Any, *, rel_tol: float = 1e-6, abs_tol: float = 1e-6
) -> float:
    """1.0 when the number the prediction states equals a gold number within tolerance, else 0.0.

    Both sides go through :func:`parse_number`; the comparison is ``math.isclose(p, g, rel_tol,
    abs_tol)``. A prediction without a number scores 0.
    """
    predicted = parse_number(prediction)
    if predicted is None:
        return 0.0
    aliases: list[Any] = list(gold) if isinstance(gold, list | tuple | set) else [gold]
    for alias in aliases:
        expected = parse_number(alias)
        if expected is not None and math.isclose(predicted, expected, rel_tol=rel_tol, abs_tol=abs_tol):
            return 1.0
    return 0.0


def final_answer(trajectory: Trajectory) -> str | None:
    """The episode's final answer: the last step's ``action.answer`` (``None`` when it gave none).

    Only the last step counts: an answer followed by more actions was not where the episode ended.
    """
    if not trajectory.steps:
        return None
    return trajectory.steps[-1].action.answer


METRICS = {"exact": exact_match, "f1": f1_score, "substring": substring_match, "numeric": numeric_match}
"""Mode name → metric function, as used by the ``answer_match`` reward shaper."""


def answer_normalizations(shapers: Iterable[Any]) -> dict[str, str]:
    """Signal name → normalisation, for each reward shaper among ``shapers`` that has a
    ``normalization`` option (``answer_match``, the search plugin's ``qa_*``), so that an evaluation
    report can say how its answers were compared. The signal name is the shaper's ``signal_name``
    option when it has one, else its ``name``; ``numeric`` mode normalises nothing and is left out."""
    out: dict[str, str] = {}
    for shaper in shapers:
        config = getattr(shaper, "config", None)
        normalization = getattr(config, "normalization", None)
        if normalization is None or getattr(config, "mode", None) == "numeric":
            continue
        out[str(getattr(config, "signal_name", None) or shaper.name)] = str(normalization)
    return out


TEXT_METRICS = {"exact": exact_match, "f1": f1_score, "substring": substring_match}
"""The metrics that compare normalised text (they take ``normalization`` and ``keep_accents``)."""

__all__ = [
    "DEFAULT_NORMALIZATION",
    "METRICS",
    "NORMALIZATIONS",
    "TEXT_METRICS",
    "Normalization",
    "answer_normalizations",
    "as_aliases",
    "exact_match",
    "f1_score",
    "final_answer",
    "fold_accents",
    "normalize_answer",
    "numeric_match",
    "parse_number",
    "substring_match",
]
