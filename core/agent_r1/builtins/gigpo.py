"""GiGPO: group-in-group advantages with step-level groups of identical anchor states.

Feng et al. 2025, "Group-in-Group Policy Optimization for LLM Agent Training" (arXiv 2505.10978;
reference implementation: ``gigpo/core_gigpo.py`` of langfengQ/verl-agent). For the G trajectories
of one task (a group g):

* **episode level** (the paper's Eq. 3): ``A^E_i = (s_i − mean_g(s)) / F``, GRPO's advantage on the
  trajectory score, with F the unbiased group std + ε (``scale: group``, verl-agent's
  ``mean_std_norm``) or 1 (``scale: none``, ``mean_norm``); a group of one gets 0;
* **step level** (Eqs. 5–7): every action turn j of trajectory i has a discounted return
  ``R_{i,j} = Σ_{m ≥ j} γ^{m−j} r_{i,m}`` over the trajectory's action turns, with ``r_{i,m}`` the
  rewards on the tokens of turn m (process rewards of that turn; the outcome lands on the last
  turn). The turns of one group that start from the same anchor state (equal keys in
  :attr:`AdvantageInput.anchor_keys <agent_r1.contracts.AdvantageInput.anchor_keys>`, see
  :mod:`agent_r1.engine.learner.turns`) form a step group S, whatever their turn number, and
  ``A^S_{i,j} = (R_{i,j} − mean_S(R)) / F_S``; a step group of one gets 0;
* **combined** (Eq. 8): every policy token of turn j gets ``A^E_i + ω·A^S_{i,j}``.

Both levels compute their statistics in float64 and give exactly 0 to a group whose values are all
equal (:data:`~agent_r1.engine.learner.loss_utils.FLAT_GROUP_RTOL`); an episode without any action turn is
left out of its episode group.

Differences from verl-agent, where each turn is its own batch row: there the episode mean and std
are taken over rows, so a trajectory counts once per turn, and a group of one gets its raw score as
its advantage; here they are taken over trajectories (the paper's definition) and a group of one
gets 0, as under ``grpo``. ``returns`` equal the advantages.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

import torch
from pydantic import Field

from agent_r1.builtins.estimators import (
    _check_input,
    acted_rows,
    broadcast_turns,
    group_stats,
    index_stats,
    informative,
    turn_returns,
    turn_table,
)
from agent_r1.contracts import AdvantageEstimator, AdvantageInput, ComponentConfig
from agent_r1.engine.learner.loss_utils import masked_mean

__all__ = ["GiGPO", "step_groups"]


def step_groups(
    rows: torch.Tensor, turns: torch.Tensor, group_ids: Sequence[str], anchor_keys: Sequence[Sequence[str]]
) -> tuple[torch.Tensor, int]:
    """The step group of each (trajectory, turn) cell: cells of one task group with equal anchor
    keys share one. Returns ``(dense group index [N], number of step groups)``."""
    dense: dict[tuple[str, str], int] = {}
    index = []
    for row, turn in zip(rows.tolist(), turns.tolist(), strict=True):
        keys = anchor_keys[row]
        if turn >= len(keys) or not keys[turn]:
            raise ValueError(
                f"AdvantageInput.anchor_keys[{row}] has no key for turn {turn}: give one non-empty key per "
                "turn number of the trajectory (agent_r1.engine.learner.turns.anchor_keys builds them)"
            )
        index.append(dense.setdefault((group_ids[row], keys[turn]), len(dense)))
    return torch.tensor(index, dtype=torch.long, device=rows.device), len(dense)


class GiGPO(AdvantageEstimator):
    """Group-in-Group Policy Optimization (Feng et al. 2025, arXiv 2505.10978): GRPO's episode-level
    advantage plus ``step_weight`` times a step-level advantage that compares the discounted
    returns of turns taken from the same anchor state within the task's group (see the module
    docstring for the definitions). Needs ``AdvantageInput.turn_ids`` and ``anchor_keys``, which
    the trainer fills. ``returns`` equal the advantages."""

    name = "gigpo"

    class Config(ComponentConfig):
        gamma: float = Field(
            0.95,
            ge=0.0,
            le=1.0,
            description="discount per action turn of the step returns (verl-agent: 0.95)",
        )
        step_weight: float = Field(
            1.0, ge=0.0, description="ω: weight of the step-level advantage (0 gives grpo; verl-agent: 1)"
        )
        scale: Literal["group", "none"] = Field(
            "group",
            description="divide centred scores and returns by their group's std ('group', verl-agent's "
            "mean_std_norm) or not ('none', mean_norm)",
        )
        eps: float = Field(1e-6, gt=0.0, description="added to the std before dividing")

    config: Config

    def __init__(self, config: ComponentConfig | Mapping[str, Any] | None = None) -> None:
        super().__init__(config)
        self._metrics: dict[str, float] = {}

    def step_metrics(self) -> dict[str, float]:
        """Figures of the latest batch: ``gigpo/step_groups`` (number of step groups),
        ``gigpo/step_group_size_mean`` (action turns per step group), ``gigpo/step_groups_shared``
        (share of step groups with more than one turn), ``gigpo/turns_shared`` (share of action
        turns in such a group: the turns that get a step-level advantage) and
        ``gigpo/episode_adv_abs_mean``, ``gigpo/step_adv_abs_mean`` (mean |A^E| and |ω·A^S| over
        policy tokens)."""
        return dict(self._metrics)

    def compute(self, batch: AdvantageInput) -> tuple[torch.Tensor, torch.Tensor]:
        _check_input(batch)
        cfg = self.config
        table = turn_table(batch, self.name)
        if batch.anchor_keys is None or len(batch.anchor_keys) != batch.loss_mask.shape[0]:
            raise ValueError(
                "advantage estimator 'gigpo' needs AdvantageInput.anchor_keys, one list of keys per "
                "trajectory (the trainer fills it; agent_r1.engine.learner.turns.anchor_keys builds it)"
            )
        mask = batch.loss_mask  # [B, T]

        scores = batch.scores.double()  # [B]
        acted = acted_rows(batch)  # [B]
        episode_stats = group_stats(scores, batch.group_ids, acted)  # [B] each
        episode = torch.where(informative(episode_stats, acted), scores - episode_stats.mean, 0.0)  # [B]
        if cfg.scale == "group":
            episode = episode / (episode_stats.std + cfg.eps)

        returns = turn_returns(table, cfg.gamma)  # [B, K]
        rows, turns = table.present.nonzero(as_tuple=True)  # [N] each: the action turns
        group, num_groups = step_groups(rows, turns, batch.group_ids, batch.anchor_keys)
        values = returns[rows, turns].double()  # [N]
        step_stats = index_stats(values, group, num_groups)  # [N] each
        step = torch.where(informative(step_stats), values - step_stats.mean, 0.0)  # [N]
        if cfg.scale == "group":
            step = step / (step_stats.std + cfg.eps)

        step_table = torch.zeros_like(returns)  # [B, K]
        step_table[rows, turns] = (cfg.step_weight * step).to(returns.dtype)
        step_tokens = broadcast_turns(step_table, table.turn_ids, mask)  # [B, T]
        episode_tokens = torch.where(
            mask & (table.turn_ids >= 0), episode.to(returns.dtype).unsqueeze(-1), 0.0
        )  # [B, T]
        advantages = episode_tokens + step_tokens
        self._metrics = _metrics(step_stats.count, num_groups, episode_tokens, step_tokens, mask)
        return advantages, advantages.clone()


def _metrics(
    size: torch.Tensor, num_groups: int, episode: torch.Tensor, step: torch.Tensor, mask: torch.Tensor
) -> dict[str, float]:
    turns = int(size.numel())
    shared_turns = int((size > 1).sum())
    # each step group of n turns appears n times in `size`: weight 1/n counts groups once
    shared_groups = float(((size > 1).double() / size.clamp(min=1).double()).sum()) if turns else 0.0
    return {
        "gigpo/step_groups": float(num_groups),
        "gigpo/step_group_size_mean": turns / num_groups if num_groups else 0.0,
        "gigpo/step_groups_shared": shared_groups / num_groups if num_groups else 0.0,
        "gigpo/turns_shared": shared_turns / turns if turns else 0.0,
        "gigpo/episode_adv_abs_mean": float(masked_mean(episode.abs(), mask)),
        "gigpo/step_adv_abs_mean": float(masked_mean(step.abs(), mask)),
    }
