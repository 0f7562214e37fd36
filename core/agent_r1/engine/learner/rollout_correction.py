"""Rollout/trainer mismatch: importance weights and their per-step diagnostics.

A rollout backend other than the trainer's own forward pass (vLLM: other kernels, other precision,
batch-dependent reductions) samples from a policy ``π_rollout`` slightly different from the
trainer's ``π_old``. ``algorithm.rollout_correction`` corrects the policy loss with the ratio
``π_old / π_rollout`` per token or per sequence, truncated at ``cap`` (TIS) or masked outside
``[1/cap, cap]`` (MIS); see ``docs/algorithms.md``. :func:`correction_weights` returns the weights
(or ``None`` when the correction is off) and :func:`ratio_stats` the numbers logged every step
whether or not the correction is on, so a run shows when it would need one.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from agent_r1.engine.learner.loss_utils import host_floats, masked_mean, mismatch_log_ratio, tis_weights

__all__ = ["correction_weights", "ratio_stats", "ratio_stats_tensors"]


def correction_weights(
    correction: Any, old_logprobs: torch.Tensor, rollout_logprobs: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor | None:
    """The detached weights ``[B, T]`` that multiply the per-token policy loss under
    ``correction`` (an :class:`~agent_r1.config.RolloutCorrectionConfig`), or ``None`` when its mode
    is ``off``."""
    if correction.mode == "off":
        return None
    return tis_weights(
        old_logprobs,
        rollout_logprobs,
        mask,
        correction.cap,
        level=correction.level,
        masked=correction.mode == "mask",
    )


def ratio_stats_tensors(
    old_logprobs: torch.Tensor,
    rollout_logprobs: torch.Tensor,
    mask: torch.Tensor,
    *,
    level: str = "token",
    cap: float = 2.0,
) -> dict[str, torch.Tensor]:
    """:func:`ratio_stats` as 0-dim tensors on the inputs' device, computed without a host
    synchronisation (no boolean indexing, no branch on the mask)."""
    with torch.no_grad():
        log_ratio = mismatch_log_ratio(old_logprobs, rollout_logprobs, mask, level)  # [B, T]
        ratio = torch.exp(log_ratio)  # [B, T]
        log_cap = math.log(cap)
        clipped = (log_ratio > log_cap) & mask
        outside = ((log_ratio > log_cap) | (log_ratio < -log_cap)) & mask
        some = mask.any()
        one = ratio.new_ones(())
        return {  # without policy tokens: ratio 1, nothing clipped or masked
            "mismatch/ratio_mean": torch.where(some, masked_mean(ratio, mask), one),
            "mismatch/ratio_max": torch.where(some, torch.where(mask, ratio, -math.inf).max(), one),
            "mismatch/ratio_min": torch.where(some, torch.where(mask, ratio, math.inf).min(), one),
            "mismatch/clipped_frac": masked_mean(clipped.float(), mask),
            "mismatch/masked_frac": masked_mean(outside.float(), mask),
        }


def ratio_stats(
    old_logprobs: torch.Tensor, rollout_logprobs: torch.Tensor, mask: torch.Tensor, **options: Any
) -> dict[str, float]:
    """Diagnostics of the importance ratio ``π_old / π_rollout`` at ``level`` over the policy tokens
    of ``mask``: ``mismatch/ratio_mean``, ``mismatch/ratio_max``, ``mismatch/ratio_min``, and the
    shares of policy tokens that truncation at ``cap`` clips (``mismatch/clipped_frac``: ratio above
    ``cap``) and that masking drops (``mismatch/masked_frac``: ratio outside ``[1/cap, cap]``). A
    sequence-level ratio counts for every policy token of its sequence. ``options``: ``level``
    (``token``) and ``cap`` (2.0), as :func:`ratio_stats_tensors` takes them."""
    return host_floats(ratio_stats_tensors(old_logprobs, rollout_logprobs, mask, **options))
