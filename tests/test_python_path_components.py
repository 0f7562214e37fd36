"""Components given as a Python path (``module:function`` / ``module:Class``) instead of a plugin:
reward functions and dataset functions wrapped as components, classes checked against their
contract, the rule that tells ``plugin:name`` from ``module:attribute``, the error messages, and a
real ``agent-r1 rollout`` that imports both from the working directory.

The modules are real files written into ``tmp_path`` (each test uses its own module names, so no
test sees another's cached import)."""

from __future__ import annotations

import asyncio
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from foundation_helpers import run_cli
from trainer_helpers import toy_config, write_config, write_tiny_checkpoint

from agent_r1 import AgentR1Error, ComponentNotFound, ConfigError, RewardShaper
from agent_r1.config import RunConfig, validate_components
from agent_r1.contracts import Dataset
from agent_r1.mdp import Action, RewardSignal, Step, Task, Trajectory, load_trajectories
from agent_r1.python_paths import PYTHON_PATH_PLUGIN
from agent_r1.registry import Registry
from agent_r1.testing import write_plugin_distribution


@pytest.fixture
def modules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A directory on ``sys.path`` for the test's modules; they are forgotten afterwards."""
    directory = tmp_path / "modules"
    directory.mkdir()
    monkeypatch.syspath_prepend(str(directory))
    before = set(sys.modules)
    yield directory
    for name in set(sys.modules) - before:
        sys.modules.pop(name, None)


@pytest.fixture
def registry(monkeypatch: pytest.MonkeyPatch) -> Registry:
    """A registry with only the bundled plugins (third-party plugins in the environment stay out)."""
    monkeypatch.setenv("AGENT_R1_LOAD_PLUGINS", "builtins")
    monkeypatch.delenv("AGENT_R1_DISABLE_PLUGINS", raising=False)
    monkeypatch.delenv("AGENT_R1_STRICT_PLUGINS", raising=False)
    return Registry()


def write_module(directory: Path, name: str, source: str) -> Path:
    path = directory / f"{name.replace('.', '/')}.py"
    path.parent.mkdir(parents=True, exist_ok=True)
    for parent in path.parents:  # make every package level importable
        if parent == directory:
            break
        (parent / "__init__.py").touch()
    path.write_text(textwrap.dedent(source), encoding="utf-8")
    return path


def answered(text: str, answer: str = "42") -> tuple[Trajectory, Task]:
    """A finished one-turn trajectory whose action text is ``text``, and its task."""
    task = Task(id="t0", messages=[{"role": "user", "content": "What is 6 x 7?"}], answer=answer)
    action = Action(token_ids=[1, 2], text=text, answer=text)
    trajectory = Trajectory(id="t0/0", task_id="t0", steps=[Step(turn=0, action=action)])
    return trajectory, task


def score(shaper: RewardShaper, trajectory: Trajectory, task: Task) -> list[RewardSignal]:
    result: Any = shaper.score(trajectory, task)
    return asyncio.run(result) if asyncio.iscoroutine(result) else list(result)


REWARDS = """
    import functools

    from agent_r1 import RewardSignal

    def exact(trajectory, task):
        return float(trajectory.steps[-1].action.text.strip() == task.answer)

    def length_penalty(trajectory, task, max_chars: int = 10, scale: float = 1.0):
        return -scale if len(trajectory.steps[-1].action.text) > max_chars else 0.0

    def needs_option(trajectory, task, target: str):
        return float(target in trajectory.steps[-1].action.text)

    async def slow_exact(trajectory, task):
        return trajectory.steps[-1].action.text == task.answer

    def two_signals(trajectory, task):
        return [RewardSignal(name="a", value=1.0), RewardSignal(name="b", value=0.5)]

    def forgets_to_return(trajectory, task):
        trajectory.steps[-1].action.text == task.answer

    def one_argument(trajectory):
        return 1.0

    strict_penalty = functools.partial(length_penalty, max_chars=3)
"""


# --------------------------------------------------------------------------------------------
# Reward functions
# --------------------------------------------------------------------------------------------


def test_a_reward_function_becomes_a_reward_shaper_with_a_named_signal(
    modules: Path, registry: Registry
) -> None:
    source = write_module(modules, "pp_rewards_a", REWARDS)
    cls = registry.get("reward_shapers", "pp_rewards_a:exact")
    assert issubclass(cls, RewardShaper) and cls.name == "exact"
    assert registry.get("reward_shapers", "pp_rewards_a:exact") is cls  # one class per path
    shaper = registry.build("reward_shapers", "pp_rewards_a:exact")
    right, task = answered("42")
    wrong, _ = answered("41")
    assert [(s.name, s.value, s.kind) for s in score(shaper, right, task)] == [("exact", 1.0, "outcome")]
    assert [s.value for s in score(shaper, wrong, task)] == [0.0]

    provenance = cls.provenance
    assert provenance is not None
    assert provenance.plugin == PYTHON_PATH_PLUGIN
    assert provenance.module == "pp_rewards_a:exact"
    assert provenance.distribution == f"local file {source}"
    assert provenance.version.startswith("sha256:")
    assert f"{cls.__module__}.{cls.__qualname__}" == "pp_rewards_a.exact"  # what a run records


def test_keyword_parameters_are_the_options_of_a_reward_function(modules: Path, registry: Registry) -> None:
    write_module(modules, "pp_rewards_b", REWARDS)
    long, task = answered("forty-two, I think")
    shaper = registry.build("reward_shapers", "pp_rewards_b:length_penalty", {"max_chars": 5, "scale": 2})
    assert [s.value for s in score(shaper, long, task)] == [-2.0]
    config = RunConfig.model_validate(
        {"rewards": [{"name": "pp_rewards_b:length_penalty", "max_char": 5, "weight": 0.5}]}
    )
    with pytest.raises(ConfigError, match=r"rewards\[0\]\.max_char.*Did you mean 'max_chars'") as caught:
        validate_components(config, registry)
    assert caught.value.path == "rewards[0].max_char"
    config = RunConfig.model_validate({"rewards": [{"name": "pp_rewards_b:needs_option"}]})
    with pytest.raises(ConfigError, match=r"rewards\[0\]\.target"):
        validate_components(config, registry)
    config = RunConfig.model_validate({"rewards": [{"name": "pp_rewards_b:needs_option", "target": "two"}]})
    resolved = {c.path: c for c in validate_components(config, registry)}
    assert resolved["rewards[0]"].config.target == "two"


def test_async_functions_booleans_and_signal_lists_are_accepted(modules: Path, registry: Registry) -> None:
    write_module(modules, "pp_rewards_c", REWARDS)
    right, task = answered("42")
    assert [
        s.value for s in score(registry.build("reward_shapers", "pp_rewards_c:slow_exact"), right, task)
    ] == [1.0]
    signals = score(registry.build("reward_shapers", "pp_rewards_c:two_signals"), right, task)
    assert [(s.name, s.value) for s in signals] == [("a", 1.0), ("b", 0.5)]
    partial = registry.build("reward_shapers", "pp_rewards_c:strict_penalty", {"scale": 0.5})
    assert partial.name == "strict_penalty"  # a partial has no __name__: the attribute's
    assert [(s.name, s.value) for s in score(partial, answered("four")[0], task)] == [
        ("strict_penalty", -0.5)
    ]


def test_a_reward_function_with_a_wrong_return_or_signature_is_a_clear_error(
    modules: Path, registry: Registry
) -> None:
    write_module(modules, "pp_rewards_d", REWARDS)
    right, task = answered("42")
    shaper = registry.build("reward_shapers", "pp_rewards_d:forgets_to_return")
    with pytest.raises(
        AgentR1Error, match=r"'pp_rewards_d:forgets_to_return' returned None .*must return a float"
    ):
        score(shaper, right, task)
    with pytest.raises(ComponentNotFound, match=r"one_argument\(trajectory\) must take \(trajectory, task\)"):
        registry.get("reward_shapers", "pp_rewards_d:one_argument")


# --------------------------------------------------------------------------------------------
# Classes
# --------------------------------------------------------------------------------------------

CLASSES = """
    from agent_r1 import ComponentConfig, Dataset, RewardShaper, RewardSignal, Task

    class Shouting(RewardShaper):
        class Config(ComponentConfig):
            bonus: float = 1.0

        def score(self, trajectory, task):
            text = trajectory.steps[-1].action.text
            return [RewardSignal(name="shouting", value=self.config.bonus * text.isupper())]

    class NotAShaper:
        def score(self, trajectory, task):
            return 1.0

    class Arithmetic(Dataset):
        name = "arithmetic"

        class Config(ComponentConfig):
            count: int = 2

        def load(self, split):
            return [
                Task(id=f"{split}{i}", messages=[{"role": "user", "content": "?"}], answer=str(2 * i))
                for i in range(self.config.count)
            ]
"""


def test_a_class_path_is_used_as_it_is_with_a_name_and_provenance(modules: Path, registry: Registry) -> None:
    write_module(modules, "pp_pkg.shapers", CLASSES)
    cls = registry.get("reward_shapers", "pp_pkg.shapers:Shouting")
    import pp_pkg.shapers  # type: ignore[import-not-found]

    assert cls is pp_pkg.shapers.Shouting
    assert cls.name == "Shouting"  # no name of its own: the attribute's
    assert cls.provenance is not None and cls.provenance.module == "pp_pkg.shapers:Shouting"
    shouting, task = answered("FORTY-TWO")
    shaper = registry.build("reward_shapers", "pp_pkg.shapers:Shouting", {"bonus": 3})
    assert [s.value for s in score(shaper, shouting, task)] == [3.0]
    dataset = registry.build("datasets", "pp_pkg.shapers:Arithmetic", {"count": 3})
    assert [t.answer for t in dataset.load("train")] == ["0", "2", "4"]
    assert registry.get("datasets", "pp_pkg.shapers:Arithmetic").name == "arithmetic"  # its own name kept


def test_a_class_of_the_wrong_kind_names_the_class_and_the_expected_base(
    modules: Path, registry: Registry
) -> None:
    write_module(modules, "pp_classes_b", CLASSES)
    with pytest.raises(
        ComponentNotFound,
        match=r"class pp_classes_b.NotAShaper does not subclass agent_r1.RewardShaper",
    ):
        registry.get("reward_shapers", "pp_classes_b:NotAShaper")
    with pytest.raises(ComponentNotFound, match=r"pp_classes_b.Shouting does not subclass agent_r1.Dataset"):
        registry.get("datasets", "pp_classes_b:Shouting")
    with pytest.raises(ComponentNotFound, match=r"expected a class subclassing agent_r1.Environment\.$"):
        registry.get("environments", "pp_classes_b:RewardSignal.model_validate")


# --------------------------------------------------------------------------------------------
# Dataset functions
# --------------------------------------------------------------------------------------------

DATASETS = """
    from agent_r1 import Task

    def questions(split, count: int = 2):
        if split == "eval":
            return [Task(id="e0", messages=[{"role": "user", "content": "1 + 1?"}], answer="2")]
        return [
            {"messages": [{"role": "user", "content": f"{i} x 2?"}], "answer": str(2 * i)}
            for i in range(count)
        ]

    def bad_rows(split):
        return [{"messages": "not a list"}]

    def not_a_list(split):
        return {"id": "x"}
"""


def test_a_dataset_function_returns_tasks_per_split(modules: Path, registry: Registry) -> None:
    write_module(modules, "pp_data_a", DATASETS)
    dataset = registry.build("datasets", "pp_data_a:questions", {"count": 3})
    assert isinstance(dataset, Dataset) and dataset.name == "questions"
    train = dataset.load("train")
    assert [(t.id, t.answer) for t in train] == [("train-0", "0"), ("train-1", "2"), ("train-2", "4")]
    train[0].answer = "changed"
    assert dataset.load("train")[0].answer == "0"  # fresh copies
    assert [t.id for t in dataset.load("eval")] == ["e0"]
    with pytest.raises(AgentR1Error, match=r"'pp_data_a:bad_rows', split 'train', task 0: not a valid Task"):
        registry.build("datasets", "pp_data_a:bad_rows").load("train")
    with pytest.raises(AgentR1Error, match=r"returned dict for split 'train'; it must return a list"):
        registry.build("datasets", "pp_data_a:not_a_list").load("train")


# --------------------------------------------------------------------------------------------
# The rule: plugin:name or module:attribute, and what the errors say
# --------------------------------------------------------------------------------------------


def test_a_plugin_name_before_the_colon_still_picks_the_plugins_component(registry: Registry) -> None:
    answer_match = registry.get("reward_shapers", "answer_match")
    assert answer_match.provenance is not None and answer_match.provenance.plugin == "builtins"
    assert registry.get("reward_shapers", "builtins:answer_match") is answer_match
    assert registry.get("reward_shapers", "agent-r1:answer_match") is answer_match  # distribution name
    with pytest.raises(ComponentNotFound) as caught:
        registry.get("reward_shapers", "builtins:exact")
    message = str(caught.value)
    assert (
        "plugin 'builtins' (distribution agent-r1" in message
        and "provides no reward shaper 'exact'" in message
    )
    assert "answer_match" in message  # what the plugin does provide
    # 'builtins' is also a Python module (the standard library's): the message says which one won
    assert "a plugin name before ':' takes precedence over the Python module 'builtins'" in message


def test_an_unknown_module_says_what_was_tried(registry: Registry) -> None:
    with pytest.raises(ComponentNotFound) as caught:
        registry.get("reward_shapers", "pp_no_such_module:score")
    message = str(caught.value)
    assert "'pp_no_such_module' is not an installed plugin (plugins: builtins" in message
    assert "read as a Python path module:attribute" in message
    assert (
        "no module 'pp_no_such_module' can be imported (searched sys.path and the working directory"
        in message
    )
    with pytest.raises(
        ComponentNotFound, match=r"no plugin named 'nobody' provides reward shaper 'answer_match'"
    ):
        registry.get("reward_shapers", "nobody:answer_match")  # a known component name: both readings
    with pytest.raises(ComponentNotFound, match=r"but it is not one \(write dotted.module:attribute"):
        registry.get("reward_shapers", "my-rewards:score")


def test_a_module_that_fails_to_import_or_lacks_the_attribute_is_named(
    modules: Path, registry: Registry
) -> None:
    broken = write_module(modules, "pp_broken", "import json\nraise RuntimeError('no GPU here')\n")
    with pytest.raises(ComponentNotFound) as caught:
        registry.get("reward_shapers", "pp_broken:score")
    message = str(caught.value)
    assert (
        f"importing module 'pp_broken' ({broken}) raised RuntimeError: no GPU here at {broken}:2" in message
    )
    write_module(modules, "pp_missing_dep", "import pp_not_installed_anywhere\n")
    with pytest.raises(
        ComponentNotFound, match=r"raised ModuleNotFoundError: No module named 'pp_not_installed"
    ):
        registry.get("reward_shapers", "pp_missing_dep:score")
    write_module(modules, "pp_typo", REWARDS)
    with pytest.raises(
        ComponentNotFound, match=r"pp_typo \(.*pp_typo.py\) has no attribute 'exakt'. Did you mean 'exact'"
    ):
        registry.get("reward_shapers", "pp_typo:exakt")


def test_a_module_in_the_working_directory_is_found(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, registry: Registry
) -> None:
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", ".", str(tmp_path))])
    monkeypatch.chdir(tmp_path)
    write_module(tmp_path, "pp_cwd_rewards", REWARDS)
    try:
        assert registry.get("reward_shapers", "pp_cwd_rewards:exact").name == "exact"
        assert str(tmp_path) in sys.path
    finally:
        sys.modules.pop("pp_cwd_rewards", None)


def test_a_run_config_resolves_python_paths_with_their_options(modules: Path, registry: Registry) -> None:
    write_module(modules, "pp_run_rewards", REWARDS)
    write_module(modules, "pp_run_data", DATASETS)
    config = RunConfig.model_validate(
        {
            "data": {"name": "pp_run_data:questions", "count": 4},
            "rewards": [{"name": "pp_run_rewards:exact", "weight": 0.5}, {"name": "answer_match"}],
        }
    )
    resolved = {c.path: c for c in validate_components(config, registry)}
    assert resolved["data"].cls.provenance.module == "pp_run_data:questions"
    assert resolved["data"].config.count == 4
    assert resolved["rewards[0]"].cls.name == "exact"
    assert resolved["rewards[1]"].cls.provenance.plugin == "builtins"
    missing = RunConfig.model_validate(
        {"rewards": [{"name": "answer_match"}, {"name": "pp_run_nowhere:exact"}]}
    )
    with pytest.raises(
        ConfigError, match=r"^rewards\[1\]\.name: unknown reward shaper 'pp_run_nowhere:exact'"
    ) as caught:
        validate_components(missing, registry)
    assert caught.value.path == "rewards[1].name"


# --------------------------------------------------------------------------------------------
# The real command line
# --------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_agent_r1_rollout_imports_a_reward_function_and_a_dataset_from_the_working_directory(
    tmp_path: Path,
) -> None:
    site = tmp_path / "site"
    write_plugin_distribution(
        site, "agent-r1-toy-plugin", files={}, entry_points={"toy": "agent_r1.testing.toy"}
    )
    model_dir = write_tiny_checkpoint(tmp_path / "model")
    work = tmp_path / "work"
    work.mkdir()
    write_module(
        work,
        "my_rewards",
        """
        def digit_share(trajectory, task, bonus: float = 0.0):
            text = trajectory.steps[-1].action.text
            return sum(c.isdigit() for c in text) / max(len(text), 1) + bonus
        """,
    )
    write_module(
        work,
        "my_tasks",
        """
        def digits(split, count: int = 2):
            return [{"id": f"{split}{i}", "messages": [{"role": "user", "content": f"Digits please ({i})."}]}
                    for i in range(count)]
        """,
    )
    config = toy_config(
        model_dir, tmp_path / "run", rewards=[{"name": "my_rewards:digit_share", "bonus": 1.0}]
    )
    config["data"] = {"name": "my_tasks:digits", "count": 2}
    write_config(work / "run.yaml", config)
    out = tmp_path / "trajectories.jsonl"
    env = {"AGENT_R1_DISABLE_PLUGINS": "search,code", "OMP_NUM_THREADS": "1"}
    result = run_cli(
        ["rollout", "run.yaml", "--out", str(out), "--num-tasks", "2"],
        sites=[site],
        env=env,
        isolate=False,
        cwd=work,
    )
    assert result.returncode == 0, result.stderr
    trajectories = load_trajectories(out)
    assert sorted({t.task_id for t in trajectories}) == ["train0", "train1"]
    for trajectory in trajectories:
        text = trajectory.steps[-1].action.text
        expected = sum(c.isdigit() for c in text) / max(len(text), 1) + 1.0
        assert [(r.name, r.source) for r in trajectory.rewards] == [("digit_share", "digit_share")]
        assert trajectory.rewards[0].value == pytest.approx(expected)
