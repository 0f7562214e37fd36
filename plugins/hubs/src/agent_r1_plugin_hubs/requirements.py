"""The third-party packages behind the hubs' components: which extra installs each, the release it
is tested with, and :func:`require`, which imports one or stops with what to install."""

from __future__ import annotations

import importlib
import importlib.metadata
import warnings
from dataclasses import dataclass
from types import ModuleType

from agent_r1.errors import ConfigError

__all__ = ["PACKAGES", "Package", "require"]


@dataclass(frozen=True)
class Package:
    """A package a family needs: its import name, distribution, the tested release and the extra
    of agent-r1-plugin-hubs that installs it."""

    module: str
    distribution: str
    tested: str
    extra: str


PACKAGES = {
    "reasoning_gym": Package("reasoning_gym", "reasoning-gym", "0.1.25", "reasoning-gym"),
    "textarena": Package("textarena", "textarena", "0.7.4", "textarena"),
    "verifiers": Package("verifiers", "verifiers", "0.4.0", "verifiers"),
    "openenv": Package("openenv", "openenv-core", "0.3.0", "openenv"),
}
"""The packages by import name (the versions are the extras' pins in pyproject.toml)."""

_warned: set[str] = set()


def require(module: str, *, component: str, path: str | None = None) -> ModuleType:
    """Import ``module`` (a key of :data:`PACKAGES`) for ``component``, or raise
    :class:`~agent_r1.errors.ConfigError` naming the ``pip install`` that provides it. A release
    other than the tested one is used with a warning (once)."""
    package = PACKAGES[module]
    try:
        imported = importlib.import_module(package.module)
    except ImportError as exc:
        missing = getattr(exc, "name", None) or package.module
        raise ConfigError(
            f"{component} needs the {package.distribution} package ({missing!r} cannot be imported: "
            f"{exc}); install it with: pip install 'agent-r1-plugin-hubs[{package.extra}]' "
            f"(tested with {package.distribution}=={package.tested})",
            path=path,
        ) from None
    try:
        version = importlib.metadata.version(package.distribution)
    except importlib.metadata.PackageNotFoundError:
        version = None
    if version is not None and version != package.tested and package.module not in _warned:
        _warned.add(package.module)
        warnings.warn(
            f"{package.distribution} {version} is installed; agent-r1-plugin-hubs is tested with "
            f"{package.tested} (pip install 'agent-r1-plugin-hubs[{package.extra}]')",
            stacklevel=2,
        )
    return imported
