"""Package attributes imported on first use (PEP 562), so that importing a package stays light."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = ["lazy_getattr"]


def lazy_getattr(package: str, exports: Mapping[str, Sequence[str]]) -> Callable[[str], Any]:
    """A module-level ``__getattr__`` for ``package`` that imports each name of ``exports`` (module →
    the public names it defines) from its module on first access; any other name is an
    ``AttributeError`` naming ``package``."""
    modules = {name: module for module, names in exports.items() for name in names}

    def __getattr__(name: str) -> Any:
        if name in modules:
            return getattr(importlib.import_module(modules[name]), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
