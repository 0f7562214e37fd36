"""One training step: collect experience, then update the policy.

Start reading here to follow a GRPO step: :func:`train_step` calls
:func:`agent_r1.engine.collect.collect` (rollout, rewards, dynamic sampling) and
:func:`agent_r1.engine.update.update` (advantages, loss, optimizer steps, weight sync). The session
(:mod:`agent_r1.engine.session`) holds the objects both use; the runner
(:mod:`agent_r1.run.training`) owns the run around the steps: run directory, evaluation,
checkpoints, trackers, observer hooks, signals and the reward-hacking alarms.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from agent_r1.engine.asynchrony import AsyncRollouts, ProcessRollouts
from agent_r1.engine.collect import all_gather, collect
from agent_r1.engine.reports.health import step_figures, trajectory_counts
from agent_r1.engine.session import Session
from agent_r1.engine.update import update
from agent_r1.errors import AgentR1Error, TrainingAborted
from agent_r1.mdp import Trajectory

__all__ = ["StepResult", "train_step"]


@dataclass
class StepResult:
    """What one training step produced: its metrics, this process's trajectories (those trained
    on), and the episodes set aside because their environment or a reward shaper failed."""

    metrics: dict[str, float]
    trajectories: list[Trajectory]
    failed: list[Trajectory] = field(default_factory=list)


def train_step(session: Session) -> StepResult:
    """Run one full training step (rollout, rewards, update) and return what it produced."""
    started = time.perf_counter()
    step = session.step
    producer = _async_rollouts(session)
    trajectories, failed, metrics = producer.take(step) if producer else collect(session, step)
    _check_failures(session, trajectories, failed, metrics)
    metrics.update(_health_figures(session, trajectories))
    metrics.update(update(session, trajectories))
    if producer is not None:  # the rollouts' copy gets the new weights at its next turn
        producer.pushed(session.unwrapped, session.step)
    for name, value in session.backend.step_metrics().items():  # weight sync, sleep/wake figures
        metrics[name] = metrics.get(name, 0.0) + value  # async: added to the rollout copy's
    metrics["time/step_s"] = time.perf_counter() - started
    if producer is not None:
        metrics["async/trainer_idle_share"] = metrics["async/trainer_wait_s"] / max(
            metrics["time/step_s"], 1e-9
        )
    accounted = (
        "time/rollout_s",  # generation, tools and rewards
        "time/no_grad_passes_s",
        "time/advantages_s",
        "time/forward_backward_s",
        "time/optimizer_s",
    )
    metrics["time/other_s"] = max(metrics["time/step_s"] - sum(metrics.get(k, 0.0) for k in accounted), 0.0)
    metrics["perf/tokens_per_s"] = metrics.pop("_tokens") / max(metrics["time/step_s"], 1e-9)
    return StepResult(metrics, trajectories, failed)


def _async_rollouts(session: Session) -> Any:
    """The session's producer of ``rollout.mode: async`` (started at its first step), or None."""
    if session.config.rollout.mode != "async":
        return None
    if session.async_rollouts is None:
        worker = session.config.rollout.async_worker
        if worker == "ranks":
            from agent_r1.engine.asynchrony.ranks import RankRollouts

            if session.launch_role is None:
                raise AgentR1Error(
                    "rollout.async_worker ranks needs the processes of a launch: run `torchrun "
                    "--nproc_per_node 2 -m agent_r1.cli train run.yaml ...` (rank 0 trains, the others "
                    "roll out), or use rollout.async_worker: thread or process"
                )
            session.async_rollouts = RankRollouts(session, session.launch_role)
        elif worker == "process":
            session.async_rollouts = ProcessRollouts(session)
        else:
            session.async_rollouts = AsyncRollouts(session)
    return session.async_rollouts  # type: ignore[no-any-return]


def _check_failures(
    session: Session, kept: list[Trajectory], failed: list[Trajectory], metrics: dict[str, float]
) -> None:
    """Count the episodes whose environment or reward shaper failed (over every process), and stop
    the run when their share passes ``trainer.max_error_rate``."""
    unclosed = sum(t.metrics.get("env_close_errors", 0.0) for t in [*kept, *failed])
    counts = all_gather(session, [(len(kept), len(failed), failed[0].errors[0] if failed else "", unclosed)])
    total = sum(c[0] + c[1] for c in counts)
    bad = sum(c[1] for c in counts)
    metrics["errors/failed_episodes"] = float(bad)
    metrics["errors/failed_rate"] = bad / max(total, 1)
    metrics["errors/env_close_errors"] = float(sum(c[3] for c in counts))
    limit = session.config.trainer.max_error_rate
    if bad and (bad / max(total, 1) > limit or bad == total):
        first = next(c[2] for c in counts if c[2])
        raise TrainingAborted(
            f"step {session.step}: {bad} of {total} episodes failed outside the agent's control (limit "
            f"trainer.max_error_rate={limit:g}); first: {first}. Fix the environment, tool or reward shaper "
            "(its own error setting, e.g. a tool's timeout or a retriever's address), or raise "
            "trainer.max_error_rate to tolerate more."
        )


def _health_figures(session: Session, kept: list[Trajectory]) -> dict[str, float]:
    """The per-trajectory figures of the reward-hacking alarms (suspicious reward paths, reward
    model against verifier), counted over every process's trained-on trajectories so that every
    process judges the alarms alike (:mod:`agent_r1.engine.reports.health`); empty when ``health`` is off."""
    config = session.config.health
    if not config.enabled:
        return {}
    return step_figures(all_gather(session, [trajectory_counts(kept, config)]), config)
