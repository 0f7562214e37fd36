"""Scoring a step's trajectories (agent_r1.engine.collect.score): each reward shaper scores the whole
batch in one ``score_batch`` call, signals are weighted, and a failure on one trajectory is recorded
on that trajectory only, while an agent-r1 error stops the run."""

from __future__ import annotations

from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import pytest

from agent_r1.contracts import RewardShaper
from agent_r1.engine.collect import score
from agent_r1.errors import AgentR1Error
from agent_r1.mdp import RewardSignal, Task, Trajectory


class LengthShaper(RewardShaper):
    """Scores the number of characters of the task id; raises on task ``bad``; records its calls."""

    name = "length"

    def __init__(self, config: Any = None) -> None:
        super().__init__(config)
        self.batches: list[int] = []

    def score(self, trajectory: Trajectory, task: Task) -> list[RewardSignal]:
        if task.id == "bad":
            raise ValueError("no score for this one")
        if task.id == "fatal":
            raise AgentR1Error("the judge's model is gone")
        return [RewardSignal(name="length", value=float(len(task.id)), weight=2.0)]

    def score_batch(
        self, trajectories: Sequence[Trajectory], tasks: Sequence[Task]
    ) -> list[list[RewardSignal] | Exception]:
        self.batches.append(len(trajectories))
        return super().score_batch(trajectories, tasks)


class AsyncShaper(RewardShaper):
    name = "async_one"

    async def score(self, trajectory: Trajectory, task: Task) -> list[RewardSignal]:
        return [RewardSignal(name="one", value=1.0)]


class ShortShaper(RewardShaper):
    name = "short"

    def score_batch(
        self, trajectories: Sequence[Trajectory], tasks: Sequence[Task]
    ) -> list[list[RewardSignal] | Exception]:
        return []


def _batch(*task_ids: str) -> tuple[list[Trajectory], dict[str, Task]]:
    tasks = {task_id: Task(id=task_id, messages=[{"role": "user", "content": "q"}]) for task_id in task_ids}
    trajectories = [Trajectory(id=f"{task_id}/{i}", task_id=task_id) for i, task_id in enumerate(task_ids)]
    return trajectories, tasks


def test_each_shaper_scores_the_batch_once_with_weights_and_sources() -> None:
    length, one = LengthShaper(), AsyncShaper()
    trajectories, tasks = _batch("a", "abc", "ab")
    score(SimpleNamespace(shapers=[(length, 0.5), (one, 3.0)]), trajectories, tasks)  # type: ignore[arg-type]
    assert length.batches == [3]
    for trajectory, expected in zip(trajectories, [1.0, 3.0, 2.0], strict=True):
        first, second = trajectory.rewards
        assert (first.name, first.value, first.weight, first.source) == ("length", expected, 1.0, "length")
        assert (second.name, second.value, second.weight, second.source) == ("one", 1.0, 3.0, "async_one")
        assert not trajectory.errors


def test_a_failure_on_one_trajectory_is_recorded_on_it_alone() -> None:
    trajectories, tasks = _batch("a", "bad", "ab")
    score(SimpleNamespace(shapers=[(LengthShaper(), 1.0)]), trajectories, tasks)  # type: ignore[arg-type]
    good, bad, other = trajectories
    assert [len(t.rewards) for t in trajectories] == [1, 0, 1]
    assert bad.errors == [
        "reward shaper 'length' raised on task 'bad' (trajectory 'bad/1'): ValueError: no score for this one"
    ]
    assert bad.metrics["reward_errors"] == 1.0
    assert not good.errors and not other.errors


def test_an_agent_r1_error_stops_scoring_and_a_wrong_result_count_is_named() -> None:
    trajectories, tasks = _batch("a", "fatal")
    with pytest.raises(AgentR1Error, match="the judge's model is gone"):
        score(SimpleNamespace(shapers=[(LengthShaper(), 1.0)]), trajectories, tasks)  # type: ignore[arg-type]
    with pytest.raises(AgentR1Error, match="reward shaper 'short' returned 0 results from score_batch for 2"):
        score(SimpleNamespace(shapers=[(ShortShaper(), 1.0)]), *_batch("a", "b"))  # type: ignore[arg-type]
