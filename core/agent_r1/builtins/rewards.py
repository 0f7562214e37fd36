"""Bundled reward shapers: answer match, format, tool-call process rewards and overlong shaping.

A shaper scores a finished trajectory and returns :class:`~agent_r1.mdp.RewardSignal`s: ``outcome``
signals for the whole episode and ``process`` signals for a turn (they carry ``turn``). Each signal's
``source`` is the shaper's name. Shapers never apply the run config's ``weight``: the engine sets it on
every signal afterwards, and logs each signal by name (``reward/<name>``).

Run config example::

    rewards:
      - {name: answer_match, mode: numeric, weight: 1.0}   # or mode: exact, normalization: official
      - {name: format, weight: 0.1}
      - {name: tool_call, success: 0.1, failure: -0.1, weight: 1.0}
      - {name: overlong, max_length: 512, buffer: 128, weight: 1.0}
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from agent_r1.contracts import ComponentConfig, RewardShaper
from agent_r1.mdp import RewardSignal, Task, Trajectory
from agent_r1.rewards import (
    DEFAULT_NORMALIZATION,
    TEXT_METRICS,
    Normalization,
    final_answer,
    numeric_match,
)


class AnswerMatchReward(RewardShaper):
    """Outcome reward: how well the final answer matches ``task.answer``.

    The final answer is the last step's ``action.answer`` (see :func:`agent_r1.rewards.final_answer`);
    an episode that gave none scores 0. ``task.answer`` is a value or a list of aliases, and the best
    alias counts. Modes (see :mod:`agent_r1.rewards` for the normalisation):

    * ``exact``: 1 when the normalised answer equals a normalised alias, else 0;
    * ``f1``: token-level F1 in [0, 1];
    * ``substring``: 1 when an alias occurs in the answer at word boundaries (lenient: a policy can
      learn to list many candidates, so prefer ``exact``/``f1`` for training);
    * ``numeric``: 1 when the stated number equals the gold number within tolerance, with commas,
      currency signs and units ignored.

    ``normalization`` (``exact``, ``f1``, ``substring``): ``official`` (default) applies the official
    HotpotQA / SQuAD rules exactly, so scores compare with published numbers; ``robust`` adds Unicode
    care (NFKC, Unicode punctuation, accents folded unless ``keep_accents``, an empty answer never
    matches). The search plugin's ``qa_em`` / ``qa_f1`` / ``qa_substring`` use the same functions, so
    with the same options they give the same value on the same trajectory.

    A task without a reference answer (``task.answer is None``) gets no signal. Evaluation reads
    success from the signal named ``signal_name`` (``eval.success_signal`` in the run config).
    """

    name = "answer_match"

    class Config(ComponentConfig):
        mode: Literal["exact", "f1", "substring", "numeric"] = Field(
            "exact", description="how the final answer is compared with task.answer"
        )
        signal_name: str = Field(
            "answer_match",
            min_length=1,
            description="name of the emitted signal (eval reads success from it)",
        )
        normalization: Normalization = Field(
            DEFAULT_NORMALIZATION,
            description="answer normalisation of the text modes: 'official' (HotpotQA/SQuAD scripts) "
            "or 'robust' (Unicode-aware)",
        )
        keep_accents: bool = Field(
            False, description="robust normalisation only: compare accents too ('René' != 'Rene')"
        )
        rel_tol: float = Field(1e-6, ge=0.0, description="numeric mode: relative tolerance")
        abs_tol: float = Field(1e-6, ge=0.0, description="numeric mode: absolute tolerance")

    config: Config

    def score(self, trajectory: Trajectory, task: Task) -> list[RewardSignal]:
        """One outcome signal in [0, 1] (none when the task has no reference answer)."""
        if task.answer is None:
            return []
        answer = final_answer(trajectory)
        value = 0.0 if answer is None else self.match(answer, task.answer)
        return [RewardSignal(name=self.config.signal_name, value=value, kind="outcome", source=self.name)]

    def match(self, answer: str, gold: object) -> float:
        """Score one answer against a gold value or alias list with the configured mode."""
        cfg = self.config
        if cfg.mode == "numeric":
            return numeric_match(answer, gold, rel_tol=cfg.rel_tol, abs_tol=cfg.abs_tol)
        metric = TEXT_METRICS[cfg.mode]
        return metric(answer, gold, normalization=cfg.normalization, keep_accents=cfg.keep_accents)


class FormatReward(RewardShaper):
    """Outcome reward for a well-formed episode.

    ``value`` when the episode ended with a final answer (the last step has ``action.answer``) and no
    action had a parse error; 0 otherwise. On top of that, ``error_penalty`` is subtracted for each
    parse error of the episode (at most ``max_penalty`` in total). The signal is emitted for every
    trajectory (often 0), so ``reward/format`` tracks how well-formed the policy's output is.
    """

    name = "format"

    class Config(ComponentConfig):
        value: float = Field(1.0, description="reward for an episode that answered with no parse error")
        error_penalty: float = Field(0.0, ge=0.0, description="subtracted per parse error (format error)")
        max_penalty: float | None = Field(
            None, ge=0.0, description="cap on the total penalty of an episode; null means no cap"
        )
        require_answer: bool = Field(True, description="the bonus needs a final answer in the last step")

    config: Config

    def score(self, trajectory: Trajectory, task: Task) -> list[RewardSignal]:
        """One outcome signal: the bonus (or 0) minus the parse-error penalty."""
        errors = sum(len(step.action.parse_errors) for step in trajectory.steps)
        answered = final_answer(trajectory) is not None
        well_formed = bool(trajectory.steps) and errors == 0 and (answered or not self.config.require_answer)
        penalty = self.config.error_penalty * errors
        if self.config.max_penalty is not None:
            penalty = min(penalty, self.config.max_penalty)
        value = (self.config.value if well_formed else 0.0) - penalty
        return [RewardSignal(name=self.name, value=value, kind="outcome", source=self.name)]


class ToolCallReward(RewardShaper):
    """Process rewards per turn for tool use: a bonus per successful call, a penalty per failure.

    For each turn, ``success`` is earned for each tool result with ``ok`` true, and ``failure``
    (negative) for each result with ``ok`` false and, with ``penalize_parse_errors``, for each parse
    error of the action (a malformed call that never ran). One process signal per turn with a
    non-zero total, carrying that ``turn``.

    **Reward hacking.** A bonus for well-formed tool calls on its own pays the policy to keep calling
    the tool instead of answering, and a run can collapse that way (turns run to ``max_turns`` and
    success falls to 0%). The defaults are therefore the safe ones: the success
    bonus counts only when the episode also produced a final answer (``only_if_answered``), and at
    most ``max_rewarded_calls`` (1) successful calls per episode are rewarded. Penalties are neither
    capped nor conditional. Watch ``termination/max_turns`` and ``tools/calls_mean`` when you loosen
    these.
    """

    name = "tool_call"

    class Config(ComponentConfig):
        success: float = Field(0.1, description="reward per successful tool call")
        failure: float = Field(
            -0.1, le=0.0, description="reward (negative) per failed tool call or malformed call"
        )
        max_rewarded_calls: int | None = Field(
            1, ge=0, description="successful calls rewarded per episode at most; null means no cap"
        )
        only_if_answered: bool = Field(
            True, description="success bonuses count only when the episode ended with a final answer"
        )
        penalize_parse_errors: bool = Field(
            True, description="each parse error of an action counts as a failed (malformed) call"
        )

    config: Config

    def score(self, trajectory: Trajectory, task: Task) -> list[RewardSignal]:
        """Process signals, one per turn whose successes and failures do not cancel to zero."""
        cfg = self.config
        reward_successes = not cfg.only_if_answered or final_answer(trajectory) is not None
        budget = cfg.max_rewarded_calls
        signals: list[RewardSignal] = []
        for step in trajectory.steps:
            results = step.observation.tool_results if step.observation is not None else []
            succeeded = sum(result.ok for result in results)
            failed = len(results) - succeeded
            if cfg.penalize_parse_errors:
                failed += len(step.action.parse_errors)
            rewarded = succeeded if reward_successes else 0
            if budget is not None:
                rewarded = min(rewarded, budget)
                budget -= rewarded
            value = cfg.success * rewarded + cfg.failure * failed
            if value != 0.0:
                signals.append(
                    RewardSignal(
                        name=self.name, value=value, kind="process", turn=step.turn, source=self.name
                    )
                )
        return signals


class OverlongReward(RewardShaper):
    """DAPO's soft overlong punishment (Yu et al. 2025, "DAPO", section 3.4), plus a truncation penalty.

    With ``L`` the number of policy tokens of the episode (all turns), ``L_max = max_length`` and
    ``B = buffer``, the signal is ``-penalty * clip((L - (L_max - B)) / B, 0, 1)``: zero up to
    ``L_max - B`` tokens, growing linearly to ``-penalty`` at ``L_max`` and staying there beyond.
    A trajectory flagged ``truncated`` (a token budget cut it short) loses ``truncated_penalty`` more.
    Both penalties are magnitudes (>= 0); the signal is emitted for every trajectory.
    """

    name = "overlong"

    class Config(ComponentConfig):
        max_length: int = Field(1024, ge=1, description="policy tokens at which the full penalty applies")
        buffer: int = Field(256, ge=1, description="length of the linear ramp before max_length")
        penalty: float = Field(1.0, ge=0.0, description="penalty magnitude at max_length and beyond")
        truncated_penalty: float = Field(
            0.0, ge=0.0, description="extra penalty magnitude for a trajectory flagged truncated"
        )

        @model_validator(mode="after")
        def _buffer_fits(self) -> OverlongReward.Config:
            if self.buffer > self.max_length:
                raise ValueError(f"buffer ({self.buffer}) must not exceed max_length ({self.max_length})")
            return self

    config: Config

    def penalty_for(self, num_policy_tokens: int, truncated: bool = False) -> float:
        """The (non-positive) signal value for an episode of ``num_policy_tokens`` policy tokens."""
        cfg = self.config
        ramp = (num_policy_tokens - (cfg.max_length - cfg.buffer)) / cfg.buffer
        value = -cfg.penalty * min(max(ramp, 0.0), 1.0)
        if truncated:
            value -= cfg.truncated_penalty
        return value + 0.0  # turn -0.0 into 0.0

    def score(self, trajectory: Trajectory, task: Task) -> list[RewardSignal]:
        """One outcome signal (<= 0)."""
        value = self.penalty_for(trajectory.num_policy_tokens, trajectory.truncated)
        return [RewardSignal(name=self.name, value=value, kind="outcome", source=self.name)]


SHAPERS: list[type[RewardShaper]] = [AnswerMatchReward, FormatReward, ToolCallReward, OverlongReward]
"""The reward shapers the bundled plugin registers."""

__all__ = ["SHAPERS", "AnswerMatchReward", "FormatReward", "OverlongReward", "ToolCallReward"]
