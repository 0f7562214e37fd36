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

import importlib.metadata as metadata
import inspect
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
from agent_r1.contracts import CONTRACTS, KIND_LABELS, KINDS, Component, Provenance
from agent_r1.errors import ComponentConflict, ComponentNotFound, PluginError, did_you_mean

ENTRY_POINT_GROUP = "agent_r1"
BUILTIN_PLUGIN = "builtins"
OWN_DISTRIBUTION = "agent-r1"


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
    rejected: dict[str, dict[str, str]] = field(default_factory=dict)
    """kind → component name → why the class registered under that name was refused."""

    @property
    def provenance(self) -> Provenance:
        return Provenance(self.name, self.distribution, self.version, self.module)

    def describe(self) -> str:
        """``plugin 'x' (distribution d 1.0, entry point x = module)``: used in every message."""
        return (
            f"plugin {self.name!r} (distribution {self.distribution} {self.version}, "
            f"entry point {self.name} = {self.module})"
        )

    def as_dict(self) -> dict[str, Any]:
        """Plain data for ``agent-r1 plugins list --json``."""
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
        self._commands: dict[str, list[tuple[Any, PluginInfo]]] | None = None
        self._lock = threading.RLock()
        self._warned: set[str] = set()
        self._lenient = False  # set while `doctor` runs: report everything, raise nothing
        self._python_paths: dict[tuple[str, str], type[Component]] = {}

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
            self._python_paths.clear()  # a new plugin name may now claim a 'name:...' prefix
            self._commands = None
            if info.status == "broken":
                if self._is_strict():
                    raise PluginError(f"{info.describe()}: {'; '.join(info.errors)}")
                self._warn(info)
            return info

    def _add(self, info: PluginInfo, plugin: object) -> None:
        if info.name in self._plugins and self._plugins[info.name].status == "loaded":
            other = self._plugins[info.name]
            info.status = "broken"
            info.errors.append(
                f"entry point name {info.name!r} is already used by distribution "
                f"{other.distribution} {other.version}; rename one of the entry points"
            )
            self._plugins[f"{info.name}@{info.distribution}"] = info
            return
        try:
            self.pm.register(plugin, name=info.name)
        except Exception as exc:  # pluggy validates hookimpl signatures here
            info.status = "broken"
            info.errors.append(f"could not register its hook implementations: {_short_error(exc)}")
        else:
            info.status = "loaded"
            for caller in self.pm.get_hookcallers(plugin) or []:
                if caller.spec is None:  # pluggy accepts unknown hooks silently; a typo is a bug
                    known = [n for n in dir(hookspecs) if n.startswith(("register_", "on_"))]
                    info.status = "broken"
                    info.errors.append(
                        f"implements {caller.name!r}, which is not an agent-r1 hook, so it is never "
                        f"called.{did_you_mean(caller.name, known)}"
                    )
        self._plugins[info.name] = info

    def load(self) -> None:
        """Import every plugin module named by an ``agent_r1`` entry point (once).

        Raises :class:`~agent_r1.PluginError` (on this and every later call) when
        ``AGENT_R1_STRICT_PLUGINS`` is set and a plugin is broken; otherwise each broken plugin is
        one :class:`PluginLoadWarning`.
        """
        with self._lock:
            if not self._loaded:
                self._loaded = True
                if self._use_entry_points:
                    self._load_entry_points()
                for plugin_info in self._plugins.values():
                    if plugin_info.status == "broken" and not self._is_strict():
                        self._warn(plugin_info)
            self._raise_if_strict()

    def _load_entry_points(self) -> None:
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
                key = ep.name if ep.name not in self._plugins else f"{ep.name}@{dist_name}"
                self._plugins[key] = info
                continue
            self._add(info, plugin)

    def _is_strict(self) -> bool:
        return _strict() and not self._lenient

    def _raise_if_strict(self) -> None:
        if not self._is_strict():
            return
        broken = [p for p in self._plugins.values() if p.status == "broken"]
        if broken:
            raise PluginError(
                "AGENT_R1_STRICT_PLUGINS is set and these plugins are broken:\n"
                + "\n".join(f"  - {p.describe()}: {'; '.join(p.errors)}" for p in broken)
                + "\nFix or uninstall them, disable them with AGENT_R1_DISABLE_PLUGINS=<plugin>, or "
                "unset AGENT_R1_STRICT_PLUGINS."
            )

    def _warn(self, info: PluginInfo) -> None:
        key = f"{info.name}@{info.distribution}"
        if key in self._warned:
            return
        self._warned.add(key)
        warnings.warn(
            f"{info.describe()} is broken: {'; '.join(info.errors)}. What it failed to provide is "
            "unavailable. Run `agent-r1 plugins doctor` for details; set AGENT_R1_DISABLE_PLUGINS="
            f"{info.name} to silence this.",
            PluginLoadWarning,
            stacklevel=4,
        )

    def plugins(self) -> list[PluginInfo]:
        """Every plugin seen, loaded or not, with the components it provides (loads every kind)."""
        self.load()
        for kind in KINDS:
            self._table(kind)
        self.commands()
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
            by_name = self._active_plugins()
            for info in by_name.values():  # a rebuilt table must not list components twice
                info.components.pop(kind, None)
                info.rejected.pop(kind, None)
            for impl in caller.get_hookimpls():  # registration order
                provider = by_name.get(impl.plugin_name)
                if provider is None:
                    continue
                for cls in self._collect(kind, impl.function, provider):
                    table.setdefault(cls.name, []).append(Registered(cls, provider))
                    provider.components.setdefault(kind, []).append(cls.name)
            self._tables[kind] = table
            return table

    def _active_plugins(self) -> dict[str, PluginInfo]:
        return {info.name: info for info in self._plugins.values() if info.status != "disabled"}

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
                name = getattr(item, "name", None)
                if isinstance(name, str) and name:
                    info.rejected.setdefault(kind, {})[name] = problem
                self._broken(info, f"{hook}() returned {item!r}: {problem}")
                continue
            item.provenance = info.provenance
            good.append(item)
        return good

    def _broken(self, info: PluginInfo, message: str) -> None:
        if message not in info.errors:
            info.errors.append(message)
        info.status = "broken"
        if self._is_strict():
            raise PluginError(
                f"{info.describe()}: {message}. AGENT_R1_STRICT_PLUGINS is set, so this is an error; "
                f"fix the plugin or disable it with AGENT_R1_DISABLE_PLUGINS={info.name}."
            )
        self._warn(info)

    # -- lookups ---------------------------------------------------------------------------
    def names(self, kind: str) -> list[str]:
        """Every component name of ``kind`` that loaded plugins provide, sorted."""
        return sorted(self._table(kind))

    def providers(self, kind: str, name: str) -> list[Registered]:
        """Every provider of ``name`` (more than one means a conflict that ``plugin:name`` resolves)."""
        return list(self._table(kind).get(name, []))

    def get(self, kind: str, name: str) -> type[Component]:
        """The class registered under ``name`` (or ``plugin:name`` to pick one provider), or the
        object that the Python path ``module:attribute`` names.

        The rule for a name with a ``:``: when the part before it is the name or distribution of a
        plugin this registry knows (loaded, broken or disabled), the name picks that plugin's
        component; otherwise it is a Python path, imported by :mod:`agent_r1.python_paths` (a
        component class, or a function for reward shapers and datasets).
        """
        table = self._table(kind)
        label = KIND_LABELS[kind]
        plugin_name, _, short = name.rpartition(":")
        if plugin_name and not self._is_plugin(plugin_name):
            return self._python_path(kind, name)
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

    def _is_plugin(self, name: str) -> bool:
        return any(name in (info.name, info.distribution) for info in self._plugins.values())

    def _python_path(self, kind: str, name: str) -> type[Component]:
        from agent_r1.python_paths import PythonModuleNotFound, load_python_path

        with self._lock:
            key = (kind, name)
            if key not in self._python_paths:
                plugins = {info.name for info in self._plugins.values()}
                try:
                    self._python_paths[key] = load_python_path(kind, name, plugins=plugins)
                except PythonModuleNotFound as exc:
                    plugin_name, _, short = name.rpartition(":")
                    providers = self._table(kind).get(short)
                    if not providers:
                        raise
                    label = KIND_LABELS[kind]
                    who = ", ".join(repr(r.plugin.name) for r in providers)
                    raise ComponentNotFound(
                        f"no plugin named {plugin_name!r} provides {label} {short!r}; it is provided by "
                        f"{who}. Write '<plugin>:{short}' with one of those, or just {short!r}. (Read "
                        f"as a Python path, {name!r} fails too: {exc})"
                    ) from None
            return self._python_paths[key]

    def _not_found_message(self, kind: str, name: str) -> str:
        label = KIND_LABELS[kind]
        table = self._table(kind)
        known = sorted(table)
        plugin_name, _, short = name.rpartition(":")
        if plugin_name and short in table:
            providers = ", ".join(repr(r.plugin.name) for r in table[short])
            return (
                f"no plugin named {plugin_name!r} provides {label} {short!r}; it is provided by "
                f"{providers}. Write '<plugin>:{short}' with one of those, or just {short!r}."
                + _shadowed_module_note(plugin_name, name)
            )
        owner = next((i for i in self._plugins.values() if plugin_name in (i.name, i.distribution)), None)
        if plugin_name and owner is not None and owner.status == "loaded":
            offered = sorted(owner.components.get(kind, []))
            return (
                f"{owner.describe()} provides no {label} {short!r} (its {label}s: "
                f"{', '.join(offered) if offered else 'none'})."
                f"{did_you_mean(short, offered)}" + _shadowed_module_note(plugin_name, name)
            )
        message = f"unknown {label} {name!r}."
        for info in self._plugins.values():
            problem = info.rejected.get(kind, {}).get(short)
            if problem:
                return (
                    f"{label} {short!r} is provided by {info.describe()}, but the plugin is broken: "
                    f"{problem}. Fix or upgrade the plugin, or choose another {label}."
                )
        message += did_you_mean(short, known)
        message += f" Known {label}s: {', '.join(known) if known else '(none)'}."
        broken = [p for p in self._plugins.values() if p.status == "broken"]
        if broken:
            message += " These plugins are broken and may be the ones that provide it: " + "; ".join(
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

    # -- commands ----------------------------------------------------------------------------
    def commands(self) -> dict[str, list[tuple[Any, PluginInfo]]]:
        """Command objects from ``register_commands``, by command name, with the plugin of each.

        More than one provider for a name is a conflict that the command line reports. A hook that
        raises or returns something that is not a command marks its plugin broken.
        """
        with self._lock:
            if self._commands is not None:
                return self._commands
            self.load()
            commands: dict[str, list[tuple[Any, PluginInfo]]] = {}
            by_name = self._active_plugins()
            for info in by_name.values():
                info.components.pop("commands", None)
            for impl in self.pm.hook.register_commands.get_hookimpls():  # registration order
                provider = by_name.get(impl.plugin_name)
                if provider is None:
                    continue
                try:
                    returned = impl.function() or []
                except Exception as exc:
                    self._broken(provider, f"register_commands() raised {_short_error(exc)}")
                    continue
                if not isinstance(returned, Iterable) or isinstance(returned, (str, bytes, Mapping)):
                    self._broken(
                        provider, f"register_commands() must return a list, got {type(returned).__name__}"
                    )
                    continue
                for item in returned:
                    name = _command_name(item)
                    if name is None:
                        self._broken(
                            provider,
                            f"register_commands() returned {item!r}: expected a typer.Typer (with a "
                            "name, or with exactly one command) or a click.Command with a name",
                        )
                        continue
                    commands.setdefault(name, []).append((item, provider))
                    provider.components.setdefault("commands", []).append(name)
            self._commands = commands
            return commands

    # -- observer hooks ----------------------------------------------------------------------
    def notify(self, hook_name: str, **kwargs: Any) -> None:
        """Call an ``on_*`` observer hook on every plugin. An observer that raises is reported as a
        warning naming its plugin; it does not stop training."""
        spec = getattr(hookspecs, hook_name, None)
        if not hook_name.startswith("on_") or spec is None:
            observers = sorted(n for n in dir(hookspecs) if n.startswith("on_"))
            raise ValueError(f"{hook_name!r} is not an observer hook; they are {', '.join(observers)}")
        expected = set(inspect.signature(spec).parameters)
        if set(kwargs) != expected:
            raise TypeError(
                f"{hook_name} takes exactly the arguments {sorted(expected)}, got {sorted(kwargs)}"
            )
        self.load()
        caller = getattr(self.pm.hook, hook_name)
        by_name = {info.name: info for info in self._plugins.values()}
        for impl in caller.get_hookimpls():  # registration order
            try:
                impl.function(**{arg: kwargs[arg] for arg in impl.argnames})
            except Exception as exc:
                info = by_name.get(impl.plugin_name)
                who = info.describe() if info else impl.plugin_name
                warnings.warn(
                    f"{hook_name} of {who} raised {_short_error(exc)}; the run goes on without it",
                    PluginLoadWarning,
                    stacklevel=2,
                )

    def doctor(self) -> list[PluginInfo]:
        """Load every plugin, kind and command, check each component (its default ``Config``
        builds, it rejects unknown keys, no other plugin provides its name), and return the plugin
        list with problems recorded in ``errors``. Never raises for a broken plugin, even under
        strict mode."""
        with self._lock, warnings.catch_warnings():
            warnings.simplefilter("ignore", PluginLoadWarning)
            self._lenient = True
            try:
                infos = self.plugins()
            finally:
                self._lenient = False
            for kind in KINDS:
                for name, providers in self._table(kind).items():
                    for provider in providers:
                        for problem in _doctor_component(provider.cls):
                            _add_error(provider.plugin, f"{KIND_LABELS[kind]} {name!r}: {problem}")
                    if len(providers) > 1:
                        for provider in providers:
                            others = [p.plugin.name for p in providers if p is not provider]
                            _add_error(
                                provider.plugin,
                                f"{KIND_LABELS[kind]} {name!r} is also provided by {', '.join(others)}; "
                                f"runs must write '<plugin>:{name}' to choose",
                            )
            for command, command_providers in self.commands().items():
                if len(command_providers) > 1:
                    for _, owner in command_providers:
                        others = [i.name for _, i in command_providers if i is not owner]
                        _add_error(owner, f"command {command!r} is also provided by {', '.join(others)}")
        return infos


def _shadowed_module_note(plugin_name: str, name: str) -> str:
    """Say so when a Python module has the same name as the plugin that ``name`` selected."""
    import importlib.util

    try:
        found = importlib.util.find_spec(plugin_name) is not None
    except (ImportError, ValueError):  # not a valid module name: nothing is shadowed
        found = False
    if not found:
        return ""
    return (
        f" ({name!r} selects plugin {plugin_name!r}: a plugin name before ':' takes precedence over "
        f"the Python module {plugin_name!r}; to use an object of that module, import it through a "
        "module with another name.)"
    )


def _add_error(info: PluginInfo, message: str) -> None:
    if message not in info.errors:
        info.errors.append(message)


def _command_name(item: Any) -> str | None:
    """The subcommand name of a click-style command or a ``typer.Typer`` (None if neither)."""
    if hasattr(item, "make_context") and callable(item.make_context):  # click.Command (any click)
        name = getattr(item, "name", None)
        return name if isinstance(name, str) and name else None
    try:
        import typer
    except ImportError:  # pragma: no cover - typer is a dependency of the CLI
        return None
    if isinstance(item, typer.Typer):
        info_name = item.info.name
        if isinstance(info_name, str) and info_name:
            return info_name
        commands = item.registered_commands
        if len(commands) == 1 and not item.registered_groups:
            command = commands[0]
            if command.name:
                return command.name
            if command.callback is not None:
                return command.callback.__name__.replace("_", "-")
    return None


def _doctor_component(cls: type[Component]) -> list[str]:
    from pydantic import ValidationError

    problems: list[str] = []
    config_cls = cls.Config
    if config_cls.model_config.get("extra") != "forbid":
        problems.append(
            f"{config_cls.__qualname__} accepts unknown keys; subclass agent_r1.ComponentConfig so "
            "that misspelt options are errors"
        )
    try:
        config_cls()
    except ValidationError as exc:
        if any(error["type"] != "missing" for error in exc.errors()):
            problems.append(f"its default {config_cls.__qualname__} is invalid: {exc}")
    except Exception as exc:
        problems.append(f"building its default {config_cls.__qualname__} raised {_short_error(exc)}")
    return problems


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
    from agent_r1.errors import validation_error_message

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
