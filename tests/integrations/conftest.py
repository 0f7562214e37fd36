"""Tests of agent_r1.integrations against the real TRL and verl, run by `make test-integrations` in
their own virtual environment (.venv-integrations). They are collected only when the pytest command
line names this directory (or a file in it), so the main `make test` never imports TRL or verl.
Run them with `--import-mode=importlib` (the Makefile does): the default mode puts tests/ on
sys.path, where the folder tests/vllm passes for the vllm package when TRL probes for it."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent_r1.testing.pytest_plugin import only_when_named

HERE = Path(__file__).resolve().parent


pytest_ignore_collect = only_when_named(HERE)
"""The main suite skips this folder: its tests need their own virtual environment."""


@pytest.fixture
def calculator_tasks() -> list:
    from agent_r1.registry import get_registry

    return get_registry().build("datasets", "arithmetic", {"num_train": 8, "num_eval": 4}).load("train")
