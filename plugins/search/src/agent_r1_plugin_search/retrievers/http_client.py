"""A client of the Search-R1 retrieval-server protocol, with retries and exponential backoff (see
:mod:`agent_r1_plugin_search.protocol`).

(Named ``http_client`` so that it never stands for the standard library's ``http``.)
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Generator, Sequence
from typing import Any

from agent_r1_plugin_search.corpus import Hit
from agent_r1_plugin_search.protocol import ProtocolError, parse_retrieve_response
from agent_r1_plugin_search.retrievers.base import RetrievalError, Retriever, check_topk

__all__ = ["HttpRetriever"]

_Post = tuple[float | None, list[str]]
"""One post of the retry protocol: the seconds to wait before it (``None``: none) and its queries."""


class HttpRetriever(Retriever):
    """Client of a Search-R1-protocol retrieval server (``POST {url}`` with queries and topk).

    Connection failures, timeouts, HTTP 429 and 5xx answers are retried ``retries`` times with
    exponential backoff (``backoff_s``, doubled each time, at most ``max_backoff_s``). Other 4xx
    answers and malformed bodies fail at once with :class:`RetrievalError` naming the URL and the
    problem. ``url`` may be the server root (``http://host:8000``) or the endpoint
    (``http://host:8000/retrieve``).
    """

    name = "http"

    def __init__(
        self,
        url: str,
        *,
        timeout_s: float = 30.0,
        retries: int = 3,
        backoff_s: float = 0.5,
        max_backoff_s: float = 8.0,
        batch_size: int = 64,
    ) -> None:
        import httpx

        url = url.rstrip("/")
        self.url = url if url.endswith("/retrieve") else f"{url}/retrieve"
        self.timeout_s = timeout_s
        self.retries = retries
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.batch_size = batch_size
        self._client = httpx.Client(timeout=timeout_s)

    def _delay(self, attempt: int) -> float:
        return min(self.backoff_s * (2**attempt), self.max_backoff_s)

    def _payload(self, queries: list[str], topk: int) -> dict[str, Any]:
        return {"queries": queries, "topk": topk, "return_scores": True}

    def _outcome(self, response: Any, queries: list[str], topk: int) -> list[list[Hit]] | str:
        """The hits of a good answer, or the reason to retry; raises on an answer not worth retrying."""
        if response.status_code == 429 or response.status_code >= 500:
            return f"HTTP {response.status_code}"
        if response.status_code >= 400:
            try:
                body = response.json()
                detail = body.get("error") or body.get("detail") if isinstance(body, dict) else body
            except ValueError:
                detail = response.text[:200]
            raise RetrievalError(
                f"retrieval server {self.url} refused the request: HTTP {response.status_code}: {detail}"
            )
        try:
            body = response.json()
        except ValueError:
            raise RetrievalError(
                f"retrieval server {self.url} answered HTTP {response.status_code} with a body that is "
                f"not JSON: {response.text[:200]!r}"
            ) from None
        try:
            return parse_retrieve_response(body, expected=len(queries), topk=topk)
        except ProtocolError as exc:
            raise RetrievalError(f"retrieval server {self.url} sent a malformed answer: {exc}") from None

    def _unreachable(self, last: str) -> RetrievalError:
        return RetrievalError(
            f"retrieval server {self.url} is unreachable after {self.retries + 1} attempts ({last}). "
            "Start one with `agent-r1-search serve --corpus PATH --port N`, or fix the retriever url."
        )

    def _batches(self, queries: Sequence[str], topk: int) -> list[list[str]]:
        check_topk(topk)
        texts = [str(q) for q in queries]
        return [texts[i : i + self.batch_size] for i in range(0, len(texts), self.batch_size)]

    def _exchange(self, queries: Sequence[str], topk: int) -> Generator[_Post, Any, list[list[Hit]]]:
        """The retry protocol, apart from its I/O (which :meth:`search` and :meth:`asearch` do):
        yields each post to make, as the seconds to wait first (``None``: none) and the batch of
        queries; is sent the response, or the text of the error a failed post raised; returns the
        hits of every query, or raises :class:`RetrievalError`."""
        out: list[list[Hit]] = []
        for batch in self._batches(queries, topk):
            outcome: list[list[Hit]] | str = ""
            for attempt in range(self.retries + 1):
                answer = yield (self._delay(attempt - 1) if attempt else None), batch
                outcome = answer if isinstance(answer, str) else self._outcome(answer, batch, topk)
                if not isinstance(outcome, str):
                    break
            if isinstance(outcome, str):
                raise self._unreachable(outcome)
            out.extend(outcome)
        return out

    def search(self, queries: Sequence[str], topk: int) -> list[list[Hit]]:
        import httpx

        exchange = self._exchange(queries, topk)
        try:
            delay, batch = next(exchange)
            while True:
                if delay is not None:
                    time.sleep(delay)
                try:
                    answer: Any = self._client.post(self.url, json=self._payload(batch, topk))
                except httpx.HTTPError as exc:
                    answer = _failure(exc)
                delay, batch = exchange.send(answer)
        except StopIteration as done:
            return done.value

    async def asearch(self, queries: Sequence[str], topk: int) -> list[list[Hit]]:
        import httpx

        exchange = self._exchange(queries, topk)
        async with httpx.AsyncClient(timeout=self.timeout_s) as client:
            try:
                delay, batch = next(exchange)
                while True:
                    if delay is not None:
                        await asyncio.sleep(delay)
                    try:
                        answer: Any = await client.post(self.url, json=self._payload(batch, topk))
                    except httpx.HTTPError as exc:
                        answer = _failure(exc)
                    delay, batch = exchange.send(answer)
            except StopIteration as done:
                return done.value

    def describe(self) -> dict[str, Any]:
        return {"retriever": self.name, "url": self.url}

    def close(self) -> None:
        self._client.close()


def _failure(exc: Exception) -> str:
    """A post that raised, as the retry protocol's reason to try again."""
    return f"{type(exc).__name__}: {exc}"
