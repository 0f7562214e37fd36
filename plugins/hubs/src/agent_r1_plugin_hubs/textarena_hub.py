"""TextArena (https://github.com/LeonGuertler/TextArena) single-player games as agent-r1 components:
the ``textarena`` dataset (episodes: a game id and a seed each) and the ``textarena`` environment,
which plays the task's game over several turns::

    data:
      name: textarena
      game: GuessTheNumber-v0           # a TextArena env id, or a list of them (episodes alternate)
      num_train: 256
      num_eval: 32
      seed: 0
    environment:
      name: textarena
      max_turns: 10
    rewards: []                         # the game's own reward is the environment's outcome signal
    eval:
      success_signal: textarena

How a game maps onto an episode:

* reset: ``textarena.make(game)``, ``reset(num_players=1, seed=task seed)``; the game's first
  messages (its prompt, the board) become the user message of the prompt (the task's own message
  only names the game and seed);
* each turn: the action's text goes to the game's ``step`` (through the game's action wrappers,
  e.g. ``ActionFormattingWrapper``, which adds ``[...]`` around a move written without them); the
  game's new messages for the player (hints, the board, invalid-move notices; not the echo of the
  player's own move) come back as one user message, which the engine renders with the chat
  template;
* the end: when the game says done, its reward for player 0 (``close()``) is an outcome signal
  named ``textarena`` (a win is 1; some games give partial credit or -1 for invalid moves), with the
  game's reason in ``observation.info``; when the environment's ``max_turns`` ends an unfinished
  game, the signal is ``unfinished_reward``.

TextArena's observation wrappers (``LLMObservationWrapper``...) are not used: they re-send the
whole history as one text every turn, for agents without memory, while an agent-r1 episode is a
conversation that already holds it. Each game's Python ``random`` state is its own: TextArena
seeds the process-wide ``random`` at reset, and an episode's game draws from it as it steps, so the
environment swaps the game's state in and out around each call; episodes then replay the same way
whatever else runs between their turns.
"""

from __future__ import annotations

import contextlib
import random
import re
import threading
from collections.abc import Iterator, Sequence
from typing import Any

from pydantic import Field, field_validator

from agent_r1 import (
    Action,
    ComponentConfig,
    Dataset,
    Environment,
    EpisodeStart,
    Observation,
    RewardSignal,
    Task,
)
from agent_r1.errors import AgentR1Error, ConfigError, did_you_mean
from agent_r1.records import split_key
from agent_r1_plugin_hubs.requirements import require

__all__ = ["DATASETS", "ENVIRONMENTS", "OFFLINE_GAMES", "TextArenaDataset", "TextArenaEnv"]

METADATA_KEY = "textarena"
"""The key of ``task.metadata`` that holds the episode: ``game`` (the env id) and ``seed``."""

OFFLINE_GAMES = (
    "2048-v0",
    "Bandit-v0",
    "Blackjack-v0",
    "Countdown-v0",
    "Crosswords-v0",
    "Cryptarithm-v0",
    "FifteenPuzzle-v0",
    "FrozenLake-v0",
    "GuessTheNumber-v0",
    "LightsOut-v0",
    "LogicPuzzle-v0",
    "Mastermind-v0",
    "Minesweeper-v0",
    "PegJump-v0",
    "RushHour-v0",
    "Secretary-v0",
    "Set-v0",
    "Slitherlink-v0",
    "Sokoban-v0",
    "Sudoku-v0",
    "ThreeCardMonte-v0",
    "TowerOfHanoi-v0",
)
"""Single-player games of textarena 0.7.4 that start without network access or downloaded data
(one id per family; their other variants, ``-hard`` and so on, work too). A test plays a turn of
each. Games that need nltk corpora (Hangman, Wordle, WordLadder, WordSearch, SpellingBee) or an
OpenRouter key (GuessWho, TwentyQuestions) do not start offline."""

_SEED_RANGE = 2**31


def _component(kind: str) -> str:
    return f"{kind} (textarena)"


# --------------------------------------------------------------------------------------------
# Games
# --------------------------------------------------------------------------------------------


@contextlib.contextmanager
def _own_random(state: list[Any]) -> Iterator[None]:
    """Run a game call with the game's own ``random`` state (``state[0]``; ``None`` before its
    reset seeds it), keeping the process-wide state as it was."""
    outer = random.getstate()
    if state[0] is not None:
        random.setstate(state[0])
    try:
        yield
    finally:
        state[0] = random.getstate()
        random.setstate(outer)


def _innermost(game: Any, ta: Any) -> Any:
    while isinstance(game, ta.Wrapper):
        game = game.env
    return game


def _first_line(exc: BaseException) -> str:
    lines = [line.strip(" *") for line in str(exc).splitlines() if line.strip(" *")]
    return f"{type(exc).__name__}: {lines[0] if lines else '(no message)'}"


_probed: dict[str, str | None] = {}
_probe_lock = threading.Lock()


def check_game(ta: Any, game: str, path: str) -> None:
    """Raise :class:`ConfigError` unless ``game`` is a registered single-player TextArena game that
    starts here (built and reset once per process)."""
    registry = ta.envs.registration.ENV_REGISTRY
    if game not in registry:
        hint = did_you_mean(game, sorted(registry))
        raise ConfigError(
            f"{path}: TextArena has no game {game!r}.{hint} Single-player games that run offline: "
            f"{', '.join(OFFLINE_GAMES)} (textarena.envs.registration.ENV_REGISTRY lists every id)",
            path=path,
        )
    with _probe_lock:
        if game not in _probed:
            _probed[game] = _probe(ta, game)
        problem = _probed[game]
    if problem is not None:
        raise ConfigError(f"{path}: {problem}", path=path)


def _probe(ta: Any, game: str) -> str | None:
    """Why ``game`` cannot be played here, or ``None``."""
    state: list[Any] = [None]
    try:
        with _own_random(state):
            made = ta.make(game)
            made.reset(num_players=1, seed=0)
    except AssertionError as exc:  # the game's State checks its number of players
        return (
            f"TextArena game {game!r} is not a single-player game ({_first_line(exc)}); agent-r1 plays "
            f"single-player games only (two-player games are not supported yet). Single-player games: "
            f"{', '.join(OFFLINE_GAMES)}"
        )
    except LookupError as exc:  # nltk's "Resource ... not found"
        named = re.search(r"Resource\W+([\w.]+)", str(exc))
        resource = named.group(1) if named else "<the resource named above>"
        return (
            f"TextArena game {game!r} cannot start: it needs nltk data that is not installed "
            f"({_first_line(exc)}); download it where the machine can reach the internet "
            f"(python -m nltk.downloader {resource}), or pick a game that needs none: "
            f"{', '.join(OFFLINE_GAMES)}"
        )
    except Exception as exc:
        return (
            f"TextArena game {game!r} cannot start here: {_first_line(exc)}. Games that start offline: "
            f"{', '.join(OFFLINE_GAMES)}"
        )
    if not isinstance(_innermost(made, ta).state, ta.SinglePlayerState):
        return (
            f"TextArena game {game!r} is a game for several players; agent-r1 plays single-player games "
            f"only (two-player games are not supported yet). Single-player games: {', '.join(OFFLINE_GAMES)}"
        )
    return None


# --------------------------------------------------------------------------------------------
# Dataset: episodes
# --------------------------------------------------------------------------------------------


class TextArenaDataset(Dataset):
    """Episodes of TextArena single-player games: each task names a game and a seed
    (``task.metadata["textarena"]``); the ``textarena`` environment plays it. Splits: ``train``,
    ``eval`` (also ``test``, ``validation``) and ``all`` (eval, then train). Train and eval seeds
    are distinct; a game with few distinct starts (GuessTheNumber-v0 hides one of 20 numbers)
    still repeats starting states across them, whatever the seeds."""

    name = "textarena"

    class Config(ComponentConfig):
        """Options of :class:`TextArenaDataset`."""

        game: str | list[str] = Field(
            description="a TextArena env id (GuessTheNumber-v0...) or a list of them; episodes cycle "
            "through the list"
        )
        num_train: int = Field(256, ge=1, description="train episodes")
        num_eval: int = Field(32, ge=0, description="eval episodes (seeds not used in train)")
        seed: int = Field(0, description="seed from which the episodes' seeds are drawn")

        @field_validator("game")
        @classmethod
        def _games(cls, game: str | list[str]) -> str | list[str]:
            games = [game] if isinstance(game, str) else game
            if not games:
                raise ValueError("game is an empty list; name at least one TextArena env id")
            repeated = sorted({g for g in games if games.count(g) > 1})
            if repeated:
                raise ValueError(f"game lists {', '.join(map(repr, repeated))} more than once")
            return game

        def games(self) -> list[str]:
            return [self.game] if isinstance(self.game, str) else list(self.game)

    config: Config

    @classmethod
    def check(cls, config: Config) -> list[str]:
        """Preflight: the package is installed and every game starts here as a single-player game."""
        _check_games(config)
        return []

    def load(self, split: str) -> list[Task]:
        """The episodes of ``split`` (the same config always gives the same seeds)."""
        key = split_key(self.name, split, error=lambda message: ConfigError(message, path="eval.split"))
        _check_games(self.config)
        used: set[int] = set()
        evaluation = self._episodes("eval", self.config.num_eval, used)
        train = self._episodes("train", self.config.num_train, used)
        return {"train": train, "eval": evaluation, "all": evaluation + train}[key]

    def _episodes(self, split: str, count: int, used: set[int]) -> list[Task]:
        rng = random.Random(f"agent-r1/textarena/{split}/{self.config.seed}")
        games = self.config.games()
        tasks = []
        for index in range(count):
            seed = rng.randrange(_SEED_RANGE)
            while seed in used:
                seed = rng.randrange(_SEED_RANGE)
            used.add(seed)
            game = games[index % len(games)]
            tasks.append(
                Task(
                    id=f"{game}/{split}-{index}",
                    messages=[{"role": "user", "content": f"Play the TextArena game {game} (seed {seed})."}],
                    category=game,
                    metadata={METADATA_KEY: {"game": game, "seed": seed}},
                )
            )
        return tasks


def _check_games(config: TextArenaDataset.Config) -> None:
    ta = require("textarena", component=_component("data"), path="data.name")
    for index, game in enumerate(config.games()):
        check_game(ta, game, "data.game" if isinstance(config.game, str) else f"data.game[{index}]")


# --------------------------------------------------------------------------------------------
# Environment: one game per episode
# --------------------------------------------------------------------------------------------


class TextArenaEnv(Environment):
    """Plays the task's TextArena single-player game (see the module docstring for the mapping).

    Termination: ``game_over`` when the game says done (its reward is the outcome signal);
    ``max_turns`` when ``max_turns`` actions did not finish it (outcome ``unfinished_reward``, or no
    signal when that is null). Keep ``rollout.max_turns`` at least ``max_turns``: an episode the
    engine cuts first never reaches the game's end, and gets no signal. The step's metric
    ``invalid_moves`` (logged as ``env/invalid_moves``) counts moves the game refused.
    """

    name = "textarena"

    class Config(ComponentConfig):
        """Options of :class:`TextArenaEnv`."""

        max_turns: int = Field(
            20, ge=1, description="actions per episode at most (games have their own limits)"
        )
        system_prompt: str | None = Field(None, description="system message before the game's first message")
        signal_name: str = Field(
            "textarena", min_length=1, description="name of the outcome signal (eval.success_signal reads it)"
        )
        unfinished_reward: float | None = Field(
            0.0, description="outcome when max_turns ends a game that has not ended (null: no signal)"
        )

    config: Config

    def __init__(self, config: Any = None) -> None:
        super().__init__(config)
        self._ta: Any = None
        self._game: Any = None
        self._inner: Any = None
        self._random: list[Any] = [None]
        self._game_id = ""

    @classmethod
    def check(cls, config: Config) -> list[str]:
        """Preflight: the package is installed (the data check names the games)."""
        require("textarena", component=_component("environment"), path="environment.name")
        return []

    async def reset(self, task: Task) -> EpisodeStart:
        """Start the task's game with its seed; its first messages are the prompt."""
        ta = self._ta = require("textarena", component=_component("environment"), path="environment.name")
        episode = task.metadata.get(METADATA_KEY)
        if not isinstance(episode, dict) or not isinstance(episode.get("game"), str):
            raise ConfigError(
                f"environment 'textarena' plays tasks of the textarena dataset, but task {task.id!r} names "
                "no game in its metadata; set data.name: textarena (with data.game)",
                path="data.name",
            )
        self._game_id = episode["game"]
        check_game(ta, self._game_id, "data.game")
        with _own_random(self._random):
            self._game = ta.make(self._game_id)
            self._game.reset(num_players=1, seed=int(episode["seed"]))
        self._inner = _innermost(self._game, ta)
        messages = []
        if self.config.system_prompt:
            messages.append({"role": "system", "content": self.config.system_prompt})
        messages.append({"role": "user", "content": self._new_messages()})
        return EpisodeStart(messages=messages)

    async def step(self, action: Action, turn: int) -> Observation:
        """Play the action's text as the player's move; the game's answer, or the end."""
        if self._game is None:
            raise AgentR1Error(
                "environment 'textarena': step() before reset(); the engine resets every episode"
            )
        with _own_random(self._random):
            done, _ = self._game.step(action.text)
        state = self._inner.state
        info: dict[str, Any] = {"game": self._game_id, "turn": turn}
        if done:
            rewards, game_info = self._game.close()
            player = (game_info or {}).get(0, {})
            if not rewards or 0 not in rewards:
                raise AgentR1Error(
                    f"TextArena game {self._game_id!r} ended at turn {turn} without a reward for the player "
                    f"(rewards {rewards!r}, reason {player.get('reason')!r})"
                )
            info.update(reason=player.get("reason"), reward=float(rewards[0]))
            invalid = bool(player.get("invalid_move"))
            signals = [self._outcome(float(rewards[0]))]
            return self._observation([], signals, info, invalid, done=True, termination="game_over")
        invalid = getattr(state, "error_count", 0) > 0
        if turn + 1 >= self.config.max_turns:
            value = self.config.unfinished_reward
            signals = [] if value is None else [self._outcome(value)]
            info["reason"] = f"not finished after {turn + 1} turns (environment.max_turns)"
            return self._observation([], signals, info, invalid, done=True, termination="max_turns")
        messages = [{"role": "user", "content": self._new_messages()}]
        return self._observation(messages, [], info, invalid, done=False, termination=None)

    def _new_messages(self) -> str:
        """The game's messages to the player since the last call, as one text (not the echo of the
        player's own move, which the conversation already holds)."""
        player, messages = self._inner.get_observation()
        parts = [
            str(text).strip()
            for sender, text, kind in messages
            if not (sender == player and kind == self._ta.ObservationType.PLAYER_ACTION) and str(text).strip()
        ]
        return "\n\n".join(parts) or "(The game has nothing new to say. Make your next move.)"

    def _outcome(self, value: float) -> RewardSignal:
        return RewardSignal(name=self.config.signal_name, value=value, kind="outcome", source=self.name)

    @staticmethod
    def _observation(
        messages: Sequence[dict[str, Any]],
        rewards: list[RewardSignal],
        info: dict[str, Any],
        invalid: bool,
        *,
        done: bool,
        termination: str | None,
    ) -> Observation:
        return Observation(
            messages=list(messages),
            rewards=rewards,
            done=done,
            termination=termination,
            info={METADATA_KEY: info},
            metrics={"invalid_moves": float(invalid)},
        )


DATASETS: list[type[Dataset]] = [TextArenaDataset]
ENVIRONMENTS: list[type[Environment]] = [TextArenaEnv]
SHAPERS: list[Any] = []
