"""The retriever interface and its error."""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

from agent_r1 import AgentR1Error
from agent_r1_plugin_search.corpus import Hit

__all__ = ["RetrievalError", "Retriever"]


class RetrievalError(AgentR1Error):
    """A retriever could not answer: server unreachable, bad answer, missing extra, bad settings."""


class Retriever(ABC):
    """Finds passages for queries. Implementations must be safe to call from several threads."""

    name: str = ""

    @abstractmethod
    def search(self, queries: Sequence[str], topk: int) -> list[list[Hit]]:
        """Return, for each query, at most ``topk`` hits, best first."""

    async def asearch(self, queries: Sequence[str], topk: int) -> list[list[Hit]]:
        """Async form of :meth:`search` (runs it in a worker thread unless overridden)."""
        return await asyncio.to_thread(self.search, list(queries), topk)

    def describe(self) -> dict[str, Any]:
        """What this retriever is, for ``/health`` and logs."""
        return {"retriever": self.name}

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release sockets or other resources."""


def check_topk(topk: int) -> int:
    """``topk`` when it is a positive integer; raises :class:`RetrievalError` otherwise."""
    if not isinstance(topk, int) or isinstance(topk, bool) or topk < 1:
        raise RetrievalError(f"topk must be a positive integer, got {topk!r}")
    return topk
