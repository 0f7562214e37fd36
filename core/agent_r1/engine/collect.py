"""Collect one step's experience: roll out, score, and apply the algorithm's sampling options.

Read top to bottom:

1. :func:`collect` takes this process's share of ``trainer.tasks_per_step`` tasks and rolls each
   out ``rollout.group_size`` times with the current policy (:func:`rollout`);
2. every trajectory is scored by the reward shapers, each signal multiplied by the shaper's weight
   (:func:`score`); an episode whose environment or reward shaper raised is set aside (it carries
   no loss) and counted, and the caller decides whether the share of such episodes stops the run;
3. DAPO's dynamic sampling (``algorithm.dynamic_sampling``) drops groups whose scores all agree
   and rolls out fresh tasks to refill, up to ``algorithm.max_refill_rounds`` rounds;
4. ReMax (an estimator with ``needs_baseline_rollout``) gets one greedy rollout per task, whose
   score becomes each trajectory's ``baseline_score``.

No hooks, trackers or files here: the runner owns those.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, defaultdict
from collections.abc import Sequence

import torch

from agent_r1.engine.dist import all_gather
from agent_r1.engine.learner.loss_utils import scores_all_equal
from agent_r1.engine.session import Session
from agent_r1.engine.source import RolloutSource
from agent_r1.errors import AgentR1Error
from agent_r1.mdp import RewardSignal, Task, Trajectory
from agent_r1.rollout.generation import RolloutRequest

__all__ = ["all_gather", "collect", "flat_groups", "my_tasks", "rollout", "score", "step_seed"]

_SCORING = threading.Lock()
"""Reward shapers score one batch at a time, also when asynchronous rollouts collect several."""


def step_seed(session: Session, step: int, round_: int = 0) -> int:
    """The sampling seed of one rollout round of ``step`` on this process."""
    return (session.config.seed * 1_000_003 + step * 9_973 + round_ * 101 + session.rank * 7) % 2**31


def rollout(
    session: Session,
    tasks: list[Task],
    group_size: int,
    *,
    seed: int,
    temperature: float,
    salt: str,
    progress: str | None = None,
    spread: bool = False,
    source: RolloutSource | None = None,
    version: int | None = None,
) -> list[Trajectory]:
    """Roll out ``tasks`` (each ``group_size`` times) with the current policy, then score them.
    ``progress`` labels a progress bar of finished episodes (main process only). With ``spread``
    the tasks are shared out across processes and every process gets all trajectories back
    (evaluation). ``source`` and ``version``: another source than the session's and the version of
    its weights (asynchronous rollouts' copy of the policy)."""
    from agent_r1.engine.reports.progress import EpisodeProgress

    source = source if source is not None else session.source
    assert source is not None
    if spread:
        tasks = tasks[session.rank :: session.world]
    if source is session.source:
        session.unwrapped.eval()
    enabled = progress is not None and session.is_main
    with (
        EpisodeProgress(progress or "", enabled=enabled) as bar,
        torch.no_grad(),
        session.rollout_weights(),
    ):
        request = RolloutRequest(
            tasks,
            group_size,
            seed=seed,
            temperature=temperature,
            salt=salt,
            policy_version=session.step if version is None else version,
            decoding=session.decoding,  # None: the source uses the run's rollout.decoding
            on_progress=bar.update,
        )
        trajectories = source.rollout(request)
    with _SCORING:
        started = time.perf_counter()
        score(session, trajectories, {t.id: t for t in tasks})
        elapsed = (time.perf_counter() - started) / max(len(trajectories), 1)
    for trajectory in trajectories:  # the scoring time, shared out, so that steps can sum it
        trajectory.metrics["reward_s"] = elapsed
    return all_gather(session, trajectories) if spread else trajectories


def score(session: Session, trajectories: Sequence[Trajectory], tasks: dict[str, Task]) -> None:
    """Add every shaper's signals (times its configured weight) to each trajectory. Each shaper
    scores the whole batch in one call (``RewardShaper.score_batch``), so that model-based shapers
    batch their forward passes; a failure on one trajectory is recorded on that trajectory."""
    # an episode whose environment failed before its first action has nothing to score
    trajectories = [t for t in trajectories if t.steps or not t.errors]
    if not trajectories:
        return
    batch_tasks = [tasks[trajectory.task_id] for trajectory in trajectories]
    for shaper, weight in session.shapers:
        try:
            results: Sequence[list[RewardSignal] | Exception] = shaper.score_batch(trajectories, batch_tasks)
        except AgentR1Error:
            raise
        except Exception as exc:  # the whole batch failed: each trajectory records it
            results = [exc] * len(trajectories)
        if len(results) != len(trajectories):
            raise AgentR1Error(
                f"reward shaper {shaper.name!r} returned {len(results)} results from score_batch for "
                f"{len(trajectories)} trajectories; it must return one list of signals (or the "
                "exception) per trajectory, in order"
            )
        for trajectory, task, result in zip(trajectories, batch_tasks, results, strict=True):
            if isinstance(result, AgentR1Error):
                raise result
            if isinstance(result, Exception):  # counted; the runner stops when too many episodes fail
                trajectory.errors.append(
                    f"reward shaper {shaper.name!r} raised on task {task.id!r} (trajectory "
                    f"{trajectory.id!r}): {type(result).__name__}: {result}"
                )
                trajectory.metrics["reward_errors"] = trajectory.metrics.get("reward_errors", 0.0) + 1
                continue
            signals = list(result or [])
            for signal in signals:
                signal.weight = weight * signal.weight
                signal.source = signal.source or shaper.name
            trajectory.rewards.extend(signals)


def collect(
    session: Session,
    step: int,
    *,
    source: RolloutSource | None = None,
    version: int | None = None,
    tasks: list[Task] | None = None,
) -> tuple[list[Trajectory], list[Trajectory], dict[str, float]]:
    """This process's scored trajectories for training step ``step``, the episodes set aside because
    their environment or a reward shaper failed, and rollout metrics. ``source``/``version``: see
    :func:`rollout` (asynchronous rollouts collect on their own copy of the policy); ``tasks``: the
    step's tasks, already drawn from the task stream (asynchronous rollouts draw them in order
    before rolling out several steps at once); by default they are drawn here."""
    started = time.perf_counter()
    source = source if source is not None else session.source
    assert source is not None
    source.step_metrics()  # drop the figures of evaluation rollouts since the last step
    with session.rollout_weights():  # sharded: gathered once for every rollout of the step
        return _collect(session, step, started, source, version, tasks)


def _collect(
    session: Session,
    step: int,
    started: float,
    source: RolloutSource,
    version: int | None,
    drawn: list[Task] | None,
) -> tuple[list[Trajectory], list[Trajectory], dict[str, float]]:
    config = session.config
    group_size, temperature = config.rollout.group_size, config.rollout.temperature
    tasks = drawn if drawn is not None else my_tasks(session)
    seen = {t.id: t for t in tasks}
    options = {"source": source, "version": version}
    trajectories = rollout(
        session,
        tasks,
        group_size,
        seed=step_seed(session, step),
        temperature=temperature,
        salt=f"s{step}",
        **options,  # type: ignore[arg-type]
    )
    metrics: dict[str, float] = {
        "time/env_s": _env_seconds(trajectories),
        "time/rewards_s": sum(t.metrics.get("reward_s", 0.0) for t in trajectories),
    }
    failed = [t for t in trajectories if t.errors]
    trajectories = [t for t in trajectories if not t.errors]
    flat = flat_groups(trajectories)
    metrics["batch/zero_variance_groups"] = len(flat) / max(len(tasks), 1)

    if config.algorithm.dynamic_sampling and group_size > 1:  # DAPO: refill with informative groups
        kept = [t for t in trajectories if t.group_id not in flat]
        rounds = 0
        while len({t.group_id for t in kept}) < len(tasks) and rounds < config.algorithm.max_refill_rounds:
            rounds += 1
            more = my_tasks(session)
            seen.update((t.id, t) for t in more)
            extra = rollout(
                session,
                more,
                group_size,
                seed=step_seed(session, step, rounds),
                temperature=temperature,
                salt=f"s{step}r{rounds}",
                **options,  # type: ignore[arg-type]
            )
            metrics["time/env_s"] += _env_seconds(extra)
            metrics["time/rewards_s"] += sum(t.metrics.get("reward_s", 0.0) for t in extra)
            failed += [t for t in extra if t.errors]
            extra = [t for t in extra if not t.errors]
            kept += [t for t in extra if t.group_id not in flat_groups(extra)]
        groups = set(list(dict.fromkeys(t.group_id for t in kept))[: len(tasks)])
        metrics["batch/refill_rounds"] = rounds
        trajectories = [t for t in kept if t.group_id in groups] or trajectories  # never train on nothing

    if session.estimator.needs_baseline_rollout:  # ReMax: one greedy rollout per task
        needed = {t.task_id for t in trajectories}
        greedy = rollout(
            session,
            [t for t in seen.values() if t.id in needed],
            1,
            seed=step_seed(session, step, 77),
            temperature=0.0,
            salt=f"s{step}g",
            **options,  # type: ignore[arg-type]
        )
        baseline = {t.task_id: t.score for t in greedy}
        for trajectory in trajectories:
            trajectory.metrics["baseline_score"] = baseline[trajectory.task_id]
        metrics["reward/baseline_score_mean"] = sum(baseline.values()) / max(len(baseline), 1)

    metrics.update(source.step_metrics())  # e.g. gateway/...: this step's rollouts only
    metrics["time/rollout_s"] = time.perf_counter() - started
    return trajectories, failed, metrics


def flat_groups(trajectories: Sequence[Trajectory]) -> set[str]:
    """Groups of more than one trajectory whose advantages are zero under the group estimators:
    the scores of the episodes that acted are all equal
    (:func:`~agent_r1.engine.learner.loss_utils.scores_all_equal`, the estimators' definition), and an
    episode without any action turn does not count (the estimators leave it out too)."""
    sizes: Counter[str] = Counter()
    scores: dict[str, list[float]] = defaultdict(list)
    for t in trajectories:
        sizes[t.group_id] += 1
        if t.num_policy_tokens:
            scores[t.group_id].append(t.score)
    return {g for g, size in sizes.items() if size > 1 and scores_all_equal(scores[g])}


def my_tasks(session: Session) -> list[Task]:
    """This process's share of the next global batch of tasks (every process draws the same global
    batch from identically seeded streams, then keeps every ``world``-th task)."""
    assert session.stream is not None
    tasks = session.stream.take(session.config.trainer.tasks_per_step)
    return tasks[session.rank :: session.world]


def _env_seconds(trajectories: Sequence[Trajectory]) -> float:
    return sum(t.metrics.get("tool_s", 0.0) for t in trajectories) / max(len(trajectories), 1)
