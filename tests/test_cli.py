"""The ``agent-r1`` command line, run as a real subprocess with test plugin distributions on
``PYTHONPATH`` (and in-process through typer's runner where no plugin is involved)."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from foundation_helpers import Sites, run_cli, run_python_or_cli, write_sites
from typer.testing import CliRunner

from agent_r1.cli import app, reports_errors
from agent_r1.errors import AgentR1Error, RunInterrupted
from agent_r1.mdp import (
    Action,
    Observation,
    RewardSignal,
    Step,
    TokenSource,
    ToolCall,
    ToolResult,
    Trajectory,
    save_trajectories,
)
from agent_r1.testing import PluginDistribution


@pytest.fixture(scope="session")
def sites(tmp_path_factory: pytest.TempPathFactory) -> Sites:
    return write_sites(tmp_path_factory.mktemp("cli-sites"))


# --------------------------------------------------------------------------------------------
# --help and import never import plugin code
# --------------------------------------------------------------------------------------------


def test_help_and_import_work_with_a_broken_plugin_and_import_no_plugin(sites: Sites, tmp_path: Path) -> None:
    markers = {"BROKEN_MARKER": str(tmp_path / "broken"), "ACME_MARKER": str(tmp_path / "acme")}
    paths = [sites["broken_import"], sites["acme"]]
    for args in (["--help"], ["plugins", "--help"], ["config", "--help"], []):
        result = run_cli(args, sites=paths, env=markers, isolate=False)
        assert result.returncode in (0, 2), result.stderr  # no arguments prints help and exits 2
        assert "Usage" in result.stdout + result.stderr
        assert "Traceback" not in result.stderr
    help_text = run_cli(["--help"], sites=paths, env=markers, isolate=False).stdout
    assert "plugins" in help_text and "acme-hello" not in help_text
    code = "import agent_r1, sys; print(agent_r1.__version__, 'agent_r1.registry' in sys.modules)"
    imported = run_python_or_cli([sys.executable, "-c", code], sites=paths, env=markers, isolate=False)
    assert imported.returncode == 0, imported.stderr
    assert imported.stdout.split() == ["0.1.0", "False"]
    assert not Path(markers["BROKEN_MARKER"]).exists(), "--help or import imported the broken plugin"
    assert not Path(markers["ACME_MARKER"]).exists(), "--help or import imported a plugin"


# --------------------------------------------------------------------------------------------
# plugins list / doctor
# --------------------------------------------------------------------------------------------


def test_plugins_list_json_shows_distributions_components_and_problems(sites: Sites) -> None:
    result = run_cli(["plugins", "list", "--json"], sites=[sites["acme"], sites["broken_import"]])
    assert result.returncode == 0, result.stderr
    infos = {info["name"]: info for info in json.loads(result.stdout)}
    assert infos["builtins"]["status"] == "disabled"
    acme = infos["acme"]
    assert (acme["distribution"], acme["version"], acme["module"], acme["status"]) == (
        "agent-r1-plugin-acme",
        "1.2.3",
        "acme_agent_plugin",
        "loaded",
    )
    assert acme["components"]["environments"] == ["echo_env"]
    assert acme["components"]["commands"] == ["acme-hello"]
    broken = infos["broken_import"]
    assert broken["status"] == "broken" and broken["components"] == {}
    assert "import failed: RuntimeError: boom" in broken["errors"][0]


def test_plugins_list_table(sites: Sites) -> None:
    result = run_cli(["plugins", "list"], sites=[sites["acme"]])
    assert result.returncode == 0, result.stderr
    for text in ("agent-r1-plugin-acme 1.2.3", "acme_agent_plugin", "environments: echo_env", "loaded"):
        assert text in result.stdout


def test_plugins_doctor_exits_1_and_explains_broken_plugins(sites: Sites) -> None:
    result = run_cli(["plugins", "doctor"], sites=[sites["acme"], sites["broken_import"], sites["bad_class"]])
    assert result.returncode == 1, result.stdout + result.stderr
    out = result.stdout
    assert "✓ plugin 'acme' (distribution agent-r1-plugin-acme 1.2.3" in out
    assert "✗ plugin 'broken_import' (distribution agent-r1-plugin-broken-import 0.0.1, entry point" in out
    assert "import failed: RuntimeError: boom: the broken plugin cannot start" in out
    assert "✗ plugin 'bad_class'" in out and "NotATool does not subclass agent_r1.Tool" in out
    assert "2 plugin(s) have problems" in out and "AGENT_R1_DISABLE_PLUGINS" in out
    assert "Traceback" not in result.stderr


def test_plugins_doctor_passes_when_everything_loads(sites: Sites) -> None:
    result = run_cli(["plugins", "doctor"], sites=[sites["acme"]])
    assert result.returncode == 0, result.stdout + result.stderr
    assert "all plugins OK" in result.stdout
    assert "- plugin 'builtins'" in result.stdout and "disabled by" in result.stdout


def test_strict_mode_on_the_command_line(sites: Sites) -> None:
    paths = [sites["acme"], sites["broken_import"]]
    strict = {"AGENT_R1_STRICT_PLUGINS": "1"}
    listed = run_cli(["plugins", "list"], sites=paths, env=strict)
    assert listed.returncode == 2
    assert "AGENT_R1_STRICT_PLUGINS is set" in listed.stderr and "Traceback" not in listed.stderr
    command = run_cli(["acme-hello"], sites=paths, env=strict)
    assert command.returncode == 2
    assert "AGENT_R1_STRICT_PLUGINS is set" in command.stderr and "Traceback" not in command.stderr
    doctor = run_cli(["plugins", "doctor"], sites=paths, env=strict)
    assert doctor.returncode == 1 and "import failed" in doctor.stdout, "doctor reports even when strict"


# --------------------------------------------------------------------------------------------
# Plugin commands
# --------------------------------------------------------------------------------------------


@pytest.mark.covers_hook("register_commands")
def test_a_plugin_command_runs_but_help_does_not_load_it(sites: Sites, tmp_path: Path) -> None:
    marker = tmp_path / "acme-imported"
    env = {"ACME_MARKER": str(marker)}
    helped = run_cli(["--help"], sites=[sites["acme"]], env=env)
    assert helped.returncode == 0 and not marker.exists()
    ran = run_cli(["acme-hello", "--name", "tester"], sites=[sites["acme"]], env=env)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip() == "hello tester from acme"
    assert marker.exists()
    command_help = run_cli(["acme-hello", "--help"], sites=[sites["acme"]])
    assert command_help.returncode == 0 and "who to greet" in command_help.stdout


@pytest.mark.covers_hook("register_commands")
def test_a_command_two_plugins_provide_is_refused_naming_both(sites: Sites) -> None:
    result = run_cli(["acme-hello"], sites=[sites["acme"], sites["other"]])
    assert result.returncode == 2
    assert "command 'acme-hello' is provided by more than one plugin" in result.stderr
    assert "agent-r1-plugin-acme" in result.stderr and "agent-r1-plugin-other" in result.stderr


def test_an_unknown_command_is_a_usage_error(sites: Sites) -> None:
    result = run_cli(["acme-goodbye"], sites=[sites["acme"]])
    assert result.returncode == 2 and "acme-goodbye" in result.stderr


@pytest.mark.covers_hook("register_commands")
@pytest.mark.skipif(importlib.util.find_spec("click") is None, reason="the click package is not installed")
def test_a_click_command_from_the_click_package_runs(tmp_path: Path) -> None:
    source = '''
from agent_r1 import hookimpl


@hookimpl
def register_commands():
    import click

    @click.command("clicky")
    @click.argument("words", nargs=-1)
    @click.option("--shout", is_flag=True, help="capitals")
    def clicky(words, shout):
        """Say words with click."""
        text = " ".join(words)
        click.echo(text.upper() if shout else text)

    return [clicky]
'''
    PluginDistribution(
        "agent-r1-plugin-clicky", {"clicky_plugin.py": source}, {"clicky": "clicky_plugin"}
    ).write(tmp_path)
    result = run_cli(["clicky", "a", "b", "--shout"], sites=[tmp_path])
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "A B"
    assert "capitals" in run_cli(["clicky", "--help"], sites=[tmp_path]).stdout


# --------------------------------------------------------------------------------------------
# config show
# --------------------------------------------------------------------------------------------

ACME_RUN = """
seed: 3
data: {name: counting}
environment: {name: echo_env, max_turns: 3}
rollout:
  backend: {name: noop}
algorithm: {name: acme_pg}
rewards:
  - {name: length, target: 4, weight: 0.5}
trackers:
  - {name: memory}
"""


def test_config_show_prints_the_resolved_config_with_component_defaults(sites: Sites, tmp_path: Path) -> None:
    run = tmp_path / "run.yaml"
    run.write_text(ACME_RUN, encoding="utf-8")
    result = run_cli(
        ["config", "show", str(run), "rollout.max_turns=2", "environment.greeting=hello"],
        sites=[sites["acme"]],
    )
    assert result.returncode == 0, result.stderr
    shown = yaml.safe_load(result.stdout)
    assert shown["seed"] == 3
    assert shown["rollout"]["max_turns"] == 2
    assert shown["environment"] == {"name": "echo_env", "max_turns": 3, "greeting": "hello"}
    assert shown["data"] == {"name": "counting", "num_tasks": 3}
    assert shown["rewards"] == [{"name": "length", "target": 4, "weight": 0.5}]
    as_json = run_cli(["config", "show", str(run), "--json"], sites=[sites["acme"]])
    assert json.loads(as_json.stdout)["environment"]["greeting"] == "hi"


def test_config_show_reports_errors_with_the_config_path(sites: Sites, tmp_path: Path) -> None:
    run = tmp_path / "run.yaml"
    run.write_text(ACME_RUN, encoding="utf-8")
    cases = {
        "environment.greetin=x": "environment.greetin: unknown key 'greetin' of environment 'echo_env'. "
        "Did you mean 'greeting'?",
        "environment.name=echo_envv": "environment.name: unknown environment 'echo_envv'. "
        "Did you mean 'echo_env'?",
        "rollout.max_turns=many": "rollout.max_turns: Input should be a valid integer",
        "rollout.max_turns": "bad override 'rollout.max_turns': expected KEY=VALUE",
    }
    for override, expected in cases.items():
        result = run_cli(["config", "show", str(run), override], sites=[sites["acme"]])
        assert result.returncode == 2, override
        assert expected in " ".join(result.stderr.split()), result.stderr
        assert "Traceback" not in result.stderr


# --------------------------------------------------------------------------------------------
# view
# --------------------------------------------------------------------------------------------


def _trajectory() -> Trajectory:
    trajectory = Trajectory(id="t-1", task_id="task-9", group_id="g", termination="answer")
    trajectory.append(TokenSource.PROMPT, 0, [1, 2, 3])
    trajectory.append(TokenSource.POLICY, 0, [4, 5], [-0.1, -0.2])
    trajectory.append(TokenSource.ENV, 0, [6, 7, 8, 9])
    trajectory.append(TokenSource.POLICY, 1, [10], [-0.3])
    call = ToolCall(id="c0", name="calculator", arguments={"expression": "6*7"})
    trajectory.steps = [
        Step(
            turn=0,
            action=Action(token_ids=[4, 5], text="<calc>6*7</calc>", tool_calls=[call], finish_reason="stop"),
            observation=Observation(tool_results=[ToolResult(call_id="c0", name="calculator", content="42")]),
        ),
        Step(
            turn=1,
            action=Action(token_ids=[10], text="<answer>42</answer>", answer="42"),
            observation=Observation(done=True, termination="answer"),
        ),
    ]
    trajectory.rewards = [RewardSignal(name="answer_match", value=1.0, source="answer_match")]
    return trajectory


def test_view_shows_steps_tools_rewards_and_token_counts(tmp_path: Path) -> None:
    path = tmp_path / "trajectories.jsonl"
    save_trajectories(path, [_trajectory(), _trajectory().model_copy(update={"id": "t-2"})])
    result = CliRunner().invoke(app, ["view", str(path), "--limit", "1"], env={"COLUMNS": "160"})
    assert result.exit_code == 0, result.output
    out = result.output
    for text in (
        "trajectory t-1",
        "task-9",
        "10 = 3 prompt + 3 policy + 4 env + 0 template",
        "<calc>6*7</calc>",
        "call calculator({'expression': '6*7'})",
        "calculator ok: 42",
        "answer: 42",
        "episode ends: answer",
        "answer_match",
    ):
        assert text in out, text
    assert "t-2" not in out
    assert "turn versions" not in out  # sync rollouts: one version, shown once


def test_view_shows_the_weights_version_of_each_turn(tmp_path: Path) -> None:
    path = tmp_path / "trajectories.jsonl"
    save_trajectories(path, [_trajectory().model_copy(update={"turn_versions": {0: 3, 1: 4}})])
    result = CliRunner().invoke(app, ["view", str(path)], env={"COLUMNS": "160"})
    assert result.exit_code == 0, result.output
    assert "turn 0: 3, turn 1: 4" in result.output


def test_view_names_a_corrupt_line_and_a_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "trajectories.jsonl"
    path.write_text(_trajectory().to_json_line() + "\n{not json\n", encoding="utf-8")
    result = CliRunner().invoke(app, ["view", str(path), "--limit", "5"], env={"COLUMNS": "160"})
    assert result.exit_code == 2
    assert f"{path}:2: not a valid trajectory" in " ".join(result.output.split())
    missing = CliRunner().invoke(app, ["view", str(tmp_path / "nope.jsonl")])
    assert missing.exit_code == 2 and "does not exist" in missing.output


def test_viewer_colours_decoded_tokens_by_provenance(tmp_path: Path) -> None:
    import io

    from rich.console import Console

    from agent_r1.engine.reports.viewer import SOURCE_STYLES, show_trajectories, token_counts

    class DigitTokenizer:
        def decode(self, token_ids: list[int]) -> str:
            return "".join(f"<{t}>" for t in token_ids)

    path = tmp_path / "one.jsonl"
    save_trajectories(path, [_trajectory()])
    console = Console(record=True, width=160, file=io.StringIO(), color_system="truecolor")
    assert show_trajectories(path, limit=5, console=console, tokenizer=DigitTokenizer()) == 1
    text = console.export_text(clear=False)
    assert "<1><2><3><4><5><6><7><8><9><10>" in text
    html = console.export_html(inline_styles=True)
    policy = re.search(r'<span style="([^"]*)">&lt;4&gt;&lt;5&gt;</span>', html)
    env = re.search(r'<span style="([^"]*)">&lt;6&gt;&lt;7&gt;&lt;8&gt;&lt;9&gt;</span>', html)
    assert SOURCE_STYLES[TokenSource.POLICY] == "bold green"
    assert policy is not None and "font-weight: bold" in policy.group(1)
    assert env is not None and env.group(1) != policy.group(1)
    assert token_counts(_trajectory()) == {"prompt": 3, "policy": 3, "env": 4, "template": 0}


# --------------------------------------------------------------------------------------------
# train / demo pass --resume and --allow-config-change through to the runner
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["train", "demo"])
def test_allow_config_change_reaches_the_runner(command: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # The runner itself is tested end to end elsewhere; here only the command-line wiring, so
    # runner.train is replaced by a recorder (the real one would train a model).
    import agent_r1.run.training as runner

    calls: list[tuple[Any, ...]] = []

    def record(config_path: Any, overrides: Any, **kwargs: Any) -> dict[str, Any]:
        calls.append((config_path, list(overrides), kwargs))
        return {}

    monkeypatch.setattr(runner, "train", record)
    args = (
        [command]
        + (["run.yaml"] if command == "train" else [])
        + ["seed=3", "--resume", "--allow-config-change"]
    )
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    expected_path = "run.yaml" if command == "train" else "demo"
    assert calls == [(expected_path, ["seed=3"], {"resume": True, "allow_config_change": True})]
    calls.clear()
    assert CliRunner().invoke(app, args[:-2]).exit_code == 0
    assert calls[0][2] == {"resume": False, "allow_config_change": False}


# --------------------------------------------------------------------------------------------
# errors: one wrapper turns a user error into "error: ..." and exit 2 in every command
# --------------------------------------------------------------------------------------------


def _command_callbacks(typer_app: Any, prefix: str = "") -> dict[str, Any]:
    """Every built-in command's function by its command line (``plugins list``...)."""
    found = {}
    for info in typer_app.registered_commands:
        name = info.name or info.callback.__name__.replace("_", "-")
        found[f"{prefix}{name}"] = info.callback
    for group in typer_app.registered_groups:
        found.update(_command_callbacks(group.typer_instance, f"{prefix}{group.name} "))
    return found


def _reports_errors(callback: Any) -> bool:
    return callback.__code__ is reports_errors(lambda: None).__code__


def test_every_built_in_command_reports_errors_through_one_wrapper() -> None:
    callbacks = _command_callbacks(app)
    assert {"train", "view", "plugins list", "config show", "models prepare", "new-plugin"} <= set(callbacks)
    unwrapped = sorted(name for name, callback in callbacks.items() if not _reports_errors(callback))
    assert unwrapped == [], f"commands without @reports_errors: {unwrapped}"

    def plain_command() -> None:
        """A command someone forgot to wrap."""

    assert not _reports_errors(plain_command)  # the check can fail


@pytest.mark.parametrize("debug", ["", "1"])
def test_a_user_error_in_a_command_is_one_line_and_exit_2(
    debug: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import agent_r1.run.training as runner

    def fail(*args: Any, **kwargs: Any) -> None:
        raise AgentR1Error("model.path: no such directory; point it at a model")

    monkeypatch.setattr(runner, "train", fail)
    result = CliRunner().invoke(app, ["train", "run.yaml"], env={"AGENT_R1_DEBUG": debug})
    assert result.exit_code == 2
    assert "error: model.path: no such directory; point it at a model" in result.output
    assert ("Traceback" in result.output) == bool(debug), result.output


def test_an_interrupted_run_prints_its_message_and_exits_with_its_own_status(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import agent_r1.run.training as runner

    def interrupted(*args: Any, **kwargs: Any) -> None:
        raise RunInterrupted("interrupted (SIGINT) at step 3; continue with --resume", exit_code=130)

    monkeypatch.setattr(runner, "train", interrupted)
    result = CliRunner().invoke(app, ["demo"], env={"AGENT_R1_DEBUG": ""})
    assert result.exit_code == 130
    assert "interrupted (SIGINT) at step 3; continue with --resume" in result.output
    assert "error:" not in result.output
