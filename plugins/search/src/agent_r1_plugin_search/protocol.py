"""The Search-R1 retrieval-server protocol, shared by the server and the HTTP client.

Request: ``POST /retrieve`` with ``{"queries": ["..."], "topk": 3, "return_scores": true}``. As in
Search-R1's server, ``topk`` may be left out (the server's default) and ``return_scores`` defaults
to false; fields the server does not know are ignored (and listed in the answer's ``ignored``).

Answer, one list of hits per query, best first::

    {"result": [[{"document": {"id": "...", "contents": "\\"Title\\"\\ntext"}, "score": 12.3}, ...], ...]}

With ``"return_scores": false`` each hit is the bare document (``{"id", "contents"}``). Documents
may also carry ``title`` and ``text`` instead of ``contents`` (FlashRAG corpora do); this client
accepts both.
"""

from __future__ import annotations

import math
from typing import Any

from agent_r1 import AgentR1Error
from agent_r1_plugin_search.corpus import Hit, split_contents

MAX_QUERIES = 8192
"""Default cap on the queries of one request (the server answers 413 above it; ``agent-r1-search serve
--max-queries`` changes it). Search-R1 posts every search of a rollout batch in one request: its GRPO
script's 512 prompts x 5 samples make 2,560 queries."""

SERVER_BATCH = 512
"""Default number of queries the server hands the retriever at a time (large requests are split, so
peak memory stays bounded; ``--batch-size`` changes it)."""

MAX_TOPK = 100
"""Largest ``topk`` the server accepts."""

MAX_QUERY_CHARS = 2048
"""Queries longer than this are cut to this many characters before retrieval."""


class ProtocolError(AgentR1Error):
    """An answer does not follow the retrieval protocol; the message names the JSON path."""


def _document_fields(document: Any, where: str) -> tuple[str, str, str]:
    if not isinstance(document, dict):
        raise ProtocolError(f"{where} should be a JSON object, got {type(document).__name__}")
    if isinstance(document.get("contents"), str):
        title, text = split_contents(document["contents"])
    elif isinstance(document.get("text"), str):
        title, text = str(document.get("title", "")), document["text"]
    else:
        present = ", ".join(sorted(map(str, document))) or "none"
        raise ProtocolError(f"{where} has no string 'contents' (or 'text'); fields present: {present}")
    raw_id = document.get("id", document.get("doc_id"))
    passage_id = str(raw_id) if raw_id is not None else title
    return passage_id, title, text


def parse_hit(item: Any, where: str) -> Hit:
    """One hit: ``{"document": {...}, "score": x}`` or a bare document (score 0.0)."""
    if isinstance(item, dict) and "document" in item:
        passage_id, title, text = _document_fields(item["document"], f"{where}.document")
        score = item.get("score", 0.0)
        if isinstance(score, bool) or not isinstance(score, (int, float)) or not math.isfinite(score):
            raise ProtocolError(f"{where}.score should be a finite number, got {score!r}")
        return Hit(passage_id, title, text, float(score))
    passage_id, title, text = _document_fields(item, where)
    return Hit(passage_id, title, text, 0.0)


def parse_retrieve_response(body: Any, *, expected: int, topk: int | None = None) -> list[list[Hit]]:
    """Validate a ``/retrieve`` answer for ``expected`` queries and return its hits (at most ``topk``)."""
    if not isinstance(body, dict):
        raise ProtocolError(f"the answer should be a JSON object with 'result', got {type(body).__name__}")
    if "result" not in body:
        present = ", ".join(sorted(map(str, body))) or "none"
        raise ProtocolError(f"the answer has no 'result' field (fields present: {present})")
    result = body["result"]
    if not isinstance(result, list):
        raise ProtocolError(f"'result' should be a list (one per query), got {type(result).__name__}")
    if len(result) != expected:
        raise ProtocolError(f"'result' has {len(result)} entries for {expected} queries")
    out: list[list[Hit]] = []
    for i, hits in enumerate(result):
        if not isinstance(hits, list):
            raise ProtocolError(f"result[{i}] should be a list of hits, got {type(hits).__name__}")
        parsed = [parse_hit(item, f"result[{i}][{j}]") for j, item in enumerate(hits)]
        out.append(parsed[:topk] if topk is not None else parsed)
    return out


def hit_to_json(hit: Hit, *, with_score: bool = True) -> dict[str, Any]:
    """A hit as the protocol spells it."""
    document = {"id": hit.id, "contents": f'"{hit.title}"\n{hit.text}'}
    return {"document": document, "score": hit.score} if with_score else document
