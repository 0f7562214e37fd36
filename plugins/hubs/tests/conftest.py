"""Fixtures of the reasoning-gym and TextArena tests (the main suite: .venv has both packages, at
the versions the extras pin). The verifiers and OpenEnv tests in hubs_venv/ have a conftest of
their own, whose fixtures of the same names take precedence there.

Nothing here imports reasoning_gym or textarena: a test that needs one imports it itself."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest


@pytest.fixture(scope="session")
def tokenizer() -> Any:
    """The tiny ChatML tokenizer of agent_r1.testing (the tiny model's)."""
    from agent_r1.testing.models import tiny_tokenizer

    return tiny_tokenizer()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Llama checkpoint with that tokenizer (``model.path`` of a run)."""
    from agent_r1.testing.pytest_plugin import write_tiny_checkpoint

    return write_tiny_checkpoint(tmp_path_factory.mktemp("tiny-model"))


@pytest.fixture
def recorder() -> Iterator[Any]:
    """Every training rollout of a run started in the test (a fresh registry of the installed
    plugins, with the recorder as an observer)."""
    from agent_r1.registry import Registry, reset_registry
    from agent_r1.testing.pytest_plugin import RolloutRecorder

    recorder = RolloutRecorder()
    registry = reset_registry(Registry())
    registry.register_plugin(recorder, "rollout-recorder")
    yield recorder
    reset_registry()
