"""A toy task that a tiny random model can learn in a few steps: use it to check that a training
setup really learns (the reward must rise) without a real model or GPU.

The environment is single-turn: the policy writes one short action and the episode ends. The
``target_char`` reward scores the share of the action's characters that belong to a target set
(digits by default). A randomly initialised model puts little mass on those tokens, so the reward
starts low and climbs as soon as policy-gradient updates work.

Register it in tests with ``Registry.register_plugin(agent_r1.testing.toy, "toy")`` or through an
entry point ``toy = "agent_r1.testing.toy"``.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from agent_r1.contracts import ComponentConfig, Dataset, Environment, EpisodeStart, RewardShaper
from agent_r1.hookspecs import hookimpl
from agent_r1.mdp import Action, Observation, RewardSignal, Task, Trajectory


class ToyDataset(Dataset):
    """Prompts asking for characters of the target set; ``answer`` is that set."""

    name = "toy_target"

    class Config(ComponentConfig):
        num_train: int = Field(16, ge=1)
        num_eval: int = Field(4, ge=1)
        target_chars: str = Field("0123456789", min_length=1)

    def load(self, split: str) -> list[Task]:
        count = self.config.num_train if split == "train" else self.config.num_eval
        prefix = "t" if split == "train" else "e"
        return [
            Task(
                id=f"{prefix}{i}",
                messages=[{"role": "user", "content": f"Write only digits ({i})."}],
                answer=self.config.target_chars,
                category="toy",
            )
            for i in range(count)
        ]


class ToyEnv(Environment):
    """One action, then the episode ends; the action text is the answer (returned in the
    observation, which the engine records in the action)."""

    name = "toy_single_turn"

    async def reset(self, task: Task) -> EpisodeStart:
        return EpisodeStart(messages=list(task.messages))

    async def step(self, action: Action, turn: int) -> Observation:
        return Observation(done=True, termination="answer", answer=action.text)


class ToyMultiTurnEnv(Environment):
    """``turns`` actions per episode: every action but the last is answered with a short user
    message after a tool-like wait (log-normal, median ``latency_s``, spread ``latency_sigma``,
    drawn from the task id, the turn and the episode, so that a run is reproducible), the last
    action is the answer. For tests and benchmarks of multi-turn rollouts (asynchronous rollouts,
    tool latency)."""

    name = "toy_multi_turn"

    class Config(ComponentConfig):
        turns: int = Field(3, ge=1)
        latency_s: float = Field(0.0, ge=0.0)
        latency_sigma: float = Field(0.0, ge=0.0)

    _episodes = 0

    async def reset(self, task: Task) -> EpisodeStart:
        type(self)._episodes += 1
        self._episode = type(self)._episodes
        self._task = task.id
        return EpisodeStart(messages=list(task.messages))

    async def step(self, action: Action, turn: int) -> Observation:
        import asyncio
        import math
        import random

        if turn + 1 >= self.config.turns:
            return Observation(done=True, termination="answer", answer=action.text)
        if self.config.latency_s > 0:
            rng = random.Random(f"{self._task}/{self._episode}/{turn}")
            wait = self.config.latency_s * math.exp(self.config.latency_sigma * rng.gauss(0.0, 1.0))
            await asyncio.sleep(wait)
        return Observation(messages=[{"role": "user", "content": f"Go on ({turn + 1})."}])


class TargetCharReward(RewardShaper):
    """Outcome reward: the share of characters of the final answer that belong to the task's
    answer (a set of characters)."""

    name = "target_char"

    class Config(ComponentConfig):
        signal_name: str = "answer_match"

    def score(self, trajectory: Trajectory, task: Task) -> list[RewardSignal]:
        text = (trajectory.steps[-1].action.answer or "") if trajectory.steps else ""
        value = sum(ch in task.answer for ch in text) / max(len(text), 1)
        return [RewardSignal(name=self.config.signal_name, value=value, kind="outcome")]


@hookimpl
def register_datasets() -> list[Any]:
    return [ToyDataset]


@hookimpl
def register_environments() -> list[Any]:
    return [ToyEnv, ToyMultiTurnEnv]


@hookimpl
def register_reward_shapers() -> list[Any]:
    return [TargetCharReward]
