"""The tool task's environment, in TRL's ``environment_factory`` contract (used by both arms), and
the record of when its tool calls ran."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Sequence
from typing import Any

from benchsuite.tasks import code_of

CALLS: list[tuple[float, float]] = []
"""(start, end) of every ``CodeBook.lookup`` call in this process (``time.perf_counter``)."""


def interval_union(intervals: Sequence[tuple[float, float]]) -> float:
    """The time covered by at least one of ``intervals``: the tool wall time of a step."""
    total, end = 0.0, -math.inf
    for start, stop in sorted(intervals):
        if start > end:
            total += stop - start
            end = stop
        elif stop > end:
            total += stop - end
            end = stop
    return total


class CodeBook:
    """The tool task: look up the codes of the two keys in the request with the ``lookup`` tool.

    A TRL ``environment_factory`` class (``reset``, public tool methods with docstrings,
    ``get_reward``). ``lookup`` is ``async`` and waits ``latency_s`` like a remote service would;
    every call's (start, end) goes to :data:`CALLS`. ``get_reward`` = 0.25 per lookup (two at
    most) + 0.25 per key of the request looked up: 1.0 for the right two calls.
    """

    def __init__(self, latency_s: float = 0.0) -> None:
        self.latency_s = latency_s
        self.keys: list[str] = []
        self.looked_up: list[str] = []

    def reset(self, **row: Any) -> None:
        """Start an episode from a dataset row (its ``keys`` column)."""
        self.keys = list(row.get("keys") or [])
        self.looked_up = []

    async def lookup(self, key: str) -> str:
        """Look up the code stored under a key.

        Args:
            key: the key to look up
        """
        started = time.perf_counter()
        if self.latency_s > 0:
            await asyncio.sleep(self.latency_s)
        CALLS.append((started, time.perf_counter()))
        self.looked_up.append(str(key))
        return f"code {code_of(str(key))}"

    def get_reward(self) -> float:
        """0.25 per lookup (two at most) + 0.25 per requested key that was looked up."""
        calls = min(len(self.looked_up), len(self.keys))
        right = len(set(self.looked_up) & set(self.keys))
        return 0.25 * calls + 0.25 * right
