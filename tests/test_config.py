"""Run configs: YAML + dotlist overrides validated into RunConfig; every error names its path."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from foundation_helpers import ISOLATE, write_sites

from agent_r1 import ConfigError
from agent_r1.config import (
    BUNDLED_CONFIGS,
    RunConfig,
    bundled_config_path,
    load_config,
    load_raw_config,
    resolved_dict,
    suggestions,
    validate_components,
)
from agent_r1.registry import Registry


@pytest.fixture(scope="module")
def acme(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    """A registry that sees only the acme test distribution (through its entry point)."""
    sites = write_sites(tmp_path_factory.mktemp("config-sites"))
    with pytest.MonkeyPatch.context() as patch, sites.on_path("acme"):
        patch.setenv("AGENT_R1_DISABLE_PLUGINS", ISOLATE)
        patch.delenv("AGENT_R1_LOAD_PLUGINS", raising=False)
        patch.delenv("AGENT_R1_STRICT_PLUGINS", raising=False)
        registry = Registry()
        registry.load()
        for kind in (
            "datasets",
            "environments",
            "rollout_backends",
            "algorithms",
            "reward_shapers",
            "trackers",
        ):
            registry.names(kind)  # import everything while the site is on sys.path
        yield registry


ACME_RUN = """
data: {name: counting}
environment: {name: echo_env}
rollout:
  backend: {name: noop}
algorithm: {name: acme_pg}
rewards:
  - {name: length, weight: 0.5}
trackers:
  - {name: memory}
"""


def write(tmp_path: Path, text: str, name: str = "run.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def config_error(*args: object, **kwargs: object) -> ConfigError:
    with pytest.raises(ConfigError) as caught:
        load_config(*args, **kwargs)  # type: ignore[arg-type]
    return caught.value


# --------------------------------------------------------------------------------------------
# Loading and overrides
# --------------------------------------------------------------------------------------------


def test_defaults_file_and_overrides_merge_in_order(tmp_path: Path) -> None:
    assert load_config() == RunConfig()
    path = write(tmp_path, "seed: 5\nrollout: {max_turns: 2, group_size: 8}\noutput_dir: runs/s${seed}\n")
    config = load_config(path, ["rollout.max_turns=6", "trainer.lr=3e-6", "rewards[0].weight=2"])
    assert config.seed == 5
    assert (config.rollout.max_turns, config.rollout.group_size) == (6, 8)
    assert config.trainer.lr == pytest.approx(3e-6)
    assert config.rewards[0].weight == 2.0
    assert config.output_dir == "runs/s5", "omegaconf interpolation resolves"


def test_component_options_are_kept_for_the_component_to_validate(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, ACME_RUN), ["environment.max_turns=3", "rewards.0.target=2"])
    assert config.environment.name == "echo_env"
    assert config.environment.options == {"max_turns": 3}
    assert config.rewards[0].options == {"target": 2}


def test_unknown_key_names_the_path_and_suggests(tmp_path: Path) -> None:
    error = config_error(write(tmp_path, "rollouts: {max_turns: 2}\n"))
    assert "rollouts: unknown key 'rollouts'. Did you mean 'rollout'?" in str(error)
    assert error.path == "rollouts"
    error = config_error(None, ["rollout.max_turn=4"])
    assert "rollout.max_turn: unknown key 'max_turn'. Did you mean 'max_turns'?" in str(error)
    assert re.search(r"Valid keys: (\w+, )*backend, (\w+, )*group_size, max_context", str(error))
    assert error.path == "rollout.max_turn"
    error = config_error(None, ["algorithm.kl.coeff=0.1"])
    assert "algorithm.kl.coeff: unknown key 'coeff'. Did you mean 'coef'?" in str(error)


def test_wrong_type_names_the_path_and_the_value(tmp_path: Path) -> None:
    error = config_error(None, ["rollout.max_turns=many"])
    assert "rollout.max_turns: Input should be a valid integer" in str(error)
    assert "(got 'many')" in str(error)
    error = config_error(write(tmp_path, "trainer: {lr: fast}\n"))
    assert "trainer.lr: Input should be a valid number" in str(error)
    error = config_error(None, ["rollout.group_size=0"])
    assert "rollout.group_size: Input should be greater than or equal to 1 (got 0)" in str(error)
    error = config_error(None, ["model.dtype=float8"])
    assert "model.dtype: Input should be 'float32', 'bfloat16' or 'float16'" in str(error)


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("rollout.max_turns", "bad override 'rollout.max_turns': expected KEY=VALUE"),
        ("=4", "bad override '=4': expected KEY=VALUE"),
        ("rollout..max_turns=4", "'rollout..max_turns' is not a dotted config path"),
        ("rollout.max_turns=[1,", "bad override 'rollout.max_turns=[1,': cannot parse value '[1,'"),
        ("trackers.3.name=x", "an override can change a list item but not add one"),
        ("seed.deeper=1", "seed: Input should be a valid integer (got {'deeper': 1})"),
    ],
)
def test_bad_overrides_are_explained(override: str, expected: str) -> None:
    error = config_error(None, [override])
    assert expected.lower() in str(error).lower()


def test_bad_yaml_files_are_explained(tmp_path: Path) -> None:
    broken = write(tmp_path, "rollout:\n  max_turns: [2\n")
    error = config_error(broken)
    assert f"cannot read config {broken}" in str(error)
    assert "line" in str(error), "the YAML parser's position is kept"
    listed = write(tmp_path, "- a\n- b\n", "list.yaml")
    assert "must be a mapping at the top level" in str(config_error(listed))
    misfit = write(tmp_path, "rollout: 5\n", "misfit.yaml")
    assert "rollout: Input should be a valid dictionary" in str(config_error(misfit))
    missing = config_error(tmp_path / "nope.yaml")
    assert "does not exist" in str(missing) and "bundled configs: demo" in str(missing)
    interpolation = write(tmp_path, "output_dir: runs/${nowhere}\n", "interp.yaml")
    assert "cannot resolve config interpolation" in str(config_error(interpolation))


def test_bundled_config_loads_by_name() -> None:
    config = load_raw_config("demo")
    assert config["algorithm"]["name"] == "grpo"


def test_bundled_config_names_are_the_files_present() -> None:
    assert "demo" in BUNDLED_CONFIGS
    assert all(bundled_config_path(name) is not None for name in BUNDLED_CONFIGS)
    message = str(config_error(Path("no-such-config")))
    assert f"(bundled configs: {', '.join(BUNDLED_CONFIGS)})" in message


# --------------------------------------------------------------------------------------------
# Component sections
# --------------------------------------------------------------------------------------------


def test_components_resolve_with_their_own_config(acme: Registry, tmp_path: Path) -> None:
    config = load_config(write(tmp_path, ACME_RUN), ["environment.max_turns=3"])
    resolved = {c.path: c for c in validate_components(config, acme)}
    assert set(resolved) == {
        "data",
        "environment",
        "rollout.backend",
        "algorithm",
        "algorithm.estimator",  # the preset's effective estimator and loss, always resolved
        "algorithm.loss",
        "rewards[0]",
        "trackers[0]",
    }
    assert resolved["environment"].config.max_turns == 3
    assert resolved["environment"].cls.provenance is not None
    full = resolved_dict(config, list(resolved.values()))
    assert full["environment"] == {"name": "echo_env", "max_turns": 3, "greeting": "hi"}
    assert full["rewards"] == [{"name": "length", "target": 5, "weight": 0.5}]


@pytest.mark.parametrize(
    ("override", "path", "expected"),
    [
        (
            "environment.name=echo_envv",
            "environment.name",
            "unknown environment 'echo_envv'. Did you mean 'echo_env'?",
        ),
        (
            "algorithm.name=acme_pgg",
            "algorithm.name",
            "unknown algorithm 'acme_pgg'. Did you mean 'acme_pg'?",
        ),
        (
            "rewards.0.name=lenght",
            "rewards[0].name",
            "unknown reward shaper 'lenght'. Did you mean 'length'?",
        ),
        (
            "data.name=nothing_like_it",
            "data.name",
            "unknown dataset 'nothing_like_it'. Known datasets: counting.",
        ),
    ],
)
def test_unknown_component_names_suggest_the_closest(
    acme: Registry, tmp_path: Path, override: str, path: str, expected: str
) -> None:
    config = load_config(write(tmp_path, ACME_RUN), [override])
    with pytest.raises(ConfigError) as caught:
        validate_components(config, acme)
    assert caught.value.path == path
    assert f"{path}: {expected}" in str(caught.value)


@pytest.mark.parametrize(
    ("override", "path", "expected"),
    [
        (
            "environment.greetin=hey",
            "environment.greetin",
            "environment.greetin: unknown key 'greetin' of environment 'echo_env'. Did you mean 'greeting'?",
        ),
        (
            "environment.max_turns=0",
            "environment.max_turns",
            "environment.max_turns: Input should be greater than or equal to 1 (got 0), an option of "
            "environment 'echo_env'",
        ),
        (
            "rewards.0.target=-1",
            "rewards[0].target",
            "rewards[0].target: Input should be greater than or equal to 0 (got -1), an option of "
            "reward shaper 'length'",
        ),
        (
            "data.num_tasks=some",
            "data.num_tasks",
            "data.num_tasks: Input should be a valid integer",
        ),
    ],
)
def test_a_component_config_rejecting_an_option_names_the_path(
    acme: Registry, tmp_path: Path, override: str, path: str, expected: str
) -> None:
    config = load_config(write(tmp_path, ACME_RUN), [override])
    with pytest.raises(ConfigError) as caught:
        validate_components(config, acme)
    assert caught.value.path == path
    assert expected in str(caught.value)


def test_registry_build_validates_options_too(acme: Registry) -> None:
    with pytest.raises(ConfigError, match="environment 'echo_env': greetin: unknown key 'greetin'"):
        acme.build("environments", "echo_env", {"greetin": "x"})
    assert acme.build("environments", "echo_env", {"greeting": "x"}).config.greeting == "x"


def test_suggestions_are_close_matches_only() -> None:
    assert suggestions("grpoo", ["grpo", "gspo", "rloo", "dr_grpo"]) == ["grpo"]
    assert suggestions("max_turn", ["max_turns", "max_context", "temperature"]) == ["max_turns"]
    assert suggestions("xyz", ["grpo", "ppo"]) == []
