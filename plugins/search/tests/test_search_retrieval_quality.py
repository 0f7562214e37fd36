"""Retrieval quality of BM25 on the bundled HotpotQA sample (200 hard dev questions, 1,975 paragraphs).

Measured with this plugin (bm25s, Lucene BM25 k1=1.5 b=0.75, English stop words, no stemming),
searching each question as is:

* at least one of the two gold paragraphs in the top 5: 94.5% of questions
* both gold paragraphs in the top 5: 45.0%
* top 3: 91.0% / 33.5%

(With ``stemmer="english"`` (PyStemmer) the top-5 figures are 97.0% / 48.5%.) The bands below
allow for small changes in tokenisation across bm25s versions, and fail if retrieval breaks.
"""

from __future__ import annotations

import pytest

from agent_r1_plugin_search.datasets import HotpotQADataset
from agent_r1_plugin_search.evaluation import retrieval_recall
from agent_r1_plugin_search.retrievers import BM25Retriever


@pytest.fixture(scope="module")
def hotpot_tasks():
    return HotpotQADataset().load("all")


def test_bm25_top5_recall_on_bundled_hotpotqa(hotpot_bm25: BM25Retriever, hotpot_tasks) -> None:
    report = retrieval_recall(hotpot_bm25, hotpot_tasks, topk=5)
    assert report.questions == 200
    assert 0.92 <= report.any_gold <= 0.98, report
    assert 0.40 <= report.all_gold <= 0.55, report
    assert report.any_gold > report.mean_gold_found > report.all_gold


def test_bm25_top3_recall_is_lower(hotpot_bm25: BM25Retriever, hotpot_tasks) -> None:
    top3 = retrieval_recall(hotpot_bm25, hotpot_tasks, topk=3)
    top5 = retrieval_recall(hotpot_bm25, hotpot_tasks, topk=5)
    assert 0.86 <= top3.any_gold <= 0.95, top3
    assert 0.30 <= top3.all_gold <= 0.42, top3
    assert top3.any_gold <= top5.any_gold and top3.all_gold <= top5.all_gold


def test_stemming_when_pystemmer_is_installed(search_cache, hotpot_tasks) -> None:
    pytest.importorskip("Stemmer", reason="PyStemmer (extra 'stem') is not installed")
    stemmed = BM25Retriever.from_corpus("hotpotqa", cache_dir=search_cache, stemmer="english")
    report = retrieval_recall(stemmed, hotpot_tasks, topk=5)
    assert 0.94 <= report.any_gold <= 0.99, report
    assert 0.43 <= report.all_gold <= 0.56, report
