"""Tests of the turn-budget reward shapers: the contract checkers of ``agent_r1.testing``, the
values on a known trajectory, where the process penalty lands on the tokens, and how a run config
that misspells an option fails. Install the plugin first (``pip install -e .``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from agent_r1 import ConfigError, Task
from agent_r1.config import load_config, validate_components
from agent_r1.testing import ContractViolation, check_plugin, check_reward_shaper, example_trajectory

from agent_r1_plugin_turn_budget import plugin

# example_trajectory(): prompt tokens 0-3, turn 0 acts with 3 policy tokens (4-6, a calculator
# call), the environment answers (7-8), a template token (9), turn 1 answers with 2 tokens (10-11).
TASK = Task(id="t", messages=[{"role": "user", "content": "What is 17 * 23?"}], answer="391")


def _values(config: dict, answer: str = "391", task: Task = TASK) -> list[float]:
    signals = check_reward_shaper(
        plugin.AnswerWithinTurns, config=config, trajectory=example_trajectory(answer, task=task), task=task
    )
    return [signal.value for signal in signals]


def test_the_plugin_registers_both_shapers() -> None:
    info = check_plugin(plugin, "turn_budget")
    assert info.components == {"reward_shapers": ["answer_within_turns", "length_penalty"]}


@pytest.mark.parametrize(
    ("config", "answer", "expected"),
    [
        ({}, "391", 1.0),  # two turns, two allowed
        ({"max_turns": 1}, "391", 0.5),  # one turn late: half the reward
        ({"max_turns": 1, "late_penalty": 0.25}, "391", 0.75),
        ({"max_turns": 1, "late_penalty": 1.0}, "391", 0.0),
        ({}, "390", 0.0),  # wrong answers earn nothing, however quick
        ({}, "391.0", 0.0),  # exact match compares text...
        ({"mode": "numeric"}, "391.0", 1.0),  # ...numeric match compares numbers
    ],
)
def test_answer_within_turns(config: dict, answer: str, expected: float) -> None:
    assert _values(config, answer) == [expected]


def test_a_task_without_a_reference_answer_gets_no_signal() -> None:
    open_task = TASK.model_copy(update={"answer": None})
    assert _values({}, task=open_task) == []


def test_length_penalty_names_the_long_turn_and_lands_on_its_last_action_token() -> None:
    trajectory = example_trajectory("391", task=TASK)
    signals = check_reward_shaper(
        plugin.LengthPenalty, config={"max_tokens_per_turn": 2, "per_token": 0.5}, trajectory=trajectory
    )
    assert [(s.kind, s.turn, s.value) for s in signals] == [("process", 0, -0.5)]
    trajectory.rewards.extend(signals)
    token_rewards = trajectory.token_rewards()
    assert token_rewards[6] == -0.5  # the last policy token of turn 0
    assert sum(token_rewards) == -0.5  # nothing on prompt or environment tokens
    assert check_reward_shaper(plugin.LengthPenalty, trajectory=trajectory) == []  # default budget: 64


def test_bad_options_are_rejected_before_scoring() -> None:
    with pytest.raises(ContractViolation, match="late_penalty"):
        check_reward_shaper(plugin.AnswerWithinTurns, config={"late_penalty": 2.0})


def test_a_run_config_with_a_misspelt_option_fails_naming_it(tmp_path: Path) -> None:
    config = tmp_path / "run.yaml"
    config.write_text(
        "rewards:\n  - {name: answer_match}\n  - {name: answer_within_turns, max_turn: 3}\n", encoding="utf-8"
    )
    with pytest.raises(ConfigError, match=r"rewards\[1\]\.max_turn.*Did you mean 'max_turns'"):
        validate_components(load_config(config))
    config.write_text("rewards:\n  - {name: answer_within_turns, max_turns: 3}\n", encoding="utf-8")
    resolved = {c.path: c for c in validate_components(load_config(config))}
    assert resolved["rewards[0]"].cls is plugin.AnswerWithinTurns
    assert resolved["rewards[0]"].config.max_turns == 3
