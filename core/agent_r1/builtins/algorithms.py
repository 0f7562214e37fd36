"""Bundled algorithms: named bundles of an advantage estimator, a policy loss and an aggregation.

Each is declarative; the run config may still override the estimator, the loss or the aggregation
(``algorithm.estimator``, ``algorithm.loss``, ``algorithm.aggregation``).

Aggregation choices. The framework default is ``token-mean`` (every policy token of the optimizer
batch weighs the same; DAPO, Yu et al. 2025), which is also verl's default for GRPO. We keep it for
``grpo`` rather than the original paper's ``seq-mean-token-mean`` (Shao et al. 2024) because the
per-sequence mean gives each token of a long trajectory less weight, a length bias that matters more
for multi-turn agents, whose trajectories vary widely in length; it also keeps our GRPO numbers
comparable with verl-based agent work (Agent-R1, Search-R1, verl-agent). Choose the paper's form with
``algorithm.aggregation: seq-mean-token-mean``.
"""

from __future__ import annotations

from typing import Any, ClassVar

from agent_r1.contracts import Algorithm


class PPO(Algorithm):
    """PPO (Schulman et al. 2017) with a critic: GAE advantages with advantage alignment over
    observations (Schulman et al. 2016), the clipped surrogate, token-mean aggregation."""

    name = "ppo"
    estimator = "gae"
    loss = "ppo_clip"
    aggregation = "token-mean"
    needs_critic: ClassVar[bool] = True


class GRPO(Algorithm):
    """GRPO (Shao et al. 2024): group-normalised outcome advantages, the clipped surrogate, and
    ``token-mean`` aggregation (see the module docstring for why not the paper's per-sequence mean)."""

    name = "grpo"
    estimator = "grpo"
    estimator_config: ClassVar[dict[str, Any]] = {"scale": "group"}
    loss = "ppo_clip"
    aggregation = "token-mean"


class DrGRPO(Algorithm):
    """Dr.GRPO (Liu et al. 2025, "Understanding R1-Zero-Like Training"): GRPO without the std
    division and with every sequence's token sum divided by one fixed length, removing both the
    difficulty and the length bias."""

    name = "dr_grpo"
    estimator = "grpo"
    estimator_config: ClassVar[dict[str, Any]] = {"scale": "none"}
    loss = "ppo_clip"
    aggregation = "seq-mean-token-sum-norm"


class DAPO(Algorithm):
    """DAPO's loss (Yu et al. 2025): GRPO advantages, clip-higher (ε_low 0.2, ε_high 0.28) and the
    token-level loss. Dynamic sampling and overlong masking are run options
    (``algorithm.dynamic_sampling``, ``algorithm.mask_truncated``)."""

    name = "dapo"
    estimator = "grpo"
    estimator_config: ClassVar[dict[str, Any]] = {"scale": "group"}
    loss = "ppo_clip"
    loss_config: ClassVar[dict[str, Any]] = {"clip_low": 0.2, "clip_high": 0.28}
    aggregation = "token-mean"


class RLOO(Algorithm):
    """RLOO (Ahmadian et al. 2024): leave-one-out baselines, the clipped surrogate, token-mean."""

    name = "rloo"
    estimator = "rloo"
    loss = "ppo_clip"
    aggregation = "token-mean"


class ReinforcePP(Algorithm):
    """REINFORCE++ (Hu 2025): batch-whitened discounted returns over policy tokens, the clipped
    surrogate, token-mean."""

    name = "reinforce_pp"
    estimator = "reinforce_pp"
    loss = "ppo_clip"
    aggregation = "token-mean"


class GiGPO(Algorithm):
    """GiGPO (Feng et al. 2025, "Group-in-Group Policy Optimization for LLM Agent Training"): GRPO's
    episode-level advantage plus a step-level advantage over turns that start from the same anchor
    state (γ = 0.95 per turn, ω = 1, std normalisation), the clipped surrogate, token-mean."""

    name = "gigpo"
    estimator = "gigpo"
    estimator_config: ClassVar[dict[str, Any]] = {"gamma": 0.95, "step_weight": 1.0, "scale": "group"}
    loss = "ppo_clip"
    aggregation = "token-mean"


ALGORITHMS: list[type[Algorithm]] = [PPO, GRPO, DrGRPO, DAPO, RLOO, ReinforcePP, GiGPO]

__all__ = ["ALGORITHMS", "DAPO", "GRPO", "PPO", "RLOO", "DrGRPO", "GiGPO", "ReinforcePP"]
