"""Advantage numerics in float32: all-equal groups get exactly 0 in every estimator, unequal groups
match a float64 naive reference, episodes without an action stay out of the statistics, and the
dynamic filter, the zero-variance metric and the skipping of idle rows agree with the estimators.

The batches here are what the trainer hands an estimator: float32 token rewards whose row sums are
the scores, with fractional rewards (4.95, 0.7, 1/3, sums of process rewards) placed on different
tokens in different orders, so that scores equal in exact arithmetic differ in their last bits.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from agent_r1.builtins.estimators import RLOO, GRPOEstimator, ReinforcePPBaseline, ReMax
from agent_r1.builtins.gigpo import GiGPO
from agent_r1.contracts import AdvantageInput
from agent_r1.engine.collect import flat_groups
from agent_r1.engine.learner.batch import collate
from agent_r1.engine.learner.loss_utils import FLAT_GROUP_RTOL, scores_all_equal
from agent_r1.engine.learner.turns import anchor_keys
from agent_r1.engine.update import advantage_input
from agent_r1.mdp import RewardSignal, TokenSource, Trajectory

SETTINGS = settings(max_examples=40, deadline=None)
FRACTIONS = [4.95, 0.7, 1 / 3, 0.1, 2.05, -0.35, 1.0, 0.0]


# --------------------------------------------------------------------------------------------
# The report's figures: today's float32 formula and the fix
# --------------------------------------------------------------------------------------------


def float32_grpo_before_fix(scores: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """GRPO's group advantage as computed before the fix (and by verl): float32 mean and unbiased
    std of one group, then (s - mean) / (std + eps)."""
    mean = scores.sum() / scores.numel()
    std = torch.sqrt(((scores - mean) ** 2).sum() / (scores.numel() - 1))
    return (scores - mean) / (std + eps)


@pytest.mark.parametrize(("value", "before"), [(4.95, 0.316), (0.7, 0.056), (1 / 3, 0.029)])
def test_all_equal_fractional_group_gets_exactly_zero(value: float, before: float) -> None:
    scores = torch.full((8,), value, dtype=torch.float32)
    # the error of the old formula, as reported: rounding divided by a std of the same size
    assert float(float32_grpo_before_fix(scores).abs().max()) == pytest.approx(before, abs=5e-4)
    batch = AdvantageInput(torch.zeros(8, 3), torch.ones(8, 3, dtype=torch.bool), scores, ["g"] * 8)
    for estimator in (GRPOEstimator(), GRPOEstimator({"scale": "batch"}), RLOO(), ReinforcePPBaseline()):
        advantages, returns = estimator.compute(batch)
        assert advantages.dtype == torch.float32
        assert torch.equal(advantages, torch.zeros_like(advantages)), estimator.name
        assert torch.equal(returns, torch.zeros_like(returns)), estimator.name


def test_tolerance_is_relative_with_a_floor_of_one() -> None:
    assert scores_all_equal([4.95, 4.95 * (1 + 0.5 * FLAT_GROUP_RTOL)])
    assert not scores_all_equal([4.95, 4.95 * (1 + 2 * FLAT_GROUP_RTOL)])
    assert scores_all_equal([0.0, 0.5 * FLAT_GROUP_RTOL])  # |s| < 1: an absolute 1e-6
    assert not scores_all_equal([0.0, 2 * FLAT_GROUP_RTOL])
    assert scores_all_equal([1e6, 1e6 + 0.5])  # 1e6 * 1e-6 = 1
    assert scores_all_equal([]) and scores_all_equal([3.0])


# --------------------------------------------------------------------------------------------
# Float32 batches with repeated fractional scores, and float64 naive references
# --------------------------------------------------------------------------------------------


@dataclass
class Float32Batch:
    token_rewards: torch.Tensor  # [B, T] float32
    loss_mask: torch.Tensor  # [B, T] bool
    turn_ids: torch.Tensor  # [B, T] long
    group_ids: list[str]
    flat_by_construction: list[bool]  # [B]: the row's group is all equal in exact arithmetic
    keys: list[list[str]]

    def inputs(self, baseline: torch.Tensor | None = None) -> AdvantageInput:
        return AdvantageInput(
            token_rewards=self.token_rewards,
            loss_mask=self.loss_mask,
            scores=self.token_rewards.sum(dim=-1),  # what the trainer does
            group_ids=self.group_ids,
            baseline_scores=baseline,
            turn_ids=self.turn_ids,
            anchor_keys=self.keys,
        )


@st.composite
def float32_batches(draw: st.DrawFn, *, turns: int = 1) -> Float32Batch:
    """Groups of 2-64 trajectories (fewer when several groups), each trajectory ``turns`` action
    turns of 1-4 tokens. A flat group gives every member the same reward pieces per turn, summed
    on different tokens in a different order; an unequal group draws each member's own."""
    rng = random.Random(draw(st.integers(0, 2**32 - 1)))
    num_groups = draw(st.integers(1, 3))
    rows: list[tuple[list[int], list[float], str, bool]] = []
    for g in range(num_groups):
        size = draw(st.integers(2, 64 if num_groups == 1 else 12))
        flat = draw(st.booleans())
        shared = [
            [draw(st.sampled_from(FRACTIONS)) for _ in range(draw(st.integers(1, 4)))] for _ in range(turns)
        ]
        for _ in range(size):
            pieces = (
                shared
                if flat
                else [[rng.choice(FRACTIONS) for _ in range(rng.randint(1, 4))] for _ in range(turns)]
            )
            turn_row: list[int] = [-1] * rng.randint(0, 2)  # prompt
            reward_row: list[float] = [0.0] * len(turn_row)
            for k in range(turns):
                width = rng.randint(1, 4)
                start = len(turn_row)
                turn_row += [k] * width + [-1] * rng.randint(0, 2)  # action, then observation
                reward_row += [0.0] * (len(turn_row) - start)
                for piece in rng.sample(pieces[k], len(pieces[k])):  # another order, other tokens
                    reward_row[start + rng.randrange(width)] += piece
            rows.append((turn_row, reward_row, f"g{g}", flat))
    rng.shuffle(rows)
    length = max(len(r[0]) for r in rows)
    turn_ids = torch.tensor([r[0] + [-1] * (length - len(r[0])) for r in rows])
    rewards = torch.tensor([r[1] + [0.0] * (length - len(r[1])) for r in rows], dtype=torch.float32)
    keys = [[f"state{k}" for k in range(turns)] for _ in rows]  # one state per turn position
    return Float32Batch(rewards, turn_ids >= 0, turn_ids, [r[2] for r in rows], [r[3] for r in rows], keys)


def naive_groups(scores: list[float], group_ids: list[str]) -> dict[str, list[float]]:
    groups: dict[str, list[float]] = {}
    for score, group in zip(scores, group_ids, strict=True):
        groups.setdefault(group, []).append(score)
    return groups


def naive_flat(xs: list[float]) -> bool:
    return len(xs) < 2 or max(xs) - min(xs) <= FLAT_GROUP_RTOL * max(1.0, *(abs(x) for x in xs))


def naive_std(xs: list[float]) -> float:
    mean = sum(xs) / len(xs)
    return math.sqrt(sum((x - mean) ** 2 for x in xs) / (len(xs) - 1)) if len(xs) > 1 else 0.0


def naive_score_level(name: str, scores: list[float], group_ids: list[str]) -> list[float]:
    """Float64 references of the score-level estimators, one advantage per trajectory."""
    groups = naive_groups(scores, group_ids)
    out = []
    for score, group_id in zip(scores, group_ids, strict=True):
        group = groups[group_id]
        if naive_flat(group):
            out.append(0.0)
        elif name == "grpo":
            out.append((score - sum(group) / len(group)) / (naive_std(group) + 1e-6))
        elif name == "grpo_batch":
            out.append((score - sum(group) / len(group)) / (naive_std(scores) + 1e-6))
        elif name == "rloo":
            out.append(score - (sum(group) - score) / (len(group) - 1))
        else:
            raise AssertionError(name)
    return out


def assert_rows(advantages: torch.Tensor, mask: torch.Tensor, expected: list[float]) -> None:
    """Each row's policy tokens carry its expected advantage (within 1e-6), every other token 0."""
    assert advantages.dtype == torch.float32
    expected_tokens = torch.tensor(expected, dtype=torch.float64).unsqueeze(-1).expand(mask.shape)
    expected_tokens = torch.where(mask, expected_tokens, 0.0)
    torch.testing.assert_close(advantages.double(), expected_tokens, rtol=1e-6, atol=1e-6)


def assert_flat_rows_exactly_zero(
    advantages: torch.Tensor, batch: Float32Batch, *, scores_decide: bool = True
) -> None:
    """Rows of groups built all-equal get exactly 0 (their float32 scores must be all equal by the
    definition); with ``scores_decide`` so does every row of a group whose scores happen to be."""
    scores = batch.token_rewards.sum(dim=-1).double().tolist()
    groups = naive_groups(scores, batch.group_ids)
    for row, (group_id, by_construction) in enumerate(
        zip(batch.group_ids, batch.flat_by_construction, strict=True)
    ):
        assert not by_construction or naive_flat(groups[group_id]), "float32 rounding beyond the tolerance"
        if by_construction or (scores_decide and naive_flat(groups[group_id])):
            assert torch.all(advantages[row] == 0), (row, groups[group_id])


@SETTINGS
@given(batch=float32_batches(), name=st.sampled_from(["grpo", "grpo_batch", "rloo"]))
def test_score_level_estimators_in_float32(batch: Float32Batch, name: str) -> None:
    estimator = {"grpo": GRPOEstimator(), "grpo_batch": GRPOEstimator({"scale": "batch"}), "rloo": RLOO()}[
        name
    ]
    advantages, _ = estimator.compute(batch.inputs())
    assert_flat_rows_exactly_zero(advantages, batch)
    scores = batch.token_rewards.sum(dim=-1).double().tolist()
    assert_rows(advantages, batch.loss_mask, naive_score_level(name, scores, batch.group_ids))


@SETTINGS
@given(batch=float32_batches(), whiten=st.booleans())
def test_reinforce_pp_baseline_in_float32(batch: Float32Batch, whiten: bool) -> None:
    advantages, _ = ReinforcePPBaseline({"whiten": whiten}).compute(batch.inputs())
    assert_flat_rows_exactly_zero(advantages, batch)
    scores = batch.token_rewards.sum(dim=-1).double().tolist()
    groups = naive_groups(scores, batch.group_ids)
    centred = [
        0.0 if naive_flat(groups[g]) else s - sum(groups[g]) / len(groups[g])
        for s, g in zip(scores, batch.group_ids, strict=True)
    ]
    if whiten:
        tokens = [c for c, row in zip(centred, batch.loss_mask.tolist(), strict=True) for m in row if m]
        mean = sum(tokens) / len(tokens)
        var = sum((t - mean) ** 2 for t in tokens) / (len(tokens) - 1) if len(tokens) > 1 else 0.0
        centred = [
            0.0 if naive_flat(groups[g]) else (c - mean) / math.sqrt(var + 1e-8)
            for c, g in zip(centred, batch.group_ids, strict=True)
        ]
    assert_rows(advantages, batch.loss_mask, centred)


@SETTINGS
@given(batch=float32_batches())
def test_remax_score_equal_to_its_baseline_in_float32(batch: Float32Batch) -> None:
    # the baseline is the same reward pieces summed in another order: equal in exact arithmetic
    baseline = batch.token_rewards.flip(dims=[1]).cumsum(dim=1)[:, -1]
    advantages, _ = ReMax().compute(batch.inputs(baseline))
    assert torch.equal(advantages, torch.zeros_like(advantages))


@SETTINGS
@given(
    batch=float32_batches(turns=3),
    scale=st.sampled_from(["group", "none"]),
    weight=st.sampled_from([0.0, 1.0]),
)
def test_gigpo_in_float32(batch: Float32Batch, scale: str, weight: float) -> None:
    """A flat group shares its per-turn rewards, so its episode group and every step group it
    forms (one anchor state per turn position) are all equal: every token gets exactly 0. With
    ω = 0 unequal groups equal GRPO's float64 reference."""
    advantages, _ = GiGPO({"scale": scale, "step_weight": weight, "gamma": 0.9}).compute(batch.inputs())
    assert_flat_rows_exactly_zero(advantages, batch, scores_decide=weight == 0.0)
    if weight == 0.0 and scale == "group":
        scores = batch.token_rewards.sum(dim=-1).double().tolist()
        assert_rows(advantages, batch.loss_mask, naive_score_level("grpo", scores, batch.group_ids))


@SETTINGS
@given(batch=float32_batches(turns=3), name=st.sampled_from(["grpo", "rloo"]))
def test_turn_level_in_float32(batch: Float32Batch, name: str) -> None:
    estimator = (
        GRPOEstimator({"turn_level": True, "gamma": 0.9}) if name == "grpo" else RLOO({"turn_level": True})
    )
    advantages, _ = estimator.compute(batch.inputs())
    assert_flat_rows_exactly_zero(advantages, batch, scores_decide=False)


# --------------------------------------------------------------------------------------------
# Episodes without an action turn
# --------------------------------------------------------------------------------------------


def test_episode_without_an_action_is_left_out_of_its_group() -> None:
    """Seven acting trajectories and one that never acted (its row has no policy token, so its
    score reaches the estimator as 0): the acting ones get exactly the advantages of their own
    group of seven, in every group estimator."""
    acted_scores = [1.0, 0.0, 1.0, 1.0, 0.0, 1.0, 1.0]
    mask = torch.zeros(8, 4, dtype=torch.bool)
    mask[:7, 1:] = True  # row 7: prompt only
    turn_ids = torch.where(mask, 0, -1)
    rewards = torch.zeros(8, 4)
    rewards[:7, 3] = torch.tensor(acted_scores)
    with_idle = AdvantageInput(
        rewards, mask, rewards.sum(-1), ["g"] * 8, turn_ids=turn_ids, anchor_keys=[["s"]] * 8
    )
    alone = AdvantageInput(
        rewards[:7], mask[:7], rewards[:7].sum(-1), ["g"] * 7, turn_ids=turn_ids[:7], anchor_keys=[["s"]] * 7
    )
    for estimator in (
        GRPOEstimator(),
        GRPOEstimator({"scale": "batch"}),
        RLOO(),
        ReinforcePPBaseline({"whiten": False}),
        GiGPO(),
    ):
        got, _ = estimator.compute(with_idle)
        want, _ = estimator.compute(alone)
        torch.testing.assert_close(got[:7], want, msg=estimator.name)
        assert torch.all(got[7] == 0)
    # before the fix the idle episode counted as a 0 score: GRPO moved the others by up to 0.26
    counted = float32_grpo_before_fix(rewards.sum(-1))[:7]
    assert float((counted - GRPOEstimator().compute(alone)[0][:, 3]).abs().max()) > 0.2


def test_a_group_left_with_one_acting_episode_gets_zero() -> None:
    mask = torch.tensor([[True, True], [False, False], [False, False]])
    rewards = torch.tensor([[0.0, 1.0], [0.0, 0.0], [0.0, 0.0]])
    inputs = AdvantageInput(rewards, mask, rewards.sum(-1), ["g"] * 3, turn_ids=torch.where(mask, 0, -1))
    for estimator in (GRPOEstimator(), RLOO(), ReinforcePPBaseline()):
        assert torch.equal(estimator.compute(inputs)[0], torch.zeros(3, 2))


# --------------------------------------------------------------------------------------------
# One definition: the dynamic filter and the metric agree with the advantages
# --------------------------------------------------------------------------------------------


def scored_trajectory(group: str, index: int, pieces: list[float], *, acted: bool = True) -> Trajectory:
    trajectory = Trajectory(id=f"{group}/{index}", task_id=group, group_id=group, sample_index=index)
    trajectory.append(TokenSource.PROMPT, 0, [1, 2, 3])
    if acted:
        trajectory.append(TokenSource.POLICY, 0, [4, 5], [-0.5, -0.5])
        trajectory.append(TokenSource.ENV, 0, [6])
        trajectory.append(TokenSource.POLICY, 1, [7, 8, 9], [-0.5] * 3)
    for k, piece in enumerate(pieces):
        if k % 2:
            trajectory.rewards.append(RewardSignal(name=f"r{k}", value=piece, kind="process", turn=1))
        else:
            trajectory.rewards.append(RewardSignal(name=f"r{k}", value=piece))
    return trajectory


@SETTINGS
@given(seed=st.integers(0, 2**31 - 1))
def test_flat_groups_agree_with_the_estimators(seed: int) -> None:
    rng = random.Random(seed)
    trajectories = []
    for g in range(rng.randint(1, 5)):
        shared = [rng.choice(FRACTIONS) for _ in range(rng.randint(1, 4))]
        flat = rng.random() < 0.5
        for i in range(rng.randint(1, 6)):
            pieces = (
                rng.sample(shared, len(shared))
                if flat
                else [rng.choice(FRACTIONS) for _ in range(rng.randint(1, 4))]
            )
            trajectories.append(scored_trajectory(f"g{g}", i, pieces, acted=rng.random() > 0.15))
    batch = collate(trajectories, pad_token_id=0)
    advantages, _ = GRPOEstimator().compute(advantage_input(batch, batch.token_rewards))
    flat = flat_groups(trajectories)
    for row, trajectory in enumerate(trajectories):
        members = sum(t.group_id == trajectory.group_id for t in trajectories)
        zero = bool(torch.all(advantages[row] == 0))
        if trajectory.group_id in flat:
            assert zero
        elif members > 1 and trajectory.num_policy_tokens:
            assert not zero, (
                trajectory.group_id,
                [t.score for t in trajectories if t.group_id == trajectory.group_id],
            )


def test_anchor_key_of_turn_zero_comes_from_the_initial_state() -> None:
    """An environment that names its initial state (EpisodeStart.info) lets a return to that state
    share a step group with turn 0; without it, turn 0 is keyed by the prompt's tokens."""
    named = scored_trajectory("g", 0, [1.0])
    named.start_info = {"state_key": "room-0"}
    plain = scored_trajectory("g", 1, [1.0])
    assert anchor_keys(named)[0] == "env:room-0"
    assert anchor_keys(plain)[0].startswith("tok:")
    line = Trajectory.from_json_line(named.to_json_line())
    assert line.start_info == {"state_key": "room-0"} and anchor_keys(line) == anchor_keys(named)
