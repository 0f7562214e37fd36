"""The turn-decoder protocol: how the agent loop hands one turn of all active episodes to a decoder
(:class:`TurnRequest`) and what it gets back (:class:`TurnChoice`). :class:`TurnDecoder` samples
``K`` candidates per episode in one backend call and keeps the best-scored; the bundled decoders
(value-guided, best-of-K) live in :mod:`agent_r1.engine.experimental.decoding`. Under plain
sampling (``rollout.decoding: sample``) no decoder runs."""

from __future__ import annotations

import math
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from agent_r1.contracts import Environment, Generation, SamplingParams
from agent_r1.errors import AgentR1Error
from agent_r1.mdp import Action, Message

if TYPE_CHECKING:
    pass


__all__ = [
    "DECODING_METRICS",
    "TurnChoice",
    "TurnDecoder",
    "TurnRequest",
    "decoding_step_metrics",
]

DECODING_METRICS: dict[str, str] = {
    "decoding_candidates": "candidate actions generated (K per turn)",
    "decoding_generated_tokens": "tokens generated, discarded candidates included",
    "decoding_scored_tokens": "tokens forwarded through the critic to score candidates (value_guided)",
    "decoding_score_s": "seconds of the batched scoring calls the episode took part in",
    "decoding_picked_other": "turns whose kept action was not the first candidate (the plain sample)",
}
"""Per-trajectory metrics a decoder adds to ``Trajectory.metrics`` (absent under ``sample``)."""


@dataclass
class TurnRequest:
    """One turn of all active episodes, as the engine hands it to a decoder."""

    prompts: list[list[int]]
    """Each active episode's trajectory so far (token ids)."""
    budgets: list[int]
    """Each episode's token budget for this action."""
    sampling: SamplingParams
    """The turn's sampling parameters (its seed included)."""
    generate: Callable[[list[list[int]], SamplingParams, list[int]], list[Generation]]
    """The engine's backend call: prompts, sampling, budgets -> one generation per prompt."""
    action_of: Callable[[Generation, int], Action]
    """The action the environment would see for a generation of the given budget."""
    envs: list[Environment] = field(default_factory=list)
    messages: list[list[Message]] = field(default_factory=list)
    """Each episode's conversation so far (for verifiers)."""


@dataclass
class TurnChoice:
    """What a decoder chose for each episode of a turn, and what it cost."""

    generations: list[Generation]
    """The kept candidate of each episode, as the backend returned it."""
    picked: list[int]
    """Index of the kept candidate among the episode's ``K``."""
    candidates: list[int]
    generated_tokens: list[int]
    """Tokens generated for each episode, discarded candidates included."""
    scored_tokens: list[float]
    """Tokens each episode's candidates sent through the critic (a prefix that several episodes
    share is charged to them in equal parts)."""
    score_s: float
    """Seconds spent scoring the turn's candidates (critic or verifier)."""


class TurnDecoder(ABC):
    """Samples ``candidates`` actions per episode in one backend call and keeps the best-scored."""

    kind = ""

    def __init__(self, candidates: int) -> None:
        if candidates < 1:
            raise ValueError(f"a decoder needs at least one candidate, got {candidates}")
        self.candidates = candidates

    def decide(self, request: TurnRequest) -> TurnChoice:
        """Generate ``K`` candidates per episode (one batched call, each prompt repeated ``K`` times
        in a row), score them, and keep the argmax of each episode (ties: the first)."""
        k = self.candidates
        prompts = [prompt for prompt in request.prompts for _ in range(k)]
        budgets = [budget for budget in request.budgets for _ in range(k)]
        generations = request.generate(prompts, request.sampling, budgets)
        groups = [generations[i * k : (i + 1) * k] for i in range(len(request.prompts))]
        started = time.perf_counter()
        scores, scored_tokens = self.score(request, groups)
        score_s = time.perf_counter() - started
        picked = [argmax_first(row, self.kind) for row in scores]
        return TurnChoice(
            generations=[group[j] for group, j in zip(groups, picked, strict=True)],
            picked=picked,
            candidates=[k] * len(groups),
            generated_tokens=[sum(len(g.token_ids) for g in group) for group in groups],
            scored_tokens=scored_tokens,
            score_s=score_s,
        )

    @abstractmethod
    def score(
        self, request: TurnRequest, groups: list[list[Generation]]
    ) -> tuple[list[list[float]], list[float]]:
        """A score per candidate of each episode, and the critic tokens each episode cost."""


def argmax_first(scores: Sequence[float], kind: str) -> int:
    """The index of the highest score, the first one on ties. A non-finite score (a diverged
    critic, a broken verifier) is an error rather than a silent pick."""
    if not all(math.isfinite(score) for score in scores):
        raise AgentR1Error(
            f"decoding.kind={kind}: a candidate got a non-finite score ({list(scores)}); the critic or "
            "verifier is broken (check the run's value loss, or the verifier's output)"
        )
    best = 0
    for j, score in enumerate(scores):
        if score > scores[best]:
            best = j
    return best


def decoding_step_metrics(trajectories: Sequence[Any]) -> dict[str, float]:
    """``decoding/...`` means per episode over a training step's trajectories (empty under plain
    sampling): candidates, generated tokens (discarded included), critic tokens, scoring seconds."""
    present = [t for t in trajectories if "decoding_candidates" in t.metrics]
    if not present:
        return {}
    n = len(present)
    return {
        f"decoding/{name.removeprefix('decoding_')}": sum(t.metrics[name] for t in present) / n
        for name in DECODING_METRICS
    }
