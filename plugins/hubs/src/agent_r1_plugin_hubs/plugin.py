"""Hook implementations of agent-r1-plugin-hubs (entry point ``hubs`` in group ``agent_r1``).

Each family lives in its own module (``reasoning_gym_hub``, ``textarena_hub``, ``verifiers_hub``,
``openenv_hub``), which imports its third-party package only when a component is built, so the
components are listed even where a package is missing and loading the plugin stays cheap.
"""

from __future__ import annotations

import importlib
from typing import Any

from agent_r1 import hookimpl

FAMILIES = ("reasoning_gym_hub", "textarena_hub", "verifiers_hub", "openenv_hub")


def _collect(kind: str) -> list[Any]:
    """The components of ``kind`` (``DATASETS``, ``ENVIRONMENTS``, ``SHAPERS``) every family
    module lists."""
    found: list[Any] = []
    for family in FAMILIES:
        module = importlib.import_module(f"agent_r1_plugin_hubs.{family}")
        found.extend(getattr(module, kind, ()))
    return found


@hookimpl
def register_datasets() -> list[Any]:
    return _collect("DATASETS")


@hookimpl
def register_environments() -> list[Any]:
    return _collect("ENVIRONMENTS")


@hookimpl
def register_reward_shapers() -> list[Any]:
    return _collect("SHAPERS")
