"""Turn-level credit: ``gigpo`` and the ``turn_level`` options of ``grpo``, ``rloo`` and
``reinforce_pp``, against naive pure-Python references; turn ids and anchor keys from real
trajectories; credit moving to the turn that made the difference; the trainer's wiring.

The batches hypothesis draws have prompts, several action turns per trajectory separated by
observations (or adjacent, as when an observation continues the assistant's message), skipped turn
numbers, trajectories without actions, trajectories masked out of the loss that keep their turns
(``mask_truncated``), rewards on action tokens and off them, groups of one, and anchor keys from a
small alphabet so that step groups of several turns (also across turn numbers) are common.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from agent_r1.builtins.estimators import RLOO, GRPOEstimator, ReinforcePP
from agent_r1.builtins.gigpo import GiGPO
from agent_r1.contracts import AdvantageInput
from agent_r1.engine.learner.batch import collate
from agent_r1.engine.learner.turns import STATE_KEY, anchor_keys, turn_ids
from agent_r1.errors import ConfigError
from agent_r1.mdp import Action, Observation, RewardSignal, Step, TokenSource, Trajectory
from agent_r1.registry import validate_component_config

SETTINGS = settings(max_examples=80, deadline=None)
EPS = 1e-6

# --------------------------------------------------------------------------------------------
# Naive references: lists, one trajectory and one turn at a time
# --------------------------------------------------------------------------------------------


def naive_turn_returns(rewards: list[float], turns: list[int], gamma: float) -> dict[int, float]:
    """{turn number: discounted return from that action turn on}, rewards off actions credited to
    the last action token before them (else the first action token)."""
    action = [t for t, turn in enumerate(turns) if turn >= 0]
    if not action:
        return {}
    per_turn: dict[int, float] = {}
    for t, reward in enumerate(rewards):
        before = [a for a in action if a <= t]
        target = before[-1] if before else action[0]
        per_turn[turns[target]] = per_turn.get(turns[target], 0.0) + reward
    order = sorted({turns[a] for a in action})
    returns: dict[int, float] = {}
    following = 0.0
    for turn in reversed(order):
        following = per_turn.get(turn, 0.0) + gamma * following
        returns[turn] = following
    return returns


def naive_std(xs: list[float]) -> float:
    if len(xs) < 2:
        return 0.0
    mean = sum(xs) / len(xs)
    return math.sqrt(sum((x - mean) ** 2 for x in xs) / (len(xs) - 1))


def flat(group: list[float]) -> bool:
    """Fewer than two values, or all equal within the documented tolerance (FLAT_GROUP_RTOL)."""
    return len(group) < 2 or max(group) - min(group) <= 1e-6 * max(1.0, *(abs(v) for v in group))


def centred(value: float, group: list[float], scale: bool) -> float:
    if flat(group):
        return 0.0
    out = value - sum(group) / len(group)
    return out / (naive_std(group) + EPS) if scale else out


def spread(per_turn: list[dict[int, float]], batch: TurnBatch) -> list[list[float]]:
    return [
        [per_turn[i].get(turn, 0.0) if m else 0.0 for turn, m in zip(t_row, m_row, strict=True)]
        for i, (t_row, m_row) in enumerate(zip(batch.turns, batch.mask, strict=True))
    ]


def naive_gigpo(batch: TurnBatch, gamma: float, weight: float, scale: bool) -> list[list[float]]:
    returns = [naive_turn_returns(r, t, gamma) for r, t in zip(batch.rewards, batch.turns, strict=True)]
    groups: dict[tuple[str, str], list[float]] = {}
    for i, row in enumerate(returns):
        for turn, value in row.items():
            groups.setdefault((batch.group_ids[i], batch.keys[i][turn]), []).append(value)
    per_turn = []
    for i, row in enumerate(returns):
        episode_group = [  # episodes without any action turn stay out of the statistics
            s
            for s, g, t_row in zip(batch.scores, batch.group_ids, batch.turns, strict=True)
            if g == batch.group_ids[i] and max(t_row) >= 0
        ]
        episode = centred(batch.scores[i], episode_group, scale)
        step = {
            turn: centred(value, groups[(batch.group_ids[i], batch.keys[i][turn])], scale)
            for turn, value in row.items()
        }
        per_turn.append({turn: episode + weight * a for turn, a in step.items()})
    return spread(per_turn, batch)


def naive_position_cells(batch: TurnBatch, gamma: float) -> tuple[list[dict[int, float]], dict, list]:
    returns = [naive_turn_returns(r, t, gamma) for r, t in zip(batch.rewards, batch.turns, strict=True)]
    cells: dict[tuple[str, int], list[float]] = {}
    positions = []
    for i, row in enumerate(returns):
        position = {turn: j for j, turn in enumerate(sorted(row))}
        positions.append(position)
        for turn, value in row.items():
            cells.setdefault((batch.group_ids[i], position[turn]), []).append(value)
    return returns, cells, positions


def naive_turn_grpo(batch: TurnBatch, gamma: float, scale: str) -> list[list[float]]:
    returns, cells, positions = naive_position_cells(batch, gamma)
    every = [v for row in returns for v in row.values()]
    per_turn = []
    for i, row in enumerate(returns):
        out = {}
        for turn, value in row.items():
            cell = cells[(batch.group_ids[i], positions[i][turn])]
            a = centred(value, cell, scale == "group")
            if scale == "batch" and not flat(cell):
                a /= naive_std(every) + EPS
            out[turn] = a
        per_turn.append(out)
    return spread(per_turn, batch)


def naive_turn_rloo(batch: TurnBatch, gamma: float) -> list[list[float]]:
    returns, cells, positions = naive_position_cells(batch, gamma)
    per_turn = []
    for i, row in enumerate(returns):
        out = {}
        for turn, value in row.items():
            cell = cells[(batch.group_ids[i], positions[i][turn])]
            out[turn] = value - (sum(cell) - value) / (len(cell) - 1) if not flat(cell) else 0.0
        per_turn.append(out)
    return spread(per_turn, batch)


def naive_turn_reinforce(batch: TurnBatch, gamma: float, whiten: bool) -> list[list[float]]:
    returns = [naive_turn_returns(r, t, gamma) for r, t in zip(batch.rewards, batch.turns, strict=True)]
    out = spread(returns, batch)
    if not whiten:
        return out
    values = [
        v for row, m_row in zip(out, batch.mask, strict=True) for v, m in zip(row, m_row, strict=True) if m
    ]
    n = len(values)
    mean = sum(values) / n if n else 0.0
    var = sum((v - mean) ** 2 for v in values) / (n - 1) if n > 1 else 0.0
    return [
        [(v - mean) / math.sqrt(var + 1e-8) if m else 0.0 for v, m in zip(row, m_row, strict=True)]
        for row, m_row in zip(out, batch.mask, strict=True)
    ]


# --------------------------------------------------------------------------------------------
# Batches
# --------------------------------------------------------------------------------------------


@dataclass
class TurnBatch:
    mask: list[list[bool]]
    turns: list[list[int]]
    rewards: list[list[float]]
    scores: list[float]
    group_ids: list[str]
    keys: list[list[str]]

    def tensors(self) -> AdvantageInput:
        rewards = torch.tensor(self.rewards, dtype=torch.float64)
        return AdvantageInput(
            token_rewards=rewards,
            loss_mask=torch.tensor(self.mask, dtype=torch.bool),
            scores=torch.tensor(self.scores, dtype=torch.float64),
            group_ids=list(self.group_ids),
            turn_ids=torch.tensor(self.turns, dtype=torch.long),
            anchor_keys=[list(k) for k in self.keys],
        )


small_floats = st.floats(-3.0, 3.0, allow_nan=False, width=32)


@st.composite
def turn_batches(draw: st.DrawFn, *, one_turn: bool = False, distinct_keys: bool = False) -> TurnBatch:
    size = draw(st.integers(1, 7))
    rows: list[list[int]] = []
    for _ in range(size):
        row = [-1] * draw(st.integers(0, 3))  # prompt
        turn = -1
        for _ in range(1 if one_turn else draw(st.integers(0, 3))):
            turn += 1 + (0 if one_turn else draw(st.integers(0, 1)))  # turn numbers may skip
            row += [turn] * draw(st.integers(1, 4)) + [-1] * draw(st.integers(0, 3))
        rows.append(row)
    length = max(1, *(len(r) for r in rows))
    turns = [r + [-1] * (length - len(r)) for r in rows]
    masked_out = [draw(st.integers(0, 4)) == 0 for _ in range(size)]  # mask_truncated keeps turns
    mask = [[t >= 0 and not out for t in row] for row, out in zip(turns, masked_out, strict=True)]
    rewards = []
    for row in turns:
        r_row = [0.0] * length
        action = [t for t, turn in enumerate(row) if turn >= 0]
        if action:
            r_row[action[-1]] += draw(small_floats)  # outcome at the last action token
            for t in draw(st.lists(st.sampled_from(action), max_size=3)):  # process rewards
                r_row[t] += draw(small_floats)
        if not one_turn:
            for t in draw(st.lists(st.integers(0, length - 1), max_size=2)):  # off the actions
                r_row[t] += draw(small_floats)
        rewards.append(r_row)
    num_groups = draw(st.integers(1, size))
    group_ids = [f"task-{draw(st.integers(0, num_groups - 1))}" for _ in range(size)]
    keys = []
    for i, row in enumerate(turns):
        top = max(row) + 1
        if distinct_keys:
            keys.append([f"row{i}-turn{k}" for k in range(top)])
        else:
            keys.append([draw(st.sampled_from(["a", "b", "c"])) for _ in range(top)])
    scores = [sum(r) for r in rewards]
    return TurnBatch(mask, turns, rewards, scores, group_ids, keys)


def assert_matches(actual: torch.Tensor, expected: list[list[float]]) -> None:
    torch.testing.assert_close(
        actual, torch.tensor(expected, dtype=torch.float64).reshape(actual.shape), rtol=1e-7, atol=1e-7
    )


# --------------------------------------------------------------------------------------------
# Property tests against the references
# --------------------------------------------------------------------------------------------


@SETTINGS
@given(
    batch=turn_batches(),
    gamma=st.sampled_from([1.0, 0.95, 0.5]),
    weight=st.sampled_from([1.0, 0.5, 0.0]),
    scale=st.sampled_from(["group", "none"]),
)
def test_gigpo_matches_naive(batch: TurnBatch, gamma: float, weight: float, scale: str) -> None:
    inputs = batch.tensors()
    estimator = GiGPO({"gamma": gamma, "step_weight": weight, "scale": scale})
    advantages, returns = estimator.compute(inputs)
    assert_matches(advantages, naive_gigpo(batch, gamma, weight, scale == "group"))
    assert torch.equal(advantages, returns)
    assert torch.all(advantages[~inputs.loss_mask] == 0)
    metrics = estimator.step_metrics()
    turns_total = sum(len({t for t in row if t >= 0}) for row in batch.turns)
    groups: dict[tuple[str, str], int] = {}
    for i, row in enumerate(batch.turns):
        for turn in {t for t in row if t >= 0}:
            key = (batch.group_ids[i], batch.keys[i][turn])
            groups[key] = groups.get(key, 0) + 1
    assert metrics["gigpo/step_groups"] == len(groups)
    if groups:
        assert metrics["gigpo/step_group_size_mean"] == pytest.approx(turns_total / len(groups))
        shared = [n for n in groups.values() if n > 1]
        assert metrics["gigpo/step_groups_shared"] == pytest.approx(len(shared) / len(groups))
        assert metrics["gigpo/turns_shared"] == pytest.approx(sum(shared) / turns_total)


@SETTINGS
@given(batch=turn_batches(distinct_keys=True), scale=st.sampled_from(["group", "none"]))
def test_gigpo_without_shared_states_is_grpo(batch: TurnBatch, scale: str) -> None:
    """No two turns share an anchor state: every step group has one turn, the step advantage is 0,
    and GiGPO gives GRPO's advantages."""
    inputs = batch.tensors()
    gigpo, _ = GiGPO({"scale": scale}).compute(inputs)
    grpo, _ = GRPOEstimator({"scale": scale}).compute(inputs)
    torch.testing.assert_close(gigpo, grpo, rtol=1e-9, atol=1e-9)


@SETTINGS
@given(batch=turn_batches(), scale=st.sampled_from(["group", "none"]))
def test_gigpo_with_zero_step_weight_is_grpo(batch: TurnBatch, scale: str) -> None:
    inputs = batch.tensors()
    gigpo, _ = GiGPO({"scale": scale, "step_weight": 0.0}).compute(inputs)
    grpo, _ = GRPOEstimator({"scale": scale}).compute(inputs)
    torch.testing.assert_close(gigpo, grpo, rtol=1e-9, atol=1e-9)


@SETTINGS
@given(
    batch=turn_batches(),
    gamma=st.sampled_from([1.0, 0.9, 0.0]),
    scale=st.sampled_from(["group", "batch", "none"]),
)
def test_turn_level_grpo_matches_naive(batch: TurnBatch, gamma: float, scale: str) -> None:
    estimator = GRPOEstimator({"turn_level": True, "gamma": gamma, "scale": scale})
    advantages, returns = estimator.compute(batch.tensors())
    assert_matches(advantages, naive_turn_grpo(batch, gamma, scale))
    assert torch.equal(advantages, returns)
    _, cells, _ = naive_position_cells(batch, gamma)
    turns_total = sum(len(c) for c in cells.values())
    lone = sum(len(c) for c in cells.values() if len(c) == 1)
    expected = lone / turns_total if turns_total else 0.0
    assert estimator.step_metrics()["turn_level/lone_turn_share"] == pytest.approx(expected)


@SETTINGS
@given(batch=turn_batches(), gamma=st.sampled_from([1.0, 0.8]))
def test_turn_level_rloo_matches_naive(batch: TurnBatch, gamma: float) -> None:
    advantages, _ = RLOO({"turn_level": True, "gamma": gamma}).compute(batch.tensors())
    assert_matches(advantages, naive_turn_rloo(batch, gamma))


@SETTINGS
@given(batch=turn_batches(), gamma=st.sampled_from([1.0, 0.8]), whiten=st.booleans())
def test_turn_level_reinforce_pp_matches_naive(batch: TurnBatch, gamma: float, whiten: bool) -> None:
    advantages, returns = ReinforcePP({"turn_level": True, "gamma": gamma, "whiten": whiten}).compute(
        batch.tensors()
    )
    assert_matches(advantages, naive_turn_reinforce(batch, gamma, whiten))
    assert_matches(returns, naive_turn_reinforce(batch, gamma, False))


@SETTINGS
@given(batch=turn_batches(one_turn=True), scale=st.sampled_from(["group", "batch", "none"]))
def test_turn_level_on_single_turn_trajectories_is_the_score_level_estimator(
    batch: TurnBatch, scale: str
) -> None:
    """One action turn per trajectory: the turn's return is the score, so turn-level ``grpo`` and
    ``rloo`` are the score-level ones (trajectories without actions have no tokens to differ on)."""
    inputs = batch.tensors()
    has_action = [any(t >= 0 for t in row) for row in batch.turns]
    if not all(has_action):  # a row without actions has a score but no turn: drop it from both
        keep = [i for i, h in enumerate(has_action) if h]
        batch = TurnBatch(*([getattr(batch, f)[i] for i in keep] for f in batch.__dataclass_fields__))
        if not keep:
            return
        inputs = batch.tensors()
    for score_level, turn_level in (
        (GRPOEstimator({"scale": scale}), GRPOEstimator({"scale": scale, "turn_level": True})),
        (RLOO(), RLOO({"turn_level": True})),
    ):
        expected, _ = score_level.compute(inputs)
        actual, _ = turn_level.compute(inputs)
        torch.testing.assert_close(actual, expected, rtol=1e-9, atol=1e-9)


def test_turn_level_equals_score_level_for_outcome_only_equal_length_trajectories() -> None:
    """γ = 1, the outcome only, every trajectory with the same number of turns: each turn's return
    is the score and each position holds the whole group, so the advantages are GRPO's."""
    trajectories = [_two_turn(i, [5 + i % 2], [8 + i], reward=float(i % 3 == 0)) for i in range(6)]
    inputs = _inputs(trajectories)
    expected, _ = GRPOEstimator().compute(inputs)
    actual, _ = GRPOEstimator({"turn_level": True}).compute(inputs)
    torch.testing.assert_close(actual, expected)
    assert bool((expected != 0).any())
    expected, _ = RLOO().compute(inputs)
    actual, _ = RLOO({"turn_level": True}).compute(inputs)
    torch.testing.assert_close(actual, expected)


# --------------------------------------------------------------------------------------------
# Turn ids and anchor keys from real trajectories
# --------------------------------------------------------------------------------------------


def _two_turn(
    i: int,
    first: list[int],
    second: list[int],
    *,
    reward: float,
    group: str = "g",
    prompt: tuple[int, ...] = (1, 2, 3),
    observation: tuple[int, ...] = (7, 7),
    process: float | None = None,
) -> Trajectory:
    """Prompt, action (turn 0), observation, action (turn 1), as the rollout engine records them."""
    trajectory = Trajectory(id=f"t{i}", task_id=group, group_id=group, sample_index=i)
    trajectory.append(TokenSource.PROMPT, 0, list(prompt))
    trajectory.append(TokenSource.POLICY, 0, first, [-0.5] * len(first))
    trajectory.append(TokenSource.ENV, 0, list(observation))
    trajectory.append(TokenSource.TEMPLATE, 1, [4])
    trajectory.append(TokenSource.POLICY, 1, second, [-0.5] * len(second))
    trajectory.steps = [
        Step(turn=0, action=Action(token_ids=first), observation=Observation()),
        Step(turn=1, action=Action(token_ids=second), observation=Observation(done=True)),
    ]
    trajectory.rewards.append(RewardSignal(name="answer_match", value=reward))
    if process is not None:
        trajectory.rewards.append(RewardSignal(name="step", value=process, kind="process", turn=0))
    return trajectory


def _inputs(trajectories: list[Trajectory]) -> AdvantageInput:
    batch = collate(trajectories, pad_token_id=0)
    return AdvantageInput(
        token_rewards=batch.token_rewards.double(),
        loss_mask=batch.loss_mask,
        scores=batch.scores.double(),
        group_ids=batch.group_ids,
        turn_ids=turn_ids(trajectories, batch.loss_mask.shape[1]),
        anchor_keys=[anchor_keys(t) for t in trajectories],
    )


def test_turn_ids_mark_policy_tokens_only() -> None:
    trajectory = _two_turn(0, [5, 6], [8], reward=1.0)
    ids = turn_ids([trajectory, _two_turn(1, [5], [8, 9, 9], reward=0.0)], 12)
    #                 prompt      turn 0  obs     tmpl turn 1 pad
    assert ids[0].tolist() == [-1, -1, -1, 0, 0, -1, -1, -1, 1, -1, -1, -1]
    assert ids[1].tolist() == [-1, -1, -1, 0, -1, -1, -1, 1, 1, 1, -1, -1]
    with pytest.raises(ValueError, match="more than length"):
        turn_ids([trajectory], 5)


def test_anchor_keys_group_identical_histories_only() -> None:
    """The key of a turn is the state before it: trajectories that took the same first action and
    saw the same observation share their turn-1 key; any difference before the turn separates
    them; what comes after the turn does not matter."""
    same_a = _two_turn(0, [5, 5], [8], reward=1.0)
    same_b = _two_turn(1, [5, 5], [9, 9, 9], reward=0.0)  # another second action
    other_action = _two_turn(2, [5, 6], [8], reward=0.0)
    other_observation = _two_turn(3, [5, 5], [8], reward=0.0, observation=(7, 6))
    other_prompt = _two_turn(4, [5, 5], [8], reward=0.0, prompt=(1, 2, 4))
    keys = [anchor_keys(t) for t in (same_a, same_b, other_action, other_observation, other_prompt)]
    assert all(len(k) == 2 and all(k) for k in keys)
    assert keys[0][0] == keys[1][0] == keys[2][0] == keys[3][0] != keys[4][0]  # the prompt
    assert keys[0][1] == keys[1][1]
    assert len({keys[0][1], keys[2][1], keys[3][1], keys[4][1]}) == 4
    # the state is the token context the policy conditions on, not who wrote which token: [5, 5]
    # then [7, 7] and [5] then [5, 7, 7] are the same context
    shifted = _two_turn(5, [5], [8], reward=0.0, observation=(5, 7, 7))
    assert anchor_keys(shifted)[1] == keys[0][1]


def test_anchor_keys_use_the_environments_state_key() -> None:
    """An environment that names its state (``Observation.info["state_key"]``) groups turns that
    reach the same state through different histories; turn 0 stays the prompt's digest."""
    first = _two_turn(0, [5, 5], [8], reward=1.0)
    second = _two_turn(1, [6], [9], reward=0.0, observation=(3, 3, 3))
    for trajectory in (first, second):
        trajectory.steps[0].observation = Observation(info={STATE_KEY: "kitchen"})
    keys = [anchor_keys(t) for t in (first, second)]
    assert keys[0][1] == keys[1][1] == "env:kitchen"
    assert keys[0][0] == keys[1][0] and keys[0][0].startswith("tok:")  # no initial state named


def test_a_return_to_the_named_initial_state_shares_turn_zeros_step_group() -> None:
    """The environment names its initial state in ``reset`` (``EpisodeStart.info``, recorded as
    ``Trajectory.start_info``): a trajectory whose first action leads back to that state has its
    second turn in the same step group as every first turn; without the name it cannot."""
    back = _two_turn(0, [5], [8], reward=1.0)
    onward = _two_turn(1, [6], [9], reward=0.0, observation=(3, 3))
    back.steps[0].observation = Observation(info={STATE_KEY: "lobby"})
    onward.steps[0].observation = Observation(info={STATE_KEY: "hall"})
    for named in (True, False):
        for trajectory in (back, onward):
            trajectory.start_info = {STATE_KEY: "lobby"} if named else {}
        keys = [anchor_keys(t) for t in (back, onward)]
        assert (keys[0][1] == keys[0][0] == keys[1][0] == "env:lobby") is named
        estimator = GiGPO()
        estimator.compute(_inputs([back, onward]))
        # named: {lobby: 3 turns, hall: 1}; unnamed: {prompt: 2, lobby: 1, hall: 1}
        assert estimator.step_metrics()["gigpo/step_groups"] == (2 if named else 3)


def test_anchor_keys_skip_turns_without_actions() -> None:
    trajectory = Trajectory(id="t", task_id="x", group_id="g")
    trajectory.append(TokenSource.PROMPT, 0, [1, 2])
    trajectory.append(TokenSource.POLICY, 0, [5], [0.0])
    trajectory.append(TokenSource.ENV, 0, [7])
    trajectory.append(TokenSource.POLICY, 2, [6], [0.0])  # turn 1 produced nothing
    keys = anchor_keys(trajectory)
    assert len(keys) == 3 and keys[1] == "" and keys[0] and keys[2]


# --------------------------------------------------------------------------------------------
# Credit moves to the turn that made the difference
# --------------------------------------------------------------------------------------------


def test_credit_moves_to_the_turn_that_made_the_difference() -> None:
    """Two trajectories take the same first action, reach the same state and differ only at the
    second turn, where one succeeds. GiGPO's step advantage is positive on the successful second
    action and negative on the failed one; on the shared first action the two step advantages
    cancel, so that action gets no net step credit. GRPO gives every token of a trajectory the
    same advantage and cannot tell the turns apart."""
    success = _two_turn(0, [5, 5], [8], reward=1.0)
    failure = _two_turn(1, [5, 5], [9], reward=0.0)
    inputs = _inputs([success, failure])
    turns = inputs.turn_ids
    assert turns is not None
    estimator = GiGPO({"gamma": 0.95})
    advantages, _ = estimator.compute(inputs)
    episode, _ = GRPOEstimator().compute(inputs)
    step = advantages - episode  # ω = 1: the step-level part
    second = turns == 1
    first = turns == 0
    assert float(step[0][second[0]].min()) > 0.5 and float(step[1][second[1]].max()) < -0.5
    shared_first = step[0][first[0]] + step[1][first[1]]  # the same tokens, from the same state
    torch.testing.assert_close(shared_first, torch.zeros_like(shared_first), atol=1e-6, rtol=0)
    # under GRPO both turns of a trajectory carry the same advantage
    assert torch.unique(episode[0][inputs.loss_mask[0]]).numel() == 1
    # with GiGPO the successful trajectory's second turn gets more than its first
    assert float(advantages[0][second[0]].mean()) > float(advantages[0][first[0]].mean())
    metrics = estimator.step_metrics()
    assert metrics["gigpo/step_groups"] == 2  # the prompt, and the shared state after turn 0
    assert metrics["gigpo/turns_shared"] == 1.0


def test_diverging_first_actions_get_step_credit_at_the_first_turn() -> None:
    """Four samples: two take first action a (one of them then succeeds), two take c and fail.
    The first turn's step group is the whole group (the prompt); the second turn of the a
    trajectories forms its own group, those of the c trajectories another (both failed: 0)."""
    a_win = _two_turn(0, [5], [8], reward=1.0)
    a_lose = _two_turn(1, [5], [9], reward=0.0)
    c_lose = [_two_turn(2 + i, [6], [8], reward=0.0) for i in range(2)]
    inputs = _inputs([a_win, a_lose, *c_lose])
    assert inputs.turn_ids is not None
    advantages, _ = GiGPO({"gamma": 1.0, "scale": "none"}).compute(inputs)
    second = inputs.turn_ids == 1
    # second turns: a_win vs a_lose (returns 1 and 0, mean 0.5) on top of the episode part
    episode = torch.tensor([0.75, -0.25, -0.25, -0.25], dtype=torch.float64)
    step_second = torch.tensor([0.5, -0.5, 0.0, 0.0], dtype=torch.float64)
    step_first = torch.tensor([0.75, -0.25, -0.25, -0.25], dtype=torch.float64)  # whole group
    for row in range(4):
        torch.testing.assert_close(
            advantages[row][second[row]].unique(), (episode + step_second)[row : row + 1]
        )
        first = inputs.turn_ids[row] == 0
        torch.testing.assert_close(advantages[row][first].unique(), (episode + step_first)[row : row + 1])


def test_process_rewards_count_from_their_turn_on() -> None:
    """A process reward on the first turn is in that turn's return only (γ < 1 discounts the
    outcome back to the first turn)."""
    trajectory = _two_turn(0, [5], [8], reward=1.0, process=0.5)
    table_inputs = _inputs([trajectory])
    _, returns = ReinforcePP({"turn_level": True, "gamma": 0.5, "whiten": False}).compute(table_inputs)
    assert table_inputs.turn_ids is not None
    assert returns[0][table_inputs.turn_ids[0] == 0].tolist() == [0.5 + 0.5 * 1.0]
    assert returns[0][table_inputs.turn_ids[0] == 1].tolist() == [1.0]


# --------------------------------------------------------------------------------------------
# Errors and configuration
# --------------------------------------------------------------------------------------------


def test_missing_turn_inputs_say_what_to_do() -> None:
    mask = torch.ones(2, 3, dtype=torch.bool)
    bare = AdvantageInput(torch.zeros(2, 3), mask, torch.zeros(2), ["a", "a"])
    with pytest.raises(ValueError, match=r"needs AdvantageInput\.turn_ids"):
        GiGPO().compute(bare)
    with pytest.raises(ValueError, match=r"needs AdvantageInput\.turn_ids"):
        GRPOEstimator({"turn_level": True}).compute(bare)
    no_keys = AdvantageInput(
        torch.zeros(2, 3), mask, torch.zeros(2), ["a", "a"], turn_ids=torch.zeros(2, 3, dtype=torch.long)
    )
    with pytest.raises(ValueError, match="anchor_keys"):
        GiGPO().compute(no_keys)
    short_keys = AdvantageInput(
        torch.zeros(2, 3),
        mask,
        torch.zeros(2),
        ["a", "a"],
        turn_ids=torch.tensor([[0, 0, 1], [0, 0, 0]]),
        anchor_keys=[["s0"], ["s0"]],
    )
    with pytest.raises(ValueError, match=r"anchor_keys\[0\] has no key for turn 1"):
        GiGPO().compute(short_keys)
    unturned = AdvantageInput(
        torch.zeros(2, 3), mask, torch.zeros(2), ["a", "a"], turn_ids=torch.full((2, 3), -1)
    )
    with pytest.raises(ValueError, match="every policy token needs its turn"):
        ReinforcePP({"turn_level": True}).compute(unturned)


def test_gamma_without_turn_level_is_a_config_error() -> None:
    for estimator in (GRPOEstimator, RLOO):
        with pytest.raises(ConfigError, match="turn_level"):
            validate_component_config(
                estimator, {"gamma": 0.9}, where=f"advantage estimator {estimator.name!r}"
            )
        validate_component_config(estimator, {"gamma": 0.9, "turn_level": True}, where="x")


# --------------------------------------------------------------------------------------------
# The trainer: the engine fills turn ids and anchor keys, metrics reach the step
# --------------------------------------------------------------------------------------------


def _session(config: dict[str, Any], registry: Any) -> Any:
    from agent_r1.config import RunConfig, validate_components
    from agent_r1.engine import build_session

    run = RunConfig.model_validate(config)
    return build_session(run, validate_components(run, registry), Path(run.output_dir), registry=registry)


def test_update_with_gigpo_logs_step_group_metrics(registry: Any, model_dir: Path, tmp_path: Path) -> None:
    """Two-turn trajectories through the real update: the advantages the trainer used are GiGPO's
    on the engine's own turn ids and anchor keys, and the step-group figures are logged."""
    from trainer_helpers import toy_config

    from agent_r1.engine.update import update

    config = toy_config(
        model_dir, tmp_path / "run", algorithm={"name": "gigpo"}, trainer={"steps": 1, "micro_batch_size": 8}
    )
    session = _session(config, registry)
    assert isinstance(session.estimator, GiGPO) and session.estimator.config.gamma == 0.95
    trajectories = [
        _two_turn(0, [5], [8], reward=1.0, process=0.25),
        _two_turn(1, [5], [9], reward=0.0),
        _two_turn(2, [6], [8], reward=0.0),
        _two_turn(3, [6], [8, 8], reward=0.0, process=-0.25),
    ]
    expected, _ = GiGPO(session.estimator.config).compute(_engine_inputs(trajectories, session.pad_id))
    metrics = update(session, trajectories)
    # the prompt (4 turns), then the state after [5] (2 turns) and after [6] (2 turns)
    assert metrics["gigpo/step_groups"] == 3.0
    assert metrics["gigpo/step_group_size_mean"] == pytest.approx(8 / 3)
    assert metrics["gigpo/turns_shared"] == 1.0
    assert metrics["advantages/max"] == pytest.approx(float(expected.max()), abs=1e-5)
    assert metrics["advantages/min"] == pytest.approx(float(expected.min()), abs=1e-5)
    assert float(expected.max()) > 0 > float(expected.min())


def _engine_inputs(trajectories: list[Trajectory], pad_id: int) -> AdvantageInput:
    batch = collate(trajectories, pad_id)
    return AdvantageInput(
        token_rewards=batch.token_rewards,
        loss_mask=batch.loss_mask,
        scores=batch.token_rewards.sum(dim=-1),
        group_ids=batch.group_ids,
        turn_ids=turn_ids(trajectories, batch.loss_mask.shape[1]),
        anchor_keys=[anchor_keys(t) for t in trajectories],
    )


def test_two_training_steps_with_gigpo(registry: Any, model_dir: Path, tmp_path: Path) -> None:
    from trainer_helpers import toy_config

    from agent_r1.engine import train_step

    config = toy_config(
        model_dir, tmp_path / "run", algorithm={"name": "gigpo"}, trainer={"steps": 2, "tasks_per_step": 2}
    )
    session = _session(config, registry)
    for step in range(2):
        metrics = train_step(session).metrics
        # single-turn toy task: the only step group of a task is its prompt, shared by its 4 samples
        assert metrics["gigpo/step_groups"] == 2.0
        assert metrics["gigpo/step_group_size_mean"] == 4.0
        assert metrics["step"] == step + 1


def test_gigpo_is_registered_as_estimator_and_algorithm() -> None:
    import agent_r1.builtins
    from agent_r1.registry import Registry

    registry = Registry(entry_points=False)  # only the bundled plugin
    registry.register_plugin(agent_r1.builtins, "builtins")
    assert registry.get("advantage_estimators", "gigpo") is GiGPO
    assert registry.get("algorithms", "gigpo").estimator == "gigpo"
