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
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from agent_r1 import ComponentConfig, Tool, ToolError
from agent_r1.errors import ToolInfrastructureError
from agent_r1_plugin_search.corpus import CorpusError, Hit
from agent_r1_plugin_search.protocol import MAX_QUERY_CHARS
from agent_r1_plugin_search.retrievers import (
    RetrievalError,
    RetrieverConfig,
    check_retriever,
    get_retriever,
)

RESULT_LINE = re.compile(r"^Doc (\d+) ?\(Title: (\"?)(.*?)\2\) ", re.MULTILINE)


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


def format_hits(hits: Sequence[Hit], *, max_passage_chars: int | None = None, style: str = "agent_r1") -> str:
    """``Doc N (Title: T) text`` lines, or a short note when nothing was found.

    ``style="search_r1"`` writes what Search-R1's rollout shows its policy (``_passages2string``):
    ``Doc N(Title: "T") text`` (no space before the parenthesis, the title as the first line of the
    passage's ``contents``, quotes included), the text as it is, and nothing at all for no hits.
    """
    if style == "search_r1":
        return "\n".join(f'Doc {rank}(Title: "{hit.title}") {hit.text}' for rank, hit in enumerate(hits, 1))
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
    """Titles of the ``Doc N (Title: T)`` lines of a search result, in either style (best effort: a
    title that itself contains ``") "`` is cut there; the observation-info record is exact)."""
    return [match.group(3) for match in RESULT_LINE.finditer(text)]


class SearchTool(Tool):
    """Search a passage corpus (BM25, dense, FAISS, or a retrieval server) and return the top passages.

    A retrieval failure that is not the agent's doing (the server is unreachable after the client's
    retries or answers something malformed, the corpus or index is missing or unreadable) raises
    :class:`~agent_r1.errors.ToolInfrastructureError`: the policy never reads it as an observation,
    and the engine treats the step as an environment error. With ``show_errors: true`` it is an
    ordinary failed call instead (``Error: search failed: ...``, shown to the agent). An empty query
    is the agent's mistake and always shown.
    """

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
        result_style: Literal["agent_r1", "search_r1"] = Field(
            "agent_r1",
            description="search_r1: Search-R1's 'Doc N(Title: \"T\") text' lines, passages as they are",
        )
        show_errors: bool = Field(
            False,
            description="show retrieval failures to the agent as failed calls instead of raising "
            "ToolInfrastructureError (the search_qa environment sets it for on_retrieval_error: show)",
        )

    @classmethod
    def check(cls, config: Any) -> list[str]:
        """Problems a run would hit when this tool first searches, found before any model loads:
        corpus (or index) missing, empty or not a corpus at all, a missing optional package. Empty
        when the retriever looks usable. Reads the first record of the corpus only."""
        cfg = config if isinstance(config, cls.Config) else cls.Config.model_validate(dict(config or {}))
        return check_retriever(cfg.retriever)  # the preflight names the component in front

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
        except (RetrievalError, CorpusError) as exc:
            if records is not None:
                records.append(SearchRecord(query=query, error=str(exc)))
            if self.config.show_errors:
                raise ToolError(f"search failed: {exc}") from exc
            raise ToolInfrastructureError(f"search tool: retrieval failed: {exc}") from exc
        if records is not None:
            records.append(
                SearchRecord(
                    query=query,
                    ids=[hit.id for hit in hits],
                    titles=[hit.title for hit in hits],
                    scores=[round(hit.score, 4) for hit in hits],
                )
            )
        return format_hits(
            hits, max_passage_chars=self.config.max_passage_chars, style=self.config.result_style
        )
