"""The plugin-author harness: distributions written to disk, and contract checkers that pass on
good components and fail, with a useful message, on broken ones."""

from __future__ import annotations

import base64
import hashlib
import importlib
import importlib.metadata
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from foundation_helpers import Sites, write_sites
from pydantic import ConfigDict

from agent_r1 import (
    AdvantageEstimator,
    ComponentConfig,
    Dataset,
    Environment,
    EpisodeStart,
    PolicyLoss,
    RewardShaper,
    RewardSignal,
    Task,
    Tool,
)
from agent_r1.mdp import Observation
from agent_r1.registry import Registry
from agent_r1.testing import (
    ContractViolation,
    PluginDistribution,
    check_advantage_estimator,
    check_algorithm,
    check_component,
    check_dataset,
    check_environment,
    check_plugin,
    check_policy_loss,
    check_reward_shaper,
    check_tool,
    check_tool_call_format,
    example_trajectory,
    plugin_path,
)


@pytest.fixture(scope="module")
def sites(tmp_path_factory: pytest.TempPathFactory) -> Sites:
    return write_sites(tmp_path_factory.mktemp("harness-sites"))


@pytest.fixture
def acme(sites: Sites) -> Iterator[ModuleType]:
    with sites.on_path("acme"):
        yield importlib.import_module("acme_agent_plugin")


# --------------------------------------------------------------------------------------------
# Distributions
# --------------------------------------------------------------------------------------------


def test_a_written_distribution_is_a_valid_install(tmp_path: Any) -> None:
    distribution = PluginDistribution(
        "My.Plugin_Name",
        {"my_pkg/__init__.py": "VALUE = 1\n", "my_pkg/plugin.py": "from my_pkg import VALUE\n"},
        {"mine": "my_pkg.plugin"},
        version="2.0",
        extra_entry_points={"console_scripts": {"my-tool": "my_pkg.plugin:main"}},
    )
    info = distribution.write(tmp_path)
    assert info.name == "My_Plugin_Name-2.0.dist-info"
    with plugin_path(tmp_path):
        found = importlib.metadata.distribution("my-plugin-name")
        assert found.metadata["Name"] == "My.Plugin_Name"
        groups = {(ep.group, ep.name, ep.value) for ep in found.entry_points}
        assert groups == {
            ("agent_r1", "mine", "my_pkg.plugin"),
            ("console_scripts", "my-tool", "my_pkg.plugin:main"),
        }
        assert (found.read_text("top_level.txt") or "").split() == ["my_pkg"]
        for file in found.files or []:
            if file.hash is None:
                assert file.name == "RECORD"
                continue
            content = file.locate().read_bytes()
            digest = base64.urlsafe_b64encode(hashlib.sha256(content).digest()).rstrip(b"=").decode()
            assert (file.hash.mode, file.hash.value, file.size) == ("sha256", digest, len(content))
        assert importlib.import_module("my_pkg.plugin").VALUE == 1
    assert "my_pkg" not in sys.modules and "my_pkg.plugin" not in sys.modules, "modules are forgotten"
    assert str(tmp_path) not in sys.path


# --------------------------------------------------------------------------------------------
# Checkers on good components
# --------------------------------------------------------------------------------------------


def test_checkers_pass_on_the_acme_components(acme: ModuleType) -> None:
    tool = check_tool(acme.EchoTool, calls=[{"text": "hello"}])
    assert tool.run(tool.Arguments(text="x")) == "x"
    observations = check_environment(acme.EchoEnv, config={"max_turns": 2}, actions=["a", "b", "c"])
    assert [o.done for o in observations] == [False, True], "stops at done"
    check_tool_call_format(acme.LineFormat, tools=[acme.EchoTool], texts=["call echo hi", "no call"])
    signals = check_reward_shaper(acme.LengthShaper, config={"target": 5})
    assert signals == [RewardSignal(name="length", value=0.0, source="length")]
    tasks = check_dataset(acme.CountingDataset, config={"num_tasks": 2}, splits=("train", "eval"))
    assert [t.id for t in tasks["eval"]] == ["eval-0", "eval-1"]
    check_advantage_estimator(acme.ConstantEstimator)
    check_policy_loss(acme.SignLoss)
    registry = Registry(entry_points=False)
    registry.register_plugin(acme, "acme")
    check_algorithm(acme.AcmePG, registry=registry)
    info = check_plugin(acme, "acme")
    assert info.components["tools"] == ["echo"]


def test_example_trajectory_is_consistent() -> None:
    trajectory = example_trajectory("42")
    assert trajectory.num_turns == 2
    for step in trajectory.steps:
        policy = [s for s in trajectory.segments if s.source.value == "policy" and s.turn == step.turn]
        assert step.action.token_ids == [t for s in policy for t in s.token_ids]
    assert trajectory.steps[-1].action.answer == "42"


# --------------------------------------------------------------------------------------------
# Checkers on broken components
# --------------------------------------------------------------------------------------------


class NoDescription(Tool):
    name = "silent"


class RaisingTool(Tool):
    name = "raiser"
    description = "always fails"

    def run(self, arguments: Any) -> str:
        raise OSError("disk on fire")


class ReturnsNumber(Tool):
    name = "numbers"
    description = "returns an int"

    def run(self, arguments: Any) -> Any:
        return 42


class LooseConfig(Tool):
    name = "loose"
    description = "accepts anything"

    class Config(ComponentConfig):
        model_config = ConfigDict(extra="allow")


class NeedsPath(Dataset):
    name = "needs_path"

    class Config(ComponentConfig):
        path: str

    def load(self, split: str) -> list[Task]:
        return []


class SyncEnv(Environment):
    name = "sync_env"

    def reset(self, task: Task) -> EpisodeStart:  # type: ignore[override]
        return EpisodeStart(messages=list(task.messages))


class SilentEnd(Environment):
    name = "silent_end"

    async def reset(self, task: Task) -> EpisodeStart:
        return EpisodeStart(messages=list(task.messages))

    async def step(self, action: Any, turn: int) -> Observation:
        return Observation(done=True)


class Coin(RewardShaper):
    name = "coin"
    flips = 0

    def score(self, trajectory: Any, task: Task) -> list[RewardSignal]:
        Coin.flips += 1
        return [RewardSignal(name="coin", value=float(Coin.flips % 2))]


class BareFloats(RewardShaper):
    name = "bare"

    def score(self, trajectory: Any, task: Task) -> Any:
        return [1.0]


class WrongTurn(RewardShaper):
    name = "wrong_turn"

    async def score(self, trajectory: Any, task: Task) -> list[RewardSignal]:
        return [RewardSignal(name="p", value=1.0, kind="process", turn=9)]


class Duplicates(Dataset):
    name = "dups"

    def load(self, split: str) -> list[Task]:
        return [Task(id="same", messages=[{"role": "user", "content": str(i)}]) for i in range(2)]


class Leaky(AdvantageEstimator):
    name = "leaky"

    def compute(self, batch: Any) -> Any:
        import torch

        ones = torch.ones_like(batch.token_rewards)
        return ones, ones


class FlatLoss(PolicyLoss):
    name = "flat"

    def token_loss(self, inputs: Any) -> Any:
        return (inputs.advantages * inputs.logprobs).sum(dim=1), {}


@pytest.mark.parametrize(
    ("check", "expected"),
    [
        (lambda: check_tool(NoDescription), "test_testing_harness.NoDescription (name 'silent'): "),
        (lambda: check_tool(NoDescription), "has no description"),
        (lambda: check_tool(RaisingTool, calls=[{}]), "run({}) raised OSError: disk on fire"),
        (lambda: check_tool(ReturnsNumber, calls=[{}]), "returned int; return str or ToolResult"),
        (lambda: check_tool(RaisingTool, calls=[{"bogus": 1}]), "Arguments rejects the example call"),
        (lambda: check_component(LooseConfig), "Config accepts unknown keys"),
        (lambda: check_component(NeedsPath), "its Config requires path; pass config={...}"),
        (lambda: check_component(NeedsPath, config={"path": 3}), "its Config rejects {'path': 3}"),
        (lambda: check_component(object, "tools"), "does not subclass agent_r1.Tool"),
        (lambda: check_component("not a class"), "expected a component class"),
        (lambda: check_environment(SyncEnv), "reset must be an `async def` method"),
        (lambda: check_environment(SilentEnd), "ended the episode without a termination reason"),
        (lambda: check_reward_shaper(Coin), "scoring the same trajectory twice gave"),
        (lambda: check_reward_shaper(BareFloats), "score() must return a list of RewardSignal"),
        (lambda: check_reward_shaper(WrongTurn), "names turn 9, not in [0, 1]"),
        (lambda: check_dataset(Duplicates), "repeats task ids ['same']"),
        (lambda: check_advantage_estimator(Leaky), "non-zero outside the loss mask"),
        (lambda: check_policy_loss(FlatLoss), "token_loss must return a finite [B, T] tensor"),
    ],
)
def test_checkers_fail_with_a_useful_message(check: Any, expected: str) -> None:
    with pytest.raises(ContractViolation) as caught:
        check()
    assert expected in str(caught.value)


def test_a_nondeterministic_shaper_may_opt_out() -> None:
    assert len(check_reward_shaper(Coin, deterministic=False)) == 1


def test_check_plugin_lists_every_problem(sites: Sites) -> None:
    with sites.on_path("bad_class"):
        module = importlib.import_module("bad_class_plugin")
        with pytest.raises(ContractViolation) as caught:
            check_plugin(module, "bad_class")
    message = str(caught.value)
    assert "NotATool does not subclass agent_r1.Tool" in message
    assert "NamelessEnv has no 'name'" in message
    assert "reward table is missing" in message
    assert "LooseConfigEnv.Config accepts unknown keys" in message


def test_check_algorithm_needs_its_estimator_and_loss(acme: ModuleType) -> None:
    with pytest.raises(ContractViolation, match="advantage estimator 'constant' is unusable"):
        check_algorithm(acme.AcmePG, registry=Registry(entry_points=False))


def test_scripted_rollout_is_one_import_away() -> None:
    """A plugin test runs its environment through the real engine with one import."""
    from agent_r1.builtins.calculator import CalculatorEnv
    from agent_r1.mdp import Task
    from agent_r1.testing import scripted_rollout

    task = Task(id="q", messages=[{"role": "user", "content": "What is 2+3?"}], answer="5")
    [trajectory] = scripted_rollout(CalculatorEnv, ["<calc>2+3</calc>", "<answer>5</answer>"], task)
    assert [step.action.tool_calls[0].name for step in trajectory.steps[:1]] == ["calculator"]
    assert trajectory.steps[0].observation is not None
    assert trajectory.steps[0].observation.tool_results[0].content == "5"
    assert trajectory.steps[-1].action.answer == "5" and trajectory.termination == "answer"


def test_the_pytest_plugin_gives_plugin_authors_its_fixtures_with_one_line(tmp_path: Path) -> None:
    """A plugin's suite loads ``agent_r1.testing.pytest_plugin`` with one line and gets a tiny model
    directory, the toy registry and a rollout recorder that sees ``on_rollout_end``."""
    (tmp_path / "conftest.py").write_text('pytest_plugins = ["agent_r1.testing.pytest_plugin"]\n')
    (tmp_path / "test_uses_fixtures.py").write_text(
        "from agent_r1.mdp import Trajectory\n"
        "from agent_r1.registry import get_registry\n\n"
        "def test_model_dir(agent_r1_tiny_model_dir):\n"
        "    assert (agent_r1_tiny_model_dir / 'config.json').is_file()\n\n"
        "def test_toy(agent_r1_toy_registry):\n"
        "    assert 'toy_target' in agent_r1_toy_registry.names('datasets')\n"
        "    assert get_registry() is agent_r1_toy_registry\n\n"
        "def test_recorder(agent_r1_rollout_recorder):\n"
        "    seen = Trajectory(id='t', task_id='x')\n"
        "    get_registry().notify('on_rollout_end', step=1, trajectories=[seen])\n"
        "    assert agent_r1_rollout_recorder.trajectories == [seen]\n"
    )
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "3 passed" in result.stdout
