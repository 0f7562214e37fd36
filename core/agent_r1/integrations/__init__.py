"""Adapters that embed agent-r1's multi-turn engine in other trainers.

- :mod:`agent_r1.integrations.trl`: a ``rollout_func`` for TRL's ``GRPOTrainer``, a rollout worker
  for TRL's experimental ``AsyncGRPOTrainer``, and TRL ``environment_factory`` classes as agent-r1
  environments (``pip install "agent-r1[trl]"``).
- :mod:`agent_r1.integrations.verl`: an ``AgentLoopBase`` subclass that runs an agent-r1
  environment through verl's LLM server manager, and verl ``BaseTool`` classes as agent-r1 tools
  (``pip install "agent-r1[verl]"``).

Each adapter runs the same :class:`~agent_r1.rollout.loop.RolloutEngine` as agent-r1's own
trainer, so trajectories stay token-faithful and only policy-sampled tokens carry loss. Importing
this package imports neither TRL nor verl; importing a submodule without its library raises
:class:`IntegrationError` saying what to install.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from agent_r1.errors import AgentR1Error

__all__ = ["IntegrationError", "require"]


class IntegrationError(AgentR1Error):
    """An integration is used in a way its host library does not support, or that library is missing
    or of an untested version."""


def require(module: str, extra: str, tested: str) -> ModuleType:
    """Import ``module`` or raise :class:`IntegrationError` naming the extra that installs it and the
    version the adapter was tested with."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise IntegrationError(
            f"agent_r1.integrations.{extra} needs {module!r}, which cannot be imported ({exc}). Install it "
            f'with `pip install "agent-r1[{extra}]"` (tested with {tested}).'
        ) from exc
