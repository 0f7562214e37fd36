"""The ``search`` tool: one query in, the top-k passages out, formatted with their titles.

The result the agent reads looks like Search-R1's::

    Doc 1 (Title: Tinted Windows (band)) Tinted Windows is an American rock supergroup ...
    Doc 2 (Title: ...) ...

Which passages a call retrieved is recorded for rewards (see :mod:`agent_r1_plugin_search.rewards`)
in two ways:

1. **Observation info** (primary). While :func:`recording_searches` is active, every search call
   appends a :class:`SearchRecord` (query, passage ids, titles, scores) to the active list. The
   ``search_qa`` environment wraps each step in it and stores the records, as plain dicts, under
   ``observation.info["search"]`` (one entry per successful call, in completion order).
2. **The result text** (fallback). The ``Doc N (Title: T)`` lines are parsed back by
   :func:`titles_from_text`, so trajectories produced by another environment that uses this tool
   (e.g. the generic ``tool_env``) can still be scored on titles.
"""

from __future__ import annotations

import contextvars
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from agent_r1 import ComponentConfig, Tool, ToolError
from agent_r1_plugin_search.corpus import Hit
from agent_r1_plugin_search.protocol import MAX_QUERY_CHARS
from agent_r1_plugin_search.retrievers import RetrievalError, RetrieverConfig, get_retriever

RESULT_LINE = re.compile(r"^Doc (\d+) \(Title: (.*?)\) ", re.MULTILINE)


@dataclass
class SearchRecord:
    """What one search call retrieved (stored in ``observation.info["search"]`` as a dict)."""

    query: str
    ids: list[str] = field(default_factory=list)
    titles: list[str] = field(default_factory=list)
    scores: list[float] = field(default_factory=list)
    error: str | None = None
    """Why the retriever failed (server unreachable...); ``None`` for a search that ran."""

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        if data["error"] is None:
            del data["error"]
        return data


_RECORDER: contextvars.ContextVar[list[SearchRecord] | None] = contextvars.ContextVar(
    "agent_r1_plugin_search_recorder", default=None
)


@contextmanager
def recording_searches() -> Iterator[list[SearchRecord]]:
    """Collect the :class:`SearchRecord` of every search call made inside the block.

    The list is shared through a context variable, so calls made in tasks or threads started from
    the block (``asyncio.gather``, ``asyncio.to_thread``, ``asyncio.wait_for``) are recorded too.
    """
    records: list[SearchRecord] = []
    token = _RECORDER.set(records)
    try:
        yield records
    finally:
        _RECORDER.reset(token)


def format_hits(hits: Sequence[Hit], *, max_passage_chars: int | None = None) -> str:
    """``Doc N (Title: T) text`` lines, or a short note when nothing was found."""
    if not hits:
        return "No results found. Try different keywords."
    lines = []
    for rank, hit in enumerate(hits, start=1):
        text = " ".join(hit.text.split())
        if max_passage_chars is not None and len(text) > max_passage_chars:
            text = text[:max_passage_chars].rstrip() + " ..."
        lines.append(f"Doc {rank} (Title: {hit.title}) {text}")
    return "\n".join(lines)


def titles_from_text(text: str) -> list[str]:
    """Titles of the ``Doc N (Title: T)`` lines of a search result (best effort: a title that itself
    contains ``") "`` is cut there; the observation-info record is exact)."""
    return [match.group(2) for match in RESULT_LINE.finditer(text)]


class SearchTool(Tool):
    """Search a passage corpus (BM25, dense, or a retrieval server) and return the top passages."""

    name = "search"
    description = (
        "Search a Wikipedia knowledge base. Returns the most relevant passages, each with its title. "
        "Use short, specific queries (an entity and what you want to know about it)."
    )

    class Arguments(BaseModel):
        model_config = ConfigDict(extra="forbid")

        query: str = Field(description="what to search for, e.g. 'Tinted Windows band first performance'")

    class Config(ComponentConfig):
        topk: int = Field(3, ge=1, le=100, description="passages returned per search")
        retriever: RetrieverConfig = Field(default_factory=RetrieverConfig, description="where to search")
        max_query_chars: int = Field(MAX_QUERY_CHARS, ge=1, description="longer queries are cut")
        max_passage_chars: int | None = Field(None, ge=16, description="cut each passage's text (None: keep)")

    @property
    def retriever(self) -> Any:
        """The shared retriever for this tool's config (built on first use)."""
        return get_retriever(self.config.retriever)

    async def run(self, arguments: Any) -> str:
        if isinstance(arguments, dict):
            arguments = self.Arguments.model_validate(arguments)
        query = " ".join(str(arguments.query).split())[: self.config.max_query_chars]
        if not query:
            raise ToolError("the search query is empty: write what to search for")
        records = _RECORDER.get()
        try:
            hits = (await self.retriever.asearch([query], self.config.topk))[0]
        except RetrievalError as exc:
            if records is not None:
                records.append(SearchRecord(query=query, error=str(exc)))
            raise
        if records is not None:
            records.append(
                SearchRecord(
                    query=query,
                    ids=[hit.id for hit in hits],
                    titles=[hit.title for hit in hits],
                    scores=[round(hit.score, 4) for hit in hits],
                )
            )
        return format_hits(hits, max_passage_chars=self.config.max_passage_chars)
