"""Advantage estimators against deliberately naive pure-Python references (``ALGORITHMS.md``).

The batches hypothesis draws have observation gaps inside trajectories, padding, rows without any
policy token, groups of one, tied and all-equal scores, and process rewards at arbitrary policy
tokens (plus, in one test, rewards on non-policy tokens that the estimators must re-credit).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from agent_r1.builtins.algorithms import ALGORITHMS
from agent_r1.builtins.estimators import (
    ESTIMATORS,
    GAE,
    RLOO,
    GRPOEstimator,
    ReinforcePP,
    ReinforcePPBaseline,
    ReMax,
)
from agent_r1.builtins.gigpo import GiGPO
from agent_r1.builtins.losses import LOSSES
from agent_r1.contracts import AdvantageEstimator, AdvantageInput, Algorithm
from agent_r1.engine.learner.loss_utils import AGGREGATION_MODES
from agent_r1.errors import ConfigError
from agent_r1.registry import validate_component_config

SETTINGS = settings(max_examples=60, deadline=None)
EPS_WHITEN = 1e-8
ALL_ESTIMATORS: list[type[AdvantageEstimator]] = [*ESTIMATORS, GiGPO]
"""Everything the bundled plugin registers (``gigpo`` and the turn-level options: tests/test_gigpo.py)."""

# --------------------------------------------------------------------------------------------
# Naive references: lists of floats, one trajectory at a time.
# --------------------------------------------------------------------------------------------


def naive_realign(rewards: list[float], mask: list[bool]) -> list[float]:
    """Credit a reward on a non-policy token to the last policy token before it, else the first."""
    policy = [t for t, m in enumerate(mask) if m]
    out = [0.0] * len(rewards)
    if not policy:
        return out
    for t, reward in enumerate(rewards):
        before = [p for p in policy if p <= t]
        out[before[-1] if before else policy[0]] += reward
    return out


def naive_whiten(rows: list[list[float]], mask: list[list[bool]]) -> list[list[float]]:
    values = [v for row, mrow in zip(rows, mask, strict=True) for v, m in zip(row, mrow, strict=True) if m]
    n = len(values)
    mean = sum(values) / n if n else 0.0
    var = sum((v - mean) ** 2 for v in values) / (n - 1) if n > 1 else 0.0
    return [
        [(v - mean) / math.sqrt(var + EPS_WHITEN) if m else 0.0 for v, m in zip(row, mrow, strict=True)]
        for row, mrow in zip(rows, mask, strict=True)
    ]


def naive_gae(rewards, values, mask, gamma, lam, whiten):
    advantages, returns = [], []
    for r_row, v_row, m_row in zip(rewards, values, mask, strict=True):
        r_row = naive_realign(r_row, m_row)
        policy = [t for t, m in enumerate(m_row) if m]
        adv = [0.0] * len(m_row)
        ret = [0.0] * len(m_row)
        next_value, next_adv = 0.0, 0.0
        for t in reversed(policy):  # t' = the next policy token; observations are skipped
            delta = r_row[t] + gamma * next_value - v_row[t]
            adv[t] = delta + gamma * lam * next_adv
            ret[t] = adv[t] + v_row[t]
            next_value, next_adv = v_row[t], adv[t]
        advantages.append(adv)
        returns.append(ret)
    if whiten:
        advantages = naive_whiten(advantages, mask)
    return advantages, returns


def naive_reinforce_pp(rewards, mask, gamma, whiten):
    returns = []
    for r_row, m_row in zip(rewards, mask, strict=True):
        r_row = naive_realign(r_row, m_row)
        ret = [0.0] * len(m_row)
        following = 0.0
        for t in reversed(range(len(m_row))):
            if m_row[t]:
                following = r_row[t] + gamma * following
                ret[t] = following
        returns.append(ret)
    advantages = naive_whiten(returns, mask) if whiten else returns
    return advantages, returns


FLAT_RTOL = 1e-6  # the documented "all equal" tolerance (agent_r1.engine.learner.loss_utils.FLAT_GROUP_RTOL)


def naive_group(scores, group_ids, i, acted=None):
    """The scores of row i's group, counting only rows that acted (all rows when ``acted`` is None)."""
    return [
        scores[j] for j in range(len(scores)) if group_ids[j] == group_ids[i] and (acted is None or acted[j])
    ]


def naive_flat(xs):
    return len(xs) < 2 or max(xs) - min(xs) <= FLAT_RTOL * max(1.0, *(abs(x) for x in xs))


def naive_informative(scores, group_ids, i, acted):
    group = naive_group(scores, group_ids, i, acted)
    return acted[i] and len(group) > 1 and not naive_flat(group)


def naive_std(xs):
    if len(xs) < 2:
        return 0.0
    mean = sum(xs) / len(xs)
    return math.sqrt(sum((x - mean) ** 2 for x in xs) / (len(xs) - 1))


def naive_grpo(scores, group_ids, scale, eps, acted):
    out = []
    for i, score in enumerate(scores):
        group = naive_group(scores, group_ids, i, acted)
        if not naive_informative(scores, group_ids, i, acted):
            out.append(0.0)
            continue
        centred = score - sum(group) / len(group)
        if scale == "group":
            centred /= naive_std(group) + eps
        elif scale == "batch":
            centred /= naive_std([s for s, a in zip(scores, acted, strict=True) if a]) + eps
        out.append(centred)
    return out


def naive_rloo(scores, group_ids, acted):
    out = []
    for i, score in enumerate(scores):
        group = naive_group(scores, group_ids, i, acted)
        if not naive_informative(scores, group_ids, i, acted):
            out.append(0.0)
        else:
            out.append(score - (sum(group) - score) / (len(group) - 1))
    return out


def naive_group_mean_centred(scores, group_ids, acted):
    out = []
    for i, score in enumerate(scores):
        group = naive_group(scores, group_ids, i, acted)
        informative = naive_informative(scores, group_ids, i, acted)
        out.append(score - sum(group) / len(group) if informative else 0.0)
    return out


def broadcast(per_sequence, mask):
    return [[a if m else 0.0 for m in m_row] for a, m_row in zip(per_sequence, mask, strict=True)]


# --------------------------------------------------------------------------------------------
# Batches
# --------------------------------------------------------------------------------------------


@dataclass
class Batch:
    mask: list[list[bool]]
    rewards: list[list[float]]
    values: list[list[float]]
    scores: list[float]
    baseline: list[float]
    group_ids: list[str]

    def tensors(self) -> AdvantageInput:
        f64 = torch.float64
        return AdvantageInput(
            token_rewards=torch.tensor(self.rewards, dtype=f64),
            loss_mask=torch.tensor(self.mask, dtype=torch.bool),
            scores=torch.tensor(self.scores, dtype=f64),
            group_ids=list(self.group_ids),
            values=torch.tensor(self.values, dtype=f64),
            baseline_scores=torch.tensor(self.baseline, dtype=f64),
            turn_ids=torch.tensor(self.turn_ids, dtype=torch.long),
            anchor_keys=[[f"turn{k}" for k in range(max(row, default=-1) + 1)] for row in self.turn_ids],
        )

    @property
    def acted(self) -> list[bool]:
        """Rows with at least one action token (the others stay out of group statistics)."""
        return [any(row) for row in self.mask]

    @property
    def turn_ids(self) -> list[list[int]]:
        """Each run of policy tokens is one turn (the turn-level estimators need turn ids)."""
        out = []
        for m_row in self.mask:
            turn, row = -1, []
            for t, m in enumerate(m_row):
                if m and (t == 0 or not m_row[t - 1]):
                    turn += 1
                row.append(turn if m else -1)
            out.append(row)
        return out


small_floats = st.floats(-3.0, 3.0, allow_nan=False, width=32)
# Scores from a small discrete set: ties and all-equal groups are common.
discrete_scores = st.sampled_from([0.0, 0.5, 1.0, 1.0, 2.0, -1.0])


def trajectory_mask(length: int) -> st.SearchStrategy[list[bool]]:
    """Prompt, then turns of action and observation tokens, then padding (a row may have no
    policy token at all)."""

    @st.composite
    def build(draw: st.DrawFn) -> list[bool]:
        row: list[bool] = [False] * draw(st.integers(0, 3))  # prompt
        for _ in range(draw(st.integers(0, 3))):  # turns
            row += [True] * draw(st.integers(1, 4)) + [False] * draw(st.integers(0, 3))
        row = row[:length]
        return row + [False] * (length - len(row))  # padding

    return build()


@st.composite
def batches(draw: st.DrawFn, *, off_policy_rewards: bool = False, equal_scores: bool | None = None) -> Batch:
    size = draw(st.integers(1, 7))
    length = draw(st.integers(1, 14))
    mask = [draw(trajectory_mask(length)) for _ in range(size)]
    rewards, values = [], []
    for m_row in mask:
        r_row = [0.0] * length
        policy = [t for t, m in enumerate(m_row) if m]
        if policy:
            r_row[policy[-1]] += draw(small_floats)  # outcome at the last action token
            for t in draw(st.lists(st.sampled_from(policy), max_size=3)):  # process rewards mid-trajectory
                r_row[t] += draw(small_floats)
        if off_policy_rewards:
            for t in draw(st.lists(st.integers(0, length - 1), max_size=3)):
                r_row[t] += draw(small_floats)
        rewards.append(r_row)
        values.append([draw(small_floats) for _ in range(length)])
    num_groups = draw(st.integers(1, size))
    group_ids = [f"task-{draw(st.integers(0, num_groups - 1))}" for _ in range(size)]
    if equal_scores is None:
        equal_scores = draw(st.booleans()) and draw(st.booleans())
    if equal_scores:
        scores = [draw(discrete_scores)] * size
    else:
        scores = [draw(discrete_scores) for _ in range(size)]
    baseline = [draw(discrete_scores) for _ in range(size)]
    return Batch(mask, rewards, values, scores, baseline, group_ids)


def assert_matches(actual: torch.Tensor, expected: list[list[float]]) -> None:
    expected_tensor = torch.tensor(expected, dtype=torch.float64).reshape(actual.shape)
    torch.testing.assert_close(actual, expected_tensor, rtol=1e-7, atol=1e-7)


def assert_zero_off_mask(tensor: torch.Tensor, mask: torch.Tensor) -> None:
    assert torch.all(tensor[~mask] == 0)


# --------------------------------------------------------------------------------------------
# Property tests against the references
# --------------------------------------------------------------------------------------------


@SETTINGS
@given(
    batch=batches(),
    gamma=st.sampled_from([1.0, 0.9, 0.5]),
    lam=st.sampled_from([1.0, 0.95, 0.0]),
    whiten=st.booleans(),
)
def test_gae_matches_naive(batch: Batch, gamma: float, lam: float, whiten: bool) -> None:
    inputs = batch.tensors()
    advantages, returns = GAE({"gamma": gamma, "lam": lam, "whiten": whiten}).compute(inputs)
    expected_adv, expected_ret = naive_gae(batch.rewards, batch.values, batch.mask, gamma, lam, whiten)
    assert_matches(advantages, expected_adv)
    assert_matches(returns, expected_ret)
    assert_zero_off_mask(advantages, inputs.loss_mask)
    assert_zero_off_mask(returns, inputs.loss_mask)


@SETTINGS
@given(batch=batches(), gamma=st.sampled_from([1.0, 0.99, 0.5]), whiten=st.booleans())
def test_reinforce_pp_matches_naive(batch: Batch, gamma: float, whiten: bool) -> None:
    inputs = batch.tensors()
    advantages, returns = ReinforcePP({"gamma": gamma, "whiten": whiten}).compute(inputs)
    expected_adv, expected_ret = naive_reinforce_pp(batch.rewards, batch.mask, gamma, whiten)
    assert_matches(advantages, expected_adv)
    assert_matches(returns, expected_ret)
    assert_zero_off_mask(advantages, inputs.loss_mask)


@SETTINGS
@given(batch=batches(off_policy_rewards=True), gamma=st.sampled_from([1.0, 0.8]))
def test_token_level_estimators_recredit_rewards_on_non_policy_tokens(batch: Batch, gamma: float) -> None:
    inputs = batch.tensors()
    advantages, returns = GAE({"gamma": gamma, "lam": 0.9, "whiten": False}).compute(inputs)
    expected_adv, expected_ret = naive_gae(batch.rewards, batch.values, batch.mask, gamma, 0.9, False)
    assert_matches(advantages, expected_adv)
    assert_matches(returns, expected_ret)
    _, returns = ReinforcePP({"gamma": gamma, "whiten": False}).compute(inputs)
    assert_matches(returns, naive_reinforce_pp(batch.rewards, batch.mask, gamma, False)[1])


@SETTINGS
@given(batch=batches(), scale=st.sampled_from(["group", "batch", "none"]))
def test_grpo_matches_naive(batch: Batch, scale: str) -> None:
    inputs = batch.tensors()
    advantages, returns = GRPOEstimator({"scale": scale}).compute(inputs)
    expected = broadcast(naive_grpo(batch.scores, batch.group_ids, scale, 1e-6, batch.acted), batch.mask)
    assert_matches(advantages, expected)
    assert_matches(returns, expected)


@SETTINGS
@given(batch=batches())
def test_rloo_matches_naive(batch: Batch) -> None:
    advantages, _ = RLOO().compute(batch.tensors())
    assert_matches(advantages, broadcast(naive_rloo(batch.scores, batch.group_ids, batch.acted), batch.mask))


@SETTINGS
@given(batch=batches(), whiten=st.booleans())
def test_reinforce_pp_baseline_matches_naive(batch: Batch, whiten: bool) -> None:
    advantages, _ = ReinforcePPBaseline({"whiten": whiten}).compute(batch.tensors())
    acted = batch.acted
    expected = broadcast(naive_group_mean_centred(batch.scores, batch.group_ids, acted), batch.mask)
    if whiten:  # rows of groups without signal keep 0: no shift by the batch mean
        kept = [naive_informative(batch.scores, batch.group_ids, i, acted) for i in range(len(acted))]
        expected = [
            row if keep else [0.0] * len(row)
            for row, keep in zip(naive_whiten(expected, batch.mask), kept, strict=True)
        ]
    assert_matches(advantages, expected)


@SETTINGS
@given(batch=batches())
def test_remax_matches_naive(batch: Batch) -> None:
    advantages, _ = ReMax().compute(batch.tensors())
    expected = broadcast([s - b for s, b in zip(batch.scores, batch.baseline, strict=True)], batch.mask)
    assert_matches(advantages, expected)


@SETTINGS
@given(
    batch=batches(equal_scores=True), estimator=st.sampled_from([GRPOEstimator, RLOO, ReinforcePPBaseline])
)
def test_all_equal_scores_give_zero_advantage(batch: Batch, estimator: type[AdvantageEstimator]) -> None:
    advantages, _ = estimator().compute(batch.tensors())
    assert torch.allclose(advantages, torch.zeros_like(advantages), atol=1e-9)


@SETTINGS
@given(batch=batches(), estimator=st.sampled_from(ALL_ESTIMATORS))
def test_permuting_the_batch_permutes_the_advantages(
    batch: Batch, estimator: type[AdvantageEstimator]
) -> None:
    """Group and batch statistics must not depend on where a trajectory sits in the batch."""
    inputs = batch.tensors()
    order = list(reversed(range(len(batch.scores))))
    permuted = AdvantageInput(
        token_rewards=inputs.token_rewards[order],
        loss_mask=inputs.loss_mask[order],
        scores=inputs.scores[order],
        group_ids=[batch.group_ids[i] for i in order],
        values=inputs.values[order] if inputs.values is not None else None,
        baseline_scores=inputs.baseline_scores[order] if inputs.baseline_scores is not None else None,
        turn_ids=inputs.turn_ids[order] if inputs.turn_ids is not None else None,
        anchor_keys=[inputs.anchor_keys[i] for i in order] if inputs.anchor_keys is not None else None,
    )
    advantages, returns = estimator().compute(inputs)
    advantages_p, returns_p = estimator().compute(permuted)
    torch.testing.assert_close(advantages[order], advantages_p, rtol=1e-7, atol=1e-7)
    torch.testing.assert_close(returns[order], returns_p, rtol=1e-7, atol=1e-7)


# --------------------------------------------------------------------------------------------
# Worked examples
# --------------------------------------------------------------------------------------------


def test_gae_bootstraps_across_an_observation() -> None:
    """Action tokens at 1 and 4 with an observation (2, 3) between them: the first bootstraps from
    the value at 4, and the observation's values and rewards play no part."""
    mask = torch.tensor([[False, True, False, False, True]])
    values = torch.tensor([[9.0, 0.5, 100.0, -100.0, 0.25]], dtype=torch.float64)
    rewards = torch.tensor([[0.0, 0.0, 0.0, 0.0, 1.0]], dtype=torch.float64)
    gamma, lam = 0.9, 0.8
    inputs = AdvantageInput(rewards, mask, rewards.sum(1), ["a"], values=values)
    advantages, returns = GAE({"gamma": gamma, "lam": lam, "whiten": False}).compute(inputs)
    last = 1.0 - 0.25  # δ at token 4: r + γ·0 − V
    first = (0.0 + gamma * 0.25 - 0.5) + gamma * lam * last
    expected = torch.tensor([[0.0, first, 0.0, 0.0, last]], dtype=torch.float64)
    torch.testing.assert_close(advantages, expected)
    torch.testing.assert_close(returns, torch.where(mask, expected + values, 0.0))


def test_earlier_turns_get_credit_for_the_outcome() -> None:
    """A published bug gave earlier turns zero advantage: with γ = 1 every action token of a
    three-turn trajectory gets the outcome reward as its return."""
    mask = torch.tensor([[False, True, True, False, True, False, False, True, True, False]])
    rewards = torch.zeros(1, 10, dtype=torch.float64)
    rewards[0, 8] = 2.0
    inputs = AdvantageInput(
        rewards, mask, rewards.sum(1), ["a"], values=torch.zeros(1, 10, dtype=torch.float64)
    )
    _, returns = ReinforcePP({"whiten": False}).compute(inputs)
    torch.testing.assert_close(returns, torch.where(mask, 2.0, 0.0).to(torch.float64))
    advantages, _ = GAE({"whiten": False}).compute(inputs)
    torch.testing.assert_close(advantages, torch.where(mask, 2.0, 0.0).to(torch.float64))


def test_process_reward_counts_only_for_tokens_before_it() -> None:
    mask = torch.tensor([[True, True, False, True, True]])
    rewards = torch.tensor([[0.0, 0.5, 0.0, 0.0, 1.0]], dtype=torch.float64)  # process at 1, outcome at 4
    inputs = AdvantageInput(rewards, mask, rewards.sum(1), ["a"])
    _, returns = ReinforcePP({"gamma": 1.0, "whiten": False}).compute(inputs)
    torch.testing.assert_close(returns, torch.tensor([[1.5, 1.5, 0.0, 1.0, 1.0]], dtype=torch.float64))


def test_grpo_group_of_one_gets_zero_and_group_is_normalised() -> None:
    mask = torch.ones(4, 2, dtype=torch.bool)
    scores = torch.tensor([1.0, 0.0, 1.0, 5.0], dtype=torch.float64)
    inputs = AdvantageInput(torch.zeros(4, 2, dtype=torch.float64), mask, scores, ["a", "a", "a", "b"])
    advantages, _ = GRPOEstimator().compute(inputs)
    std = math.sqrt(((1 / 3) ** 2 * 2 + (2 / 3) ** 2) / 2)
    expected = torch.tensor([1 / 3, -2 / 3, 1 / 3, 0.0], dtype=torch.float64) / (std + 1e-6)
    torch.testing.assert_close(advantages[:, 0], expected)
    torch.testing.assert_close(advantages[:, 1], expected)


def test_rloo_is_scaled_group_centring() -> None:
    """Ahmadian et al. 2024: the leave-one-out baseline equals G/(G-1) times the group-centred score."""
    scores = torch.tensor([3.0, 1.0, 0.0, 2.0], dtype=torch.float64)
    mask = torch.ones(4, 1, dtype=torch.bool)
    inputs = AdvantageInput(torch.zeros(4, 1, dtype=torch.float64), mask, scores, ["g"] * 4)
    advantages, _ = RLOO().compute(inputs)
    torch.testing.assert_close(advantages[:, 0], (scores - scores.mean()) * 4 / 3)


# --------------------------------------------------------------------------------------------
# Contracts and errors
# --------------------------------------------------------------------------------------------


def test_flags_and_names() -> None:
    names = [estimator.name for estimator in ESTIMATORS]
    assert names == ["gae", "grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline", "remax"]
    assert [e.name for e in ESTIMATORS if e.needs_critic] == ["gae"]
    assert [e.name for e in ESTIMATORS if e.needs_baseline_rollout] == ["remax"]


@pytest.mark.parametrize("estimator", ALL_ESTIMATORS, ids=lambda e: e.name)
def test_every_config_field_is_documented(estimator: type[AdvantageEstimator]) -> None:
    for field_name, field in estimator.Config.model_fields.items():
        assert field.description, f"{estimator.name}.Config.{field_name} has no description"


def test_unknown_config_key_names_the_estimator() -> None:
    with pytest.raises(ConfigError, match="gae") as info:
        validate_component_config(GAE, {"gama": 0.9}, where="advantage estimator 'gae'")
    assert "gama" in str(info.value)


def test_gae_without_values_says_what_to_do() -> None:
    inputs = AdvantageInput(torch.zeros(1, 2), torch.ones(1, 2, dtype=torch.bool), torch.zeros(1), ["a"])
    with pytest.raises(ValueError, match="needs critic values"):
        GAE().compute(inputs)


def test_remax_without_baseline_says_what_to_do() -> None:
    inputs = AdvantageInput(torch.zeros(1, 2), torch.ones(1, 2, dtype=torch.bool), torch.zeros(1), ["a"])
    with pytest.raises(ValueError, match="baseline_scores"):
        ReMax().compute(inputs)


def test_float_mask_is_rejected() -> None:
    inputs = AdvantageInput(torch.zeros(1, 2), torch.ones(1, 2), torch.zeros(1), ["a"])
    with pytest.raises(TypeError, match="bool"):
        GRPOEstimator().compute(inputs)


def test_mismatched_group_ids_are_rejected() -> None:
    inputs = AdvantageInput(torch.zeros(2, 2), torch.ones(2, 2, dtype=torch.bool), torch.zeros(2), ["a"])
    with pytest.raises(ValueError, match="one entry per trajectory"):
        RLOO().compute(inputs)


@pytest.mark.parametrize("estimator", [GRPOEstimator, RLOO, ReinforcePPBaseline, GiGPO])
def test_turn_ids_of_another_shape_are_rejected(estimator: type[AdvantageEstimator]) -> None:
    """Turn ids decide which trajectories acted: a mis-shaped tensor is an error, not a fallback."""
    mask = torch.ones(2, 3, dtype=torch.bool)
    inputs = AdvantageInput(
        torch.zeros(2, 3),
        mask,
        torch.tensor([0.0, 1.0]),
        ["a", "a"],
        turn_ids=torch.zeros(2, 2, dtype=torch.long),
    )
    with pytest.raises(ValueError, match="turn_ids shape"):
        estimator().compute(inputs)


# --------------------------------------------------------------------------------------------
# Algorithms: declarative bundles that must resolve to real components
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("algorithm", ALGORITHMS, ids=lambda a: a.name)
def test_algorithm_bundle_resolves(algorithm: type[Algorithm]) -> None:
    estimators = {estimator.name: estimator for estimator in ALL_ESTIMATORS}
    losses = {loss.name: loss for loss in LOSSES}
    estimator = estimators[algorithm.estimator]
    estimator.Config.model_validate(algorithm.estimator_config)
    losses[algorithm.loss].Config.model_validate(algorithm.loss_config)
    assert algorithm.aggregation in AGGREGATION_MODES
    assert algorithm.needs_critic == estimator.needs_critic
    assert algorithm.__doc__


def test_algorithm_choices() -> None:
    by_name = {algorithm.name: algorithm for algorithm in ALGORITHMS}
    assert sorted(by_name) == ["dapo", "dr_grpo", "gigpo", "grpo", "ppo", "reinforce_pp", "rloo"]
    assert by_name["gigpo"].estimator == "gigpo"
    assert by_name["gigpo"].estimator_config == {"gamma": 0.95, "step_weight": 1.0, "scale": "group"}
    assert by_name["ppo"].needs_critic and by_name["ppo"].estimator == "gae"
    assert by_name["dr_grpo"].estimator_config == {"scale": "none"}
    assert by_name["dr_grpo"].aggregation == "seq-mean-token-sum-norm"
    assert by_name["dapo"].loss_config == {"clip_low": 0.2, "clip_high": 0.28}
    assert by_name["grpo"].aggregation == by_name["dapo"].aggregation == "token-mean"
