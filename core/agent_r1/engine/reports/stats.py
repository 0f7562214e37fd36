"""Trajectory statistics: one definition of turns, tool calls, errors, termination and success,
used by the training metrics (:func:`batch_metrics`) and by evaluation
(:mod:`agent_r1.engine.reports.evaluation`). No torch is imported here (:func:`tensor_stats` takes tensors
from its caller).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from typing import Any

from agent_r1.mdp import Trajectory

__all__ = [
    "SUCCESS_EPS",
    "batch_metrics",
    "format_errors",
    "mean_metric",
    "succeeded",
    "tensor_stats",
    "termination",
    "tool_calls",
    "tool_results",
    "turns",
]

SUCCESS_EPS = 1e-9
"""A signal of 0.9999999999 still reaches a success threshold of 1.0."""


def turns(trajectory: Trajectory) -> int:
    """Actions taken. Steps are the record of actions; hand-built or step-less trajectories fall
    back to their segments' turns."""
    return len(trajectory.steps) if trajectory.steps else trajectory.num_turns


def tool_calls(trajectory: Trajectory) -> int:
    """Calls that ran: a step's tool results. Calls the environment ignored (written next to a final
    answer) do not count; a step without an observation counts the calls its action holds."""
    if not trajectory.steps:
        return int(trajectory.metrics.get("tool_calls", 0))
    return sum(
        len(step.observation.tool_results) if step.observation is not None else len(step.action.tool_calls)
        for step in trajectory.steps
    )


def tool_results(trajectory: Trajectory) -> tuple[int, int]:
    """``(results, failed results)`` of an episode."""
    if not trajectory.steps:
        return 0, int(trajectory.metrics.get("tool_errors", 0))
    results = [
        r for step in trajectory.steps if step.observation is not None for r in step.observation.tool_results
    ]
    return len(results), sum(not r.ok for r in results)


def format_errors(trajectory: Trajectory) -> int:
    """Parse errors the environment reported on the episode's actions."""
    if trajectory.steps:
        return sum(len(step.action.parse_errors) for step in trajectory.steps)
    return int(trajectory.metrics.get("format_errors", 0))


def termination(trajectory: Trajectory) -> str:
    """Why the episode ended (``answer``, ``max_turns``...; ``unknown`` when nothing says)."""
    if trajectory.termination:
        return trajectory.termination
    for step in reversed(trajectory.steps):
        if step.observation is not None and step.observation.termination:
            return step.observation.termination
    return "unknown"


def succeeded(trajectory: Trajectory, signal: str, threshold: float = 1.0) -> bool:
    """Whether the unweighted sum of the episode's ``signal`` rewards reaches ``threshold``."""
    return trajectory.reward_by_name().get(signal, 0.0) >= threshold - SUCCESS_EPS


def _mean(values: Sequence[float]) -> float:
    return float(sum(values) / len(values)) if values else 0.0


def _std(values: Sequence[float]) -> float:
    if not values:
        return 0.0
    mean = _mean(values)
    return float((sum((v - mean) ** 2 for v in values) / len(values)) ** 0.5)


def batch_metrics(trajectories: Sequence[Trajectory], *, success_signal: str) -> dict[str, float]:
    """A training batch's rewards by signal, scores, success, lengths, turns, tool use, format
    errors, template drift, environment errors and termination reasons (see docs/metrics.md)."""
    n = max(len(trajectories), 1)
    scores = [t.score for t in trajectories]
    out: dict[str, float] = {"reward/score_mean": _mean(scores), "reward/score_std": _std(scores)}
    by_name: dict[str, float] = defaultdict(float)
    for t in trajectories:
        for name, value in t.reward_by_name().items():
            by_name[name] += value
    for name, total in by_name.items():
        out[f"reward/{name}"] = total / n
    out["success/train"] = sum(succeeded(t, success_signal) for t in trajectories) / n
    lengths = [float(t.num_policy_tokens) for t in trajectories]
    out["response/length_mean"] = _mean(lengths)
    out["response/length_max"] = max(lengths, default=0.0)
    out["response/turns_mean"] = _mean([float(turns(t)) for t in trajectories])
    out["response/truncated"] = sum(t.truncated for t in trajectories) / n
    calls = [tool_calls(t) for t in trajectories]
    results = [tool_results(t) for t in trajectories]
    out["tools/calls_mean"] = _mean([float(c) for c in calls])
    out["tools/errors_mean"] = _mean([float(failed) for _, failed in results])
    out["tools/error_rate"] = sum(failed for _, failed in results) / max(sum(r for r, _ in results), 1)
    out["rollout/format_error_rate"] = sum(format_errors(t) > 0 for t in trajectories) / n
    out["rollout/template_drift_tokens"] = _mean(
        [t.metrics.get("template_drift_tokens", 0.0) for t in trajectories]
    )
    out["rollout/env_error_rate"] = sum(t.metrics.get("env_errors", 0.0) > 0 for t in trajectories) / n
    env_figures = sorted({name for t in trajectories for name in t.metrics if name.startswith("env/")})
    for name in env_figures:  # Observation.metrics of the environments, per episode, batch mean
        out[name] = _mean([t.metrics.get(name, 0.0) for t in trajectories])
    for reason, count in Counter(termination(t) for t in trajectories).items():
        out[f"termination/{reason}"] = count / n
    return out


def tensor_stats(prefix: str, values: Any, mask: Any) -> dict[str, float]:
    selected = values[mask].float()
    if selected.numel() == 0:
        return {f"{prefix}/{k}": 0.0 for k in ("mean", "std", "max", "min")}
    return {
        f"{prefix}/mean": float(selected.mean()),
        f"{prefix}/std": float(selected.std()) if selected.numel() > 1 else 0.0,
        f"{prefix}/max": float(selected.max()),
        f"{prefix}/min": float(selected.min()),
    }


def mean_metric(trajectories: Sequence[Trajectory], name: str) -> float:
    return sum(t.metrics.get(name, 0.0) for t in trajectories) / max(len(trajectories), 1)
