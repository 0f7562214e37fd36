"""Tests of the guessing game: the contract checkers of ``agent_r1.testing``, every way an episode
goes on or ends, and whole episodes through agent-r1's real rollout engine with a scripted policy
that plays binary search. Install the plugin first (``pip install -e .``)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from agent_r1 import Action, Task, TokenSource
from agent_r1.config import load_config, validate_components
from agent_r1.testing import check_dataset, check_environment, check_plugin

from agent_r1_plugin_guess_number import plugin

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "guess_number.yaml"
TASK = Task(
    id="g0",
    messages=[{"role": "user", "content": "I am thinking of a whole number from 1 to 100. Find it."}],
    answer=37,
    metadata={"low": 1, "high": 100},
)


def _texts(observations: list) -> list[str]:
    return [" ".join(m["content"] for m in o.messages) for o in observations]


def test_the_plugin_registers_the_environment_and_the_dataset() -> None:
    info = check_plugin(plugin, "guess_number")
    assert info.components == {"environments": ["guess_number"], "datasets": ["guess_number"]}


def test_higher_lower_then_found() -> None:
    actions = [Action(text=f"<guess>{n}</guess>") for n in (50, 25, 37)]
    observations = check_environment(plugin.GuessNumberEnv, task=TASK, actions=actions)
    assert _texts(observations) == ["Lower.", "Higher.", ""]
    assert [o.done for o in observations] == [False, False, True]
    assert observations[-1].termination == "answer"
    assert [o.answer for o in observations] == [None, None, "37"]
    assert all(a.answer is None for a in actions)  # the environment leaves the action alone


def test_an_invalid_guess_is_explained_and_can_cost_a_process_reward() -> None:
    actions = ["I think it is 40", "<guess>500</guess>", "<guess>37</guess>"]
    observations = check_environment(
        plugin.GuessNumberEnv, config={"invalid_guess_reward": -0.1}, task=TASK, actions=actions
    )
    first, second, last = observations
    assert "<guess>number</guess>" in _texts([first])[0] and "from 1 to 100" in _texts([second])[0]
    penalties = [(r.name, r.kind, r.turn, r.value) for o in (first, second) for r in o.rewards]
    assert penalties == [("invalid_guess", "process", 0, -0.1), ("invalid_guess", "process", 1, -0.1)]
    assert last.termination == "answer"
    quiet = check_environment(plugin.GuessNumberEnv, task=TASK, actions=["no guess"])
    assert quiet[0].rewards == []  # off by default


def test_the_episode_ends_after_max_turns() -> None:
    observations = check_environment(
        plugin.GuessNumberEnv, config={"max_turns": 2}, task=TASK, actions=["<guess>1</guess>"] * 5
    )
    assert len(observations) == 2
    assert observations[-1].done and observations[-1].termination == "max_turns"
    assert observations[-1].messages == []  # a final observation adds no tokens


def test_the_dataset_is_deterministic_and_in_range() -> None:
    config = {"num_train": 50, "num_eval": 10, "low": 5, "high": 9}
    splits = check_dataset(plugin.GuessNumberDataset, config=config, splits=("train", "eval"))
    secrets = [task.answer for task in splits["train"]]
    assert set(secrets) <= set(range(5, 10)) and len(set(secrets)) > 1
    assert all(task.metadata == {"low": 5, "high": 9} for task in splits["eval"])


def test_the_example_run_config_is_valid() -> None:
    resolved = {c.path: c for c in validate_components(load_config(CONFIG))}
    assert resolved["environment"].cls is plugin.GuessNumberEnv
    assert resolved["environment"].config.invalid_guess_reward == -0.1
    assert resolved["data"].cls is plugin.GuessNumberDataset


def binary_search(prompt: str) -> str:
    """A scripted policy: read the range and every (guess, reply) pair off the conversation so far
    and guess the middle of what is left."""
    low, high = map(int, re.search(r"from (\d+) to (\d+)", prompt).groups())
    for turn in prompt.split("<|im_start|>assistant")[1:]:
        played = re.search(r"<guess>(\d+)</guess>.*?(Higher|Lower)", turn, flags=re.DOTALL)
        if played:
            guess, reply = int(played.group(1)), played.group(2)
            low, high = (guess + 1, high) if reply == "Higher" else (low, guess - 1)
    return f"<guess>{(low + high) // 2}</guess>"


@pytest.mark.parametrize("secret", [1, 37, 100])
def test_binary_search_wins_through_the_real_rollout_engine(secret: int) -> None:
    """The engine renders the chat, tokenises the scripted actions, stops at ``</guess>``, steps the
    environment and appends its replies as environment tokens: a whole multi-turn episode."""
    import torch
    from agent_r1.registry import get_registry
    from agent_r1.rollout.loop import RolloutEngine
    from agent_r1.testing.models import tiny_tokenizer
    from agent_r1.testing.scripted import ScriptedBackend

    torch.set_num_threads(1)
    tokenizer = tiny_tokenizer()
    backend = ScriptedBackend(tokenizer=tokenizer, responses=binary_search)
    env_factory = lambda: plugin.GuessNumberEnv({"max_turns": 8})  # noqa: E731
    engine = RolloutEngine(backend, tokenizer, env_factory, max_turns=8, max_new_tokens=16, max_context=2048)
    task = TASK.model_copy(update={"answer": secret})
    [trajectory] = engine.collect([task], group_size=1, seed=0)

    assert trajectory.termination == "answer" and not trajectory.truncated
    assert 1 <= trajectory.num_turns <= 7  # ceil(log2(100)) guesses at most
    replies = [s.observation.messages for s in trajectory.steps[:-1] if s.observation]
    assert all(m[0]["content"] in ("Higher.", "Lower.") for m in replies)
    # token fidelity: the loss mask is exactly the policy's tokens, the replies are env tokens
    assert trajectory.loss_mask == [int(s is TokenSource.POLICY) for s in trajectory.sources]
    env_text = tokenizer.decode(
        [t for t, s in zip(trajectory.token_ids, trajectory.sources, strict=True) if s is TokenSource.ENV]
    )
    assert env_text.count("Higher.") + env_text.count("Lower.") == trajectory.num_turns - 1
    # the bundled answer_match shaper scores the win
    shaper = get_registry().build("reward_shapers", "answer_match")
    assert [s.value for s in shaper.score(trajectory, task)] == [1.0]
