"""The share of step time that is neither model compute nor tool waiting, per agent-r1 run of the
``trl`` and ``scaling`` sections."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from benchsuite.stats import num, timed_steps


def overhead_rows(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Per agent-r1 run of the other sections: the mean share of step time in ``time/other_s``
    (the engine's own remainder) and in everything but model compute and tool waiting."""
    rows = []
    for case in results.get("trl", {}).get("cases", []):
        for run in case["runs"]:
            if run.get("arm") == "agent-r1" and "error" not in run:
                rows.append(_overhead_row(f"trl/{case['case']} #{run['repeat']}", run["steps"]))
    for name, model in results.get("scaling", {}).get("models", {}).items():
        for point in model["points"]:
            if "error" not in point:
                rows.append(_overhead_row(f"scaling/{name} {point['axis']}={point['value']}", point["steps"]))
    return rows


def _overhead_row(label: str, steps: Sequence[dict[str, float]]) -> dict[str, Any]:
    kept = timed_steps(steps)
    wall = sum(s["wall_s"] for s in kept)

    def share(key: str) -> float:
        return sum(num(s.get(key)) for s in kept) / wall if wall else math.nan

    return {
        "run": label,
        "step_s": wall / max(len(kept), 1),
        "other_share": share("other_s"),
        "overhead_share": share("overhead_s"),
        "rewards_share": share("rewards_s"),
        "advantages_share": share("advantages_s"),
    }
