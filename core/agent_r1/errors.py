"""Errors a user can cause. Each one says what happened, where, and what to do."""

from __future__ import annotations


class AgentR1Error(Exception):
    """Base class of every error agent-r1 raises on purpose."""


class ConfigError(AgentR1Error):
    """A run configuration is invalid; the message names the config path and the bad value."""

    def __init__(self, message: str, *, path: str | None = None) -> None:
        self.path = path
        super().__init__(message)


class PluginError(AgentR1Error):
    """A plugin failed to load or provided something invalid.

    The message names the distribution, its version, the entry point and the module.
    """


class ComponentNotFound(AgentR1Error):
    """A component name is not provided by any loaded plugin."""


class ComponentConflict(AgentR1Error):
    """Two plugins provide a component of the same kind under the same name."""


class TrajectoryError(AgentR1Error):
    """A trajectory violates the token-faithful contract (lengths, provenance, log-probabilities)."""


class ModelNotFound(AgentR1Error):
    """A model path or name could not be resolved to local files."""


class ToolError(AgentR1Error):
    """Raise it from a tool to show the agent its message as is (``Error: <message>``); any other
    exception is shown with its type name."""
