"""Answer normalisation and EM / F1 / substring match on tricky cases."""

from __future__ import annotations

import pytest

from agent_r1_plugin_search.metrics import exact_match, f1_score, normalize_answer, substring_match


@pytest.mark.parametrize(
    ("raw", "normalized"),
    [
        ("The Beatles", "beatles"),
        ("  a   tale of Two  Cities. ", "tale of two cities"),
        ("Theatre", "theatre"),  # 'the' inside a word is not an article
        ("Anchorage, Alaska!", "anchorage alaska"),
        ("U.S.A.", "usa"),
        ("“Quoted” — dashed", "quoted dashed"),  # Unicode punctuation
        ("Ｔｏｋｙｏ", "tokyo"),  # full-width letters (NFKC)
        ("February\u00a01,\u00a02018", "february 1 2018"),  # non-breaking spaces (NFKC)
        ("Galați", "galati"),  # accents folded
        ("Małgorzata Braunek", "małgorzata braunek"),  # ł does not decompose: kept
        ("ﬁnal", "final"),  # ligature (NFKC)
        ("The The", "the the"),  # only articles: kept, so it cannot match an empty answer
        ("", ""),
    ],
)
def test_normalize_answer(raw: str, normalized: str) -> None:
    assert normalize_answer(raw) == normalized


def test_accents_can_be_kept() -> None:
    assert normalize_answer("René", accents=True) == "rené"
    assert exact_match("Rene", "René") == 1.0
    assert exact_match("Rene", "René", accents=True) == 0.0


def test_exact_match_over_aliases() -> None:
    gold = ["Charles Armand Rene de La Tremoille", "Charles Armand René de La Trémoille"]
    assert exact_match("charles armand rené de la trémoille", gold) == 1.0
    assert exact_match("Charles Armand", gold) == 0.0
    assert exact_match("the Mask of Fu Manchu", ["Mask of Fu Manchu", "The Mask of Fu Manchu"]) == 1.0
    assert exact_match("Tulsa", "Tulsa") == 1.0  # a bare string is one alias
    assert exact_match("anything", []) == 0.0


def test_empty_answer_never_matches_article_only_gold() -> None:
    assert exact_match("", "The The") == 0.0
    assert exact_match("the the", "The The") == 1.0
    assert exact_match("", "the") == 0.0


def test_f1_partial_overlap_and_best_alias() -> None:
    # prediction tokens: {tulsa, oklahoma}; gold: {tulsa} -> P=1/2, R=1 -> F1=2/3
    assert f1_score("Tulsa, Oklahoma", "Tulsa") == pytest.approx(2 / 3)
    assert f1_score("Tulsa, Oklahoma", ["Oklahoma City", "Tulsa Oklahoma"]) == 1.0
    assert f1_score("New York", "Los Angeles") == 0.0
    # repeated tokens count with multiplicity
    assert f1_score("new new york", "new york") == pytest.approx(2 * (2 / 3) * 1 / (2 / 3 + 1))


def test_f1_yes_no_is_all_or_nothing() -> None:
    assert f1_score("yes", "no") == 0.0
    assert f1_score("no it is not", "no") == 0.0  # HotpotQA: yes/no gold needs an exact answer
    assert f1_score("No.", "no") == 1.0


def test_f1_empty_prediction() -> None:
    assert f1_score("", "Tulsa") == 0.0
    assert f1_score("the", "Tulsa") == 0.0


def test_substring_match_respects_word_boundaries() -> None:
    assert substring_match("It was in Tulsa, Oklahoma.", "Tulsa") == 1.0
    assert substring_match("Tulsan", "Tulsa") == 0.0
    assert substring_match("The answer is 1,000", ["1000"]) == 1.0
    assert substring_match("Paris", ["Texas", "Paris, France"]) == 0.0
    assert substring_match("anything", [""]) == 0.0
