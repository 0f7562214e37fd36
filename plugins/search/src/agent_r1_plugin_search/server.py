"""A retrieval server speaking the Search-R1 protocol (FastAPI + uvicorn; extra ``server``).

``POST /retrieve`` answers ``{"queries": [...], "topk": k, "return_scores": true}`` (see
:mod:`agent_r1_plugin_search.protocol`); ``GET /health`` says what is served. It accepts what
Search-R1's own server accepts: ``topk`` may be missing or null (the server's default), ``return_scores``
defaults to false (bare documents), and unknown fields are ignored (the answer lists them under
``ignored``, so a misspelt ``top_k`` can be noticed). Problems with a request are answered with a 4xx
status and ``{"error": "<what is wrong>"}``:

* body that is not JSON, or not an object → 400;
* ``queries`` missing, not a list of strings, or empty → 400 / 422;
* more than ``max_queries`` queries (default :data:`~agent_r1_plugin_search.protocol.MAX_QUERIES`,
  8,192; ``--max-queries``) → 413;
* ``topk`` not an integer in ``1..MAX_TOPK`` → 422.

A request is handed to the retriever ``batch_size`` queries at a time (default 512), so that one
request of thousands of queries (Search-R1 sends every search of a rollout batch at once) keeps
memory bounded. Queries longer than ``max_query_chars`` are cut to that length (the answer's
``truncated`` field lists their indexes) rather than refused, because agents do write run-on queries.
"""

# No `from __future__ import annotations` here: FastAPI reads the endpoint annotations at runtime,
# and they name classes imported inside create_app (fastapi is an optional extra).
import json
import socket
import sys
from typing import Any, NamedTuple

from agent_r1_plugin_search.protocol import (
    MAX_QUERIES,
    MAX_QUERY_CHARS,
    MAX_TOPK,
    SERVER_BATCH,
    hit_to_json,
)
from agent_r1_plugin_search.retrievers import RetrievalError, Retriever


class _BadRequest(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class RetrieveRequest(NamedTuple):
    """A validated ``/retrieve`` body."""

    queries: list[str]
    topk: int
    return_scores: bool
    truncated: list[int]
    """Indexes of the queries that were cut to ``max_query_chars``."""
    ignored: list[str]
    """Fields of the body that the protocol does not know (ignored, as Search-R1's server does)."""


def parse_request(
    raw: bytes, *, default_topk: int, max_queries: int = MAX_QUERIES, max_query_chars: int = MAX_QUERY_CHARS
) -> RetrieveRequest:
    """Validate a ``/retrieve`` body (see the module docstring for what is accepted)."""
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        where = f" at line {exc.lineno} column {exc.colno}" if isinstance(exc, json.JSONDecodeError) else ""
        raise _BadRequest(400, f"request body is not valid JSON{where}: {exc}") from None
    if not isinstance(body, dict):
        raise _BadRequest(400, f"request body should be a JSON object, got {type(body).__name__}")
    ignored = sorted(set(body) - {"queries", "topk", "return_scores"})
    if "queries" not in body:
        raise _BadRequest(400, "field 'queries' is missing: send a list of query strings")
    queries = body["queries"]
    if not isinstance(queries, list):
        raise _BadRequest(422, f"field 'queries' should be a list of strings, got {type(queries).__name__}")
    if not queries:
        raise _BadRequest(400, "field 'queries' is empty: send at least one query")
    if len(queries) > max_queries:
        raise _BadRequest(
            413,
            f"{len(queries)} queries in one request; at most {max_queries} are accepted (start the "
            "server with a larger --max-queries, or send fewer queries per request)",
        )
    for i, query in enumerate(queries):
        if not isinstance(query, str):
            raise _BadRequest(422, f"queries[{i}] should be a string, got {type(query).__name__}")
    topk = body.get("topk", default_topk)
    if topk is None:
        topk = default_topk
    if isinstance(topk, bool) or not isinstance(topk, int) or not 1 <= topk <= MAX_TOPK:
        raise _BadRequest(422, f"field 'topk' should be an integer from 1 to {MAX_TOPK}, got {topk!r}")
    return_scores = body.get("return_scores", False)
    if return_scores is None:
        return_scores = False
    if not isinstance(return_scores, bool):
        raise _BadRequest(422, f"field 'return_scores' should be true or false, got {return_scores!r}")
    truncated = [i for i, query in enumerate(queries) if len(query) > max_query_chars]
    queries = [query[:max_query_chars] for query in queries]
    return RetrieveRequest(queries, topk, return_scores, truncated, ignored)


def create_app(
    retriever: Retriever,
    *,
    default_topk: int = 3,
    max_queries: int = MAX_QUERIES,
    max_query_chars: int = MAX_QUERY_CHARS,
    batch_size: int = SERVER_BATCH,
) -> Any:
    """The FastAPI application serving ``retriever`` (see the module docstring for the options)."""
    if batch_size < 1 or max_queries < 1:
        raise RetrievalError(
            f"batch_size and max_queries must be at least 1 (got {batch_size}, {max_queries})"
        )
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
            parsed = parse_request(
                await request.body(),
                default_topk=default_topk,
                max_queries=max_queries,
                max_query_chars=max_query_chars,
            )
        except _BadRequest as bad:
            return JSONResponse({"error": bad.message}, status_code=bad.status)
        results = []
        try:
            for start in range(0, len(parsed.queries), batch_size):
                results += await retriever.asearch(parsed.queries[start : start + batch_size], parsed.topk)
        except RetrievalError as exc:
            return JSONResponse({"error": f"retrieval failed: {exc}"}, status_code=502)
        body: dict[str, Any] = {
            "result": [
                [hit_to_json(hit, with_score=parsed.return_scores) for hit in hits] for hits in results
            ]
        }
        if parsed.truncated:
            body["truncated"] = parsed.truncated
        if parsed.ignored:
            body["ignored"] = parsed.ignored
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
    max_queries: int = MAX_QUERIES,
    max_query_chars: int = MAX_QUERY_CHARS,
    batch_size: int = SERVER_BATCH,
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

    app = create_app(
        retriever,
        default_topk=default_topk,
        max_queries=max_queries,
        max_query_chars=max_query_chars,
        batch_size=batch_size,
    )
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
