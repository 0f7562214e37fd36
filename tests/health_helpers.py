"""Shared by tests/test_health.py and tests/health_worker.py: audit shapers for the toy task, whose
``target_char`` reward is hackable (it pays for any digits; the task asks for the task's number),
and the run config of a short GRPO run on it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trainer_helpers import toy_config

from agent_r1 import RewardShaper, hookimpl
from agent_r1.mdp import RewardSignal, Task, Trajectory


def _answer(trajectory: Trajectory) -> str:
    return (trajectory.steps[-1].action.answer or "") if trajectory.steps else ""


class NumberAudit(RewardShaper):
    """The audit of the hackable reward: ``solved`` (weight 0) says whether the answer is the task's
    own number; a rewarded answer of digits that is not the number is flagged
    ``suspect/digits_without_number``."""

    name = "number_audit"

    def score(self, trajectory: Trajectory, task: Task) -> list[RewardSignal]:
        text = _answer(trajectory)
        solved = float(text.strip() == task.id[1:])
        signals = [RewardSignal(name="solved", value=solved)]
        if solved == 0.0 and any(ch.isdigit() for ch in text):
            signals.append(RewardSignal(name="suspect/digits_without_number", value=1.0))
        return signals


class DigitAudit(RewardShaper):
    """A consistent audit: the same digit share as the trained reward, reported with weight 0."""

    name = "digit_audit"

    def score(self, trajectory: Trajectory, task: Task) -> list[RewardSignal]:
        text = _answer(trajectory)
        return [RewardSignal(name="digits", value=sum(ch.isdigit() for ch in text) / max(len(text), 1))]


class AuditPlugin:
    @hookimpl
    def register_reward_shapers(self) -> list[Any]:
        return [NumberAudit, DigitAudit]


def hackable_run(model_dir: Path, run_dir: Path, *, steps: int = 8, **health: Any) -> dict[str, Any]:
    """The toy task trained on ``target_char`` (hackable), audited by ``number_audit`` (weight 0),
    with every alarm watching on short windows."""
    return toy_config(
        model_dir,
        run_dir,
        rewards=[{"name": "target_char", "weight": 1.0}, {"name": "number_audit", "weight": 0.0}],
        trainer={"steps": steps, "checkpoint_every": 2, "keep_checkpoints": 5},
        health={
            "audit_gap": {"signals": ["solved"], "window": 6},
            "disagreement": {"reward_model": "answer_match", "verifier": "solved", "window": 6},
            **health,
        },
    )
