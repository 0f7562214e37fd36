"""The retrieval server (a real `agent-r1-search serve` subprocess) and the HTTP client, over real
HTTP on 127.0.0.1: protocol, request errors, server down, malformed answers, retries."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from agent_r1_plugin_search.protocol import MAX_QUERIES, MAX_QUERY_CHARS
from agent_r1_plugin_search.retrievers import BM25Retriever, HttpRetriever, RetrievalError


def test_health(search_server: str) -> None:
    body = httpx.get(f"{search_server}/health").json()
    assert body["status"] == "ok" and body["retriever"] == "bm25" and body["passages"] == 1975


def test_protocol_answer_matches_in_process_bm25(search_server: str, hotpot_bm25: BM25Retriever) -> None:
    queries = ["Tinted Windows debut album", "Who directed the film UHF?"]
    response = httpx.post(
        f"{search_server}/retrieve", json={"queries": queries, "topk": 4, "return_scores": True}
    )
    assert response.status_code == 200
    result = response.json()["result"]
    assert len(result) == 2 and all(len(hits) == 4 for hits in result)
    first = result[0][0]
    assert set(first) == {"document", "score"} and set(first["document"]) == {"id", "contents"}
    assert first["document"]["contents"].startswith('"Tinted Windows')
    client = HttpRetriever(search_server)
    try:
        remote = client.search(queries, 4)
    finally:
        client.close()
    local = hotpot_bm25.search(queries, 4)
    assert [[h.id for h in hits] for hits in remote] == [[h.id for h in hits] for hits in local]
    assert [[h.title for h in hits] for hits in remote] == [[h.title for h in hits] for hits in local]
    assert remote[0][0].score == pytest.approx(local[0][0].score, rel=1e-5)


def test_bare_documents_without_scores(search_server: str) -> None:
    response = httpx.post(
        f"{search_server}/retrieve", json={"queries": ["Tinted Windows"], "return_scores": False}
    )
    hits = response.json()["result"][0]
    assert len(hits) == 3  # the server's default topk
    assert set(hits[0]) == {"id", "contents"}


def test_async_client(search_server: str) -> None:
    client = HttpRetriever(search_server + "/retrieve")  # the endpoint URL works as well as the root
    hits = asyncio.run(client.asearch(["Tinted Windows band"], 2))
    client.close()
    assert len(hits) == 1 and len(hits[0]) == 2 and hits[0][0].title.startswith("Tinted Windows")


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        (b"{not json", 400, "request body is not valid JSON at line 1 column 2"),
        (b"[1, 2]", 400, "request body should be a JSON object, got list"),
        (b'{"topk": 3}', 400, "field 'queries' is missing"),
        (b'{"queries": []}', 400, "field 'queries' is empty"),
        (b'{"queries": "one string"}', 422, "field 'queries' should be a list of strings, got str"),
        (b'{"queries": ["ok", 5]}', 422, "queries[1] should be a string, got int"),
        (b'{"queries": ["ok"], "topk": 0}', 422, "field 'topk' should be an integer from 1 to 100, got 0"),
        (b'{"queries": ["ok"], "topk": "3"}', 422, "field 'topk' should be an integer"),
        (
            b'{"queries": ["ok"], "return_scores": "yes"}',
            422,
            "field 'return_scores' should be true or false",
        ),
    ],
)
def test_bad_requests_get_clear_4xx(search_server: str, body: bytes, status: int, message: str) -> None:
    response = httpx.post(
        f"{search_server}/retrieve", content=body, headers={"Content-Type": "application/json"}
    )
    assert response.status_code == status
    assert message in response.json()["error"]


def test_too_many_queries(search_server: str) -> None:
    response = httpx.post(f"{search_server}/retrieve", json={"queries": ["x"] * (MAX_QUERIES + 1)})
    assert response.status_code == 413
    assert f"at most {MAX_QUERIES}" in response.json()["error"]


def test_very_long_query_is_truncated_not_refused(search_server: str) -> None:
    long_query = "Tinted Windows " + "padding " * 20_000  # 160 kB
    response = httpx.post(f"{search_server}/retrieve", json={"queries": ["Tinted Windows", long_query]})
    assert response.status_code == 200
    body = response.json()
    assert body["truncated"] == [1]
    assert body["result"][1][0]["contents"].startswith('"Tinted Windows')  # bare documents by default
    assert len(long_query) > MAX_QUERY_CHARS


def test_empty_query_list_through_the_client(search_server: str) -> None:
    client = HttpRetriever(search_server)
    try:
        assert client.search([], 3) == []  # nothing to send: no request
        with pytest.raises(RetrievalError, match="topk must be a positive integer"):
            client.search(["x"], 0)
    finally:
        client.close()


def test_server_down(closed_port: int) -> None:
    client = HttpRetriever(f"http://127.0.0.1:{closed_port}", retries=2, backoff_s=0.05)
    started = time.perf_counter()
    with pytest.raises(RetrievalError) as error:
        client.search(["anything"], 3)
    elapsed = time.perf_counter() - started
    client.close()
    message = str(error.value)
    assert f"127.0.0.1:{closed_port}/retrieve is unreachable after 3 attempts" in message
    assert "ConnectError" in message and "agent-r1-search serve" in message
    assert elapsed >= 0.05 + 0.1  # two backoffs: 0.05 s then 0.1 s


def test_server_down_async(closed_port: int) -> None:
    client = HttpRetriever(f"http://127.0.0.1:{closed_port}", retries=1, backoff_s=0.01)
    with pytest.raises(RetrievalError, match="unreachable after 2 attempts"):
        asyncio.run(client.asearch(["anything"], 3))


@pytest.mark.parametrize(
    ("mode", "message"),
    [
        ("notjson", "answered HTTP 200 with a body that is not JSON: '<html>surprise</html>'"),
        ("noresult", "malformed answer: the answer has no 'result' field (fields present: answer)"),
        ("short", "malformed answer: 'result' has 0 entries for 2 queries"),
        ("badhit", "malformed answer: result[0][0].document has no string 'contents'"),
        ("badscore", "malformed answer: result[0][0].score should be a finite number, got 'high'"),
        ("error400", "refused the request: HTTP 400: you sent nonsense"),
    ],
)
def test_malformed_answers(garbage_server: tuple[str, dict[str, int]], mode: str, message: str) -> None:
    url, calls = garbage_server
    client = HttpRetriever(f"{url}/{mode}", retries=3, backoff_s=0.01)
    before = calls.get(mode, 0)
    with pytest.raises(RetrievalError) as error:
        client.search(["q1", "q2"], 3)
    client.close()
    assert message in str(error.value)
    assert calls[mode] == before + 1  # not retried: retrying would not help


def test_server_errors_are_retried_with_backoff(garbage_server: tuple[str, dict[str, int]]) -> None:
    url, calls = garbage_server
    client = HttpRetriever(f"{url}/error500", retries=2, backoff_s=0.01)
    before = calls.get("error500", 0)
    with pytest.raises(RetrievalError, match=r"unreachable after 3 attempts \(HTTP 500\)"):
        client.search(["q"], 3)
    client.close()
    assert calls["error500"] == before + 3


def test_serve_refuses_a_busy_port(search_server: str) -> None:
    import subprocess
    import sys

    port = search_server.rsplit(":", 1)[1]
    result = subprocess.run(
        [sys.executable, "-m", "agent_r1_plugin_search", "serve", "--corpus", "hotpotqa", "--port", port],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert f"cannot listen on 127.0.0.1:{port}" in result.stderr
