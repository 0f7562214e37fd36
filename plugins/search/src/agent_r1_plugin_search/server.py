"""A retrieval server speaking the Search-R1 protocol (FastAPI + uvicorn; extra ``server``).

``POST /retrieve`` answers ``{"queries": [...], "topk": k, "return_scores": true}`` (see
:mod:`agent_r1_plugin_search.protocol`); ``GET /health`` says what is served. Problems with a
request are answered with a 4xx status and ``{"error": "<what is wrong>"}``:

* body that is not JSON, or not an object → 400;
* ``queries`` missing, not a list of strings, or empty → 400 / 422;
* more than :data:`~agent_r1_plugin_search.protocol.MAX_QUERIES` queries → 413;
* ``topk`` not an integer in ``1..MAX_TOPK`` → 422.

Queries longer than ``max_query_chars`` are cut to that length (the answer's ``truncated`` field
lists their indexes) rather than refused, because agents do write run-on queries.
"""

# No `from __future__ import annotations` here: FastAPI reads the endpoint annotations at runtime,
# and they name classes imported inside create_app (fastapi is an optional extra).
import json
import socket
import sys
from typing import Any

from agent_r1_plugin_search.protocol import MAX_QUERIES, MAX_QUERY_CHARS, MAX_TOPK, hit_to_json
from agent_r1_plugin_search.retrievers import RetrievalError, Retriever


class _BadRequest(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def parse_request(
    raw: bytes, *, default_topk: int, max_queries: int = MAX_QUERIES, max_query_chars: int = MAX_QUERY_CHARS
) -> tuple[list[str], int, bool, list[int]]:
    """Validate a ``/retrieve`` body: ``(queries, topk, return_scores, indexes of cut queries)``."""
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        where = f" at line {exc.lineno} column {exc.colno}" if isinstance(exc, json.JSONDecodeError) else ""
        raise _BadRequest(400, f"request body is not valid JSON{where}: {exc}") from None
    if not isinstance(body, dict):
        raise _BadRequest(400, f"request body should be a JSON object, got {type(body).__name__}")
    unknown = sorted(set(body) - {"queries", "topk", "return_scores"})
    if unknown:
        raise _BadRequest(
            422, f"unknown field(s) {', '.join(map(repr, unknown))}; expected queries, topk, return_scores"
        )
    if "queries" not in body:
        raise _BadRequest(400, "field 'queries' is missing: send a list of query strings")
    queries = body["queries"]
    if not isinstance(queries, list):
        raise _BadRequest(422, f"field 'queries' should be a list of strings, got {type(queries).__name__}")
    if not queries:
        raise _BadRequest(400, "field 'queries' is empty: send at least one query")
    if len(queries) > max_queries:
        raise _BadRequest(413, f"{len(queries)} queries in one request; at most {max_queries} are accepted")
    for i, query in enumerate(queries):
        if not isinstance(query, str):
            raise _BadRequest(422, f"queries[{i}] should be a string, got {type(query).__name__}")
    topk = body.get("topk", default_topk)
    if topk is None:
        topk = default_topk
    if isinstance(topk, bool) or not isinstance(topk, int) or not 1 <= topk <= MAX_TOPK:
        raise _BadRequest(422, f"field 'topk' should be an integer from 1 to {MAX_TOPK}, got {topk!r}")
    return_scores = body.get("return_scores", True)
    if not isinstance(return_scores, bool):
        raise _BadRequest(422, f"field 'return_scores' should be true or false, got {return_scores!r}")
    truncated = [i for i, query in enumerate(queries) if len(query) > max_query_chars]
    queries = [query[:max_query_chars] for query in queries]
    return queries, topk, return_scores, truncated


def create_app(
    retriever: Retriever,
    *,
    default_topk: int = 3,
    max_queries: int = MAX_QUERIES,
    max_query_chars: int = MAX_QUERY_CHARS,
) -> Any:
    """The FastAPI application serving ``retriever``."""
    try:
        from fastapi import FastAPI, Request
        from fastapi.responses import JSONResponse
    except ImportError:
        raise RetrievalError(
            "the retrieval server needs FastAPI and uvicorn: pip install 'agent-r1-plugin-search[server]'"
        ) from None

    app = FastAPI(title="agent-r1 retrieval server", version="1", docs_url=None, redoc_url=None)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", **retriever.describe()}

    @app.post("/retrieve")
    async def retrieve(request: Request) -> Any:
        try:
            queries, topk, return_scores, truncated = parse_request(
                await request.body(),
                default_topk=default_topk,
                max_queries=max_queries,
                max_query_chars=max_query_chars,
            )
        except _BadRequest as bad:
            return JSONResponse({"error": bad.message}, status_code=bad.status)
        try:
            results = await retriever.asearch(queries, topk)
        except RetrievalError as exc:
            return JSONResponse({"error": f"retrieval failed: {exc}"}, status_code=502)
        body: dict[str, Any] = {
            "result": [[hit_to_json(hit, with_score=return_scores) for hit in hits] for hits in results]
        }
        if truncated:
            body["truncated"] = truncated
        return body

    return app


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise RetrievalError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    return sock


def serve(
    retriever: Retriever,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    default_topk: int = 3,
    max_query_chars: int = MAX_QUERY_CHARS,
    log_level: str = "warning",
) -> None:
    """Serve ``retriever`` until interrupted. ``port=0`` picks a free port.

    Once the server accepts connections it prints one line to stdout,
    ``agent-r1-search: serving on http://HOST:PORT``, so scripts can wait for it and read the port.
    """
    try:
        import uvicorn
    except ImportError:
        raise RetrievalError(
            "the retrieval server needs FastAPI and uvicorn: pip install 'agent-r1-plugin-search[server]'"
        ) from None

    app = create_app(retriever, default_topk=default_topk, max_query_chars=max_query_chars)
    sock = _bind(host, port)
    bound_port = sock.getsockname()[1]
    shown_host = f"[{host}]" if ":" in host else host

    class _AnnouncingServer(uvicorn.Server):
        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets=sockets)
            if not self.should_exit:
                print(f"agent-r1-search: serving on http://{shown_host}:{bound_port}", flush=True)

    config = uvicorn.Config(app, log_level=log_level, access_log=False, lifespan="off")
    try:
        _AnnouncingServer(config).run(sockets=[sock])
    finally:
        sock.close()
        sys.stdout.flush()
