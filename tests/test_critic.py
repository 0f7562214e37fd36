"""The critic values states, not state-action pairs: V(s_t) for policy token t is read from the
hidden state before t, the same shift as the policy's log-probabilities (docs/algorithms.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from trainer_helpers import toy_config

from agent_r1.config import RunConfig, validate_components
from agent_r1.contracts import AdvantageInput
from agent_r1.engine.learner.batch import collate, policy_forward
from agent_r1.engine.learner.critic import critic_values, no_grad_values, state_values
from agent_r1.mdp import RewardSignal, TokenSource, Trajectory


def _ppo_session(model_dir: Path, run_dir: Path, registry: Any, **critic: Any) -> Any:
    from agent_r1.engine import build_session

    config = toy_config(
        model_dir,
        run_dir,
        algorithm={"name": "ppo", "critic": {"kind": "value_head", **critic}},
        trainer={"steps": 1, "tasks_per_step": 2, "micro_batch_size": 8},
    )
    run = RunConfig.model_validate(config)
    return build_session(run, validate_components(run, registry), run_dir, registry=registry)


def _trajectory(name: str, prompt: list[int], actions: list[list[int]], observation: list[int]) -> Trajectory:
    trajectory = Trajectory(id=name, task_id="task", group_id="g")
    trajectory.append(TokenSource.PROMPT, 0, prompt)
    for turn, action in enumerate(actions):
        if turn:
            trajectory.append(TokenSource.ENV, turn - 1, observation)
        trajectory.append(TokenSource.POLICY, turn, action, [-1.0] * len(action))
    return trajectory


def _values(session: Any, batch: Any) -> torch.Tensor:
    """The no-grad value pass the update uses before computing advantages."""
    backbone = session.critic_model if session.critic_model is not None else session.model
    return no_grad_values(session.value_head, backbone, batch, 8)


def _randomise(head: torch.nn.Module, seed: int = 0) -> None:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in head.parameters():
            param.copy_(torch.randn(param.shape, generator=generator))


@pytest.mark.parametrize("kind", ["value_head", "separate"])
def test_rows_that_differ_only_in_the_action_at_t_get_the_same_value_at_t(
    kind: str, model_dir: Path, tmp_path: Path, registry: Any
) -> None:
    session = _ppo_session(model_dir, tmp_path / "run", registry, kind=kind)
    _randomise(session.value_head)
    prompt, observation = [7, 8, 9, 10, 11], [20, 21, 22]
    a = _trajectory("a", prompt, [[30, 31, 32], [40, 41]], observation)
    b = _trajectory("b", prompt, [[30, 55, 32], [40, 41]], observation)  # differs at one policy token
    batch = collate([a, b], session.pad_id)
    values = _values(session, batch)  # [2, T]
    t = len(prompt) + 1  # the position of the differing policy token
    assert torch.equal(batch.input_ids[0, :t], batch.input_ids[1, :t])
    assert batch.input_ids[0, t] != batch.input_ids[1, t]
    assert values[0, : t + 1].tolist() == values[1, : t + 1].tolist()  # V(s_t) never sees a_t
    assert not torch.allclose(values[0, t + 1 :], values[1, t + 1 :])  # later states did see it
    # The first policy token after the observation is valued from the state that includes it.
    first_after = len(prompt) + 3 + len(observation)
    assert bool(batch.loss_mask[0, first_after]) and not bool(batch.loss_mask[0, first_after - 1])
    backbone = session.critic_model if session.critic_model is not None else session.model
    with torch.no_grad():
        hidden = backbone(input_ids=batch.input_ids[:1], output_hidden_states=True).hidden_states[-1]
        expected = session.value_head(hidden)[0, first_after - 1]
    assert float(values[0, first_after]) == pytest.approx(float(expected), abs=1e-5)


def test_training_pass_and_no_grad_pass_agree(model_dir: Path, tmp_path: Path, registry: Any) -> None:
    """The shared-backbone values inside the loss (from policy_forward's hidden state) equal the
    no-grad pass that feeds GAE."""
    session = _ppo_session(model_dir, tmp_path / "run", registry)
    _randomise(session.value_head, seed=1)
    batch = collate([_trajectory("a", [7, 8, 9], [[30, 31], [40]], [20, 21])], session.pad_id)
    out = policy_forward(session.model, batch.input_ids, batch.attention_mask, with_hidden=True)
    assert out.hidden is not None
    with torch.no_grad():
        in_loss = state_values(session.value_head, out.hidden)
    backbone = session.critic_model if session.critic_model is not None else session.model
    assert torch.allclose(in_loss, critic_values(session.value_head, backbone, batch), atol=1e-6)
    assert torch.allclose(in_loss, _values(session, batch), atol=1e-6)


def test_one_token_bandit_with_a_least_squares_critic_gives_reward_minus_mean(
    model_dir: Path, tmp_path: Path, registry: Any
) -> None:
    """Reward 1 for half of the action tokens: a critic fitted by least squares to the returns (what
    the value loss asks for) must give A = r - mean(r), not 0 (a critic that saw the action would
    predict each reward exactly)."""
    session = _ppo_session(model_dir, tmp_path / "run", registry)
    prompt = [7, 8, 9, 10]
    actions = list(range(30, 46))  # 16 one-token actions, the first 8 rewarded
    rewards = [1.0 if i < 8 else 0.0 for i in range(len(actions))]
    trajectories = []
    for i, (action, reward) in enumerate(zip(actions, rewards, strict=True)):
        trajectory = _trajectory(f"t{i}", prompt, [[action]], [])
        trajectory.rewards.append(RewardSignal(name="answer_match", value=reward))
        trajectories.append(trajectory)
    batch = collate(trajectories, session.pad_id)
    with torch.no_grad():
        hidden = session.model(input_ids=batch.input_ids, output_hidden_states=True).hidden_states[-1]

    head = session.value_head
    optimizer = torch.optim.Adam(head.parameters(), lr=0.05)
    returns = batch.token_rewards.sum(dim=-1, keepdim=True).expand_as(batch.token_rewards)  # [B, T]
    for _ in range(600):  # least squares on the value loss's own inputs
        values = state_values(head, hidden)
        loss = ((values - returns) ** 2)[batch.loss_mask].mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    from agent_r1.builtins.estimators import GAE

    values = _values(session, batch)
    advantages, _ = GAE({"whiten": False}).compute(
        AdvantageInput(
            token_rewards=batch.token_rewards,
            loss_mask=batch.loss_mask,
            scores=batch.token_rewards.sum(dim=-1),
            group_ids=batch.group_ids,
            values=values,
        )
    )
    got = advantages[batch.loss_mask]  # one policy token per row
    expected = torch.tensor(rewards) - 0.5
    assert torch.allclose(got, expected, atol=1e-3), got
