"""Testing helpers for plugin authors and for agent-r1's own tests.

``from agent_r1.testing import check_tool, PluginDistribution, plugin_path`` gives the contract
checkers and the plugin-distribution harness of :mod:`agent_r1.testing.plugins`;
``from agent_r1.testing import scripted_rollout, ScriptedBackend`` runs an environment through the
real rollout engine with a scripted policy (imported on first use). The tiny models and tokenizers
(:mod:`agent_r1.testing.models`) and the toy task (:mod:`agent_r1.testing.toy`) need torch and are
imported from their own modules.
"""

from __future__ import annotations

from agent_r1.testing import plugins as _plugins
from agent_r1.testing.plugins import *  # noqa: F403 - the public names, listed once in plugins.__all__

__all__ = [*_plugins.__all__, "ScriptedBackend", "scripted_rollout"]  # noqa: F405 - lazy names below


def __getattr__(name: str) -> object:
    """The scripted policy, imported on first use (it pulls in the rollout engine)."""
    if name in ("ScriptedBackend", "scripted_rollout"):
        from agent_r1.testing import scripted

        return getattr(scripted, name)
    raise AttributeError(f"module 'agent_r1.testing' has no attribute {name!r}")
