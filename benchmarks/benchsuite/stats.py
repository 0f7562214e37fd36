"""Summaries of per-step figures that leave out missing ones (NaN, ``None``) and the warm-up step."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any


def median(values: Sequence[float]) -> float:
    """The median of the finite values (NaN when there is none)."""
    kept = [v for v in values if v is not None and math.isfinite(v)]
    return statistics.median(kept) if kept else math.nan


def mean(values: Sequence[float]) -> float:
    """The mean of the finite values (NaN when there is none)."""
    kept = [v for v in values if v is not None and math.isfinite(v)]
    return statistics.fmean(kept) if kept else math.nan


def num(value: Any) -> float:
    """A figure as a float (NaN for a missing one, which bench.json stores as null)."""
    return math.nan if value is None else float(value)


def timed_steps(steps: Sequence[dict[str, float]]) -> list[dict[str, float]]:
    """The steps that count for speed: all but the first (which pays one-off warm-up costs) when
    there are at least two."""
    return list(steps[1:]) if len(steps) > 1 else list(steps)
