"""Answer normalisation and QA metrics (exact match, F1, substring match) over lists of aliases.

The normalisation follows the SQuAD evaluation script's definition (lowercase, drop punctuation,
drop the articles *a*, *an*, *the*, collapse whitespace) with two additions for multilingual
Wikipedia answers:

* Unicode is first normalised with NFKC, so full-width characters, ligatures and non-breaking
  spaces compare equal to their plain forms (``"February\\u00a01"`` == ``"February 1"``).
* Accents are folded by default (NFD, then combining marks are dropped), so ``"René"`` matches
  ``"Rene"``; letters that do not decompose (``ł``, ``ø``) are kept as they are.
* Punctuation means every Unicode punctuation character (category ``P*``) plus the ASCII
  punctuation of the SQuAD script, so typographic dashes and quotes are removed too.

Every metric takes one prediction and a gold answer that is either a string or a list of aliases,
and returns the best score over the aliases, as HotpotQA, NQ and 2WikiMultihopQA evaluations do.
"""

from __future__ import annotations

import re
import string
import unicodedata
from collections import Counter
from collections.abc import Iterable

_ARTICLES = re.compile(r"\b(a|an|the)\b", flags=re.UNICODE)
_ASCII_PUNCTUATION = frozenset(string.punctuation)
_SPECIAL_ANSWERS = frozenset({"yes", "no", "noanswer"})


def _is_punctuation(char: str) -> bool:
    return char in _ASCII_PUNCTUATION or unicodedata.category(char).startswith("P")


def fold_accents(text: str) -> str:
    """Drop combining marks after canonical decomposition (``"Galați"`` → ``"Galati"``)."""
    decomposed = unicodedata.normalize("NFD", text)
    return unicodedata.normalize("NFC", "".join(c for c in decomposed if not unicodedata.combining(c)))


def normalize_answer(text: str, *, accents: bool = False) -> str:
    """SQuAD-style normalisation with Unicode handling (see the module docstring).

    ``accents=True`` keeps accents (``"René"`` and ``"Rene"`` then differ). An answer made only of
    articles and punctuation (the band *The The*) would normalise to nothing and so match an empty
    prediction; such answers keep their articles instead.
    """
    text = unicodedata.normalize("NFKC", str(text))
    if not accents:
        text = fold_accents(text)
    text = text.lower()
    text = "".join(c for c in text if not _is_punctuation(c))
    without_articles = " ".join(_ARTICLES.sub(" ", text).split())
    return without_articles or " ".join(text.split())


def as_aliases(gold: str | Iterable[str] | None) -> list[str]:
    """A gold answer as a list of alias strings (a bare string becomes a one-item list)."""
    if gold is None:
        return []
    if isinstance(gold, str):
        return [gold]
    return [str(alias) for alias in gold if alias is not None]


def exact_match(prediction: str, gold: str | Iterable[str], *, accents: bool = False) -> float:
    """1.0 when the normalised prediction equals a normalised alias, else 0.0."""
    predicted = normalize_answer(prediction, accents=accents)
    return float(any(predicted == normalize_answer(alias, accents=accents) for alias in as_aliases(gold)))


def substring_match(prediction: str, gold: str | Iterable[str], *, accents: bool = False) -> float:
    """1.0 when a normalised alias occurs in the normalised prediction at word boundaries.

    ``"Tulsa, Oklahoma"`` contains ``"Tulsa"``; ``"Tulsan"`` does not. An empty alias never matches.
    """
    predicted = f" {normalize_answer(prediction, accents=accents)} "
    for alias in as_aliases(gold):
        normalized = normalize_answer(alias, accents=accents)
        if normalized and f" {normalized} " in predicted:
            return 1.0
    return 0.0


def _f1_one(prediction: str, alias: str, accents: bool) -> float:
    predicted = normalize_answer(prediction, accents=accents)
    expected = normalize_answer(alias, accents=accents)
    # HotpotQA's rule: yes/no answers score only when they are exactly right.
    if (predicted in _SPECIAL_ANSWERS or expected in _SPECIAL_ANSWERS) and predicted != expected:
        return 0.0
    predicted_tokens, expected_tokens = predicted.split(), expected.split()
    if not predicted_tokens or not expected_tokens:
        return float(predicted_tokens == expected_tokens)
    common = Counter(predicted_tokens) & Counter(expected_tokens)
    overlap = sum(common.values())
    if overlap == 0:
        return 0.0
    precision = overlap / len(predicted_tokens)
    recall = overlap / len(expected_tokens)
    return 2 * precision * recall / (precision + recall)


def f1_score(prediction: str, gold: str | Iterable[str], *, accents: bool = False) -> float:
    """Token-level F1 between the normalised prediction and the best alias (SQuAD/HotpotQA)."""
    return max((_f1_one(prediction, alias, accents) for alias in as_aliases(gold)), default=0.0)


METRICS = {"em": exact_match, "f1": f1_score, "substring": substring_match}
"""Metric name → function, as used by the reward shapers and the evaluation summary."""
