"""The retrieval server at Search-R1's scale, over real HTTP on 127.0.0.1: one request with every
query of a GRPO rollout batch (512 prompts x 5 samples = 2,560 queries), a configurable cap with
internal batching, what Search-R1's own server accepts, and many concurrent clients (bounded in count
and time; latency and memory are measured by ``benchmarks/load_server.py``, not asserted here)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from agent_r1_plugin_search.datasets import LOADERS
from agent_r1_plugin_search.retrievers import BM25Retriever


def _questions(count: int) -> list[str]:
    """``count`` real questions: the bundled HotpotQA, 2Wiki, MuSiQue and NQ samples, cycled."""
    pool = [task.metadata["question"] for loader in LOADERS.values() for task in loader({}).load("all")]
    return [pool[i % len(pool)] for i in range(count)]


def _search_r1_style_client(url: str, queries: list[str], topk: int) -> list[str]:
    """What Search-R1's rollout does with its retriever (search_r1/llm_agent/generation.py): post
    every query in one JSON request with return_scores true, fail on any non-200 answer, and turn each
    query's documents into ``Doc i(Title: <first line of contents>) <rest>`` text."""
    response = httpx.post(url, json={"queries": queries, "topk": topk, "return_scores": True}, timeout=120)
    response.raise_for_status()
    texts = []
    for hits in response.json()["result"]:
        lines = []
        for rank, item in enumerate(hits, start=1):
            contents = item["document"]["contents"]
            title, _, text = contents.partition("\n")
            lines.append(f"Doc {rank}(Title: {title}) {text}")
        texts.append("\n".join(lines))
    return texts


def test_search_r1_client_gets_2560_queries_answered_in_one_request(
    search_server: str, hotpot_bm25: BM25Retriever
) -> None:
    queries = _questions(2560)
    texts = _search_r1_style_client(f"{search_server}/retrieve", queries, topk=3)
    assert len(texts) == 2560
    assert all(text.count("\nDoc ") == 2 for text in texts)  # three documents each
    local = hotpot_bm25.search(queries[:400], 3)
    for text, hits in zip(texts, local, strict=False):
        assert text.startswith(f'Doc 1(Title: "{hits[0].title}") ')


@pytest.fixture(scope="module")
def capped_server(search_cache: Path, serve_search) -> str:
    with serve_search(search_cache, "--corpus", "hotpotqa", "--max-queries", "100", "--batch-size", "7") as (
        url,
        _,
    ):
        yield url


def test_cap_is_configurable_and_batches_keep_the_order(
    capped_server: str, hotpot_bm25: BM25Retriever
) -> None:
    queries = _questions(100)
    response = httpx.post(
        f"{capped_server}/retrieve", json={"queries": queries, "topk": 2, "return_scores": True}
    )
    assert response.status_code == 200
    remote = [[hit["document"]["id"] for hit in hits] for hits in response.json()["result"]]
    assert remote == [[hit.id for hit in hits] for hits in hotpot_bm25.search(queries, 2)]  # 15 batches of 7
    too_many = httpx.post(f"{capped_server}/retrieve", json={"queries": [*queries, "one more"]})
    assert too_many.status_code == 413
    assert too_many.json()["error"] == (
        "101 queries in one request; at most 100 are accepted (start the server with a larger "
        "--max-queries, or send fewer queries per request)"
    )


def test_accepts_what_search_r1s_server_accepts(search_server: str) -> None:
    # Search-R1's server: topk optional, return_scores false by default, unknown fields ignored.
    response = httpx.post(
        f"{search_server}/retrieve", json={"queries": ["Tinted Windows"], "top_k": 5, "x": 1}
    )
    assert response.status_code == 200
    body = response.json()
    assert body["ignored"] == ["top_k", "x"]  # listed, so that a misspelt field can be noticed
    (hits,) = body["result"]
    assert len(hits) == 3  # the server's default topk: top_k is not topk
    assert set(hits[0]) == {"id", "contents"}  # bare documents: return_scores defaults to false
    nulls = httpx.post(
        f"{search_server}/retrieve", json={"queries": ["x y"], "topk": None, "return_scores": None}
    )
    assert nulls.status_code == 200 and "ignored" not in nulls.json()


def test_many_concurrent_clients(search_server: str, hotpot_bm25: BM25Retriever) -> None:
    """24 clients x 6 requests x 20 queries at once; every answer complete and equal to in-process BM25."""
    queries = _questions(20 * 6 * 24)
    batches = [queries[i : i + 20] for i in range(0, len(queries), 20)]
    expected = {
        tuple(batch): [[h.id for h in hits] for hits in hotpot_bm25.search(batch, 3)] for batch in batches
    }

    def client(mine: list[list[str]]) -> list[bool]:
        with httpx.Client(timeout=60) as session:
            outcomes = []
            for batch in mine:
                response = session.post(
                    f"{search_server}/retrieve", json={"queries": batch, "return_scores": True}
                )
                ids = [[hit["document"]["id"] for hit in hits] for hits in response.json()["result"]]
                outcomes.append(response.status_code == 200 and ids == expected[tuple(batch)])
            return outcomes

    with ThreadPoolExecutor(max_workers=24) as pool:
        results = list(pool.map(client, [batches[i::24] for i in range(24)]))
    assert sum(len(r) for r in results) == 144 and all(all(r) for r in results)
