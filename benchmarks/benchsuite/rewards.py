"""The rewards, the same function on both sides of the ``trl`` section."""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from agent_r1.mdp import Task, Trajectory

SPECIAL = re.compile(r"<\|[^|>]*\|>")


def text_reward(text: str, answer: Any) -> float:
    """1 when the reply's last number is ``answer``, plus 0.2 × the share of digits among its
    characters (special tokens removed): the dense part gives a random model's replies different
    scores, so that GRPO's advantages are not all zero."""
    text = SPECIAL.sub("", text)
    numbers = re.findall(r"\d+", text)
    correct = 1.0 if answer is not None and numbers and numbers[-1] == str(answer) else 0.0
    return correct + 0.2 * sum(c.isdigit() for c in text) / max(len(text), 1)


def actions_text(trajectory: Trajectory) -> str:
    """Everything the policy wrote in ``trajectory``, turn after turn."""
    return "".join(step.action.text for step in trajectory.steps)


def bench_text_reward(trajectory: Trajectory, task: Task) -> float:
    """:func:`text_reward` as an agent-r1 reward function (given by Python path)."""
    return text_reward(actions_text(trajectory), task.answer)


def bench_hash_reward(trajectory: Trajectory, task: Task) -> float:
    """A score in [0, 1) fixed by the trajectory's tokens: samples that differ score differently,
    so every group has non-zero advantages and every step trains on every trajectory (the scaling
    runs measure the cost of a full update, not what a random model happens to earn)."""
    digest = hashlib.sha1(json.dumps(trajectory.token_ids).encode("ascii")).hexdigest()
    return int(digest[:8], 16) / 16**8
