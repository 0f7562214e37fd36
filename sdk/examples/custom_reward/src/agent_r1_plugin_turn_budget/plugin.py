"""Two reward shapers that favour short, correct episodes, and the hook that registers them.

* ``answer_within_turns`` (outcome): the answer's match score, reduced by ``late_penalty`` for
  every turn beyond ``max_turns``. An agent that answers right away earns more than one that
  reaches the same answer after needless tool calls.
* ``length_penalty`` (process): for each turn, ``-per_token`` times the policy tokens beyond
  ``max_tokens_per_turn``. The signal names its turn, so the engine puts it on that turn's last
  action token: the long action is the one that pays, not the whole episode.

Run config::

    rewards:
      - {name: answer_match, mode: numeric, weight: 1.0}
      - {name: answer_within_turns, mode: numeric, max_turns: 2, late_penalty: 0.25, weight: 0.5}
      - {name: length_penalty, max_tokens_per_turn: 48, per_token: 0.01, weight: 1.0}

Shapers return unweighted signals; the engine multiplies them by the ``weight`` of their entry.
"""

from __future__ import annotations

from collections import Counter
from typing import Literal

from agent_r1 import ComponentConfig, RewardShaper, RewardSignal, Task, TokenSource, Trajectory, hookimpl
from agent_r1.rewards import METRICS, final_answer
from pydantic import Field


class AnswerWithinTurns(RewardShaper):
    """Outcome reward: ``match * max(0, 1 - late_penalty * extra_turns)``.

    ``match`` compares the final answer with ``task.answer`` as the bundled ``answer_match`` does
    (``exact``, ``f1``, ``substring`` or ``numeric``, see :mod:`agent_r1.rewards`); ``extra_turns``
    counts the turns in which the policy acted beyond ``max_turns``. A task without a reference
    answer gets no signal.
    """

    name = "answer_within_turns"

    class Config(ComponentConfig):
        mode: Literal["exact", "f1", "substring", "numeric"] = Field(
            "exact", description="how the final answer is compared with task.answer"
        )
        max_turns: int = Field(2, ge=1, description="turns allowed without penalty")
        late_penalty: float = Field(
            0.5, ge=0.0, le=1.0, description="share of the reward lost per turn beyond max_turns"
        )
        signal_name: str = Field("answer_within_turns", min_length=1, description="name of the signal")

    config: Config

    def score(self, trajectory: Trajectory, task: Task) -> list[RewardSignal]:
        if task.answer is None:
            return []
        answer = final_answer(trajectory)
        match = 0.0 if answer is None else METRICS[self.config.mode](answer, task.answer)
        extra_turns = max(0, trajectory.num_turns - self.config.max_turns)
        value = match * max(0.0, 1.0 - self.config.late_penalty * extra_turns)
        return [RewardSignal(name=self.config.signal_name, value=value, kind="outcome", source=self.name)]


class LengthPenalty(RewardShaper):
    """Process reward per turn: ``-per_token * max(0, policy tokens of the turn - max_tokens_per_turn)``.

    Only turns over the budget get a signal. Token counts come from the trajectory's segments, i.e.
    exactly the tokens the policy sampled (not a re-tokenisation of the text).
    """

    name = "length_penalty"

    class Config(ComponentConfig):
        max_tokens_per_turn: int = Field(64, ge=0, description="policy tokens per turn without penalty")
        per_token: float = Field(0.01, ge=0.0, description="penalty per token beyond the budget")
        signal_name: str = Field("length_penalty", min_length=1, description="name of the signals")

    config: Config

    def score(self, trajectory: Trajectory, task: Task) -> list[RewardSignal]:
        tokens_per_turn: Counter[int] = Counter()
        for segment in trajectory.segments:
            if segment.source is TokenSource.POLICY:
                tokens_per_turn[segment.turn] += len(segment.token_ids)
        signals = []
        for turn, count in sorted(tokens_per_turn.items()):
            excess = count - self.config.max_tokens_per_turn
            if excess > 0:
                signals.append(
                    RewardSignal(
                        name=self.config.signal_name,
                        value=-self.config.per_token * excess,
                        kind="process",
                        turn=turn,
                        source=self.name,
                    )
                )
        return signals


@hookimpl
def register_reward_shapers() -> list[type[RewardShaper]]:
    return [AnswerWithinTurns, LengthPenalty]
