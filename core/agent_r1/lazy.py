"""Package attributes imported on first use (PEP 562), so that importing a package stays light.

For agent-r1's packages and for plugin packages alike: a plugin is imported through its entry point
whenever agent-r1 discovers components, so its ``__init__`` should import nothing heavy::

    from agent_r1.lazy import lazy_dir, lazy_getattr

    _EXPORTS = {".sandbox": ("PythonSession", "run_python"), ".pool": ("SandboxPool",)}
    __all__ = sorted(name for names in _EXPORTS.values() for name in names)
    __getattr__ = lazy_getattr(__name__, _EXPORTS)
    __dir__ = lazy_dir(__name__, _EXPORTS)
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = ["lazy_dir", "lazy_getattr"]


def lazy_getattr(package: str, exports: Mapping[str, Sequence[str]]) -> Callable[[str], Any]:
    """A module-level ``__getattr__`` for ``package`` that imports each name of ``exports`` (module →
    the public names it defines; a module starting with ``.`` is relative to ``package``) from its
    module on first access and keeps it in the package; any other name is an ``AttributeError``
    naming ``package``."""
    _check(package, exports)
    modules = {name: module for module, names in exports.items() for name in names}

    def __getattr__(name: str) -> Any:
        if name not in modules:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(modules[name], package), name)
        owner = sys.modules.get(package)
        if owner is not None:
            setattr(owner, name, value)
        return value

    return __getattr__


def lazy_dir(package: str, exports: Mapping[str, Sequence[str]]) -> Callable[[], list[str]]:
    """A module-level ``__dir__`` for ``package``: its own names and those of ``exports``."""
    names = {name for names in exports.values() for name in names}

    def __dir__() -> list[str]:
        owner = sys.modules.get(package)
        return sorted(names | set(vars(owner) if owner is not None else ()))

    return __dir__


def _check(package: str, exports: Mapping[str, Sequence[str]]) -> None:
    for module, names in exports.items():
        if isinstance(names, str):  # ("name") is a string, not a one-name tuple
            raise TypeError(f"{package}: the exports of {module!r} must be a tuple of names, got {names!r}")
