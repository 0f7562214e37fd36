"""The SDK (``sdk/``): the plugin template and ``agent-r1 new-plugin``, the example plugin
distributions and the embedding example.

Each example plugin, and a plugin freshly scaffolded with ``agent-r1 new-plugin``, is built into a
wheel, installed into a fresh virtual environment next to agent-r1
(:func:`agent_r1.testing.packaging.fresh_venv_with_agent_r1`), listed there by
``agent-r1 plugins list --json``, and its own tests are run there with pytest, against the
installed wheel. The embedding example runs as a script.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agent_r1.cli import app
from agent_r1.scaffold import ScaffoldError, _substitute, plugin_names, render_plugin, template_files
from agent_r1.testing.packaging import build_wheel, fresh_venv_with_agent_r1, run_checked

REPO = Path(__file__).resolve().parents[1]
SDK = REPO / "sdk"
SINGLE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


@dataclass(frozen=True)
class PluginProject:
    """What a plugin distribution under test should show once installed."""

    plugin: str
    distribution: str
    package: str
    components: dict[str, list[str]]
    source: Path | None = None
    """The example's directory (None: scaffolded during the test)."""


PROJECTS = {
    "custom_reward": PluginProject(
        plugin="turn_budget",
        distribution="agent-r1-plugin-turn-budget",
        package="agent_r1_plugin_turn_budget",
        components={"reward_shapers": ["answer_within_turns", "length_penalty"]},
        source=SDK / "examples" / "custom_reward",
    ),
    "custom_env": PluginProject(
        plugin="guess_number",
        distribution="agent-r1-plugin-guess-number",
        package="agent_r1_plugin_guess_number",
        components={"environments": ["guess_number"], "datasets": ["guess_number"]},
        source=SDK / "examples" / "custom_env",
    ),
    "scaffolded": PluginProject(
        plugin="demo_plugin",
        distribution="agent-r1-plugin-demo-plugin",
        package="agent_r1_plugin_demo_plugin",
        components={
            "tools": ["demo_plugin_reverse"],
            "environments": ["demo_plugin_env"],
            "datasets": ["demo_plugin_words"],
            "reward_shapers": ["demo_plugin_exact"],
        },
    ),
}


# --------------------------------------------------------------------------------------------
# agent-r1 new-plugin
# --------------------------------------------------------------------------------------------


def test_plugin_names_derive_every_spelling() -> None:
    names = plugin_names("agent-r1-plugin-My-Tools")
    assert (names.name, names.package, names.distribution) == (
        "my_tools",
        "agent_r1_plugin_my_tools",
        "agent-r1-plugin-my-tools",
    )
    assert plugin_names("weather").distribution == "agent-r1-plugin-weather"
    for bad in ("9lives", "has space", "a__b", "trailing_", "", "import", "builtins", "x" * 41):
        with pytest.raises(ScaffoldError, match="plugin name"):
            plugin_names(bad)


def test_the_template_has_one_source_of_truth_inside_the_package() -> None:
    assert sorted(p.name for p in (SDK / "plugin-template").iterdir()) == ["README.md"]
    paths = [path for path, _ in template_files()]
    assert "pyproject.toml.tmpl" in paths and "src/{{package}}/plugin.py.tmpl" in paths
    assert all(path.endswith(".tmpl") for path in paths), paths


def test_new_plugin_writes_a_lint_clean_project(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["new-plugin", "weather-now", "--dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    project = tmp_path / "agent-r1-plugin-weather-now"
    assert f"created agent-r1-plugin-weather-now (plugin 'weather_now') in {project}" in result.output
    files = sorted(str(p.relative_to(project)) for p in project.rglob("*") if p.is_file())
    assert files == [
        "README.md",
        "configs/weather_now.yaml",
        "pyproject.toml",
        "src/agent_r1_plugin_weather_now/__init__.py",
        "src/agent_r1_plugin_weather_now/plugin.py",
        "tests/test_plugin.py",
    ]
    for path in project.rglob("*"):
        if path.is_file():
            assert "{{" not in path.read_text(encoding="utf-8"), path
    pyproject = (project / "pyproject.toml").read_text(encoding="utf-8")
    assert 'name = "agent-r1-plugin-weather-now"' in pyproject
    assert '[project.entry-points.agent_r1]\nweather_now = "agent_r1_plugin_weather_now.plugin"' in pyproject
    assert 'name = "weather_now_env"' in (project / "src/agent_r1_plugin_weather_now/plugin.py").read_text()
    ruff = [sys.executable, "-m", "ruff"]
    run_checked([*ruff, "check", "--no-cache", "."], cwd=project)
    run_checked([*ruff, "format", "--check", "--no-cache", "."], cwd=project)


def test_new_plugin_never_overwrites_and_explains_bad_names(tmp_path: Path) -> None:
    runner = CliRunner()
    project = tmp_path / "agent-r1-plugin-demo"
    project.mkdir()
    (project / "mine.txt").write_text("keep me", encoding="utf-8")
    taken = runner.invoke(app, ["new-plugin", "demo", "--dir", str(tmp_path)])
    assert taken.exit_code == 2
    assert "already exists and is not empty; nothing was written" in taken.output
    assert [p.name for p in project.iterdir()] == ["mine.txt"]
    bad = runner.invoke(app, ["new-plugin", "9lives", "--dir", str(tmp_path)])
    assert bad.exit_code == 2 and "'9lives' is not a usable plugin name" in bad.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["agent-r1-plugin-demo"]
    (tmp_path / "empty").mkdir()
    assert render_plugin("demo", directory=tmp_path / "empty") == tmp_path / "empty"  # empty is fine
    assert (tmp_path / "empty" / "src" / "agent_r1_plugin_demo" / "plugin.py").is_file()


@pytest.mark.timeout(300)
def test_the_agent_r1_wheel_ships_the_template(tmp_path: Path) -> None:
    """An installed agent-r1 (not only a checkout) can scaffold: the template is package data."""
    wheel = build_wheel(REPO, tmp_path / "wheels")
    shipped = set(zipfile.ZipFile(wheel).namelist())
    for relative, _ in template_files():
        assert f"agent_r1/templates/plugin/{relative}" in shipped
    assert "agent_r1/scaffold.py" in shipped


def test_an_unknown_placeholder_is_an_error() -> None:
    values = plugin_names("demo").placeholders()
    assert (
        _substitute("x = '{{name}}' + '{{ package }}'", values, "f") == "x = 'demo' + 'agent_r1_plugin_demo'"
    )
    with pytest.raises(ScaffoldError, match=r"f\.tmpl uses unknown placeholders \['nmae'\]"):
        _substitute("{{nmae}}", values, "f.tmpl")


# --------------------------------------------------------------------------------------------
# Wheels installed into a fresh environment, with their own tests run there
# --------------------------------------------------------------------------------------------


def _project_copy(key: str, project: PluginProject, tmp_path: Path) -> Path:
    """A copy of the example (so nothing is built or cached inside the checkout), or a plugin
    scaffolded by the real command line."""
    if project.source is not None:
        target = tmp_path / key
        shutil.copytree(project.source, target, ignore=shutil.ignore_patterns("__pycache__", ".pytest_cache"))
        return target
    scaffold = [sys.executable, "-m", "agent_r1.cli", "new-plugin", project.plugin, "--dir", tmp_path]
    created = run_checked(scaffold, cwd=tmp_path)
    assert project.distribution in created.stdout
    return tmp_path / project.distribution


@pytest.mark.timeout(300)
@pytest.mark.parametrize("key", list(PROJECTS))
def test_plugin_wheel_installs_next_to_agent_r1_and_passes_its_own_tests(key: str, tmp_path: Path) -> None:
    project = PROJECTS[key]
    source = _project_copy(key, project, tmp_path)

    wheel = build_wheel(source, tmp_path / "wheels")
    names = zipfile.ZipFile(wheel).namelist()
    assert f"{project.package}/plugin.py" in names
    assert not [n for n in names if n.startswith("tests/") or "/tests/" in n]

    hidden = [project.distribution, "agent-r1-plugin-search"]  # e.g. installed editable here
    editable_sources = [path for path in (project.source, source) if path is not None]
    venv = fresh_venv_with_agent_r1(tmp_path / "venv", hide=hidden, hide_paths=editable_sources)
    venv.install(wheel)
    where = venv.run(["-c", f"import {project.package} as m; print(m.__file__)"], cwd=tmp_path)
    assert Path(where.stdout.strip()).is_relative_to(venv.root)

    listed = {info["name"]: info for info in venv.plugins()}
    assert "builtins" in listed
    info = listed[project.plugin]
    assert (info["distribution"], info["version"], info["status"], info["errors"]) == (
        project.distribution,
        "0.1.0",
        "loaded",
        [],
    )
    assert info["module"] == f"{project.package}.plugin"
    assert info["components"] == project.components

    # The plugin's own tests, against the installed wheel (src/ is not on the path).
    pytest_run = ["-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"]
    result = venv.run(pytest_run, cwd=source, env=SINGLE_THREAD)
    summary = result.stdout.strip().splitlines()[-1]
    assert re.search(r"\b\d+ passed\b", summary), result.stdout
    assert not re.search(r"failed|error|skipped|xfail", summary), result.stdout


# --------------------------------------------------------------------------------------------
# The embedding example
# --------------------------------------------------------------------------------------------


@pytest.mark.timeout(300)
def test_the_embedding_example_trains_the_tiny_model(tmp_path: Path) -> None:
    script = SDK / "examples" / "embedding" / "train_loop.py"
    env = {**SINGLE_THREAD, "AGENT_R1_DISABLE_PLUGINS": "search"}
    result = run_checked([sys.executable, script, "--steps", "10"], cwd=tmp_path, env=env)
    steps = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert [s["step"] for s in steps] == list(range(10))
    rewards = [s["reward"] for s in steps]
    early, late = sum(rewards[:3]) / 3, sum(rewards[-3:]) / 3
    assert early < 0.2 and late > early + 0.5, f"the reward did not rise: {rewards}"
    assert all(s["policy_tokens"] > 0 for s in steps)
    # the sampler's and the trainer's log-probabilities agree for the same weights
    assert max(s["logprob_gap"] for s in steps) < 1e-4
    assert not list(tmp_path.iterdir()), "the example must not write files"
