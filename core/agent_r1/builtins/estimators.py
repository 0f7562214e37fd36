"""Bundled advantage estimators: ``gae``, ``grpo``, ``rloo``, ``reinforce_pp``,
``reinforce_pp_baseline`` and ``remax``.

Every estimator maps an :class:`~agent_r1.contracts.AdvantageInput` over full trajectories
(``[B, T]``: prompt, actions, observations, padding) to ``(advantages, returns)``, both ``[B, T]``
and zero outside ``loss_mask``. The definitions and conventions are those of ``ALGORITHMS.md``.

Token-level estimators (``gae``, ``reinforce_pp``) work on the *policy tokens only*: a trajectory's
policy tokens are gathered into a contiguous row, the backward recursion runs over that row, and the
result is scattered back. An observation between two actions is therefore skipped, not a
reset: the last action token before it bootstraps from the first action token after it (Agent-R1's
"advantage alignment"). Rewards may sit on any policy token (process rewards mid-trajectory); a
reward found on a non-policy token is credited to the last policy token before it (the action it
answers), or to the first policy token when none precedes it.

Score-level estimators (``grpo``, ``rloo``, ``reinforce_pp_baseline``, ``remax``) use the
trajectory score ``s_i`` (all weighted rewards, process ones included) and broadcast one advantage to
the trajectory's policy tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar, Literal

import torch
from pydantic import Field

from agent_r1.contracts import AdvantageEstimator, AdvantageInput, ComponentConfig
from agent_r1.engine.loss_utils import masked_whiten

# --------------------------------------------------------------------------------------------
# Shared helpers
# --------------------------------------------------------------------------------------------


def _check_input(batch: AdvantageInput) -> None:
    mask = batch.loss_mask
    if mask.dtype != torch.bool:
        raise TypeError(f"AdvantageInput.loss_mask must be a bool tensor, got {mask.dtype}")
    if batch.token_rewards.shape != mask.shape:
        raise ValueError(
            f"token_rewards shape {tuple(batch.token_rewards.shape)} does not match "
            f"loss_mask shape {tuple(mask.shape)}"
        )
    if batch.scores.shape != (mask.shape[0],) or len(batch.group_ids) != mask.shape[0]:
        raise ValueError(
            f"scores {tuple(batch.scores.shape)} and group_ids (length {len(batch.group_ids)}) must "
            f"hold one entry per trajectory ({mask.shape[0]})"
        )


def group_index(group_ids: Sequence[str], device: torch.device | None = None) -> tuple[torch.Tensor, int]:
    """Map group ids to dense integers: ``(index [B] long, number of groups)``, in order of first
    appearance."""
    dense: dict[str, int] = {}
    index = [dense.setdefault(group_id, len(dense)) for group_id in group_ids]
    return torch.tensor(index, dtype=torch.long, device=device), len(dense)


def group_stats(scores: torch.Tensor, group_ids: Sequence[str]) -> tuple[torch.Tensor, ...]:
    """Per-trajectory statistics of its group, all ``[B]``: ``(count, sum, mean, unbiased std)``.
    A group of one has std 0. Computed with ``index_add_``, without a loop over trajectories."""
    index, num_groups = group_index(group_ids, scores.device)
    ones = torch.ones_like(scores)
    count = torch.zeros(num_groups, dtype=scores.dtype, device=scores.device).index_add_(0, index, ones)
    total = torch.zeros(num_groups, dtype=scores.dtype, device=scores.device).index_add_(0, index, scores)
    mean = total / count  # [G]
    squares = torch.zeros(num_groups, dtype=scores.dtype, device=scores.device).index_add_(
        0, index, (scores - mean[index]) ** 2
    )
    std = torch.sqrt(squares / (count - 1).clamp(min=1))  # [G]; 0 for a group of one
    return count[index], total[index], mean[index], std[index]


def _broadcast(per_sequence: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``[B]`` → ``[B, T]`` on policy tokens, 0 elsewhere."""
    return torch.where(mask, per_sequence.unsqueeze(-1), 0.0)


def rewards_on_policy_tokens(token_rewards: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Move any reward that sits on a non-policy token to the last policy token before it (or the
    first policy token when none precedes it). Rows without policy tokens lose their rewards: no
    token could be credited. The engine already places rewards on policy tokens; this makes the
    token-level estimators robust to inputs that do not."""
    batch_size, length = mask.shape
    positions = torch.arange(length, device=mask.device).expand(batch_size, length)  # [B, T]
    last_policy = torch.where(mask, positions, torch.full_like(positions, -1)).cummax(dim=1).values  # [B, T]
    first_policy = mask.to(torch.int8).argmax(dim=1, keepdim=True).expand(batch_size, length)  # [B, T]
    target = torch.where(last_policy >= 0, last_policy, first_policy)  # [B, T]
    has_policy = mask.any(dim=1, keepdim=True)  # [B, 1]
    rewards = torch.where(has_policy, token_rewards, 0.0)
    return torch.zeros_like(token_rewards).scatter_add_(1, target, rewards)


def policy_token_scan(
    rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float, lam: float
) -> torch.Tensor:
    """Backward GAE recursion over policy tokens only; returns advantages ``[B, T]`` (0 off-mask).

    With t' the next policy token after t (Schulman et al. 2016, "High-Dimensional Continuous
    Control Using Generalized Advantage Estimation", applied across observations):
    ``δ_t = r_t + γ·V_{t'} − V_t`` and ``A_t = δ_t + γλ·A_{t'}``, with ``V`` and ``A`` 0 after the
    last policy token. With ``values = 0`` and ``lam = 1`` this is the discounted return
    ``G_t = r_t + γ·G_{t'}``. Policy tokens are first packed to the left of a ``[B, L]`` buffer
    (L = most policy tokens in a row), so the loop runs over L steps, vectorised across the batch.
    """
    rows, cols = mask.nonzero(as_tuple=True)  # policy token coordinates, row-major
    rank = (mask.cumsum(dim=1) - 1)[rows, cols]  # position within the row's policy tokens
    width = int(mask.sum(dim=1).max()) if mask.numel() else 0
    packed_rewards = rewards.new_zeros(mask.shape[0], width)  # [B, L]; 0 beyond a row's tokens
    packed_values = values.new_zeros(mask.shape[0], width)  # [B, L]
    packed_rewards[rows, rank] = rewards[rows, cols]
    packed_values[rows, rank] = values[rows, cols]

    packed_advantages = torch.zeros_like(packed_rewards)  # [B, L]
    next_value = rewards.new_zeros(mask.shape[0])  # [B]
    next_advantage = rewards.new_zeros(mask.shape[0])  # [B]
    # Slots past a row's last policy token hold r = V = 0, so their δ and A are 0 and the carries
    # reaching the row's real last token are 0, as the definition requires.
    for k in range(width - 1, -1, -1):
        delta = packed_rewards[:, k] + gamma * next_value - packed_values[:, k]
        next_advantage = delta + gamma * lam * next_advantage
        next_value = packed_values[:, k]
        packed_advantages[:, k] = next_advantage

    advantages = torch.zeros_like(rewards)
    advantages[rows, cols] = packed_advantages[rows, rank]
    return advantages


# --------------------------------------------------------------------------------------------
# Token-level estimators
# --------------------------------------------------------------------------------------------


class GAE(AdvantageEstimator):
    """Generalized advantage estimation (Schulman et al. 2016) with Agent-R1's advantage
    alignment: the recursion steps from policy token to the next policy token, skipping
    observations. ``returns = A + V`` (critic targets, before whitening); the advantages are then
    whitened over the policy tokens of the batch unless ``whiten`` is off. Defaults γ = λ = 1
    match verl's."""

    name = "gae"
    needs_critic: ClassVar[bool] = True

    class Config(ComponentConfig):
        gamma: float = Field(1.0, ge=0.0, le=1.0, description="discount per policy token")
        lam: float = Field(
            1.0, ge=0.0, le=1.0, description="GAE λ: bias/variance trade-off (1 = Monte Carlo)"
        )
        whiten: bool = Field(True, description="whiten advantages over the batch's policy tokens")

    config: Config

    def compute(self, batch: AdvantageInput) -> tuple[torch.Tensor, torch.Tensor]:
        _check_input(batch)
        if batch.values is None:
            raise ValueError(
                "advantage estimator 'gae' needs critic values (AdvantageInput.values); use an algorithm "
                "with needs_critic = True, such as 'ppo', or pick an estimator without a critic"
            )
        mask = batch.loss_mask  # [B, T] bool
        values = torch.where(mask, batch.values.detach(), 0.0)
        rewards = rewards_on_policy_tokens(batch.token_rewards, mask)  # [B, T]
        advantages = policy_token_scan(rewards, values, mask, self.config.gamma, self.config.lam)  # [B, T]
        returns = torch.where(mask, advantages + values, 0.0)  # [B, T]
        if self.config.whiten:
            advantages = masked_whiten(advantages, mask)
        return advantages, returns


class ReinforcePP(AdvantageEstimator):
    """REINFORCE++ (Hu 2025, "REINFORCE++: A Simple and Efficient Approach for Aligning Large
    Language Models"): the discounted return ``G_t = r_t + γ·G_{t'}`` over policy tokens (t' the
    next policy token, so process rewards count from where they occur), whitened over the batch's
    policy tokens. ``returns`` are the raw ``G_t``."""

    name = "reinforce_pp"

    class Config(ComponentConfig):
        gamma: float = Field(1.0, ge=0.0, le=1.0, description="discount per policy token")
        whiten: bool = Field(True, description="whiten the returns over the batch's policy tokens")

    config: Config

    def compute(self, batch: AdvantageInput) -> tuple[torch.Tensor, torch.Tensor]:
        _check_input(batch)
        mask = batch.loss_mask  # [B, T] bool
        rewards = rewards_on_policy_tokens(batch.token_rewards, mask)  # [B, T]
        returns = policy_token_scan(
            rewards, torch.zeros_like(rewards), mask, self.config.gamma, 1.0
        )  # [B, T]
        advantages = masked_whiten(returns, mask) if self.config.whiten else returns
        return advantages, returns


# --------------------------------------------------------------------------------------------
# Score-level estimators
# --------------------------------------------------------------------------------------------


class GRPOEstimator(AdvantageEstimator):
    """Group-relative advantage (Shao et al. 2024, "DeepSeekMath"):
    ``A_i = (s_i − mean_g) / (std_g + ε)`` with the unbiased group std, broadcast to the policy
    tokens. ``scale="batch"`` divides by the std of all scores in the batch instead (group mean,
    batch std); ``scale="none"`` does not divide (Dr.GRPO; Liu et al. 2025, "Understanding
    R1-Zero-Like Training"). A group of one gets A = 0. ``returns`` equal the advantages."""

    name = "grpo"

    class Config(ComponentConfig):
        scale: Literal["group", "batch", "none"] = Field(
            "group", description="divide by the group std, the batch std, or nothing (Dr.GRPO)"
        )
        eps: float = Field(1e-6, gt=0.0, description="added to the std before dividing")

    config: Config

    def compute(self, batch: AdvantageInput) -> tuple[torch.Tensor, torch.Tensor]:
        _check_input(batch)
        scores = batch.scores  # [B]
        count, _, mean, std = group_stats(scores, batch.group_ids)  # [B] each
        centred = torch.where(count > 1, scores - mean, torch.zeros_like(scores))  # [B]
        if self.config.scale == "group":
            centred = centred / (std + self.config.eps)
        elif self.config.scale == "batch":
            batch_std = scores.std(unbiased=True) if scores.numel() > 1 else scores.new_zeros(())
            centred = centred / (batch_std + self.config.eps)
        advantages = _broadcast(centred, batch.loss_mask)
        return advantages, advantages.clone()


class RLOO(AdvantageEstimator):
    """REINFORCE leave-one-out (Ahmadian et al. 2024, "Back to Basics"): ``A_i = s_i −`` the mean
    score of the other G−1 trajectories of the group, broadcast to the policy tokens. A group of
    one gets A = 0. ``returns`` equal the advantages."""

    name = "rloo"

    class Config(ComponentConfig):
        pass

    config: Config

    def compute(self, batch: AdvantageInput) -> tuple[torch.Tensor, torch.Tensor]:
        _check_input(batch)
        scores = batch.scores  # [B]
        count, total, _, _ = group_stats(scores, batch.group_ids)  # [B] each
        others_mean = (total - scores) / (count - 1).clamp(min=1)
        per_sequence = torch.where(count > 1, scores - others_mean, torch.zeros_like(scores))  # [B]
        advantages = _broadcast(per_sequence, batch.loss_mask)
        return advantages, advantages.clone()


class ReinforcePPBaseline(AdvantageEstimator):
    """REINFORCE++ with a group baseline (Hu 2025): ``s_i − mean_g`` broadcast to the policy tokens,
    then whitened over the batch's policy tokens. ``returns`` equal the advantages."""

    name = "reinforce_pp_baseline"

    class Config(ComponentConfig):
        whiten: bool = Field(True, description="whiten over the batch's policy tokens")

    config: Config

    def compute(self, batch: AdvantageInput) -> tuple[torch.Tensor, torch.Tensor]:
        _check_input(batch)
        scores = batch.scores  # [B]
        _, _, mean, _ = group_stats(scores, batch.group_ids)
        advantages = _broadcast(scores - mean, batch.loss_mask)  # [B, T]
        if self.config.whiten:
            advantages = masked_whiten(advantages, batch.loss_mask)
        return advantages, advantages.clone()


class ReMax(AdvantageEstimator):
    """ReMax (Li et al. 2023, "ReMax: A Simple, Effective, and Efficient Reinforcement Learning
    Method for Aligning Large Language Models"): ``A_i = s_i − b_i`` with ``b_i`` the score of a
    greedy rollout of the same task (``AdvantageInput.baseline_scores``), broadcast to the policy
    tokens. ``returns`` equal the advantages."""

    name = "remax"
    needs_baseline_rollout: ClassVar[bool] = True

    class Config(ComponentConfig):
        pass

    config: Config

    def compute(self, batch: AdvantageInput) -> tuple[torch.Tensor, torch.Tensor]:
        _check_input(batch)
        if batch.baseline_scores is None:
            raise ValueError(
                "advantage estimator 'remax' needs AdvantageInput.baseline_scores (the score of a greedy "
                "rollout per trajectory); the engine provides them when needs_baseline_rollout is set"
            )
        if batch.baseline_scores.shape != batch.scores.shape:
            raise ValueError(
                f"baseline_scores shape {tuple(batch.baseline_scores.shape)} does not match "
                f"scores shape {tuple(batch.scores.shape)}"
            )
        advantages = _broadcast(batch.scores - batch.baseline_scores, batch.loss_mask)
        return advantages, advantages.clone()


ESTIMATORS: list[type[AdvantageEstimator]] = [
    GAE,
    GRPOEstimator,
    RLOO,
    ReinforcePP,
    ReinforcePPBaseline,
    ReMax,
]

__all__ = [
    "ESTIMATORS",
    "GAE",
    "RLOO",
    "GRPOEstimator",
    "ReMax",
    "ReinforcePP",
    "ReinforcePPBaseline",
    "group_index",
    "group_stats",
    "policy_token_scan",
    "rewards_on_policy_tokens",
]
