"""Guards of the update: non-finite rewards stop at once; non-finite losses or gradients skip the
update and stop the run when they recur, with advice that names the settings this run uses."""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING

import numpy as np
import torch

from agent_r1.engine.learner.batch import TrainBatch
from agent_r1.errors import TrainingAborted

if TYPE_CHECKING:  # pragma: no cover
    from agent_r1.engine.session import Session

__all__ = ["NonFiniteLossWarning", "check_rewards", "nonfinite_advice", "track_bad_updates"]


class NonFiniteLossWarning(UserWarning):
    """An update's loss or gradient was NaN or infinite and the update was skipped."""


def track_bad_updates(session: Session, status: str) -> None:
    """Abort when non-finite updates recur. Idle steps (no gradient) neither reset nor add to the
    count, so a run cannot hide a recurring NaN behind steps that had nothing to learn."""
    if status == "ok":
        session.bad_updates = 0
        return
    if status != "skipped":
        return
    session.bad_updates += 1
    limit = session.config.trainer.max_bad_steps
    warnings.warn(
        f"step {session.step}: the loss or gradient was NaN/infinite; the update was skipped "
        f"({session.bad_updates} of the last updates with a gradient; abort at {limit})",
        NonFiniteLossWarning,
        stacklevel=3,
    )
    if session.bad_updates >= limit:
        raise TrainingAborted(
            f"{session.bad_updates} updates in a row (not counting updates without a gradient) had a "
            f"NaN or infinite loss or gradient at step {session.step} (limit trainer.max_bad_steps={limit}); "
            f"stopping. Checkpoints and metrics written so far are kept in {session.run_dir}. "
            f"{nonfinite_advice(session)}"
        )


def nonfinite_advice(session: Session) -> str:
    """What to change, naming the settings this run actually uses."""
    config = session.config
    advice = [f"lower trainer.lr (now {config.trainer.lr:g})"]
    if config.trainer.grad_clip is None:
        advice.append("enable gradient clipping (trainer.grad_clip=1.0)")
    else:
        advice.append(f"lower trainer.grad_clip (now {config.trainer.grad_clip:g})")
    if session.ref_model is not None:
        advice.append(f"lower algorithm.kl.coef (now {config.algorithm.kl.coef:g})")
    if session.needs_critic:
        advice.append(f"lower algorithm.critic.lr (now {config.algorithm.critic.lr:g})")
    if config.model.dtype == "float16":
        advice.append("train in model.dtype=bfloat16 or float32 instead of float16")
    return "Try: " + "; ".join(advice) + "."


def check_rewards(batch: TrainBatch) -> None:
    bad = ~torch.isfinite(batch.token_rewards).all(dim=-1)  # [B]
    if bool(bad.any()):
        rows = [batch.trajectories[int(i)] for i in bad.nonzero().flatten()]
        names = sorted(
            {s.source or s.name for t in rows for s in t.rewards if not np.isfinite(s.value * s.weight)}
        )
        raise TrainingAborted(
            f"{len(rows)} trajectories have NaN or infinite rewards (first: {rows[0].id!r}, task "
            f"{rows[0].task_id!r}; from {', '.join(names) or 'unknown sources'}). Fix the reward shaper or "
            "environment that produced them."
        )
