"""Errors a user can cause. Each one says what happened, where, and what to do.

Also the helpers that word such messages (closest-name suggestions, pydantic errors as config
paths), so that every module that raises can use them without importing the config layer.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ValidationError


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


class EnvironmentFatalError(AgentR1Error):
    """Raise it from an environment (or a tool, through ``ToolEnv``) when the run must stop: the
    rollout aborts with this message whatever the engine's ``on_env_error`` policy says. Use it for
    failures the user configured as fatal (for example ``on_retrieval_error: raise``)."""


class ToolInfrastructureError(AgentR1Error):
    """Raise it from a tool when the failure is not the agent's doing (a missing corpus, a failing
    HTTP backend). The policy never sees it as an observation: the environment step fails, and the
    engine counts it as an environment error (or aborts, when the tool says it is fatal)."""


class RunInterrupted(AgentR1Error):
    """SIGINT or SIGTERM stopped a run. The command line prints the message as it is (it is not an
    error of the user's) and exits with ``exit_code`` (128 + the signal number)."""

    def __init__(self, message: str, *, exit_code: int) -> None:
        self.exit_code = exit_code
        super().__init__(message)


class TrainingAborted(AgentR1Error):
    """Training stopped on purpose (non-finite losses that recur, too many environment errors)."""


# --------------------------------------------------------------------------------------------
# Message helpers
# --------------------------------------------------------------------------------------------


def _loc_to_path(loc: Sequence[int | str]) -> str:
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            path += f".{part}" if path else str(part)
    return path


def _model_at(model: type[BaseModel] | None, loc: Sequence[int | str]) -> type[BaseModel] | None:
    """Follow ``loc`` through nested pydantic models (lists and optionals included)."""
    import typing

    current: Any = model
    for part in loc:
        if isinstance(part, int):
            continue
        if not (isinstance(current, type) and issubclass(current, BaseModel)):
            return None
        field = current.model_fields.get(str(part))
        if field is None:
            return None
        annotation = field.annotation
        current = None
        for candidate in [annotation, *typing.get_args(annotation)]:
            for inner in [candidate, *typing.get_args(candidate)]:
                if isinstance(inner, type) and issubclass(inner, BaseModel):
                    current = inner
                    break
            if current is not None:
                break
        if current is None:
            return None
    return current if isinstance(current, type) and issubclass(current, BaseModel) else None


def suggestions(word: str, options: Sequence[str], *, limit: int = 3) -> list[str]:
    """The options closest to ``word`` (a likely misspelling), best first; empty when none is close."""
    scored = sorted(
        ((difflib.SequenceMatcher(None, word, option).ratio(), option) for option in options),
        key=lambda pair: (-pair[0], pair[1]),
    )
    if not scored or scored[0][0] < 0.6:
        return []
    best = scored[0][0]
    return [option for ratio, option in scored[:limit] if ratio >= 0.6 and ratio >= best - 0.1]


def did_you_mean(word: str, options: Sequence[str]) -> str:
    """`` Did you mean 'x'?`` (with a leading space), or an empty string."""
    close = suggestions(word, options)
    return f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""


def validation_error_message(
    exc: ValidationError, *, prefix: str = "", model: type[BaseModel] | None = None, root: str = ""
) -> str:
    """Turn a pydantic error into lines ``path: problem (got value). Did you mean ...?``.

    ``root`` is the config path of the section that ``model`` validated (``environment``,
    ``rewards[0]``...): paths in the message are full config paths. ``prefix`` names what was
    validated (``environment 'calculator'``); without ``root`` it leads each line.
    """
    lines = []
    for error in exc.errors():
        loc = list(error.get("loc", ()))
        path = _join_path(root, _loc_to_path(loc))
        if root:
            where = path
            whose = f" of {prefix}" if prefix else ""
        else:
            where = f"{prefix}: {path}" if prefix and path else (prefix or path or "<root>")
            whose = ""
        value = error.get("input")
        if error["type"] == "extra_forbidden":
            parent = _model_at(model, loc[:-1]) if model is not None else None
            known = sorted(parent.model_fields) if parent is not None else []
            hint = did_you_mean(str(loc[-1]), known)
            valid = f" Valid keys: {', '.join(known)}." if known else ""
            lines.append(f"{where}: unknown key {str(loc[-1])!r}{whose}.{hint}{valid}")
        elif error["type"] == "missing":
            lines.append(f"{where}: required{whose} but not set; add it to the config")
        else:
            shown = repr(value)
            if len(shown) > 80:
                shown = shown[:77] + "..."
            owner = f", an option of {prefix}" if root and prefix else ""
            lines.append(f"{where}: {error['msg']} (got {shown}){owner}")
    return "invalid configuration:\n  " + "\n  ".join(lines)


def _join_path(root: str, path: str) -> str:
    if not root:
        return path
    if not path:
        return root
    return f"{root}{path}" if path.startswith("[") else f"{root}.{path}"


def first_error_path(exc: ValidationError, root: str = "") -> str | None:
    errors = exc.errors()
    if not errors:
        return root or None
    return _join_path(root, _loc_to_path(list(errors[0].get("loc", ())))) or None
