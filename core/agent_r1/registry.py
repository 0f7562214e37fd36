"""Plugin loading and component registries.

Plugins are modules named by entry points in the ``agent_r1`` group. We iterate
``importlib.metadata.entry_points`` ourselves (instead of ``pluggy``'s
``load_setuptools_entrypoints``) so that every failure names the distribution, its version, the
entry point and the module. Loading is lazy: ``import agent_r1`` loads nothing, and each kind of
component is collected the first time one of that kind is looked up.

Environment variables:

* ``AGENT_R1_LOAD_PLUGINS``: comma-separated allowlist of plugins (entry point or distribution
  names). Only those third-party plugins load; the bundled ``builtins`` always load.
* ``AGENT_R1_DISABLE_PLUGINS``: comma-separated blocklist (may include ``builtins``).
* ``AGENT_R1_STRICT_PLUGINS=1``: a broken plugin is an error instead of a warning.
"""

from __future__ import annotations

import difflib
import importlib.metadata as metadata
import os
import threading
import traceback
import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pluggy
from pydantic import BaseModel

from agent_r1 import hookspecs
from agent_r1.contracts import CONTRACTS, KINDS, Component, Provenance
from agent_r1.errors import ComponentConflict, ComponentNotFound, PluginError

ENTRY_POINT_GROUP = "agent_r1"
BUILTIN_PLUGIN = "builtins"
OWN_DISTRIBUTION = "agent-r1"

KIND_LABELS = {
    "tools": "tool",
    "environments": "environment",
    "tool_call_formats": "tool-call format",
    "reward_shapers": "reward shaper",
    "advantage_estimators": "advantage estimator",
    "policy_losses": "policy loss",
    "algorithms": "algorithm",
    "rollout_backends": "rollout backend",
    "trackers": "tracker",
    "datasets": "dataset",
}


class PluginLoadWarning(UserWarning):
    """A plugin that the current run does not use failed to load."""


@dataclass
class PluginInfo:
    """One plugin (entry point) and what happened when it was loaded."""

    name: str
    distribution: str
    version: str
    module: str
    status: str = "pending"  # pending | loaded | broken | disabled
    errors: list[str] = field(default_factory=list)
    components: dict[str, list[str]] = field(default_factory=dict)

    @property
    def provenance(self) -> Provenance:
        return Provenance(self.name, self.distribution, self.version, self.module)

    def describe(self) -> str:
        return (
            f"plugin {self.name!r} (distribution {self.distribution} {self.version}, "
            f"entry point {self.name} = {self.module})"
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "distribution": self.distribution,
            "version": self.version,
            "module": self.module,
            "status": self.status,
            "errors": list(self.errors),
            "components": {k: sorted(v) for k, v in self.components.items() if v},
        }


@dataclass
class Registered:
    """A component class with the plugin that provided it."""

    cls: type[Component]
    plugin: PluginInfo


def _env_list(name: str) -> set[str]:
    return {item.strip() for item in os.environ.get(name, "").split(",") if item.strip()}


def _strict() -> bool:
    return os.environ.get("AGENT_R1_STRICT_PLUGINS", "").strip().lower() in {"1", "true", "yes", "on"}


def _short_error(exc: BaseException) -> str:
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" (at {frames[-1].filename}:{frames[-1].lineno})" if frames else ""
    return f"{type(exc).__name__}: {exc}{where}"


class Registry:
    """The plugin manager plus one lazily built table per component kind.

    Most code uses the process-wide instance from :func:`get_registry`. Embedders and tests can
    build their own and add in-process plugins with :meth:`register_plugin`.
    """

    def __init__(self, *, entry_points: bool = True) -> None:
        self.pm = pluggy.PluginManager(hookspecs.PROJECT)
        self.pm.add_hookspecs(hookspecs)
        self._use_entry_points = entry_points
        self._plugins: dict[str, PluginInfo] = {}
        self._loaded = False
        self._tables: dict[str, dict[str, list[Registered]]] = {}
        self._lock = threading.RLock()
        self._warned: set[str] = set()

    # -- loading ---------------------------------------------------------------------------
    def register_plugin(
        self, plugin: object, name: str, *, distribution: str = "<in-process>", version: str = "0"
    ) -> PluginInfo:
        """Register an already imported plugin object (a module or an instance with hookimpls)."""
        with self._lock:
            module = getattr(plugin, "__name__", type(plugin).__name__)
            info = PluginInfo(name, distribution, version, module)
            self._add(info, plugin)
            self._tables.clear()
            return info

    def _add(self, info: PluginInfo, plugin: object) -> None:
        if info.name in self._plugins and self._plugins[info.name].status == "loaded":
            other = self._plugins[info.name]
            info.status = "broken"
            info.errors.append(
                f"entry point name {info.name!r} is already used by distribution "
                f"{other.distribution} {other.version}"
            )
            self._plugins[f"{info.name}@{info.distribution}"] = info
            return
        try:
            self.pm.register(plugin, name=info.name)
        except Exception as exc:  # pluggy validates hookimpl signatures here
            info.status = "broken"
            info.errors.append(f"invalid hook implementation: {_short_error(exc)}")
        else:
            info.status = "loaded"
        self._plugins[info.name] = info

    def load(self) -> None:
        """Import every plugin module named by an ``agent_r1`` entry point (once)."""
        with self._lock:
            if self._loaded:
                return
            self._loaded = True
            if not self._use_entry_points:
                return
            allow, block = _env_list("AGENT_R1_LOAD_PLUGINS"), _env_list("AGENT_R1_DISABLE_PLUGINS")
            seen: set[tuple[str, str]] = set()
            for ep in sorted(metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
                dist = ep.dist
                dist_name = dist.metadata["Name"] if dist is not None else "<unknown>"
                version = dist.version if dist is not None else "?"
                if (ep.name, ep.value) in seen:  # the same distribution seen twice on sys.path
                    continue
                seen.add((ep.name, ep.value))
                info = PluginInfo(ep.name, dist_name, version, ep.value)
                builtin = ep.name == BUILTIN_PLUGIN and dist_name == OWN_DISTRIBUTION
                names = {ep.name, dist_name}
                if names & block or (allow and not builtin and not names & allow):
                    info.status = "disabled"
                    self._plugins.setdefault(ep.name, info)
                    continue
                try:
                    plugin = ep.load()
                except BaseException as exc:  # a plugin must never take the process down
                    if isinstance(exc, KeyboardInterrupt):
                        raise
                    info.status = "broken"
                    info.errors.append(f"import failed: {_short_error(exc)}")
                    self._plugins.setdefault(ep.name, info)
                    if ep.name in self._plugins and self._plugins[ep.name] is not info:
                        self._plugins[f"{ep.name}@{dist_name}"] = info
                    continue
                self._add(info, plugin)
            broken = [p for p in self._plugins.values() if p.status == "broken"]
            if broken and _strict():
                raise PluginError(
                    "AGENT_R1_STRICT_PLUGINS is set and these plugins are broken:\n"
                    + "\n".join(f"  - {p.describe()}: {'; '.join(p.errors)}" for p in broken)
                )
            for plugin_info in broken:
                self._warn(plugin_info)

    def _warn(self, info: PluginInfo) -> None:
        key = f"{info.name}@{info.distribution}"
        if key in self._warned:
            return
        self._warned.add(key)
        warnings.warn(
            f"{info.describe()} is broken and was skipped: {'; '.join(info.errors)}. "
            "Run `agent-r1 plugins doctor` for details; set AGENT_R1_DISABLE_PLUGINS="
            f"{info.name} to silence this.",
            PluginLoadWarning,
            stacklevel=3,
        )

    def plugins(self) -> list[PluginInfo]:
        """Every plugin seen, loaded or not (loads them first)."""
        self.load()
        for kind in KINDS:
            self._table(kind)
        return sorted(self._plugins.values(), key=lambda p: (p.name != BUILTIN_PLUGIN, p.name))

    # -- per-kind tables -------------------------------------------------------------------
    def _table(self, kind: str) -> dict[str, list[Registered]]:
        if kind not in hookspecs.REGISTRATION_HOOKS:
            raise ValueError(f"unknown component kind {kind!r}; kinds are {', '.join(KINDS)}")
        with self._lock:
            if kind in self._tables:
                return self._tables[kind]
            self.load()
            table: dict[str, list[Registered]] = {}
            caller = getattr(self.pm.hook, hookspecs.REGISTRATION_HOOKS[kind])
            by_name = {info.name: info for info in self._plugins.values() if info.status != "disabled"}
            for impl in reversed(caller.get_hookimpls()):  # registration order
                info = by_name.get(impl.plugin_name)
                if info is None:
                    continue
                for cls in self._collect(kind, impl.function, info):
                    table.setdefault(cls.name, []).append(Registered(cls, info))
                    info.components.setdefault(kind, []).append(cls.name)
            self._tables[kind] = table
            return table

    def _collect(self, kind: str, function: Callable[[], Any], info: PluginInfo) -> list[type[Component]]:
        hook = hookspecs.REGISTRATION_HOOKS[kind]
        try:
            returned = function()
        except Exception as exc:
            self._broken(info, f"{hook}() raised {_short_error(exc)}")
            return []
        if returned is None:
            return []
        if not isinstance(returned, Iterable) or isinstance(returned, (str, bytes, Mapping)):
            self._broken(info, f"{hook}() must return a list of classes, got {type(returned).__name__}")
            return []
        base = CONTRACTS[kind]
        good: list[type[Component]] = []
        for item in returned:
            problem = _check_component(item, base)
            if problem:
                self._broken(info, f"{hook}() returned {item!r}: {problem}")
                continue
            item.provenance = info.provenance
            good.append(item)
        return good

    def _broken(self, info: PluginInfo, message: str) -> None:
        info.errors.append(message)
        info.status = "broken"
        if _strict():
            raise PluginError(f"{info.describe()}: {message}")
        self._warn(info)

    # -- lookups ---------------------------------------------------------------------------
    def names(self, kind: str) -> list[str]:
        return sorted(self._table(kind))

    def providers(self, kind: str, name: str) -> list[Registered]:
        return list(self._table(kind).get(name, []))

    def get(self, kind: str, name: str) -> type[Component]:
        """The class registered under ``name`` (or ``plugin:name`` to pick one provider)."""
        table = self._table(kind)
        label = KIND_LABELS[kind]
        plugin_name, _, short = name.rpartition(":")
        candidates = table.get(short, [])
        if plugin_name:
            candidates = [c for c in candidates if plugin_name in (c.plugin.name, c.plugin.distribution)]
        if len(candidates) == 1:
            return candidates[0].cls
        if len(candidates) > 1:
            who = " and ".join(
                f"{c.plugin.describe()} ({c.cls.__module__}.{c.cls.__qualname__})" for c in candidates
            )
            choices = " or ".join(f"'{c.plugin.name}:{short}'" for c in candidates)
            raise ComponentConflict(
                f"{label} {short!r} is provided by more than one plugin: {who}. Choose one by "
                f"writing {choices} in the config, or disable a plugin with "
                f"AGENT_R1_DISABLE_PLUGINS=<plugin>."
            )
        raise ComponentNotFound(self._not_found_message(kind, name))

    def _not_found_message(self, kind: str, name: str) -> str:
        label = KIND_LABELS[kind]
        known = sorted(self._table(kind))
        message = f"unknown {label} {name!r}."
        close = difflib.get_close_matches(name.rpartition(":")[2], known, n=3, cutoff=0.5)
        if close:
            message += f" Did you mean {' or '.join(repr(c) for c in close)}?"
        message += f" Known {label}s: {', '.join(known) if known else '(none)'}."
        broken = [p for p in self._plugins.values() if p.status == "broken"]
        if broken:
            message += " These plugins failed to load and may provide it: " + "; ".join(
                f"{p.describe()}: {'; '.join(p.errors)}" for p in broken
            )
        disabled = [p.name for p in self._plugins.values() if p.status == "disabled"]
        if disabled:
            message += f" Disabled by AGENT_R1_LOAD_PLUGINS/AGENT_R1_DISABLE_PLUGINS: {', '.join(disabled)}."
        return message

    def build(
        self, kind: str, name: str, config: Mapping[str, Any] | BaseModel | None = None, **kwargs: Any
    ) -> Any:
        """Look up ``name`` and instantiate it with its validated ``Config``."""
        cls = self.get(kind, name)
        validated = validate_component_config(cls, config, where=f"{KIND_LABELS[kind]} {name!r}")
        return cls(validated, **kwargs)

    # -- observer hooks ----------------------------------------------------------------------
    def notify(self, hook_name: str, **kwargs: Any) -> None:
        """Call an ``on_*`` observer hook on every plugin. An observer that raises is reported as a
        warning naming its plugin; it does not stop training."""
        if not hook_name.startswith("on_"):
            raise ValueError(f"{hook_name!r} is not an observer hook")
        self.load()
        caller = getattr(self.pm.hook, hook_name)
        by_name = {info.name: info for info in self._plugins.values()}
        for impl in reversed(caller.get_hookimpls()):
            try:
                impl.function(**{arg: kwargs[arg] for arg in impl.argnames})
            except Exception as exc:
                info = by_name.get(impl.plugin_name)
                who = info.describe() if info else impl.plugin_name
                warnings.warn(
                    f"{hook_name} of {who} raised {_short_error(exc)}", PluginLoadWarning, stacklevel=2
                )

    def doctor(self) -> list[PluginInfo]:
        """Load every plugin and every kind, instantiate each component's default ``Config``, and
        return the plugin list with problems recorded in ``errors``."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", PluginLoadWarning)
            infos = self.plugins()
            for kind in KINDS:
                for name, providers in self._table(kind).items():
                    if len(providers) > 1:
                        for provider in providers:
                            others = [p.plugin.name for p in providers if p is not provider]
                            provider.plugin.errors.append(
                                f"{KIND_LABELS[kind]} {name!r} is also provided by {', '.join(others)}"
                            )
        return infos


def _check_component(item: Any, base: type[Component]) -> str | None:
    if not isinstance(item, type):
        return f"expected a class, got a {type(item).__name__} instance"
    if not issubclass(item, base):
        return f"{item.__qualname__} does not subclass agent_r1.{base.__name__}"
    name = getattr(item, "name", "")
    if not isinstance(name, str) or not name:
        return f"{item.__qualname__} has no 'name' (set a class attribute name = \"...\")"
    if ":" in name:
        return f"component name {name!r} must not contain ':'"
    config = getattr(item, "Config", None)
    if not (isinstance(config, type) and issubclass(config, BaseModel)):
        return f"{item.__qualname__}.Config must be a pydantic BaseModel subclass"
    return None


def validate_component_config(
    cls: type[Component], config: Mapping[str, Any] | BaseModel | None, *, where: str
) -> Any:
    """Validate one component's section with its own ``Config``; errors name ``where``."""
    from agent_r1.config import validation_error_message  # local: config imports registry lazily too

    if isinstance(config, cls.Config):
        return config
    data = (
        dict(config) if isinstance(config, Mapping) else (config.model_dump() if config is not None else {})
    )
    try:
        return cls.Config.model_validate(data)
    except Exception as exc:
        from pydantic import ValidationError

        from agent_r1.errors import ConfigError

        if isinstance(exc, ValidationError):
            raise ConfigError(validation_error_message(exc, prefix=where, model=cls.Config)) from None
        raise


_default: Registry | None = None
_default_lock = threading.Lock()


def get_registry() -> Registry:
    """The process-wide registry (created on first use; loads nothing until a lookup)."""
    global _default
    with _default_lock:
        if _default is None:
            _default = Registry()
        return _default


def reset_registry(registry: Registry | None = None) -> Registry:
    """Replace the process-wide registry (tests, embedders). Returns the new one."""
    global _default
    with _default_lock:
        _default = registry if registry is not None else Registry()
        return _default
