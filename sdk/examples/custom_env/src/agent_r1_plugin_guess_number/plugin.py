"""A multi-turn environment written against the bare :class:`agent_r1.Environment` contract: a
number-guessing game in which the environment answers "Higher." or "Lower." until the agent finds
the number, plus the dataset of games. Both are registered by the hooks at the bottom.

One episode::

    user       I am thinking of a whole number from 1 to 100. Find it.
    assistant  <guess>50</guess>
    user       Lower.
    assistant  <guess>25</guess>
    user       Higher.
    ...
    assistant  <guess>37</guess>          (correct: the episode ends, termination "answer")

The engine makes one environment instance per episode, so the instance keeps the episode's state
(the secret, the range, the guesses). ``reset`` and ``step`` are ``async`` because real
environments wait on tools or servers; this one does not need to, but keeps the contract.

Success is scored by the bundled ``answer_match`` reward shaper: a correct guess is returned as
``observation.answer`` (the engine records it as the action's ``answer``), and the task's
``answer`` is the secret.
"""

from __future__ import annotations

import random
import re
from typing import Any

from agent_r1 import (
    Action,
    ComponentConfig,
    Dataset,
    Environment,
    EpisodeStart,
    Observation,
    RewardSignal,
    Task,
    hookimpl,
)
from pydantic import Field

GUESS = re.compile(r"<guess>\s*(-?\d+)\s*</guess>")
SYSTEM_PROMPT = (
    "We play a guessing game. Write exactly one guess per turn as <guess>number</guess>. "
    "I reply whether the secret number is higher or lower, until you find it."
)


class GuessNumberEnv(Environment):
    """The guessing game. The secret is ``task.answer``; the range is ``task.metadata["low"]`` and
    ``["high"]`` (the config's ``low``/``high`` when absent).

    Each step reads the last ``<guess>N</guess>`` of the action. A correct guess ends the episode
    (termination ``answer``, and ``observation.answer`` is the guess); otherwise the environment replies
    ``Higher.`` or ``Lower.``. An action without a valid guess in the range gets an explanation (and
    ``invalid_guess_reward`` as a process reward, when non-zero). After ``max_turns`` actions the
    episode ends with termination ``max_turns``.
    """

    name = "guess_number"

    class Config(ComponentConfig):
        low: int = Field(1, description="smallest possible secret when the task does not say")
        high: int = Field(100, description="largest possible secret when the task does not say")
        max_turns: int = Field(10, ge=1, description="guesses per episode at most")
        invalid_guess_reward: float = Field(
            0.0, le=0.0, description="process reward for a turn without a valid guess (0 = off)"
        )
        system_prompt: str = Field(SYSTEM_PROMPT, description="the rules, as the system message")

    config: Config

    def __init__(self, config: Any = None) -> None:
        super().__init__(config)
        self.secret = 0
        self.low, self.high = self.config.low, self.config.high
        self.guesses: list[int] = []

    @property
    def stop_sequences(self) -> list[str]:
        return ["</guess>"]  # a turn ends right after its guess

    async def reset(self, task: Task) -> EpisodeStart:
        self.secret = int(task.answer)
        self.low = int(task.metadata.get("low", self.config.low))
        self.high = int(task.metadata.get("high", self.config.high))
        self.guesses = []
        messages = [{"role": "system", "content": self.config.system_prompt}, *task.messages]
        return EpisodeStart(messages=messages)

    async def step(self, action: Action, turn: int) -> Observation:
        found = GUESS.findall(action.text)
        guess = int(found[-1]) if found else None
        last_turn = turn + 1 >= self.config.max_turns
        if guess is None or not self.low <= guess <= self.high:
            problem = (
                f"Write one guess as <guess>number</guess>, a whole number from {self.low} to {self.high}."
            )
            rewards = []
            if self.config.invalid_guess_reward:
                rewards.append(
                    RewardSignal(
                        name="invalid_guess",
                        value=self.config.invalid_guess_reward,
                        kind="process",
                        turn=turn,
                        source=self.name,
                    )
                )
            return self._reply(
                problem, rewards=rewards, done=last_turn, info={"valid": False}, parse_errors=[problem]
            )
        self.guesses.append(guess)
        if guess == self.secret:
            info = {"valid": True, "guess": guess}
            return Observation(done=True, termination="answer", info=info, answer=str(guess), parse_errors=[])
        feedback = "Higher." if guess < self.secret else "Lower."
        return self._reply(feedback, done=last_turn, info={"valid": True, "guess": guess})

    def _reply(
        self,
        text: str,
        *,
        done: bool,
        info: dict[str, Any],
        rewards: list[RewardSignal] | None = None,
        parse_errors: list[str] | None = None,
    ) -> Observation:
        # A final observation carries no messages: the engine adds no tokens after the last action.
        # What was read from the action goes back in the observation; the action is the engine's.
        return Observation(
            messages=[] if done else [{"role": "user", "content": text}],
            rewards=rewards or [],
            done=done,
            termination="max_turns" if done else None,
            info=info,
            parse_errors=parse_errors or [],
        )


class GuessNumberDataset(Dataset):
    """Games with secrets drawn uniformly from ``[low, high]``, deterministic for a given seed;
    the train and eval splits use different draws."""

    name = "guess_number"

    class Config(ComponentConfig):
        num_train: int = Field(64, ge=1, description="games in the train split")
        num_eval: int = Field(16, ge=0, description="games in the eval split")
        low: int = Field(1, description="smallest secret")
        high: int = Field(100, description="largest secret")
        seed: int = Field(0, description="seeds the secrets")

    config: Config

    def load(self, split: str) -> list[Task]:
        low, high = self.config.low, self.config.high
        if high < low:
            raise ValueError(f"guess_number: high={high} is below low={low}")
        count = self.config.num_train if split == "train" else self.config.num_eval
        rng = random.Random(f"{self.config.seed}-{split}")
        question = f"I am thinking of a whole number from {low} to {high}. Find it."
        return [
            Task(
                id=f"{split}-{index}",
                messages=[{"role": "user", "content": question}],
                answer=rng.randint(low, high),
                category="guess_number",
                metadata={"low": low, "high": high},
            )
            for index in range(count)
        ]


@hookimpl
def register_environments() -> list[type[Environment]]:
    return [GuessNumberEnv]


@hookimpl
def register_datasets() -> list[type[Dataset]]:
    return [GuessNumberDataset]
