"""Reward shapers for code and math.

Code, outcome (the submission is the last step's ``<answer>`` code, or, when that is empty or
missing, the code of the episode's last ``run_tests`` call; see
:func:`~agent_r1_plugin_code.testcases.submitted_solution`):

* ``code_tests``: the share of the task's hidden tests the submission passes (0..1);
* ``code_solved``: 1 when it passes every hidden test, else 0. Use it as ``eval.success_signal``:
  ``agent-r1 eval`` then reports success and pass@k (``eval.samples`` >= k) over it.

Both run the hidden tests once between them (a per-process cache keyed by task and code).

Code, process (one signal per rewarded turn, read from ``observation.info["code"]``, which the
``code`` environment writes):

* ``code_runs``: the turn ran code (``python`` or ``run_tests``) that finished without an error;
  at most ``max_rewarded_turns`` turns per episode, so that running code for its own sake stops
  paying;
* ``test_progress``: the turn's ``run_tests`` reached a new best share of visible tests passed;
  the value is the gain, so an episode earns at most 1.

Math, outcome:

* ``math_correct``: 1 when the final answer states the gold number (GSM8K's ``#### 72``), compared
  with :func:`agent_r1.rewards.numeric_match` (commas, currency signs and units ignored). The answer
  is the last step's ``<answer>``; with ``fallback`` the last action's ``\\boxed{...}`` or ``####
  ...`` counts too. Use it as ``eval.success_signal`` for accuracy.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field

from agent_r1 import ComponentConfig, RewardShaper, RewardSignal, Task, Trajectory
from agent_r1.rewards import numeric_match
from agent_r1_plugin_code.sandbox import SandboxConfig
from agent_r1_plugin_code.testcases import Verdict, judge_cached, submitted_solution

SUSPECT_SANDBOX_VERDICT = "suspect/sandbox_verdict"
"""A weight-0 signal on a rewarded solution some of whose tests were judged inside the sandbox."""


class _HiddenTestsShaper(RewardShaper):
    class Config(ComponentConfig):
        sandbox: SandboxConfig = Field(default_factory=SandboxConfig, description="where the tests run")
        fall_back_to_tested: bool = Field(
            True, description="without a submitted answer, judge the code of the last run_tests call"
        )

    config: Config

    def _verdict(self, trajectory: Trajectory, task: Task) -> Verdict | None:
        code = submitted_solution(trajectory, fall_back_to_tested=self.config.fall_back_to_tested)
        return None if code is None else judge_cached(code, task, self.config.sandbox)

    def value_of(self, passed: int, total: int) -> float:  # pragma: no cover - abstract
        raise NotImplementedError

    def score(self, trajectory: Trajectory, task: Task) -> list[RewardSignal]:
        if not task.metadata.get("tests"):
            return []
        verdict = self._verdict(trajectory, task)
        value = 0.0 if verdict is None else self.value_of(verdict.passed, verdict.total)
        signals = [RewardSignal(name=self.name, value=value, kind="outcome", source=self.name)]
        if verdict is not None and value > 0 and verdict.result.sandbox_verdicts:
            # Reward that rests on tests judged inside the sandbox (they could not be split), which
            # a solution could fake: the core's `suspect` alarm counts it (docs/reward_hacking.md).
            signals.append(
                RewardSignal(name=SUSPECT_SANDBOX_VERDICT, value=1.0, weight=0.0, source=self.name)
            )
        return signals


class CodeTestsReward(_HiddenTestsShaper):
    """Share of the hidden tests the submitted solution passes."""

    name = "code_tests"

    def value_of(self, passed: int, total: int) -> float:
        return passed / total if total else 0.0


class CodeSolvedReward(_HiddenTestsShaper):
    """1.0 when the submitted solution passes every hidden test (the pass@k success signal)."""

    name = "code_solved"

    def value_of(self, passed: int, total: int) -> float:
        return float(total > 0 and passed == total)


def _records(step: object) -> list[dict]:
    observation = getattr(step, "observation", None)
    if observation is None or not isinstance(observation.info, dict):
        return []
    records = observation.info.get("code")
    return [r for r in records if isinstance(r, dict)] if isinstance(records, list) else []


class CodeRunsReward(RewardShaper):
    """Process reward for turns whose code ran without an error (capped per episode)."""

    name = "code_runs"

    class Config(ComponentConfig):
        max_rewarded_turns: int = Field(2, ge=1, description="reward at most this many turns")

    config: Config

    def score(self, trajectory: Trajectory, task: Task) -> list[RewardSignal]:
        signals: list[RewardSignal] = []
        for step in trajectory.steps:
            if len(signals) >= self.config.max_rewarded_turns:
                break
            if any(record.get("status") == "ok" for record in _records(step)):
                signals.append(
                    RewardSignal(name=self.name, value=1.0, kind="process", turn=step.turn, source=self.name)
                )
        return signals


class ProgressReward(RewardShaper):
    """Process reward for turns whose ``run_tests`` passed a larger share of visible tests than ever
    before in the episode; the value is the gain (at most 1 per episode)."""

    name = "test_progress"

    def score(self, trajectory: Trajectory, task: Task) -> list[RewardSignal]:
        best = 0.0
        signals: list[RewardSignal] = []
        for step in trajectory.steps:
            shares = [
                record["passed"] / record["total"]
                for record in _records(step)
                if record.get("tool") == "run_tests" and record.get("total")
            ]
            if shares and max(shares) > best:
                gain = max(shares) - best
                best = max(shares)
                signals.append(
                    RewardSignal(name=self.name, value=gain, kind="process", turn=step.turn, source=self.name)
                )
        return signals


_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")
_HASHES = re.compile(r"####\s*([^\n]+)")


def extract_math_answer(trajectory: Trajectory, fallback: list[str]) -> str | None:
    """The final answer: the last step's ``<answer>``, else (per ``fallback``) the last
    ``\\boxed{...}`` or ``#### ...`` of the last action's text."""
    if not trajectory.steps:
        return None
    last = trajectory.steps[-1].action
    if last.answer is not None and last.answer.strip():
        return last.answer
    for kind in fallback:
        pattern = _BOXED if kind == "boxed" else _HASHES
        found = pattern.findall(last.text)
        if found:
            return str(found[-1])
    return None


class MathAnswerReward(RewardShaper):
    """1.0 when the final answer's number equals the gold number (see the module docstring)."""

    name = "math_correct"

    class Config(ComponentConfig):
        fallback: list[Literal["boxed", "hash"]] = Field(
            default_factory=list, description="also read \\boxed{...} or '#### ...' without <answer>"
        )
        rel_tol: float = Field(1e-6, ge=0.0, description="relative tolerance of the comparison")
        abs_tol: float = Field(1e-6, ge=0.0, description="absolute tolerance of the comparison")

    config: Config

    def score(self, trajectory: Trajectory, task: Task) -> list[RewardSignal]:
        if task.answer is None:
            return []
        answer = extract_math_answer(trajectory, list(self.config.fallback))
        value = (
            0.0
            if answer is None
            else numeric_match(answer, task.answer, rel_tol=self.config.rel_tol, abs_tol=self.config.abs_tol)
        )
        return [RewardSignal(name=self.name, value=value, kind="outcome", source=self.name)]


SHAPERS: list[type[RewardShaper]] = [
    CodeTestsReward,
    CodeSolvedReward,
    CodeRunsReward,
    ProgressReward,
    MathAnswerReward,
]
