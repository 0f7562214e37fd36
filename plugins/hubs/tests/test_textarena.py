"""The TextArena family against textarena 0.7.4: the ``textarena`` dataset's episodes, the
single-player games that start offline, scripted games of GuessTheNumber through the real rollout
engine (rewards against the game's own, replayed), two GRPO steps on the tiny model, and
``agent-r1 check`` refusing what cannot run before any model loads."""

from __future__ import annotations

import asyncio
import random
import re
import sys
from pathlib import Path
from typing import Any

import pytest
from hub_checks import (
    agent_r1_check,
    assert_listed_with_or_without,
    assert_token_fidelity,
    example_components,
    failures,
    metrics_lines,
    run_config,
    write_config,
)

from agent_r1 import Action, Task, TokenSource
from agent_r1.errors import ConfigError
from agent_r1_plugin_hubs.textarena_hub import OFFLINE_GAMES

ta = pytest.importorskip("textarena", reason="needs the textarena extra of agent-r1-plugin-hubs")

GAME = "GuessTheNumber-v0"


def build(kind: str, name: str, options: dict[str, Any]) -> Any:
    from agent_r1.registry import get_registry

    return get_registry().build(kind, name, options)


def episodes(split: str = "train", **options: Any) -> list[Task]:
    return build("datasets", "textarena", {"game": GAME, **options}).load(split)


def replay(task: Task, moves: list[str]) -> tuple[float | None, list[str]]:
    """The game's own play of ``moves``: made and reset with the task's seed, each move stepped
    until it says done. Returns its reward for the player (None when unfinished) and the texts of
    its messages to the player after each move."""
    episode = task.metadata["textarena"]
    game = ta.make(episode["game"])
    game.reset(num_players=1, seed=episode["seed"])
    inner = game
    while isinstance(inner, ta.Wrapper):
        inner = inner.env
    inner.get_observation()  # the prompt
    texts = []
    for move in moves:
        done, _ = game.step(move)
        if done:
            rewards, _ = game.close()
            return rewards[0], texts
        _, messages = inner.get_observation()
        texts.append([text for sender, text, kind in messages if kind != ta.ObservationType.PLAYER_ACTION])
    return None, texts


# --------------------------------------------------------------------------------------------
# The dataset and the games
# --------------------------------------------------------------------------------------------


def test_episodes_are_seeded_and_train_and_eval_seeds_differ() -> None:
    train, evaluation = episodes(num_train=40, num_eval=10), episodes("eval", num_train=40, num_eval=10)
    seeds = [t.metadata["textarena"]["seed"] for t in train]
    eval_seeds = [t.metadata["textarena"]["seed"] for t in evaluation]
    assert len(set(seeds)) == 40 and len(set(eval_seeds)) == 10 and not set(seeds) & set(eval_seeds)
    assert [t.model_dump() for t in episodes(num_train=40, num_eval=10)] == [t.model_dump() for t in train]
    assert [t.id for t in episodes("test", num_train=40, num_eval=10)] == [t.id for t in evaluation]
    # the eval episodes stay the same when the train split grows
    assert [t.model_dump() for t in episodes("eval", num_train=80, num_eval=10)] == [
        t.model_dump() for t in evaluation
    ]
    assert train[0].id == f"{GAME}/train-0" and train[0].category == GAME
    assert train[0].metadata["textarena"]["game"] == GAME
    mixed = build("datasets", "textarena", {"game": [GAME, "Mastermind-v0"], "num_train": 4}).load("train")
    assert [t.category for t in mixed] == [GAME, "Mastermind-v0", GAME, "Mastermind-v0"]


@pytest.mark.parametrize(
    ("game", "expected"),
    [
        ("GuessTheNumbr-v0", "TextArena has no game 'GuessTheNumbr-v0'. Did you mean 'GuessTheNumber-v0'?"),
        ("TicTacToe-v0", "'TicTacToe-v0' is not a single-player game (AssertionError: The number of players"),
        ("Wordle-v0", "'Wordle-v0' cannot start: it needs nltk data that is not installed"),
        ("ScorableGames-v0", "'ScorableGames-v0' cannot start here: FileNotFoundError"),
    ],
)
def test_games_that_cannot_be_played_are_config_errors(game: str, expected: str) -> None:
    with pytest.raises(ConfigError) as caught:
        episodes(game=game)
    assert caught.value.path == "data.game"
    assert expected in str(caught.value)
    assert "GuessTheNumber-v0, LightsOut-v0" in str(caught.value)  # the games that do start


@pytest.mark.parametrize("game", OFFLINE_GAMES)
def test_the_offline_games_start_and_take_a_move(game: str) -> None:
    """Each game docs/hubs.md lists as working offline starts and answers a move."""
    [task] = build("datasets", "textarena", {"game": game, "num_train": 1, "num_eval": 0}).load("train")
    env = build("environments", "textarena", {"max_turns": 2})
    start = asyncio.run(env.reset(task))
    assert start.messages[-1]["role"] == "user" and len(start.messages[-1]["content"]) > 20
    observation = asyncio.run(env.step(Action(text="[1]"), 0))
    assert observation.done or observation.messages[0]["content"]


# --------------------------------------------------------------------------------------------
# Scripted games: the mapping, token for token, and the game's own rewards
# --------------------------------------------------------------------------------------------


def bisect(prompt: str) -> str:
    """A player of GuessTheNumber that halves the range on each hint (of the last turn's)."""
    low, high = 1, 20
    guesses = [int(g) for g in re.findall(r"\[(\d+)\]", prompt.split("Enter your guess.", 1)[-1])]
    hints = re.findall(r"The target number is (higher|lower)", prompt)
    for guess, hint in zip(guesses, hints, strict=False):
        low, high = (guess + 1, high) if hint == "higher" else (low, guess - 1)
    return f"My guess: [{(low + high) // 2}]"


def scripted(tasks: list[Task], script: Any, tokenizer: Any, *, max_turns: int, **env: Any) -> list[Any]:
    from agent_r1.testing.scripted import scripted_rollout

    return scripted_rollout(
        lambda: build("environments", "textarena", {"max_turns": max_turns, **env}),
        script,
        tasks,
        tokenizer=tokenizer,
        max_turns=max_turns,
        max_context=4096,
    )


def test_scripted_games_map_turns_and_rewards_exactly(tokenizer: Any) -> None:
    tasks = episodes(num_train=6, num_eval=0)
    outer = random.getstate()
    trajectories = scripted(tasks, bisect, tokenizer, max_turns=10)
    assert random.getstate() == outer  # the games drew from their own random states
    env = build("environments", "textarena", {"max_turns": 10})
    env_tokens = 0
    for trajectory, task in zip(trajectories, tasks, strict=True):
        assert trajectory.termination == "game_over" and not trajectory.truncated
        moves = [step.action.text for step in trajectory.steps]
        reward, texts = replay(task, moves)
        assert reward == 1.0  # bisection finds the number within the game's 10 guesses
        assert [(s.name, s.value, s.kind) for s in trajectory.rewards] == [("textarena", reward, "outcome")]
        # each observation is the game's new messages to the player, nothing else
        shown = [step.observation.messages for step in trajectory.steps[:-1]]
        assert shown == [
            [{"role": "user", "content": "\n\n".join(t.strip() for t in text)}] for text in texts
        ]
        assert trajectory.steps[-1].observation.info["textarena"]["reason"].startswith("Congratulations")
        env_tokens += assert_token_fidelity(trajectory, tokenizer, task=task, environment=env)
        # the prompt is the game's own first message
        prompt = tokenizer.decode(
            [t for s in trajectory.segments if s.source is TokenSource.PROMPT for t in s.token_ids]
        )
        assert "You are playing Guess The Number." in prompt and "Play the TextArena game" not in prompt
    assert env_tokens > 0


def test_unfinished_games_and_invalid_moves(tokenizer: Any) -> None:
    tasks = episodes(num_train=2, num_eval=0)
    [repeated, cut] = scripted(
        tasks, ["[1]", "[1]", "[2]"], tokenizer, max_turns=3, system_prompt="Play well."
    )
    for trajectory, task in zip([repeated, cut], tasks, strict=True):
        reward, _ = replay(task, [s.action.text for s in trajectory.steps])
        if reward is not None:  # the number was 1 or 2: the game ended with its own reward
            assert trajectory.termination == "game_over"
            assert [s.value for s in trajectory.rewards] == [reward]
            continue
        assert trajectory.termination == "max_turns" and trajectory.truncated
        assert [(s.name, s.value) for s in trajectory.rewards] == [("textarena", 0.0)]  # unfinished_reward
        assert trajectory.metrics["env/invalid_moves"] == 1.0  # the second [1]
        second = trajectory.steps[1].observation.messages[0]["content"]
        assert second.startswith("You attempted an invalid move.")
    start = asyncio.run(build("environments", "textarena", {"system_prompt": "Play well."}).reset(tasks[0]))
    assert start.messages[0] == {"role": "system", "content": "Play well."}
    [silent] = scripted(tasks[:1], ["[1]"] * 2, tokenizer, max_turns=2, unfinished_reward=None)
    assert silent.rewards == [] or silent.termination == "game_over"


def test_the_environment_refuses_tasks_of_another_dataset() -> None:
    env = build("environments", "textarena", {})
    task = Task(id="q", messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(ConfigError, match=r"set data\.name: textarena"):
        asyncio.run(env.reset(task))


# --------------------------------------------------------------------------------------------
# Training and preflight
# --------------------------------------------------------------------------------------------


def test_two_training_steps_on_the_tiny_model(
    tiny_model_dir: Path, recorder: Any, tmp_path: Path, tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two GRPO steps on GuessTheNumber. The game's step raises at the second move of the games
    whose number is even (monkeypatched: no move makes the real game raise), which the run counts
    as failed episodes and goes on."""
    from textarena.envs.GuessTheNumber.env import GuessTheNumberEnv

    from agent_r1.run.training import train

    package_step = GuessTheNumberEnv.step

    def step(self: Any, action: str) -> Any:
        self.moves = getattr(self, "moves", 0) + 1
        if self.moves == 2 and self.game_number % 2 == 0:
            raise RuntimeError("the game broke")
        return package_step(self, action)

    monkeypatch.setattr(GuessTheNumberEnv, "step", step)
    run_dir = tmp_path / "run"
    data = {"name": "textarena", "game": GAME, "num_train": 8, "num_eval": 1}
    config = run_config(
        tiny_model_dir,
        run_dir,
        data=data,
        environment={"name": "textarena", "max_turns": 3},
        rewards=[],
        success_signal="textarena",
        max_turns=3,
    )
    summary = train(write_config(tmp_path / "ta.yaml", config), [])

    assert summary["steps"] == 2
    lines = metrics_lines(run_dir)
    assert [line["step"] for line in lines] == [1, 2]
    assert all("reward/textarena" in line and "env/invalid_moves" in line for line in lines)
    failed = sum(line["errors/failed_episodes"] for line in lines)
    assert failed > 0, "the seed no longer draws an even number; change the monkeypatched step"
    trajectories = recorder.trajectories
    assert len(trajectories) + failed == 2 * 2 * 2
    monkeypatch.setattr(GuessTheNumberEnv, "step", package_step)
    tasks = {t.id: t for t in episodes(num_train=8, num_eval=1)}
    env = build("environments", "textarena", {"max_turns": 3})
    env_tokens = 0
    for trajectory in trajectories:
        task = tasks[trajectory.task_id]
        env_tokens += assert_token_fidelity(trajectory, tokenizer, task=task, environment=env)
        reward, _ = replay(task, [step.action.text for step in trajectory.steps])
        assert [s.value for s in trajectory.rewards] == [0.0 if reward is None else reward]
    assert env_tokens > 0


def check_config(tmp_path: Path, tiny_model_dir: Path, game: str) -> Path:
    config = run_config(
        tiny_model_dir,
        tmp_path / "run",
        data={"name": "textarena", "game": game, "num_train": 4, "num_eval": 1},
        environment={"name": "textarena", "max_turns": 3},
        rewards=[],
        success_signal="textarena",
        max_turns=3,
    )
    return write_config(tmp_path / "check.yaml", config)


def test_check_passes_a_good_config(tmp_path: Path, tiny_model_dir: Path) -> None:
    code, report = agent_r1_check(check_config(tmp_path, tiny_model_dir, GAME))
    assert code == 0, failures(report)
    [prompts] = [c["message"] for c in report if c["name"] == "prompts"]
    assert prompts.startswith("first 4 train prompts")


def test_check_stops_on_an_unknown_game_or_a_missing_package(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    code, report = agent_r1_check(check_config(tmp_path, tiny_model_dir, "TicTacToe-v0"))
    assert code == 2
    failed = failures(report)
    assert set(failed) == {"data", "component"}
    assert (
        "agent-r1 plays single-player games only (two-player games are not supported yet)" in failed["data"]
    )
    assert not (tmp_path / "run").exists()

    # sys.modules[name] = None makes `import textarena` raise ImportError in this process: the
    # check's view of a machine without the package (the check path only imports; it loads no model)
    monkeypatch.setitem(sys.modules, "textarena", None)
    code, report = agent_r1_check(check_config(tmp_path, tiny_model_dir, GAME))
    assert code == 2
    failed = failures(report)
    assert set(failed) == {"data", "component"}
    assert "install it with: pip install 'agent-r1-plugin-hubs[textarena]'" in failed["data"]
    assert "data (textarena) needs the textarena package" in failed["data"]
    assert "environment (textarena) needs the textarena package" in failed["component"]
    assert not (tmp_path / "run").exists()


def test_the_example_config_is_valid_and_its_episodes_end_in_the_game() -> None:
    """examples/textarena_guess_the_number.yaml (docs/hubs.md): valid, the engine's turn budget
    covers the environment's (so that every episode ends with the outcome signal)."""
    config, components = example_components("textarena_guess_the_number.yaml")
    data = components["data"]
    assert len(data.cls(data.config).load("eval")) == 32
    assert config.rollout.max_turns >= components["environment"].config.max_turns
    assert config.eval.success_signal == components["environment"].config.signal_name
    assert config.rewards == []


def test_plugins_list_shows_the_components_with_their_origin(monkeypatch: pytest.MonkeyPatch) -> None:
    """Listed under the plugin hubs and its distribution, also where textarena is missing."""
    assert_listed_with_or_without(
        "textarena", {"datasets": "textarena", "environments": "textarena"}, monkeypatch
    )
