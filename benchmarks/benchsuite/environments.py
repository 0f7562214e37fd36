"""agent-r1 environments of the benchmark, given to the run config by Python path (e.g.
``benchsuite.environments:SingleTurnEnv``)."""

from __future__ import annotations

import functools
from typing import Any

from pydantic import Field

from agent_r1.contracts import ComponentConfig, Environment, EpisodeStart
from agent_r1.mdp import Action, Observation, Task
from benchsuite.codebook import CodeBook


class SingleTurnEnv(Environment):
    """One reply per episode: the prompt is the task's messages, any reply ends the episode (what
    TRL's GRPOTrainer does without tools)."""

    name = "bench_single_turn"

    async def reset(self, task: Task) -> EpisodeStart:
        return EpisodeStart(messages=[dict(message) for message in task.messages])

    async def step(self, action: Action, turn: int) -> Observation:
        return Observation(done=True, termination="answer", answer=action.text)


class TurnsEnv(Environment):
    """Never ends an episode itself: each reply is answered with a short user message, so that an
    episode takes exactly ``rollout.max_turns`` turns (the scaling runs' turns axis)."""

    name = "bench_turns"

    class Config(ComponentConfig):
        reply: str = Field("Go on.", description="the observation after every turn")

    config: Config

    async def reset(self, task: Task) -> EpisodeStart:
        return EpisodeStart(messages=[dict(message) for message in task.messages])

    async def step(self, action: Action, turn: int) -> Observation:
        return Observation(messages=[{"role": "user", "content": self.config.reply}])


class CodeBookEnv(Environment):
    """:class:`CodeBook` run by agent-r1's engine through
    :class:`agent_r1.integrations.trl.TRLEnvironment` (imported on first use: it needs trl)."""

    name = "bench_codebook"

    class Config(ComponentConfig):
        latency_s: float = Field(0.0, ge=0.0, description="seconds each lookup waits")
        max_turns: int = Field(3, ge=1, description="turns; the last one's calls still run")

    config: Config

    def __init__(self, config: ComponentConfig | dict[str, Any] | None = None) -> None:
        super().__init__(config)
        from agent_r1.integrations.trl import TRLEnvironment

        self.inner = TRLEnvironment(
            functools.partial(CodeBook, self.config.latency_s),
            max_turns=self.config.max_turns,
            reward_name="codebook",
        )

    @property
    def stop_sequences(self) -> list[str]:
        return self.inner.stop_sequences

    async def reset(self, task: Task) -> EpisodeStart:
        return await self.inner.reset(task)

    async def step(self, action: Action, turn: int) -> Observation:
        return await self.inner.step(action, turn)
