"""collate (agent_r1.engine.learner.batch): the padded tensors equal the trajectories' own per-token views
(token ids, loss mask, sampling log-probabilities, dense rewards) for any mix of segments, reward
signals, truncation and DAPO's overlong masking."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from agent_r1.engine.learner.batch import collate, first_policy_position
from agent_r1.mdp import RewardSignal, TokenSource, Trajectory

SOURCES = [TokenSource.PROMPT, TokenSource.POLICY, TokenSource.ENV, TokenSource.TEMPLATE]


@st.composite
def trajectories(draw: st.DrawFn, index: int) -> Trajectory:
    trajectory = Trajectory(id=f"t{index}", task_id="task", group_id="g")
    trajectory.append(TokenSource.PROMPT, 0, draw(st.lists(st.integers(3, 99), min_size=1, max_size=6)))
    with_logprobs = draw(st.booleans())  # a turn's policy tokens all have them or none does
    for turn in range(draw(st.integers(0, 3))):
        for source in draw(st.lists(st.sampled_from(SOURCES[1:]), min_size=1, max_size=3)):
            tokens = draw(st.lists(st.integers(3, 99), min_size=1, max_size=5))
            logprobs = None
            if source is TokenSource.POLICY and with_logprobs:
                logprobs = [-0.5 - i / 10 for i in range(len(tokens))]
            trajectory.append(source, turn, tokens, logprobs)
    for _ in range(draw(st.integers(0, 3))):
        process = draw(st.booleans())
        trajectory.rewards.append(
            RewardSignal(
                name="r",
                value=draw(st.sampled_from([0.1, 0.2, 1.0, -0.3])),
                kind="process" if process else "outcome",
                turn=draw(st.integers(0, 3)) if process else None,
            )
        )
    trajectory.truncated = draw(st.booleans())
    return trajectory


@settings(max_examples=60, deadline=None)
@given(data=st.data(), mask_truncated=st.booleans())
def test_collate_matches_the_per_token_views(data: st.DataObject, mask_truncated: bool) -> None:
    rows = [data.draw(trajectories(i)) for i in range(data.draw(st.integers(1, 4)))]
    batch = collate(rows, pad_token_id=0, mask_truncated=mask_truncated)
    width = max(len(t) for t in rows)
    assert batch.input_ids.shape == (len(rows), width)
    for row, trajectory in enumerate(rows):
        n = len(trajectory)
        assert batch.input_ids[row, :n].tolist() == trajectory.token_ids
        assert batch.input_ids[row, n:].eq(0).all()
        assert batch.attention_mask[row].tolist() == [True] * n + [False] * (width - n)
        expected_mask = [
            bool(m) and not (mask_truncated and trajectory.truncated) for m in trajectory.loss_mask
        ]
        assert batch.loss_mask[row, :n].tolist() == expected_mask and not batch.loss_mask[row, n:].any()
        assert torch.equal(
            batch.rollout_logprobs[row, :n], torch.tensor(trajectory.logprobs, dtype=torch.float32)
        )
        assert torch.equal(
            batch.token_rewards[row, :n], torch.tensor(trajectory.token_rewards(), dtype=torch.float32)
        )
        assert not batch.token_rewards[row, n:].any() and not batch.rollout_logprobs[row, n:].any()
        assert batch.lengths[row] == n
        loss_positions = batch.loss_mask[row].nonzero().flatten().tolist()
        assert batch.first_policy[row] == (loss_positions[0] if loss_positions else -1)
    # the host-side fields answer what the device tensors would, and travel with select()
    assert batch.first_policy_position() == first_policy_position(batch.loss_mask)
    some = list(range(len(rows)))[::-2]
    picked = batch.select(some)
    assert picked.input_ids.shape[1] == max(len(rows[r]) for r in some)
    assert picked.first_policy_position() == first_policy_position(batch.loss_mask[some])
    assert batch.first_policy_position(some) == picked.first_policy_position()
    assert batch.scores.tolist() == [torch.tensor(t.score, dtype=torch.float32).item() for t in rows]
