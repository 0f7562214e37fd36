"""Bundled policy losses: ``ppo_clip``, ``gspo`` and ``cispo``.

Each returns a per-token loss ``[B, T]`` (0 outside ``loss_mask``) and per-token diagnostics
(detached ``[B, T]`` floats). Aggregation over the optimizer batch is the framework's job
(:func:`agent_r1.engine.learner.loss_utils.aggregate`), so these plugins never normalise.

Diagnostics: ``clipped`` is 1 where the clip removed the token's gradient (PPO, GSPO) or bounded
its importance weight (CISPO); ``dual_clipped`` (PPO only) is 1 where the dual clip capped the
loss; ``ratio`` is the importance ratio used; ``approx_kl`` is the k3 estimate of KL(π_old‖π_θ)
per token, ``(ρ − 1) − log ρ``, which is non-negative.
"""

from __future__ import annotations

import torch
from pydantic import Field

from agent_r1.contracts import ComponentConfig, LossInput, PolicyLoss
from agent_r1.engine.learner.loss_utils import LOG_RATIO_BOUND, masked_mean


def _check_input(inputs: LossInput) -> None:
    if inputs.loss_mask.dtype != torch.bool:
        raise TypeError(f"LossInput.loss_mask must be a bool tensor, got {inputs.loss_mask.dtype}")
    shape = inputs.loss_mask.shape
    for field_name in ("logprobs", "old_logprobs", "advantages"):
        tensor = getattr(inputs, field_name)
        if tensor.shape != shape:
            raise ValueError(
                f"LossInput.{field_name} has shape {tuple(tensor.shape)}, expected {tuple(shape)}"
            )


def _log_ratio(inputs: LossInput) -> torch.Tensor:
    """``logπθ − logπold`` ``[B, T]``, 0 off the mask and clamped to ±20 so ``exp`` cannot overflow."""
    log_ratio = inputs.logprobs - inputs.old_logprobs.detach()
    return torch.where(inputs.loss_mask, log_ratio, 0.0).clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)


def _loss_terms(inputs: LossInput) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The checked inputs' ``loss_mask`` ``[B, T]`` bool, detached ``advantages`` ``[B, T]`` and
    :func:`_log_ratio` ``[B, T]``: where every loss starts."""
    _check_input(inputs)
    return inputs.loss_mask, inputs.advantages.detach(), _log_ratio(inputs)


def _diagnostics(
    log_ratio: torch.Tensor, ratio: torch.Tensor, clipped: torch.Tensor, mask: torch.Tensor
) -> dict[str, torch.Tensor]:
    with torch.no_grad():
        # expm1 keeps (ρ − 1) − log ρ accurate, and non-negative, for ρ near 1.
        approx_kl = (torch.expm1(log_ratio) - log_ratio).clamp(min=0.0)
        return {
            "clipped": (clipped & mask).to(ratio.dtype),
            "ratio": torch.where(mask, ratio.detach(), 0.0),
            "approx_kl": torch.where(mask, approx_kl, 0.0),
        }


def _clipped_surrogate(
    ratio: torch.Tensor, advantages: torch.Tensor, clip_low: float, clip_high: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's pessimistic surrogate ``max(−A·ρ, −A·clip(ρ, 1−ε_low, 1+ε_high))`` ``[B, T]`` and the
    indicator of tokens where the clipped branch won (their gradient is 0)."""
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    return torch.maximum(unclipped, clipped), clipped > unclipped


class _ClipConfig(ComponentConfig):
    clip_low: float = Field(0.2, ge=0.0, lt=1.0, description="ε_low: the ratio is clipped below at 1 − ε_low")
    clip_high: float = Field(0.2, ge=0.0, description="ε_high: the ratio is clipped above at 1 + ε_high")


class PPOClip(PolicyLoss):
    """PPO's clipped surrogate (Schulman et al. 2017) with separate lower and upper ranges (DAPO's
    clip-higher; Yu et al. 2025) and dual clipping (Ye et al. 2020, "Mastering Complex Control in
    MOBA Games with Deep RL"): for A < 0 the loss is capped at ``−A·c``, so a token whose ratio has
    exploded cannot dominate the update.
    ``ℓ = max(−A·ρ, −A·clip(ρ, 1−ε_low, 1+ε_high))``, then ``ℓ = min(ℓ, −A·c)`` where A < 0."""

    name = "ppo_clip"

    class Config(_ClipConfig):
        dual_clip: float | None = Field(
            3.0, gt=1.0, description="dual-clip constant c (> 1) for negative advantages; null disables"
        )

    config: Config

    def token_loss(self, inputs: LossInput) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        mask, advantages, log_ratio = _loss_terms(inputs)  # [B, T] each
        ratio = torch.exp(log_ratio)  # [B, T]
        loss, clipped = _clipped_surrogate(ratio, advantages, self.config.clip_low, self.config.clip_high)
        dual = torch.zeros_like(mask)  # [B, T] bool
        if self.config.dual_clip is not None:
            cap = -advantages * self.config.dual_clip  # [B, T]
            dual = (advantages < 0) & (loss > cap)
            loss = torch.where(dual, cap, loss)
        loss = torch.where(mask, loss, 0.0)
        diagnostics = _diagnostics(log_ratio, ratio, clipped, mask)
        diagnostics["dual_clipped"] = (dual & mask).to(loss.dtype)
        return loss, diagnostics


class GSPO(PolicyLoss):
    """Group Sequence Policy Optimization (Zheng et al. 2025, "Group Sequence Policy Optimization",
    arXiv 2507.18071): the importance ratio is per sequence, the length-normalised
    ``s_i = exp(mean_t(logπθ − logπold))`` over the sequence's policy tokens, clipped like PPO.

    Implemented in the paper's GSPO-token form: token t uses ``sg(s_i)·πθ(y_t)/sg(πθ(y_t))``, whose
    value is ``s_i`` and whose gradient is ``s_i·∇logπθ(y_t)``. With a per-sequence advantage and
    ``seq-mean-token-mean`` aggregation this is exactly the sequence-level GSPO objective. The
    default clip ranges, 3e-4 below and 4e-4 above, are the paper's: a sequence ratio moves far
    less than token ratios do."""

    name = "gspo"

    class Config(ComponentConfig):
        clip_low: float = Field(3e-4, ge=0.0, lt=1.0, description="ε_low on the sequence ratio (paper: 3e-4)")
        clip_high: float = Field(4e-4, ge=0.0, description="ε_high on the sequence ratio (paper: 4e-4)")

    config: Config

    def token_loss(self, inputs: LossInput) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        mask, advantages, log_ratio = _loss_terms(inputs)  # [B, T] each
        sequence_log_ratio = masked_mean(log_ratio, mask, dim=-1).unsqueeze(-1)  # [B, 1]
        token_log_ratio = sequence_log_ratio.detach() + inputs.logprobs - inputs.logprobs.detach()  # [B, T]
        token_log_ratio = torch.where(mask, token_log_ratio, 0.0).clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)
        ratio = torch.exp(token_log_ratio)  # [B, T]; value s_i on every policy token of row i
        loss, clipped = _clipped_surrogate(ratio, advantages, self.config.clip_low, self.config.clip_high)
        loss = torch.where(mask, loss, 0.0)
        return loss, _diagnostics(log_ratio, ratio, clipped, mask)


class CISPO(PolicyLoss):
    """Clipped IS-weight Policy Optimization (MiniMax 2025, "MiniMax-M1: Scaling Test-Time Compute
    Efficiently with Lightning Attention", arXiv 2506.13585): ``ℓ = −sg(clip(ρ, 1−ε_low,
    1+ε_high))·A·logπθ``. Unlike PPO, no token loses its gradient; only its importance weight is
    bounded. The paper sets no lower bound (ε_low large) and tunes only ε_high; our defaults are
    ε_low = 1 (lower bound 0: none) and ε_high = 0.28 (DAPO's clip-higher value)."""

    name = "cispo"

    class Config(ComponentConfig):
        clip_low: float = Field(
            1.0, ge=0.0, le=1.0, description="ε_low; 1 means no lower bound on the weight"
        )
        clip_high: float = Field(0.28, ge=0.0, description="ε_high: the weight is capped at 1 + ε_high")

    config: Config

    def token_loss(self, inputs: LossInput) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        mask, advantages, log_ratio = _loss_terms(inputs)  # [B, T] each
        ratio = torch.exp(log_ratio).detach()  # [B, T]
        lower, upper = 1.0 - self.config.clip_low, 1.0 + self.config.clip_high
        weight = ratio.clamp(lower, upper)  # [B, T], no gradient
        loss = torch.where(mask, -weight * advantages * inputs.logprobs, 0.0)
        clipped = (ratio < lower) | (ratio > upper)
        return loss, _diagnostics(log_ratio, ratio, clipped, mask)


LOSSES: list[type[PolicyLoss]] = [PPOClip, GSPO, CISPO]

__all__ = ["CISPO", "GSPO", "LOSSES", "PPOClip"]
