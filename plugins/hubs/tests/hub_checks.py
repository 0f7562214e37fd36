"""Helpers of the reasoning-gym and TextArena tests: the token-fidelity check, the run config of
the two-step training runs, and ``agent-r1 check`` run in-process."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import yaml

from agent_r1 import Task, TokenSource, Trajectory


def assert_token_fidelity(
    trajectory: Trajectory, tokenizer: Any, *, task: Task | None = None, environment: Any = None
) -> int:
    """The trajectory holds exactly the rendered prompt, what the policy sampled and what the
    environment returned: the policy tokens of each turn are that turn's sampled action (with a
    log-probability each); the environment tokens of each turn are the renderer's rendering of
    that turn's observation messages (none after the last); given ``task`` and ``environment``,
    the prompt tokens are the chat template's rendering of what ``environment.reset(task)`` starts
    with. Returns how many environment tokens it checked.

    Shared by the tests in hubs_venv/ (this folder's conftest puts it on ``sys.path`` there too)."""
    from agent_r1.rollout.chat import ChatRenderer

    renderer = ChatRenderer(tokenizer)
    if environment is not None and task is not None:
        start = asyncio.run(environment.reset(task))
        prompt = [t for s in trajectory.segments if s.source is TokenSource.PROMPT for t in s.token_ids]
        assert prompt == renderer.render_prompt(start.messages, start.tools), trajectory.id
    checked = 0
    for step in trajectory.steps:
        policy = [s for s in trajectory.segments if s.source is TokenSource.POLICY and s.turn == step.turn]
        sampled = [token for segment in policy for token in segment.token_ids]
        assert sampled == step.action.token_ids, (trajectory.id, step.turn)
        assert all(s.logprobs is not None and len(s.logprobs) == len(s.token_ids) for s in policy)
        env = [
            token
            for s in trajectory.segments
            if s.source is TokenSource.ENV and s.turn == step.turn
            for token in s.token_ids
        ]
        observation = step.observation
        if observation is None or observation.done or not observation.messages:
            assert env == [], (trajectory.id, step.turn)
            continue
        rendered = renderer.render_observation(
            observation.messages, action_ids=step.action.token_ids, finish_reason=step.action.finish_reason
        )
        assert rendered is not None and not rendered.cut
        assert env == rendered.env, (trajectory.id, step.turn)
        checked += len(env)
    return checked


def run_config(
    model_dir: Path,
    run_dir: Path,
    *,
    data: dict[str, Any],
    environment: dict[str, Any],
    rewards: list[dict[str, Any]],
    success_signal: str,
    max_turns: int = 1,
    max_new_tokens: int = 12,
) -> dict[str, Any]:
    """Two GRPO steps of two tasks, two samples each, on the tiny model."""
    return {
        "seed": 0,
        "output_dir": str(run_dir),
        "model": {"path": str(model_dir), "device": "cpu"},
        "data": data,
        "environment": environment,
        "rollout": {
            "group_size": 2,
            "max_turns": max_turns,
            "max_new_tokens": max_new_tokens,
            "max_context": 1024,
            "temperature": 1.0,
        },
        "rewards": rewards,
        "algorithm": {"name": "grpo"},
        "trainer": {
            "steps": 2,
            "tasks_per_step": 2,
            "micro_batch_size": 4,
            "lr": 1e-3,
            "checkpoint_every": 0,
            "max_error_rate": 1.0,
        },
        "eval": {"num_tasks": 1, "before_training": False, "success_signal": success_signal},
        "trackers": [{"name": "jsonl"}],
    }


def write_config(path: Path, config: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return path


def agent_r1_check(path: Path) -> tuple[int, list[dict[str, str]]]:
    """``agent-r1 check --json PATH`` in-process: the exit code and the checks."""
    from typer.testing import CliRunner

    from agent_r1.cli import app

    result = CliRunner().invoke(app, ["check", "--json", str(path)])
    start = result.output.index("[")
    return result.exit_code, json.loads(result.output[start:])


def failures(report: list[dict[str, str]]) -> dict[str, str]:
    """Failed check name -> its messages, one per line."""
    out: dict[str, str] = {}
    for check in report:
        if check["status"] == "fail":
            out[check["name"]] = "\n".join(filter(None, [out.get(check["name"]), check["message"]]))
    return out


def metrics_lines(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
"""plugins/hubs/examples: the run configs docs/hubs.md shows."""


def example_components(name: str) -> tuple[Any, dict[str, Any]]:
    """The run config ``examples/<name>`` validated as ``agent-r1 train`` validates it, and its
    components by config path."""
    from agent_r1.config import load_config, validate_components

    config = load_config(EXAMPLES / name)
    return config, {component.path: component for component in validate_components(config)}


def assert_listed_with_or_without(package: str, components: dict[str, str], monkeypatch: Any) -> None:
    """``agent-r1 plugins list`` shows ``components`` (kind -> name) under the plugin ``hubs`` and
    its distribution, with ``package`` importable and with it missing (``sys.modules[package] =
    None``: importing it raises ImportError in this process)."""
    import sys

    from agent_r1.registry import reset_registry

    for missing in (False, True):
        if missing:
            monkeypatch.setitem(sys.modules, package, None)
        reset_registry()
        hubs = listed_components()
        assert (hubs["distribution"], hubs["status"], hubs["errors"]) == (
            "agent-r1-plugin-hubs",
            "loaded",
            [],
        )
        for kind, component in components.items():
            assert component in hubs["components"][kind]
    reset_registry()


def listed_components() -> dict[str, Any]:
    """``agent-r1 plugins list --json`` in-process: the entry of the plugin ``hubs``."""
    from typer.testing import CliRunner

    from agent_r1.cli import app

    result = CliRunner().invoke(app, ["plugins", "list", "--json"])
    assert result.exit_code == 0, result.output
    [hubs] = [plugin for plugin in json.loads(result.output) if plugin["name"] == "hubs"]
    return hubs
