"""Old import paths of modules that moved, kept working for one minor release.

``import agent_r1.engine.batch`` (and ``from agent_r1.engine.batch import collate``) still work
after the module moved to ``agent_r1.engine.learner.batch``: an import hook answers the old name
with the new module itself (so monkeypatching through either name patches the same object) and
warns with a :class:`DeprecationWarning` that names the new path. A module that was split answers
with a module whose attributes are looked up in each of its successors, in order.

The table :data:`MOVED` is the one place that lists what moved where (see CHANGELOG.md, "Plugin
API"). The hook is installed when :mod:`agent_r1.engine` is imported, which every old path
imports first.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types
import warnings
from collections.abc import Sequence
from typing import Any

REMOVED_IN = "0.3.0"

MOVED: dict[str, tuple[str, ...]] = {
    # the agent loop and what it renders (torch-free)
    "agent_r1.engine.rollout": ("agent_r1.rollout.loop",),
    "agent_r1.engine.chat": ("agent_r1.rollout.chat", "agent_r1.rollout.templates"),
    "agent_r1.engine.decoding": ("agent_r1.rollout.decoder", "agent_r1.engine.experimental.decoding"),
    # models: cache, bundled conversion, paths, loading, KV helpers
    "agent_r1.engine.models": (
        "agent_r1.models.cache",
        "agent_r1.models.bundled",
        "agent_r1.models.paths",
        "agent_r1.models.loading",
    ),
    "agent_r1.engine.kv": ("agent_r1.models.kv",),
    # the learner's pieces
    "agent_r1.engine.batch": ("agent_r1.engine.learner.batch",),
    "agent_r1.engine.loss_utils": ("agent_r1.engine.learner.loss_utils",),
    "agent_r1.engine.critic": ("agent_r1.engine.learner.critic",),
    "agent_r1.engine.rollout_correction": ("agent_r1.engine.learner.rollout_correction",),
    "agent_r1.engine.turns": ("agent_r1.engine.learner.turns",),
    # what a run leaves behind
    "agent_r1.engine.checkpoint": ("agent_r1.engine.artifacts.checkpoint",),
    "agent_r1.engine.export": ("agent_r1.engine.artifacts.export",),
    "agent_r1.engine.critic_files": ("agent_r1.engine.artifacts.critic_files",),
    # what a run reports
    "agent_r1.engine.stats": ("agent_r1.engine.reports.stats",),
    "agent_r1.engine.evaluation": ("agent_r1.engine.reports.evaluation",),
    "agent_r1.engine.report": ("agent_r1.engine.reports.report",),
    "agent_r1.engine.viewer": ("agent_r1.engine.reports.viewer",),
    "agent_r1.engine.progress": ("agent_r1.engine.reports.progress",),
    # the run around the steps
    "agent_r1.engine.runner": (
        "agent_r1.run.training",
        "agent_r1.run.commands",
        "agent_r1.run.rundir",
        "agent_r1.run.console",
    ),
    "agent_r1.engine.preflight": ("agent_r1.run.preflight",),
}
"""Old module path → its successor(s), new code first."""


class _Composite(types.ModuleType):
    """The old name of a module that was split: attributes come from its successors."""

    def __init__(self, name: str, successors: Sequence[types.ModuleType]) -> None:
        super().__init__(name, f"moved to {', '.join(m.__name__ for m in successors)}")
        self._successors = tuple(successors)

    def __getattr__(self, attribute: str) -> Any:
        for module in self._successors:
            if hasattr(module, attribute):
                return getattr(module, attribute)
        raise AttributeError(
            f"module {self.__name__!r} has no attribute {attribute!r} (it moved to "
            f"{', '.join(m.__name__ for m in self._successors)})"
        )

    def __dir__(self) -> list[str]:
        return sorted({name for module in self._successors for name in dir(module)})


class _MovedModuleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Answers the old paths in :data:`MOVED`."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MOVED:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        successors = MOVED[spec.name]
        warnings.warn(
            f"{spec.name} moved to {' and '.join(successors)}; import it from there (the old path goes "
            f"in agent-r1 {REMOVED_IN})",
            DeprecationWarning,
            stacklevel=_importer_stacklevel(),
        )
        modules = [importlib.import_module(name) for name in successors]
        return modules[0] if len(modules) == 1 else _Composite(spec.name, modules)

    def exec_module(self, module: types.ModuleType) -> None:
        return None  # the successor modules are already executed


def _importer_stacklevel() -> int:
    """The stack level of the first frame outside the import machinery and this module, so that
    the warning points at the line that imported the old path."""
    frame = sys._getframe(1)
    level = 1
    while frame is not None and (
        frame.f_code.co_filename.startswith("<frozen importlib") or frame.f_code.co_filename == __file__
    ):
        frame = frame.f_back  # type: ignore[assignment]
        level += 1
    return level


def install() -> None:
    """Put the finder on ``sys.meta_path`` (once)."""
    if not any(isinstance(finder, _MovedModuleFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _MovedModuleFinder())


__all__ = ["MOVED", "install"]
