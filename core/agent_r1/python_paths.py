"""Components given as a Python path (``module:attribute``) instead of a registered name.

A run config may name a reward function, a dataset (or any component class) by where it lives,
without writing a plugin distribution::

    rewards:
      - name: my_rewards:exact_answer     # def exact_answer(trajectory, task) -> float
    data:
      name: my_data.tasks:ArithmeticTasks  # class ArithmeticTasks(agent_r1.Dataset)

:meth:`agent_r1.registry.Registry.get` decides: a name with a ``:`` whose left part is the name
(or distribution) of an installed plugin picks that plugin's component, as always; any other
``module:attribute`` is imported here. The module is imported the way Python imports it (its
``sys.path``, ``PYTHONPATH``); when that fails, the working directory is appended to ``sys.path``
and the import tried once more, so that a ``my_rewards.py`` next to the run config works with the
``agent-r1`` command too.

What the attribute may be:

* a class that subclasses the kind's contract (``RewardShaper``, ``Dataset``, ``Environment``...):
  used as it is (a class without a ``name`` gets the attribute's name);
* for reward shapers, a function ``fn(trajectory, task, **options) -> float | RewardSignal |
  list[RewardSignal]`` (may be ``async``): a float becomes one outcome signal named after the
  function;
* for datasets, a function ``fn(split, **options)`` returning tasks (:class:`~agent_r1.Task` objects
  or mappings of Task fields; a missing ``id`` becomes ``<split>-<index>``).

A function's keyword parameters after those are its options: the rest of its config section is
validated against them (unknown keys are errors, parameters without a default are required).
Every class built from a Python path carries a :class:`~agent_r1.Provenance` whose ``module`` is
the Python path and whose distribution and version name the installed distribution of the module,
or, for a loose file, its path and a hash of its source.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata as metadata
import importlib.util
import inspect
import os
import sys
import traceback
import typing
from collections.abc import Awaitable, Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from pydantic import ConfigDict, create_model

from agent_r1.contracts import CONTRACTS, KIND_LABELS, Component, ComponentConfig, Dataset, RewardShaper
from agent_r1.errors import AgentR1Error, ComponentNotFound, did_you_mean
from agent_r1.mdp import RewardSignal, Task

PYTHON_PATH_PLUGIN = "(python path)"
"""The ``plugin`` of the provenance of components given as a Python path."""

__all__ = ["PYTHON_PATH_PLUGIN", "PythonModuleNotFound", "is_python_path", "load_python_path"]


class PythonModuleNotFound(ComponentNotFound):
    """The module of a Python path cannot be imported because it does not exist (as opposed to a
    module that exists and fails while importing)."""


def is_python_path(name: str) -> bool:
    """True when ``name`` has the shape ``dotted.module:attribute`` (the attribute may be dotted)."""
    module_name, colon, attribute = name.partition(":")
    return bool(colon) and _dotted(module_name) and _dotted(attribute)


def _dotted(text: str) -> bool:
    return bool(text) and all(part.isidentifier() for part in text.split("."))


def load_python_path(kind: str, name: str, *, plugins: Iterable[str] = ()) -> type[Component]:
    """The component class of ``kind`` that the Python path ``name`` stands for (see the module
    docstring). Raises :class:`~agent_r1.ComponentNotFound` saying what was tried: ``plugins`` are
    the installed plugin names, mentioned when the left part of ``name`` is none of them."""
    label = KIND_LABELS[kind]
    module_name, _, attribute = name.partition(":")
    not_a_plugin = (
        f"{module_name!r} is not an installed plugin (plugins: {', '.join(sorted(plugins)) or 'none'}), "
        f"so {name!r} was read as a Python path module:attribute"
    )
    if not is_python_path(name):
        raise ComponentNotFound(
            f"unknown {label} {name!r}: {not_a_plugin}, but it is not one (write "
            "dotted.module:attribute with Python identifiers, e.g. my_rewards:exact_answer, or "
            "<plugin>:<name> with an installed plugin)."
        )
    module = _import(module_name, name, label, not_a_plugin)
    target: Any = module
    for depth, part in enumerate(attribute.split(".")):
        if not hasattr(target, part):
            where = module_name if depth == 0 else f"{module_name}:{'.'.join(attribute.split('.')[:depth])}"
            public = [n for n in dir(target) if not n.startswith("_")]
            raise ComponentNotFound(
                f"{label} {name!r}: {where} ({_file_of(module)}) has no attribute {part!r}."
                f"{did_you_mean(part, public)}"
            )
        target = getattr(target, part)
    contract = CONTRACTS[kind]
    provenance = _provenance(module, name)
    if isinstance(target, type):
        if not issubclass(target, contract):
            raise ComponentNotFound(
                f"{label} {name!r}: class {target.__module__}.{target.__qualname__} does not subclass "
                f"agent_r1.{contract.__name__}; a {label} class must (class "
                f"{target.__qualname__}(agent_r1.{contract.__name__}): ...)."
            )
        if not getattr(target, "name", ""):
            target.name = attribute.rpartition(".")[2]
        if target.__dict__.get("provenance") is None:  # a class a plugin registered keeps its own
            target.provenance = provenance
        return target
    if callable(target) and kind in _FUNCTION_WRAPPERS:
        return _FUNCTION_WRAPPERS[kind](target, name, provenance)
    accepted = "a class subclassing agent_r1." + contract.__name__
    if kind in _FUNCTION_WRAPPERS:
        accepted += " or a function " + _FUNCTION_SHAPES[kind]
    raise ComponentNotFound(
        f"{label} {name!r}: {module_name}:{attribute} is {_describe(target)}; expected {accepted}."
    )


def _import(module_name: str, name: str, label: str, not_a_plugin: str) -> Any:
    """Import ``module_name``, retrying with the working directory on ``sys.path``."""
    for attempt in range(2):
        try:
            return importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            missing = exc.name or ""
            if missing != module_name and not module_name.startswith(missing + "."):
                raise _import_failed(module_name, name, label, exc) from exc
            cwd = os.getcwd()
            if attempt == 0 and cwd not in {os.path.abspath(p or ".") for p in sys.path}:
                sys.path.append(cwd)  # kept: the module may import its neighbours later
                importlib.invalidate_caches()
                continue
            raise PythonModuleNotFound(
                f"unknown {label} {name!r}: {not_a_plugin}, but no module {missing!r} can be imported "
                f"(searched sys.path and the working directory {cwd}). Put {module_name.split('.')[0]} "
                "on PYTHONPATH or in the working directory, or install the plugin or package that "
                "provides it."
            ) from None
        except Exception as exc:
            raise _import_failed(module_name, name, label, exc) from exc
    raise AssertionError("unreachable")  # pragma: no cover


def _import_failed(module_name: str, name: str, label: str, exc: BaseException) -> ComponentNotFound:
    try:
        spec = importlib.util.find_spec(module_name.split(".")[0])
    except (ImportError, ValueError):  # only used to name the file in the message
        spec = None
    where = f" ({spec.origin})" if spec is not None and spec.origin else ""
    frames = traceback.extract_tb(exc.__traceback__)
    at = f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""
    return ComponentNotFound(
        f"{label} {name!r}: importing module {module_name!r}{where} raised "
        f"{type(exc).__name__}: {exc}{at}. Fix the module (or install what it imports)."
    )


def _describe(target: Any) -> str:
    if callable(target):
        return f"a callable {type(target).__name__}"
    return f"a {type(target).__name__} ({target!r:.60})"


def _file_of(module: Any) -> str:
    return str(getattr(module, "__file__", None) or "built-in module")


def _provenance(module: Any, name: str) -> Any:
    from agent_r1.contracts import Provenance

    top = module.__name__.split(".")[0]
    distributions = metadata.packages_distributions().get(top, [])  # not cached: sys.path may grow
    if distributions:
        dist = distributions[0]
        try:
            version = metadata.version(dist)
        except metadata.PackageNotFoundError:  # listed but gone (uninstalled while running)
            version = "?"
        return Provenance(PYTHON_PATH_PLUGIN, dist, version, name)
    path = getattr(module, "__file__", None)
    if path and Path(path).is_file():
        digest = hashlib.sha256(Path(path).read_bytes()).hexdigest()[:12]
        return Provenance(PYTHON_PATH_PLUGIN, f"local file {path}", f"sha256:{digest}", name)
    return Provenance(PYTHON_PATH_PLUGIN, "not installed", "?", name)


# --------------------------------------------------------------------------------------------
# Functions wrapped as components
# --------------------------------------------------------------------------------------------


def _options_config(function: Callable[..., Any], leading: int, name: str) -> type[ComponentConfig]:
    """A ``Config`` whose fields are ``function``'s parameters after the first ``leading`` ones."""
    try:
        hints = typing.get_type_hints(function)
    except Exception:  # unresolvable annotations (forward references...): options are then untyped
        hints = {}
    fields: dict[str, Any] = {}
    base: type[ComponentConfig] = ComponentConfig
    for parameter in list(inspect.signature(function).parameters.values())[leading:]:
        if parameter.kind is parameter.VAR_KEYWORD:
            base = _OpenOptions
        elif parameter.kind in (parameter.POSITIONAL_OR_KEYWORD, parameter.KEYWORD_ONLY):
            default = ... if parameter.default is parameter.empty else parameter.default
            fields[parameter.name] = (hints.get(parameter.name, Any), default)
    config: type[ComponentConfig] = create_model(
        f"{_identity(function, name)[0]}_options",
        __base__=base,
        __doc__=f"Options of {name}: the keyword parameters of the function.",
        **fields,
    )
    return config


class _OpenOptions(ComponentConfig):
    """Options of a function with ``**kwargs``: keys beyond its named parameters are accepted."""

    model_config = ConfigDict(extra="allow")


def _identity(function: Callable[..., Any], name: str) -> tuple[str, str, str]:
    """``(name, module, qualname)`` of ``function``; a callable without them (a ``partial``, an
    instance with ``__call__``) is named after the Python path."""
    module_name, _, attribute = name.partition(":")
    return (
        str(getattr(function, "__name__", attribute.rpartition(".")[2])),
        str(getattr(function, "__module__", None) or module_name),
        str(getattr(function, "__qualname__", attribute)),
    )


def _check_positional(function: Callable[..., Any], names: tuple[str, ...], name: str, label: str) -> None:
    try:
        parameters = list(inspect.signature(function).parameters.values())
    except (TypeError, ValueError) as exc:  # some built-in callables have no readable signature
        raise ComponentNotFound(
            f"{label} {name!r}: cannot read the parameters of {function!r:.60} ({exc}); wrap it in a "
            f"Python function taking ({', '.join(names)})"
        ) from None
    positional = [
        p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)
    ]
    if len(positional) < len(names) and not any(p.kind is p.VAR_POSITIONAL for p in positional):
        shown = f"{_identity(function, name)[2]}{inspect.signature(function)}"
        raise ComponentNotFound(
            f"{label} {name!r}: the function {shown} must take ({', '.join(names)}) as its first "
            "positional parameters."
        )


def _signals(function_name: str, name: str, returned: Any) -> list[RewardSignal]:
    if isinstance(returned, RewardSignal):
        return [returned]
    if isinstance(returned, (int, float)) and not isinstance(returned, bool):
        return [RewardSignal(name=function_name, value=float(returned))]
    if isinstance(returned, bool):
        return [RewardSignal(name=function_name, value=1.0 if returned else 0.0)]
    if isinstance(returned, (list, tuple)) and all(isinstance(s, RewardSignal) for s in returned):
        return list(returned)
    if hasattr(returned, "__float__") and not isinstance(returned, (str, bytes)):  # numpy / torch scalars
        return [RewardSignal(name=function_name, value=float(returned))]
    raise AgentR1Error(
        f"reward function {name!r} returned {returned!r:.80} ({type(returned).__name__}); it must return "
        "a float, a RewardSignal or a list of RewardSignals (return [] for no signal)"
    )


def _reward_shaper(function: Callable[..., Any], name: str, provenance: Any) -> type[Component]:
    label = KIND_LABELS["reward_shapers"]
    _check_positional(function, ("trajectory", "task"), name, label)
    options = _options_config(function, 2, name)
    function_name = _identity(function, name)[0]

    if inspect.iscoroutinefunction(function):

        async def score(self: RewardShaper, trajectory: Any, task: Any) -> list[RewardSignal]:
            returned = await typing.cast(
                Awaitable[Any], function(trajectory, task, **self.config.model_dump())
            )
            return _signals(function_name, name, returned)

    else:

        def score(self: RewardShaper, trajectory: Any, task: Any) -> list[RewardSignal]:  # type: ignore[misc]
            return _signals(function_name, name, function(trajectory, task, **self.config.model_dump()))

    return _wrapper_class(RewardShaper, function, name, provenance, options, {"score": score})


def _dataset(function: Callable[..., Any], name: str, provenance: Any) -> type[Component]:
    label = KIND_LABELS["datasets"]
    _check_positional(function, ("split",), name, label)
    options = _options_config(function, 1, name)

    def load(self: Dataset, split: str) -> list[Task]:
        cache: dict[str, list[Task]] = self.__dict__.setdefault("_tasks_by_split", {})
        if split not in cache:
            cache[split] = _tasks(name, split, function(split, **self.config.model_dump()))
        return [task.model_copy(deep=True) for task in cache[split]]

    return _wrapper_class(Dataset, function, name, provenance, options, {"load": load})


def _tasks(name: str, split: str, returned: Any) -> list[Task]:
    if returned is None or isinstance(returned, (str, bytes, Mapping)) or not isinstance(returned, Iterable):
        raise AgentR1Error(
            f"dataset function {name!r} returned {type(returned).__name__} for split {split!r}; it must "
            "return a list (or any iterable) of agent_r1.Task objects or mappings of Task fields"
        )
    tasks: list[Task] = []
    seen: set[str] = set()
    for index, row in enumerate(returned):
        if isinstance(row, Task):
            task = row
        elif isinstance(row, Mapping):
            data = dict(row)
            data.setdefault("id", f"{split}-{index}")
            try:
                task = Task.model_validate(data)
            except ValueError as exc:
                raise AgentR1Error(
                    f"dataset function {name!r}, split {split!r}, task {index}: not a valid Task: {exc}"
                ) from None
        else:
            raise AgentR1Error(
                f"dataset function {name!r}, split {split!r}, item {index} is a {type(row).__name__}; "
                "expected an agent_r1.Task or a mapping of Task fields (id, messages, answer...)"
            )
        if task.id in seen:
            raise AgentR1Error(
                f"dataset function {name!r}, split {split!r}: task id {task.id!r} appears twice; ids "
                "must be unique"
            )
        seen.add(task.id)
        tasks.append(task)
    return tasks


def _wrapper_class(
    base: type[Component],
    function: Callable[..., Any],
    name: str,
    provenance: Any,
    options: type[ComponentConfig],
    methods: dict[str, Any],
) -> type[Component]:
    short, module, qualname = _identity(function, name)
    namespace: dict[str, Any] = {
        "name": short,
        "Config": options,
        "provenance": provenance,
        "python_path": name,
        "function": staticmethod(function),
        "__doc__": f"The function {name} as a {base.label} (built from a Python path).",
        "__module__": module,
        "__qualname__": qualname,
        **methods,
    }
    return type(short, (base,), namespace)


_FUNCTION_WRAPPERS: dict[str, Callable[[Callable[..., Any], str, Any], type[Component]]] = {
    "reward_shapers": _reward_shaper,
    "datasets": _dataset,
}
_FUNCTION_SHAPES: dict[str, str] = {
    "reward_shapers": "fn(trajectory, task, **options) -> float | RewardSignal | list[RewardSignal]",
    "datasets": "fn(split, **options) -> list[Task | dict]",
}
