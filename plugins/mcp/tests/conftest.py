"""Fixtures of the MCP plugin's tests: a real notebook server over streamable HTTP on 127.0.0.1
(``mcp_helpers.HttpServer``) and scripted rollouts of the ``mcp`` environment through the real
rollout engine."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from mcp_helpers import HttpServer, task

from agent_r1 import Trajectory
from agent_r1.testing.pytest_plugin import agent_r1_rollout_recorder  # noqa: F401 - a fixture


@pytest.fixture
def http_server(tmp_path: Path) -> Iterator[HttpServer]:
    """A fresh HTTP notebook server for one test (killed at the end, if the test has not)."""
    server = HttpServer(tmp_path / "http_server.log")
    yield server
    server.kill()


@pytest.fixture(scope="module")
def shared_http_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HttpServer]:
    """One HTTP notebook server for the tests of a module that do not kill it."""
    server = HttpServer(tmp_path_factory.mktemp("mcp-http") / "http_server.log")
    yield server
    server.kill()


@pytest.fixture(scope="session")
def tokenizer() -> Any:
    from agent_r1.testing.models import tiny_tokenizer

    return tiny_tokenizer()


@pytest.fixture
def rollout(tokenizer: Any) -> Callable[..., list[Trajectory]]:
    """``rollout(env_options, script, tasks=1, group_size=1, max_turns=None, on_env_error="end")``:
    episodes of the ``mcp`` environment through the real rollout engine, the policy saying
    ``script`` (texts per turn, or a function of the prompt)."""
    from agent_r1.registry import get_registry
    from agent_r1.rollout.loop import RolloutEngine
    from agent_r1.testing.scripted import ScriptedBackend

    def run(
        env_options: dict[str, Any],
        script: Sequence[str] | Callable[[str], str],
        *,
        tasks: int = 1,
        group_size: int = 1,
        max_turns: int | None = None,
        on_env_error: str = "end",
    ) -> list[Trajectory]:
        registry = get_registry()
        backend = ScriptedBackend(tokenizer=tokenizer, responses=script)
        engine = RolloutEngine(
            backend,
            tokenizer,
            lambda: registry.build("environments", "mcp", env_options),
            max_turns=max_turns or env_options.get("max_turns", 4),
            max_new_tokens=200,
            max_context=8192,
            on_env_error=on_env_error,  # type: ignore[arg-type]
        )
        return engine.collect([task(i) for i in range(tasks)], group_size=group_size, seed=0)

    return run
