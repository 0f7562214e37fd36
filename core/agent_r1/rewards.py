"""Answer normalisation and answer metrics shared by reward shapers and evaluation.

Plugin authors reuse these instead of writing their own, so that "exact match" means the same thing
in every reward and every report::

    from agent_r1.rewards import exact_match, f1_score, final_answer

Normalisation follows the SQuAD v1.1 evaluation script (Rajpurkar et al. 2016, ``normalize_answer``:
lowercase, drop punctuation, drop the articles *a*, *an*, *the*, collapse whitespace), with Unicode
handling added in front and behind:

* the text is first normalised with NFKC, so full-width digits, ligatures and non-breaking spaces
  compare equal to their plain forms (``"１２"`` == ``"12"``);
* punctuation is every ASCII punctuation character (as in SQuAD) plus every Unicode punctuation
  character (category ``P*``), so typographic quotes and dashes are dropped too;
* after punctuation is removed the text is NFKC-normalised again, so that a letter and a combining
  mark that punctuation used to separate compose (this keeps :func:`normalize_answer` idempotent).

Every metric takes one prediction and a gold answer that is a value or a list of aliases and returns
the best score over the aliases. A gold answer that normalises to nothing (``"."``) matches nothing,
so an empty prediction never earns a reward.

This module imports neither torch nor anything heavy.
"""

from __future__ import annotations

import math
import re
import string
import unicodedata
from collections import Counter
from collections.abc import Iterable
from typing import Any

from agent_r1.mdp import Trajectory

_ASCII_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b", flags=re.UNICODE)

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


def normalize_answer(text: Any) -> str:
    """SQuAD-style normalisation with Unicode handling (see the module docstring).

    ``None`` normalises to ``""``; other non-strings are converted with ``str`` first. An answer made
    only of articles (the band *The The*) would normalise to nothing; such an answer keeps its
    articles instead, so it can still be matched.
    """
    if text is None:
        return ""
    text = unicodedata.normalize("NFKC", str(text)).lower()
    text = "".join(c for c in text if not _is_punctuation(c))
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


def exact_match(prediction: str | None, gold: Any) -> float:
    """1.0 when the normalised prediction equals a normalised alias of ``gold``, else 0.0."""
    if prediction is None:
        return 0.0
    predicted = normalize_answer(prediction)
    if not predicted:
        return 0.0
    return float(any(predicted == normalize_answer(alias) for alias in as_aliases(gold)))


def _f1_tokens(predicted: list[str], expected: list[str]) -> float:
    if not predicted or not expected:
        return 0.0
    overlap = sum((Counter(predicted) & Counter(expected)).values())
    if overlap == 0:
        return 0.0
    precision = overlap / len(predicted)
    recall = overlap / len(expected)
    return 2 * precision * recall / (precision + recall)


def f1_score(prediction: str | None, gold: Any) -> float:
    """Token-level F1 between the normalised prediction and the best alias (SQuAD's ``f1_score``).

    Tokens are the whitespace-separated words of the normalised strings, counted as multisets. Unlike
    the SQuAD script, two empty answers score 0 (an empty prediction never earns a reward).
    """
    if prediction is None:
        return 0.0
    predicted = normalize_answer(prediction).split()
    return max(
        (_f1_tokens(predicted, normalize_answer(alias).split()) for alias in as_aliases(gold)), default=0.0
    )


def substring_match(prediction: str | None, gold: Any) -> float:
    """1.0 when a normalised alias occurs in the normalised prediction at word boundaries.

    ``"Tulsa, Oklahoma"`` contains ``"Tulsa"``; ``"Tulsan"`` does not. Lenient by design, and so open to
    a policy that lists many candidates in one answer: prefer ``exact`` or ``f1`` as a training reward.
    """
    if prediction is None:
        return 0.0
    predicted = f" {normalize_answer(prediction)} "
    for alias in as_aliases(gold):
        expected = normalize_answer(alias)
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

__all__ = [
    "METRICS",
    "as_aliases",
    "exact_match",
    "f1_score",
    "final_answer",
    "normalize_answer",
    "numeric_match",
    "parse_number",
    "substring_match",
]
