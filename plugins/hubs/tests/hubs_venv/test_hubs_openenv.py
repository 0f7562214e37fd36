"""The ``openenv`` environment against openenv-core 0.3.0 and a real OpenEnv server: the echo
environment ``openenv init`` generates, served by agent-r1 (uvicorn on a free port of 127.0.0.1)
from its app; scripted episodes through the real rollout engine in text and tool mode; a server
whose environment raises; two GRPO steps on the tiny model; and ``agent-r1 check`` stopping before
any model loads when the package or the server is missing."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from hub_checks import assert_token_fidelity, run_config

from agent_r1 import Trajectory


def environment(echo_env: Path, *, app: str = "server.app:app", **options: Any) -> dict[str, Any]:
    return {
        "server": {"app": app, "cwd": str(echo_env)},
        "observation_field": "echoed_message",
        "max_turns": 3,
        **options,
    }


@pytest.fixture
def echo_reward(echo_env: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The echo environment's own reward for an action message: its ``step``, run in process."""
    monkeypatch.syspath_prepend(str(echo_env))
    from models import EchoAction  # the generated package's modules, as its server imports them
    from server.echo_env_environment import EchoEnvironment

    def reward(message: str) -> float:
        environment = EchoEnvironment()
        environment.reset()
        return float(environment.step(EchoAction(message=message)).reward)

    return reward


def rollout(tokenizer: Any, options: dict[str, Any], script: Any, tasks: int = 2) -> list[Trajectory]:
    from agent_r1.registry import get_registry
    from agent_r1.rollout.loop import RolloutEngine
    from agent_r1.testing.scripted import ScriptedBackend

    registry = get_registry()
    batch = registry.build("datasets", "arithmetic", {"num_train": tasks, "num_eval": 1}).load("train")
    engine = RolloutEngine(
        ScriptedBackend(tokenizer=tokenizer, responses=script),
        tokenizer,
        lambda: registry.build("environments", "openenv", options),
        max_turns=options.get("max_turns", 3),
        max_new_tokens=64,
        max_context=2048,
        on_env_error="end",  # as training does
    )
    return engine.collect(batch, 1, seed=0)


def process_rewards(trajectory: Trajectory) -> list[tuple[int, float]]:
    return [
        (signal.turn, signal.value)
        for step in trajectory.steps
        if step.observation is not None
        for signal in step.observation.rewards
        if signal.name == "openenv" and signal.kind == "process"
    ]


def test_text_mode_episode_echoes_each_action_and_rewards_it(
    echo_env: Path, echo_reward: Any, tokenizer: Any
) -> None:
    trajectories = rollout(tokenizer, environment(echo_env), ["hello there", "more words", "last"])
    for trajectory in trajectories:
        prompt = tokenizer.decode(trajectory.token_ids[: trajectory.prompt_length])
        assert "<|im_start|>user\nEcho Env environment ready!<|im_end|>" in prompt  # reset's observation
        assert (
            trajectory.start_info["openenv"]["observation"]["echoed_message"] == "Echo Env environment ready!"
        )
        steps = trajectory.steps
        assert [s.action.text for s in steps] == ["hello there", "more words", "last"]
        assert steps[0].observation.messages == [{"role": "user", "content": "hello there"}]
        assert steps[1].observation.messages == [{"role": "user", "content": "more words"}]
        assert trajectory.termination == "max_turns" and not trajectory.errors
        # the rewards are the environment's own, one process signal per turn
        assert process_rewards(trajectory) == [(t, echo_reward(s.action.text)) for t, s in enumerate(steps)]
        assert [r["observation"]["message_length"] for s in steps for r in s.observation.info["openenv"]] == [
            11,
            10,
            4,
        ]
        assert assert_token_fidelity(trajectory, tokenizer) > 0
        assert trajectory.metrics["template_drift_tokens"] == 0.0  # re-rendering gives the same tokens


def test_tool_mode_the_action_schema_is_a_tool(echo_env: Path, echo_reward: Any, tokenizer: Any) -> None:
    options = environment(echo_env, action="tool", reward="outcome", max_turns=2)
    trajectories = rollout(tokenizer, options, ["<act>hello there</act>", "<act>bye</act>"])
    for trajectory in trajectories:
        prompt = tokenizer.decode(trajectory.token_ids[: trajectory.prompt_length])
        assert "- <act>message</act>: Action for the Echo Env environment" in prompt
        first, second = trajectory.steps
        assert [r.content for r in first.observation.tool_results] == ["hello there"]
        assert first.observation.messages == [{"role": "user", "content": "<result>hello there</result>"}]
        assert first.observation.rewards == []  # outcome: only the step that ends the episode
        assert second.observation.done and trajectory.termination == "max_turns"
        [signal] = second.observation.rewards
        assert (signal.kind, signal.value) == ("outcome", echo_reward("bye"))
        assert_token_fidelity(trajectory, tokenizer)
        assert trajectory.metrics["template_drift_tokens"] == 0.0


def test_a_step_the_server_fails_is_a_counted_failed_episode(echo_env: Path, tokenizer: Any) -> None:
    def script(prompt: str) -> str:
        return "boom" if "19 barrels" in prompt else "fine"

    options = environment(echo_env, app="server.flaky_app:app")
    trajectories = rollout(tokenizer, options, script, tasks=3)
    failed = [t for t in trajectories if t.errors]
    assert len(failed) == 1 and failed[0].termination == "env_error"
    assert failed[0].metrics["env_errors"] == 1.0
    assert "the echo environment broke" in failed[0].errors[0] and "EXECUTION_ERROR" in failed[0].errors[0]
    assert all(t.termination == "max_turns" for t in trajectories if not t.errors)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_two_training_steps_on_the_tiny_model(
    echo_env: Path, echo_reward: Any, tiny_model_dir: Path, recorder: Any, tmp_path: Path, tokenizer: Any
) -> None:
    from agent_r1.run.training import train
    from agent_r1_plugin_hubs import openenv_hub

    run_dir = tmp_path / "run"
    config = run_config(
        tiny_model_dir,
        run_dir,
        data={"name": "arithmetic", "num_train": 8, "num_eval": 1},
        environment={"name": "openenv", **environment(echo_env, max_turns=2)},
        rewards=[],
        success_signal="openenv",
        max_turns=3,
    )
    path = tmp_path / "openenv.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    summary = train(path, [])

    assert summary["steps"] == 2
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == [1, 2]
    assert all(line["errors/failed_episodes"] == 0.0 and "reward/openenv" in line for line in lines)
    trajectories = recorder.trajectories
    assert len(trajectories) == 2 * 2 * 2
    env_tokens = 0
    for trajectory in trajectories:
        env_tokens += assert_token_fidelity(trajectory, tokenizer)
        steps = trajectory.steps
        assert process_rewards(trajectory) == [(t, echo_reward(s.action.text)) for t, s in enumerate(steps)]
        # what the engine placed on the tokens is those rewards
        assert sorted((r.turn, r.value) for r in trajectory.rewards) == process_rewards(trajectory)
    assert env_tokens > 0
    # the server agent-r1 started for the run is still up (it serves every episode) until stopped
    [server] = [s for s in openenv_hub._servers.values() if s.config.app == "server.app:app"]
    assert server.process.poll() is None
    openenv_hub.stop_servers()
    assert server.process.poll() is not None


def check_config(tmp_path: Path, tiny_model_dir: Path, environment: dict[str, Any]) -> Path:
    config = run_config(
        tiny_model_dir,
        tmp_path / "run",
        data={"name": "arithmetic", "num_train": 4, "num_eval": 1},
        environment={"name": "openenv", **environment},
        rewards=[],
        success_signal="openenv",
        max_turns=3,
    )
    path = tmp_path / "check.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return path


def agent_r1_check(path: Path) -> tuple[int, str]:
    from typer.testing import CliRunner

    from agent_r1.cli import app

    result = CliRunner().invoke(app, ["check", "--json", str(path)])
    report = json.loads(result.output[result.output.index("[") :])
    return result.exit_code, "\n".join(c["message"] for c in report if c["status"] == "fail")


def test_check_stops_on_a_missing_package_or_server(
    echo_env: Path, tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    code, message = agent_r1_check(
        check_config(tmp_path, tiny_model_dir, environment(echo_env, app="nowhere:app"))
    )
    assert code == 2
    assert "the server (app nowhere:app (in " in message and "exited with code" in message
    assert 'Could not import module "nowhere"' in message  # its stderr, quoted

    code, message = agent_r1_check(check_config(tmp_path, tiny_model_dir, {}))
    assert code == 2
    assert "no server: give environment.url (a running OpenEnv server) or environment.server" in message

    code, message = agent_r1_check(check_config(tmp_path, tiny_model_dir, {"url": "http://127.0.0.1:9"}))
    assert code == 2
    assert "cannot read the OpenEnv schemas at http://127.0.0.1:9/schema" in message

    code, message = agent_r1_check(
        check_config(tmp_path, tiny_model_dir, environment(echo_env, observation_field="nothing"))
    )
    assert code == 2
    assert "the server's observations have no field 'nothing'" in message
    assert "'echoed_message'" in message

    monkeypatch.setitem(sys.modules, "openenv", None)  # as if openenv-core were not installed
    code, message = agent_r1_check(check_config(tmp_path, tiny_model_dir, environment(echo_env)))
    assert code == 2
    assert "environment (openenv) needs the openenv-core package" in message
    assert "pip install 'agent-r1-plugin-hubs[openenv]'" in message
    assert not (tmp_path / "run").exists()


def test_plugins_list_shows_the_components_and_their_origin() -> None:
    from typer.testing import CliRunner

    from agent_r1.cli import app

    result = CliRunner().invoke(app, ["plugins", "list", "--json"])
    assert result.exit_code == 0, result.output
    [hubs] = [p for p in json.loads(result.output) if p["distribution"] == "agent-r1-plugin-hubs"]
    assert (hubs["name"], hubs["module"], hubs["status"]) == ("hubs", "agent_r1_plugin_hubs.plugin", "loaded")
    components = hubs["components"]
    assert "verifiers" in components["datasets"]
    assert {"verifiers", "openenv"} <= set(components["environments"])
    assert "verifiers" in components["reward_shapers"]
    doctor = CliRunner().invoke(app, ["plugins", "doctor"])  # every component's defaults validate
    assert doctor.exit_code == 0 and "plugin 'hubs'" in doctor.output, doctor.output
