"""reasoning-gym (https://github.com/open-thought/reasoning-gym) as agent-r1 components: the
``reasoning_gym`` dataset, which turns any of its procedural generators into tasks, and the
``reasoning_gym`` reward shaper, which scores the agent's final answer with the generator's own
``score_answer``::

    data:
      name: reasoning_gym
      task: basic_arithmetic            # or a list: [{name: chain_sum, weight: 2}, {name: leg_counting}]
      config: {max_terms: 2}            # the generator's options (its *Config dataclass)
      num_train: 1000
      num_eval: 100
      seed: 0
    environment:                        # one reply; the answer is <answer>...</answer>
      name: tool_env
      tools: []
      max_turns: 1
    rewards:
      - {name: reasoning_gym}
    eval:
      success_signal: reasoning_gym

Each task carries the generator's item (question, answer, metadata) with the generator's name and
options in ``task.metadata["reasoning_gym"]``, so that the shaper rebuilds the same scorer.

Splits: the generators index items by ``seed + index`` (two seeds a few apart give the same items,
shifted), and small generators repeat questions. So eval is drawn first from a seed far from the
train seed, then train; each split keeps only questions not seen before in it, in the other split
or among the few-shot examples (by question text).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pydantic import Field, model_validator

from agent_r1 import ComponentConfig, Dataset, RewardShaper, RewardSignal, Task, Trajectory
from agent_r1.errors import ConfigError, did_you_mean, suggestions
from agent_r1.records import split_key
from agent_r1.rewards import final_answer
from agent_r1_plugin_hubs.requirements import require

__all__ = ["DATASETS", "SHAPERS", "ReasoningGymDataset", "ReasoningGymScore"]

METADATA_KEY = "reasoning_gym"
"""The key of ``task.metadata`` that holds what scoring needs: ``dataset`` (the generator's name),
``config`` (its options) and ``entry`` (the item: question, answer, metadata)."""

EVAL_SEED_OFFSET = 1_000_000_007
"""Eval items come from ``seed + EVAL_SEED_OFFSET``: far from every train index, since a generator
seeds item ``i`` with ``seed + i``."""
FEW_SHOT_SEED_OFFSET = 2_000_000_014
"""Few-shot examples come from ``seed + FEW_SHOT_SEED_OFFSET``."""
DRAWS_PER_ITEM = 20
"""A split of ``n`` distinct questions draws at most ``DRAWS_PER_ITEM * n + 100`` items."""
RESERVED_OPTIONS = ("seed", "size")
"""Generator options the dataset sets itself (from ``seed`` and the split sizes)."""


class WeightedTask(ComponentConfig):
    """One generator of a composite ``task`` list (reasoning-gym's ``DatasetSpec``)."""

    name: str = Field(description="the reasoning-gym dataset name, e.g. basic_arithmetic")
    weight: float = Field(1.0, gt=0, description="how often items come from it, relative to the others")
    config: dict[str, Any] = Field(default_factory=dict, description="its generator options")


def _component(kind: str) -> str:
    return f"{kind} (reasoning_gym)"


class ReasoningGymDataset(Dataset):
    """Tasks from a reasoning-gym generator (or a weighted mix of them), seeded, with train and
    eval splits that share no question (see the module docstring). Splits: ``train``, ``eval``
    (also ``test``, ``validation``) and ``all`` (eval, then train).

    Each task's user message is ``user_template`` filled with the item's question, after the
    optional ``system_prompt`` and ``few_shot`` worked examples (items of the same generator, their
    answers written as ``few_shot_answer``); ``task.answer`` is the item's answer and
    ``task.category`` the generator's name.
    """

    name = "reasoning_gym"

    class Config(ComponentConfig):
        """Options of :class:`ReasoningGymDataset`."""

        task: str | list[WeightedTask] = Field(
            description="a reasoning-gym dataset name (basic_arithmetic, leg_counting...) or a list of "
            "{name, weight, config} mixed as reasoning-gym's composite dataset mixes them"
        )
        config: dict[str, Any] = Field(
            default_factory=dict,
            description="generator options of task (a name); with a list, each entry has its own config",
        )
        num_train: int = Field(1000, ge=1, description="train tasks (distinct questions)")
        num_eval: int = Field(100, ge=0, description="eval tasks (distinct questions, none in train)")
        seed: int = Field(0, ge=0, description="seed of the generators")
        system_prompt: str | None = Field(None, description="system message before the question")
        user_template: str = Field("{question}", description="the user message; {question} is filled in")
        few_shot: int = Field(
            0, ge=0, le=16, description="worked examples shown as earlier turns (items in neither split)"
        )
        few_shot_answer: str = Field(
            "<answer>{answer}</answer>",
            description="how an example's assistant turn writes its answer ({answer} is filled in)",
        )

        @model_validator(mode="after")
        def _check(self) -> ReasoningGymDataset.Config:
            if not isinstance(self.task, str) and self.config:
                raise ValueError(
                    "config is the options of a single task; with a list of tasks give each entry its "
                    "own config ({name: ..., weight: ..., config: {...}})"
                )
            if isinstance(self.task, list):
                if not self.task:
                    raise ValueError("task is an empty list; name at least one reasoning-gym dataset")
                names = [entry.name for entry in self.task]
                repeated = sorted({name for name in names if names.count(name) > 1})
                if repeated:
                    raise ValueError(f"task lists {', '.join(map(repr, repeated))} more than once")
            for name, options in self.specs():
                reserved = [key for key in RESERVED_OPTIONS if key in options]
                if reserved:
                    raise ValueError(
                        f"the options of {name!r} set {', '.join(reserved)}, which the dataset sets itself: "
                        "use seed, num_train and num_eval instead"
                    )
            for template, field in ((self.user_template, "question"), (self.few_shot_answer, "answer")):
                if "{" + field + "}" not in template:
                    raise ValueError(f"template {template!r} must contain {{{field}}}")
            return self

        def specs(self) -> list[tuple[str, dict[str, Any]]]:
            """``(name, options)`` of each generator."""
            if isinstance(self.task, str):
                return [(self.task, dict(self.config))]
            return [(entry.name, dict(entry.config)) for entry in self.task]

    config: Config

    @classmethod
    def check(cls, config: Config) -> list[str]:
        """Preflight: the package is installed and every generator name exists (the data check then
        generates the splits, which also checks the options)."""
        rg = require("reasoning_gym", component=_component("data"), path="data.name")
        _check_names(rg, config)
        return []

    def load(self, split: str) -> list[Task]:
        """The tasks of ``split`` (fresh copies; the same config always gives the same tasks)."""
        key = split_key(self.name, split, error=lambda message: ConfigError(message, path="eval.split"))
        require("reasoning_gym", component=_component("data"), path="data.name")  # even when cached
        train, evaluation = _splits(self.config)
        tasks = {"train": train, "eval": evaluation, "all": evaluation + train}[key]
        return [task.model_copy(deep=True) for task in tasks]


# --------------------------------------------------------------------------------------------
# Generating the splits
# --------------------------------------------------------------------------------------------

_SPLITS_CACHE_SIZE = 4
_splits_cache: OrderedDict[str, tuple[list[Task], list[Task]]] = OrderedDict()
_cache_lock = threading.Lock()


def _splits(config: ReasoningGymDataset.Config) -> tuple[list[Task], list[Task]]:
    """The train and eval tasks of ``config``, generated once per process (preflight and the run
    both load them; a slow generator then pays once)."""
    key = json.dumps(config.model_dump(mode="json"), sort_keys=True)
    with _cache_lock:
        if key in _splits_cache:
            _splits_cache.move_to_end(key)
            return _splits_cache[key]
    built = _generate(config)
    with _cache_lock:
        _splits_cache[key] = built
        while len(_splits_cache) > _SPLITS_CACHE_SIZE:
            _splits_cache.popitem(last=False)
    return built


def _check_names(rg: Any, config: ReasoningGymDataset.Config) -> None:
    known = sorted(name for name in rg.factory.DATASETS if name != "composite")
    for index, (name, _) in enumerate(config.specs()):
        if name in known:
            continue
        path = "data.task" if isinstance(config.task, str) else f"data.task[{index}].name"
        if name == "composite":
            advice = "To mix datasets, list them under data.task ({name, weight, config} entries)"
        elif suggestions(name, known):
            advice = did_you_mean(name, known).strip()
        else:
            advice = f"Its datasets: {', '.join(known)}"
        raise ConfigError(f"{path}: reasoning-gym has no dataset {name!r}. {advice}", path=path)


def _generate(config: ReasoningGymDataset.Config) -> tuple[list[Task], list[Task]]:
    rg = require("reasoning_gym", component=_component("data"), path="data.name")
    _check_names(rg, config)
    seen: set[str] = set()
    examples = _draw(rg, config, config.seed + FEW_SHOT_SEED_OFFSET, config.few_shot, seen, "few_shot")
    few_shot: list[dict[str, Any]] = []
    for entry in examples:
        few_shot.append({"role": "user", "content": config.user_template.format(question=entry["question"])})
        few_shot.append(
            {"role": "assistant", "content": config.few_shot_answer.format(answer=entry["answer"])}
        )
    evaluation = _draw(rg, config, config.seed + EVAL_SEED_OFFSET, config.num_eval, seen, "num_eval")
    train = _draw(rg, config, config.seed, config.num_train, seen, "num_train")
    return (
        [_task(config, entry, "train", i, few_shot) for i, entry in enumerate(train)],
        [_task(config, entry, "eval", i, few_shot) for i, entry in enumerate(evaluation)],
    )


def _generator(rg: Any, config: ReasoningGymDataset.Config, seed: int, size: int) -> Any:
    """reasoning-gym's generator of ``config`` with ``seed`` and room for ``size`` items."""
    specs = config.specs()
    single = isinstance(config.task, str)
    try:
        if single:
            name, options = specs[0]
            return rg.create_dataset(name, **options, seed=seed, size=size)
        from reasoning_gym.composite import DatasetSpec

        assert isinstance(config.task, list)
        mix = [DatasetSpec(name=e.name, weight=e.weight, config=dict(e.config)) for e in config.task]
        return rg.create_dataset("composite", datasets=mix, seed=seed, size=size)
    except TypeError as exc:  # an option its *Config dataclass does not have
        raise _options_error(rg, config, exc) from None
    except (AssertionError, ValueError, KeyError) as exc:  # the *Config.validate() checks
        where = "data.config" if single else "data.task"
        raise ConfigError(
            f"{where}: reasoning-gym refused the options of {_described(config)}: "
            f"{type(exc).__name__}: {exc or 'invalid options'}. Fix them (see the generator's Config "
            "dataclass in reasoning-gym)",
            path=where,
        ) from None


def _options_error(rg: Any, config: ReasoningGymDataset.Config, exc: Exception) -> ConfigError:
    for index, (name, options) in enumerate(config.specs()):
        fields = [f.name for f in dataclasses.fields(rg.factory.DATASETS[name][1])]
        unknown = [key for key in options if key not in fields]
        if unknown:
            path = "data.config" if isinstance(config.task, str) else f"data.task[{index}].config"
            allowed = [f for f in fields if f not in RESERVED_OPTIONS]
            named = [repr(key) + _closest(key, allowed) for key in unknown]
            return ConfigError(
                f"{path}: reasoning-gym dataset {name!r} has no option{'s' if len(unknown) > 1 else ''} "
                f"{', '.join(named)}. Its options: {', '.join(allowed)}",
                path=path,
            )
    return ConfigError(
        f"data.config: reasoning-gym could not build {_described(config)}: TypeError: {exc}",
        path="data.config",
    )


def _closest(word: str, options: Sequence[str]) -> str:
    close = suggestions(word, options, limit=2)
    return f" (did you mean {' or '.join(map(repr, close))}?)" if close else ""


def _described(config: ReasoningGymDataset.Config) -> str:
    names = [name for name, _ in config.specs()]
    return repr(names[0]) if len(names) == 1 else f"the mix of {', '.join(map(repr, names))}"


def _draw(
    rg: Any, config: ReasoningGymDataset.Config, seed: int, count: int, seen: set[str], option: str
) -> list[dict[str, Any]]:
    """``count`` items whose questions are not in ``seen`` (which grows with them), from the
    generator seeded with ``seed``."""
    if count == 0:
        return []
    limit = DRAWS_PER_ITEM * count + 100
    generator = _generator(rg, config, seed, limit)
    items: list[dict[str, Any]] = []
    for index in range(limit):
        try:
            entry = generator[index]
        except Exception as exc:  # a generator that cannot make items (missing data files...)
            raise ConfigError(
                f"data.task: reasoning-gym's {_described(config)} failed to generate item {index} "
                f"(seed {seed}): {type(exc).__name__}: {exc}. Check data.config, or pick another dataset",
                path="data.task",
            ) from None
        question = entry.get("question") if isinstance(entry, Mapping) else None
        if not isinstance(question, str) or question in seen:
            continue
        seen.add(question)
        items.append(entry)
        if len(items) == count:
            return items
    raise ConfigError(
        f"data.{option}: reasoning-gym's {_described(config)} gave only {len(items)} new distinct "
        f"questions in {limit} draws (questions already in another split or the few-shot examples do "
        f"not count), short of {option}={count}. Lower data.{option}, or widen data.config so that "
        "the generator has more distinct questions",
        path=f"data.{option}",
    )


def _task(
    config: ReasoningGymDataset.Config, entry: dict[str, Any], split: str, index: int, few_shot: Sequence[Any]
) -> Task:
    options_of = dict(config.specs())
    metadata = entry.get("metadata") or {}
    source = str(metadata.get("source_dataset") or "")
    if source not in options_of:  # a generator that does not name itself: the single task
        source = next(iter(options_of))
    messages: list[dict[str, Any]] = []
    if config.system_prompt:
        messages.append({"role": "system", "content": config.system_prompt})
    messages.extend(copy.deepcopy(list(few_shot)))
    messages.append({"role": "user", "content": config.user_template.format(question=entry["question"])})
    return Task(
        id=f"{source}/{split}-{index}",
        messages=messages,
        answer=entry.get("answer"),
        category=source,
        metadata={METADATA_KEY: {"dataset": source, "config": dict(options_of[source]), "entry": entry}},
    )


# --------------------------------------------------------------------------------------------
# Scoring
# --------------------------------------------------------------------------------------------

_scorers: dict[str, Any] = {}
_scorers_lock = threading.Lock()


def scorer(name: str, options: Mapping[str, Any]) -> Any:
    """reasoning-gym's dataset ``name`` built with ``options`` (its ``score_answer`` may read them),
    built once per process."""
    key = json.dumps([name, dict(options)], sort_keys=True, default=repr)
    with _scorers_lock:
        if key not in _scorers:
            rg = require("reasoning_gym", component=_component("reward shaper"), path="rewards")
            _scorers[key] = rg.create_dataset(name, **dict(options))
        return _scorers[key]


class ReasoningGymScore(RewardShaper):
    """Outcome reward: reasoning-gym's own ``score_answer(answer, entry)`` of the episode's final
    answer (the last step's parsed answer: with ``tool_env`` and the ``tags`` format, the first
    ``<answer>...</answer>`` of the reply, stripped; ``None`` when the reply has none, which the
    generator scores, usually 0). Scores tasks of the ``reasoning_gym`` dataset only.

    ``on_error``: when ``score_answer`` raises (some generators do on answers they cannot parse),
    ``fail`` records the exception on the trajectory, which the run counts as a failed episode and
    leaves out of the update (``errors/failed_episodes``; the run stops above
    ``trainer.max_error_rate``); ``zero`` scores such an answer 0 and emits a second signal,
    ``<signal_name>_error`` = 1 with weight 0, so that ``reward/<signal_name>_error`` counts them.
    ``partial_credit: false`` keeps only full marks (a score of 1 stays 1, anything less is 0).
    """

    name = "reasoning_gym"

    class Config(ComponentConfig):
        """Options of :class:`ReasoningGymScore`."""

        signal_name: str = Field(
            "reasoning_gym", min_length=1, description="name of the signal (eval.success_signal reads it)"
        )
        partial_credit: bool = Field(
            True,
            description="the package's score as it is (true), or only its full marks: 1 for a score of 1, "
            "else 0 (false; for generators whose partial credit pays wrong answers, e.g. basic_arithmetic "
            "gives 0.5 to -4 for 4)",
        )
        on_error: Literal["fail", "zero"] = Field(
            "fail",
            description="score_answer raised: fail (a counted failed episode, not trained on) or zero "
            "(scored 0, counted in <signal_name>_error)",
        )

    config: Config

    @classmethod
    def check(cls, config: Config) -> list[str]:
        """Preflight: the package is installed."""
        require("reasoning_gym", component=_component("reward shaper"), path="rewards")
        return []

    def score(self, trajectory: Trajectory, task: Task) -> list[RewardSignal]:
        """One outcome signal: the generator's score of the final answer."""
        data = task.metadata.get(METADATA_KEY)
        if not isinstance(data, Mapping) or not {"dataset", "config", "entry"} <= set(data):
            raise ConfigError(
                f"reward shaper 'reasoning_gym' scores tasks of the reasoning_gym dataset, but task "
                f"{task.id!r} has no reasoning-gym item in its metadata; set data.name: reasoning_gym "
                "or use another reward shaper",
                path="rewards",
            )
        answer = final_answer(trajectory)
        generator = scorer(str(data["dataset"]), data["config"])
        try:
            value = float(generator.score_answer(answer, data["entry"]))
        except Exception:
            if self.config.on_error == "fail":
                raise  # recorded on the trajectory by the engine: a counted failed episode
            return [self._signal(0.0), self._signal(1.0, suffix="_error", weight=0.0)]
        if not self.config.partial_credit:
            value = 1.0 if value >= 1.0 else 0.0
        return [self._signal(value)]

    def _signal(self, value: float, *, suffix: str = "", weight: float = 1.0) -> RewardSignal:
        return RewardSignal(
            name=self.config.signal_name + suffix,
            value=value,
            kind="outcome",
            weight=weight,
            source=self.name,
        )


DATASETS: list[type[Dataset]] = [ReasoningGymDataset]
ENVIRONMENTS: list[Any] = []
SHAPERS: list[type[RewardShaper]] = [ReasoningGymScore]
