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

Group statistics are computed in float64 whatever the batch's dtype, and the results are cast back
to it. A group whose scores are all equal (:data:`~agent_r1.engine.learner.loss_utils.FLAT_GROUP_RTOL`) gets
exactly 0, as does a group of one. An episode without any action turn (the environment or a budget
ended it before the policy acted) has no tokens to train and is left out of its group's
statistics, so it cannot move the others' advantages.

Turn-level options (``turn_level: true`` on ``grpo``, ``rloo`` and ``reinforce_pp``) replace the one
scalar per trajectory by a return per action turn: with ``r_{i,j}`` the rewards on the tokens of the
j-th action turn of trajectory i (its process rewards; the outcome lands on the last turn),
``R_{i,j} = r_{i,j} + γ·R_{i,j+1}``. ``grpo`` and ``rloo`` then compare ``R_{i,j}`` with the returns
of the other trajectories of the group *at the same turn position j*; ``reinforce_pp`` whitens
``R_{i,j}`` over the batch. The helpers here (:func:`turn_table`, :func:`turn_returns`,
:func:`broadcast_turns`) serve those options and :mod:`agent_r1.builtins.gigpo`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import torch
from pydantic import Field, model_validator

from agent_r1.contracts import AdvantageEstimator, AdvantageInput, ComponentConfig
from agent_r1.engine.learner.loss_utils import GroupStats, index_stats, masked_whiten, within_flat_tolerance

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
    if batch.turn_ids is not None and batch.turn_ids.shape != mask.shape:
        raise ValueError(
            f"AdvantageInput.turn_ids shape {tuple(batch.turn_ids.shape)} does not match loss_mask shape "
            f"{tuple(mask.shape)}"
        )


def _check_gamma(gamma: float, turn_level: bool) -> None:
    if gamma != 1.0 and not turn_level:
        raise ValueError(
            f"gamma={gamma} discounts turn-level returns only: set turn_level: true, or drop gamma"
        )


def group_index(group_ids: Sequence[str], device: torch.device | None = None) -> tuple[torch.Tensor, int]:
    """Map group ids to dense integers: ``(index [B] long, number of groups)``, in order of first
    appearance."""
    dense: dict[str, int] = {}
    index = [dense.setdefault(group_id, len(dense)) for group_id in group_ids]
    return torch.tensor(index, dtype=torch.long, device=device), len(dense)


def group_stats(
    scores: torch.Tensor, group_ids: Sequence[str], members: torch.Tensor | None = None
) -> GroupStats:
    """Per-trajectory statistics of its group, all ``[B]`` float64 (see
    :func:`~agent_r1.engine.learner.loss_utils.index_stats`); ``members`` ``[B]`` bool leaves trajectories
    out of the statistics."""
    index, num_groups = group_index(group_ids, scores.device)
    return index_stats(scores, index, num_groups, members)


def acted_rows(batch: AdvantageInput) -> torch.Tensor:
    """``[B]`` bool: the trajectories with at least one action token (``turn_ids`` ≥ 0, or, when
    the caller gives no turn ids, a policy token in ``loss_mask``). The others are left out of
    group statistics."""
    if batch.turn_ids is not None:
        return (batch.turn_ids >= 0).any(dim=1)
    return batch.loss_mask.any(dim=1)


def informative(stats: GroupStats, members: torch.Tensor | None = None) -> torch.Tensor:
    """``[N]`` bool: entries whose group has something to compare: at least two members and scores
    that are not all equal (and the entry is a member itself)."""
    keep = (stats.count > 1) & ~stats.flat
    return keep if members is None else keep & members


def _batch_std(values: torch.Tensor, members: torch.Tensor | None = None) -> torch.Tensor:
    """Unbiased std of ``values`` (float64) over ``members``; 0 with fewer than two."""
    chosen = values if members is None else values[members]
    return chosen.std(unbiased=True) if chosen.numel() > 1 else values.new_zeros(())


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
# Turns: per-turn rewards and returns (turn-level options, gigpo)
# --------------------------------------------------------------------------------------------


@dataclass
class TurnTable:
    """A batch seen per turn: column k is turn number k of every trajectory."""

    rewards: torch.Tensor  # [B, K] float: the rewards on the turn's tokens (0 where absent)
    present: torch.Tensor  # [B, K] bool: the trajectory has action tokens in turn k
    position: torch.Tensor  # [B, K] long: k's rank among the trajectory's action turns, -1 where absent
    turn_ids: torch.Tensor  # [B, T] long: the input's turn ids (-1 off actions)


def turn_table(batch: AdvantageInput, estimator: str) -> TurnTable:
    """Check ``batch.turn_ids`` and sum the token rewards of each action turn. A reward on a token
    outside every action is credited to the last action token before it (or the first action token
    when none precedes it), as the token-level estimators do."""
    turn_ids = batch.turn_ids
    mask = batch.loss_mask
    if turn_ids is None:
        raise ValueError(
            f"advantage estimator {estimator!r} needs AdvantageInput.turn_ids (the turn of each policy "
            "token, -1 elsewhere); the trainer fills it, and agent_r1.engine.learner.turns.turn_ids builds "
            "it from trajectories when you call the estimator yourself"
        )
    if turn_ids.shape != mask.shape or turn_ids.dtype not in (torch.int64, torch.int32):
        raise ValueError(
            f"AdvantageInput.turn_ids must be an integer tensor shaped like loss_mask {tuple(mask.shape)}, "
            f"got {turn_ids.dtype} {tuple(turn_ids.shape)}"
        )
    turn_ids = turn_ids.long()
    if bool((mask & (turn_ids < 0)).any()):
        raise ValueError(
            "AdvantageInput.turn_ids is -1 on a token of loss_mask: every policy token needs its turn"
        )
    action = turn_ids >= 0  # [B, T]: action tokens, loss-masked or not
    rewards = torch.where(action, rewards_on_policy_tokens(batch.token_rewards, action), 0.0)  # [B, T]
    width = int(turn_ids.max()) + 1 if bool(action.any()) else 1
    column = turn_ids.clamp(min=0)  # [B, T]
    per_turn = rewards.new_zeros(mask.shape[0], width).scatter_add_(1, column, rewards)  # [B, K]
    tokens = torch.zeros(mask.shape[0], width, dtype=torch.long, device=mask.device)
    present = tokens.scatter_add_(1, column, action.long()) > 0  # [B, K]
    position = torch.where(present, present.long().cumsum(dim=1) - 1, -1)  # [B, K]
    return TurnTable(per_turn, present, position, turn_ids)


def turn_returns(table: TurnTable, gamma: float) -> torch.Tensor:
    """Discounted return per action turn, ``[B, K]``: ``R_j = r_j + γ·R_{j'}`` with j' the
    trajectory's next action turn (turn numbers without action tokens are skipped, not
    discounted); 0 where the turn is absent."""
    returns = torch.zeros_like(table.rewards)  # [B, K]
    carry = table.rewards.new_zeros(table.rewards.shape[0])  # [B]
    for k in range(table.rewards.shape[1] - 1, -1, -1):
        current = table.rewards[:, k] + gamma * carry
        carry = torch.where(table.present[:, k], current, carry)
        returns[:, k] = torch.where(table.present[:, k], current, 0.0)
    return returns


def broadcast_turns(per_turn: torch.Tensor, turn_ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``[B, K]`` per-turn values → ``[B, T]`` on the policy tokens of each turn, 0 elsewhere."""
    spread = per_turn.gather(1, turn_ids.clamp(min=0))  # [B, T]
    return torch.where(mask & (turn_ids >= 0), spread, 0.0)


def position_cells(
    table: TurnTable, group_ids: Sequence[str]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """The present (trajectory, turn) cells of ``table`` and their (group, turn position) cell:
    ``(rows [N], turns [N], cell [N] dense long, number of cells)``."""
    rows, turns = table.present.nonzero(as_tuple=True)  # [N] each
    group, _ = group_index(group_ids, table.present.device)
    key = group[rows] * table.present.shape[1] + table.position[rows, turns]  # [N]
    _, cell = torch.unique(key, return_inverse=True)
    return rows, turns, cell, int(cell.max()) + 1 if cell.numel() else 0


def _turn_level_advantages(
    batch: AdvantageInput,
    estimator: str,
    gamma: float,
    baseline: Literal["grpo", "rloo"],
    scale: str,
    eps: float,
) -> tuple[torch.Tensor, dict[str, float]]:
    """``grpo``/``rloo`` with ``turn_level``: each turn's return against its (group, position) cell."""
    table = turn_table(batch, estimator)
    returns = turn_returns(table, gamma)  # [B, K]
    rows, turns, cell, num_cells = position_cells(table, batch.group_ids)
    values = returns[rows, turns].double()  # [N]
    stats = index_stats(values, cell, num_cells)
    keep = informative(stats)
    if baseline == "rloo":
        centred = torch.where(keep, values - (stats.total - values) / (stats.count - 1).clamp(min=1), 0.0)
    else:
        centred = torch.where(keep, values - stats.mean, 0.0)
        if scale == "group":
            centred = centred / (stats.std + eps)
        elif scale == "batch":
            centred = centred / (_batch_std(values) + eps)
    per_turn = torch.zeros_like(returns)
    per_turn[rows, turns] = centred.to(returns.dtype)
    lone = float((stats.count == 1).double().mean()) if stats.count.numel() else 0.0
    metrics = {"turn_level/lone_turn_share": lone}
    return broadcast_turns(per_turn, table.turn_ids, batch.loss_mask), metrics


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
    policy tokens. ``returns`` are the raw ``G_t``. With ``turn_level`` every token of an action turn
    gets that turn's return ``R_{i,j} = r_{i,j} + γ·R_{i,j+1}`` (γ per turn, not per token)."""

    name = "reinforce_pp"

    class Config(ComponentConfig):
        gamma: float = Field(
            1.0, ge=0.0, le=1.0, description="discount per policy token (per action turn with turn_level)"
        )
        whiten: bool = Field(True, description="whiten the returns over the batch's policy tokens")
        turn_level: bool = Field(
            False,
            description="one return per action turn, discounted per turn, on every token of the turn "
            "(instead of per token)",
        )

    config: Config

    def compute(self, batch: AdvantageInput) -> tuple[torch.Tensor, torch.Tensor]:
        _check_input(batch)
        mask = batch.loss_mask  # [B, T] bool
        if self.config.turn_level:
            table = turn_table(batch, self.name)
            returns = broadcast_turns(turn_returns(table, self.config.gamma), table.turn_ids, mask)  # [B, T]
        else:
            rewards = rewards_on_policy_tokens(batch.token_rewards, mask)  # [B, T]
            returns = policy_token_scan(
                rewards, torch.zeros_like(rewards), mask, self.config.gamma, 1.0
            )  # [B, T]
        advantages = masked_whiten(returns, mask) if self.config.whiten else returns
        return advantages, returns


# --------------------------------------------------------------------------------------------
# Score-level estimators
# --------------------------------------------------------------------------------------------


def _turn_level_option(compared_with: str) -> Any:
    """The ``turn_level`` option of ``grpo`` and ``rloo``: each turn's return ``compared_with`` the
    group's returns at the same turn position."""
    return Field(
        False,
        description=f"one advantage per action turn: the turn's discounted return {compared_with} "
        "at the same turn position",
    )


class _TurnLevelConfig(ComponentConfig):
    """Options with ``turn_level`` and ``gamma`` (declared by each subclass, in its own order)."""

    if TYPE_CHECKING:
        turn_level: bool
        gamma: float

    @model_validator(mode="after")
    def _gamma_needs_turns(self) -> _TurnLevelConfig:
        _check_gamma(self.gamma, self.turn_level)
        return self


class _GroupBaseline(AdvantageEstimator):
    """What ``grpo`` and ``rloo`` share: a score per trajectory against the others of its group,
    broadcast to the policy tokens, or with ``turn_level`` a return per action turn against the
    group's returns at the same turn position. Subclasses give :meth:`_centred` and
    :meth:`_turn_options`."""

    config: Any

    def __init__(self, config: ComponentConfig | Mapping[str, Any] | None = None) -> None:
        super().__init__(config)
        self._metrics: dict[str, float] = {}

    def step_metrics(self) -> dict[str, float]:
        """With ``turn_level``: ``turn_level/lone_turn_share``, the share of action turns alone at
        their turn position in their group (advantage 0)."""
        return dict(self._metrics)

    def _centred(self, scores: torch.Tensor, acted: torch.Tensor, stats: GroupStats) -> torch.Tensor:
        """The advantage ``[B]`` float64 of each trajectory from its score and its group's
        statistics (``acted``: the trajectories in the statistics)."""
        raise NotImplementedError

    def _turn_options(self) -> tuple[Literal["grpo", "rloo"], str, float]:
        """``(baseline, scale, eps)`` of :func:`_turn_level_advantages`."""
        raise NotImplementedError

    def compute(self, batch: AdvantageInput) -> tuple[torch.Tensor, torch.Tensor]:
        _check_input(batch)
        if self.config.turn_level:
            advantages, self._metrics = _turn_level_advantages(
                batch, self.name, self.config.gamma, *self._turn_options()
            )
            return advantages, advantages.clone()
        scores = batch.scores.double()  # [B]
        acted = acted_rows(batch)  # [B]
        stats = group_stats(scores, batch.group_ids, acted)  # [B] each
        advantages = _broadcast(self._centred(scores, acted, stats).to(batch.scores.dtype), batch.loss_mask)
        return advantages, advantages.clone()


class GRPOEstimator(_GroupBaseline):
    """Group-relative advantage (Shao et al. 2024, "DeepSeekMath"):
    ``A_i = (s_i − mean_g) / (std_g + ε)`` with the unbiased group std, broadcast to the policy
    tokens. ``scale="batch"`` divides by the std of all scores in the batch instead (group mean,
    batch std); ``scale="none"`` does not divide (Dr.GRPO; Liu et al. 2025, "Understanding
    R1-Zero-Like Training"). A group of one gets A = 0. ``returns`` equal the advantages.

    ``turn_level``: the same formula per action turn, on the turn's discounted return ``R_{i,j}``
    and the returns of the group's trajectories at the same turn position j (``scale="batch"``:
    the std of all turn returns of the batch); a turn alone at its position gets 0."""

    name = "grpo"

    class Config(_TurnLevelConfig):
        scale: Literal["group", "batch", "none"] = Field(
            "group", description="divide by the group std, the batch std, or nothing (Dr.GRPO)"
        )
        eps: float = Field(1e-6, gt=0.0, description="added to the std before dividing")
        turn_level: bool = _turn_level_option("against the group's returns")
        gamma: float = Field(1.0, ge=0.0, le=1.0, description="discount per action turn (turn_level only)")

    config: Config

    def _centred(self, scores: torch.Tensor, acted: torch.Tensor, stats: GroupStats) -> torch.Tensor:
        centred = torch.where(informative(stats, acted), scores - stats.mean, 0.0)  # [B]
        if self.config.scale == "group":
            centred = centred / (stats.std + self.config.eps)
        elif self.config.scale == "batch":
            centred = centred / (_batch_std(scores, acted) + self.config.eps)
        return centred

    def _turn_options(self) -> tuple[Literal["grpo", "rloo"], str, float]:
        return "grpo", self.config.scale, self.config.eps


class RLOO(_GroupBaseline):
    """REINFORCE leave-one-out (Ahmadian et al. 2024, "Back to Basics"): ``A_i = s_i −`` the mean
    score of the other G−1 trajectories of the group, broadcast to the policy tokens. A group of
    one gets A = 0. ``returns`` equal the advantages. ``turn_level``: the same per action turn, on
    the discounted turn returns at the same turn position (see :class:`GRPOEstimator`)."""

    name = "rloo"

    class Config(_TurnLevelConfig):
        turn_level: bool = _turn_level_option("minus the mean return of the group's other trajectories")
        gamma: float = Field(1.0, ge=0.0, le=1.0, description="discount per action turn (turn_level only)")

    config: Config

    def _centred(self, scores: torch.Tensor, acted: torch.Tensor, stats: GroupStats) -> torch.Tensor:
        others_mean = (stats.total - scores) / (stats.count - 1).clamp(min=1)
        return torch.where(informative(stats, acted), scores - others_mean, 0.0)

    def _turn_options(self) -> tuple[Literal["grpo", "rloo"], str, float]:
        return "rloo", "none", 1.0


class ReinforcePPBaseline(AdvantageEstimator):
    """REINFORCE++ with a group baseline (Hu 2025): ``s_i − mean_g`` broadcast to the policy tokens,
    then whitened over the batch's policy tokens. ``returns`` equal the advantages.

    Trajectories of a group with nothing to compare (all scores equal, or a single member) keep
    exactly 0 after whitening: their zeros count in the batch's mean and variance, but the mean
    shift is not applied to them (a shift would hand a group without any signal an advantage of
    the batch's sign)."""

    name = "reinforce_pp_baseline"

    class Config(ComponentConfig):
        whiten: bool = Field(True, description="whiten over the batch's policy tokens")

    config: Config

    def compute(self, batch: AdvantageInput) -> tuple[torch.Tensor, torch.Tensor]:
        _check_input(batch)
        scores = batch.scores.double()  # [B]
        acted = acted_rows(batch)  # [B]
        stats = group_stats(scores, batch.group_ids, acted)
        keep = informative(stats, acted)  # [B]
        advantages = _broadcast(torch.where(keep, scores - stats.mean, 0.0), batch.loss_mask)  # [B, T]
        if self.config.whiten:
            advantages = masked_whiten(advantages, batch.loss_mask)
            advantages = torch.where(keep.unsqueeze(-1), advantages, 0.0)
        advantages = advantages.to(batch.scores.dtype)
        return advantages, advantages.clone()


class ReMax(AdvantageEstimator):
    """ReMax (Li et al. 2023, "ReMax: A Simple, Effective, and Efficient Reinforcement Learning
    Method for Aligning Large Language Models"): ``A_i = s_i − b_i`` with ``b_i`` the score of a
    greedy rollout of the same task (``AdvantageInput.baseline_scores``), broadcast to the policy
    tokens; a score equal to its baseline (in the sense of ``FLAT_GROUP_RTOL``) gives exactly 0.
    ``returns`` equal the advantages."""

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
        scores, baseline = batch.scores.double(), batch.baseline_scores.double()  # [B] each
        equal = within_flat_tolerance(torch.minimum(scores, baseline), torch.maximum(scores, baseline))
        per_sequence = torch.where(equal, 0.0, scores - baseline)
        advantages = _broadcast(per_sequence.to(batch.scores.dtype), batch.loss_mask)
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
    "TurnTable",
    "acted_rows",
    "broadcast_turns",
    "group_index",
    "group_stats",
    "index_stats",
    "informative",
    "policy_token_scan",
    "position_cells",
    "rewards_on_policy_tokens",
    "turn_returns",
    "turn_table",
]
