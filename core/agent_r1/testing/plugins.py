"""A harness for plugin authors: contract checkers and real plugin distributions for tests.

Contract checkers build a component the way the core does and exercise its contract, raising
:class:`ContractViolation` (an ``AssertionError``, so pytest shows it as a failed assertion) with a
message that names the class and what to fix::

    from agent_r1.testing import check_tool, check_reward_shaper

    def test_my_tool():
        check_tool(MyTool, calls=[{"query": "paris"}])

    def test_my_shaper():
        signals = check_reward_shaper(MyShaper)
        assert signals[0].value == 1.0

:func:`check_plugin` registers a whole plugin module in a private registry and fails on anything
``agent-r1 plugins doctor`` would report.

:class:`PluginDistribution` writes a plugin distribution (modules plus a ``.dist-info`` directory
with ``METADATA``, ``entry_points.txt`` and ``RECORD``) into a directory; with that directory on
``sys.path`` (:func:`plugin_path`) or ``PYTHONPATH`` (for subprocesses) ``importlib.metadata``
discovers it exactly as it discovers a ``pip install``-ed plugin.

Nothing here imports torch, except :func:`check_advantage_estimator` and
:func:`check_policy_loss`, which need it to build their inputs.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import importlib
import inspect
import json
import os
import re
import sys
import typing
import warnings
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from agent_r1.contracts import (
    CONTRACTS,
    AdvantageEstimator,
    Algorithm,
    Component,
    Dataset,
    Environment,
    EpisodeStart,
    ParsedAction,
    PolicyLoss,
    RewardShaper,
    Tool,
    ToolCallFormat,
    Tracker,
)
from agent_r1.mdp import (
    Action,
    Observation,
    RewardSignal,
    Step,
    Task,
    TokenSource,
    ToolCall,
    ToolResult,
    Trajectory,
)

ENTRY_POINT_GROUP = "agent_r1"


class ContractViolation(AssertionError):
    """A component or plugin does not honour its contract; the message says which and how."""


# --------------------------------------------------------------------------------------------
# Plugin distributions on disk
# --------------------------------------------------------------------------------------------


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name)


def _record_line(relative: str, content: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(content).digest()).rstrip(b"=").decode()
    return f"{relative},sha256={digest},{len(content)}"


@dataclass
class PluginDistribution:
    """A plugin distribution to write into a directory, as ``pip install`` would lay it out.

    ``files`` maps paths relative to the directory (``"acme_plugin.py"``,
    ``"acme/__init__.py"``) to their source text. ``entry_points`` maps entry-point names to
    module paths in the ``agent_r1`` group; ``extra_entry_points`` adds other groups
    (``{"console_scripts": {...}}``).
    """

    name: str
    files: dict[str, str]
    entry_points: dict[str, str]
    version: str = "0.1.0"
    summary: str = "a test plugin for agent-r1"
    extra_entry_points: dict[str, dict[str, str]] = field(default_factory=dict)

    @property
    def dist_info_name(self) -> str:
        """The ``<name>-<version>.dist-info`` directory name."""
        return f"{_normalise(self.name)}-{self.version}.dist-info"

    def write(self, directory: str | Path) -> Path:
        """Write the modules and the ``.dist-info`` directory; returns the ``.dist-info`` path."""
        root = Path(directory)
        root.mkdir(parents=True, exist_ok=True)
        records: list[str] = []
        for relative, source in self.files.items():
            target = root / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            content = source.encode("utf-8")
            target.write_bytes(content)
            records.append(_record_line(relative, content))
        info = root / self.dist_info_name
        info.mkdir(exist_ok=True)
        groups = {ENTRY_POINT_GROUP: self.entry_points, **self.extra_entry_points}
        entry_points = "".join(
            f"[{group}]\n" + "".join(f"{name} = {value}\n" for name, value in items.items()) + "\n"
            for group, items in groups.items()
            if items
        )
        top_level = sorted({Path(relative).parts[0].removesuffix(".py") for relative in self.files})
        meta = {
            "METADATA": (
                f"Metadata-Version: 2.1\nName: {self.name}\nVersion: {self.version}\n"
                f"Summary: {self.summary}\nRequires-Dist: agent-r1\n"
            ),
            "entry_points.txt": entry_points,
            "top_level.txt": "".join(f"{name}\n" for name in top_level),
            "INSTALLER": "agent-r1-testing\n",
        }
        for filename, text in meta.items():
            content = text.encode("utf-8")
            (info / filename).write_bytes(content)
            records.append(_record_line(f"{self.dist_info_name}/{filename}", content))
        records.append(f"{self.dist_info_name}/RECORD,,")
        (info / "RECORD").write_text("\n".join(records) + "\n", encoding="utf-8")
        return info


def write_plugin_distribution(
    directory: str | Path,
    name: str,
    *,
    files: Mapping[str, str],
    entry_points: Mapping[str, str],
    version: str = "0.1.0",
) -> Path:
    """Shorthand for ``PluginDistribution(name, files, entry_points, version).write(directory)``."""
    distribution = PluginDistribution(name, dict(files), dict(entry_points), version=version)
    return distribution.write(directory)


@contextmanager
def plugin_path(*directories: str | Path) -> Iterator[None]:
    """Put ``directories`` first on ``sys.path`` so that ``importlib.metadata`` finds the
    distributions in them; afterwards remove them and forget every module imported from them."""
    entries = [str(Path(d).resolve()) for d in directories]
    prefixes = tuple({p + os.sep for p in (*entries, *(str(Path(d).absolute()) for d in directories))})
    for entry in reversed(entries):
        sys.path.insert(0, entry)
    importlib.invalidate_caches()
    try:
        yield
    finally:
        for entry in entries:
            while entry in sys.path:
                sys.path.remove(entry)
        for module_name, module in list(sys.modules.items()):
            origin = getattr(module, "__file__", None) or ""
            if origin.startswith(prefixes):
                del sys.modules[module_name]
        importlib.invalidate_caches()


# --------------------------------------------------------------------------------------------
# Contract checkers
# --------------------------------------------------------------------------------------------


def _run(value: Any) -> Any:
    """Await ``value`` if it is awaitable (components may implement methods as ``async``)."""
    if inspect.isawaitable(value):

        async def wait() -> Any:
            return await value

        return asyncio.run(wait())
    return value


def _fail(cls: type, message: str) -> ContractViolation:
    name = getattr(cls, "name", None)
    named = f" (name {name!r})" if isinstance(name, str) and name else ""
    return ContractViolation(f"{cls.__module__}.{cls.__qualname__}{named}: {message}")


def check_component(cls: Any, kind: str | None = None, config: Mapping[str, Any] | None = None) -> Any:
    """Check what every component needs (subclass of its kind's contract, a ``name``, a pydantic
    ``Config`` that rejects unknown keys and validates ``config``) and return an instance built
    from ``config``."""
    from agent_r1.registry import _check_component

    if not isinstance(cls, type):
        raise ContractViolation(f"expected a component class, got {cls!r}")
    kind = kind or getattr(cls, "kind", "")
    if kind not in CONTRACTS:
        raise _fail(
            cls, f"unknown kind {kind!r}; subclass one of {', '.join(b.__name__ for b in CONTRACTS.values())}"
        )
    problem = _check_component(cls, CONTRACTS[kind])
    if problem:
        raise _fail(cls, problem)
    cls = typing.cast(type[Component], cls)
    if cls.Config.model_config.get("extra") != "forbid":
        raise _fail(cls, "its Config accepts unknown keys; subclass agent_r1.ComponentConfig")
    try:
        validated = cls.Config.model_validate(dict(config or {}))
    except ValidationError as exc:
        if config is None and all(error["type"] == "missing" for error in exc.errors()):
            required = ", ".join(str(error["loc"][0]) for error in exc.errors())
            raise _fail(cls, f"its Config requires {required}; pass config={{...}} to the checker") from None
        raise _fail(cls, f"its Config rejects {dict(config or {})!r}: {exc}") from None
    try:
        return cls(validated)
    except Exception as exc:
        raise _fail(cls, f"building it from {validated!r} raised {type(exc).__name__}: {exc}") from exc


def check_tool(
    cls: type[Tool], *, config: Mapping[str, Any] | None = None, calls: Sequence[Mapping[str, Any]] = ()
) -> Tool:
    """Check a :class:`~agent_r1.Tool`: description, ``Arguments`` model, JSON schema, and that
    each of ``calls`` (argument dicts) validates and runs to a string or a ``ToolResult``."""
    tool = check_component(cls, "tools", config)
    if not isinstance(cls.description, str) or not cls.description.strip():
        raise _fail(cls, "has no description; the model reads it to decide when to call the tool")
    if not (isinstance(cls.Arguments, type) and issubclass(cls.Arguments, BaseModel)):
        raise _fail(cls, "Arguments must be a pydantic BaseModel subclass")
    try:
        schema = json.loads(json.dumps(cls.schema()))
    except (TypeError, ValueError) as exc:
        raise _fail(cls, f"schema() is not JSON-serialisable: {exc}") from None
    function = schema.get("function", {})
    if function.get("name") != cls.name or function.get("parameters", {}).get("type") != "object":
        raise _fail(cls, f"schema() must describe a function named {cls.name!r} with object parameters")
    for arguments in calls:
        try:
            parsed = cls.Arguments.model_validate(dict(arguments))
        except ValidationError as exc:
            raise _fail(cls, f"Arguments rejects the example call {dict(arguments)!r}: {exc}") from None
        try:
            output = _run(tool.run(parsed))
        except Exception as exc:
            raise _fail(cls, f"run({dict(arguments)!r}) raised {type(exc).__name__}: {exc}") from exc
        if not isinstance(output, (str, ToolResult)):
            raise _fail(
                cls, f"run({dict(arguments)!r}) returned {type(output).__name__}; return str or ToolResult"
            )
    return tool


DEFAULT_TASK = Task(
    id="check-0",
    messages=[{"role": "user", "content": "What is 17 * 23? Answer with the number."}],
    answer="391",
    category="check",
)
"""The task the checkers use when none is given."""


def _check_messages(cls: type, messages: Any, what: str) -> None:
    if not isinstance(messages, list):
        raise _fail(cls, f"{what} must be a list of messages, got {type(messages).__name__}")
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping) or "role" not in message:
            raise _fail(cls, f"{what}[{i}] must be a dict with a 'role', got {message!r}")
        if not isinstance(message.get("content", ""), (str, list)):
            raise _fail(cls, f"{what}[{i}]['content'] must be text, got {message.get('content')!r}")


def check_environment(
    cls: type[Environment],
    *,
    config: Mapping[str, Any] | None = None,
    task: Task | None = None,
    actions: Sequence[str | Action] = ("",),
) -> list[Observation]:
    """Check an :class:`~agent_r1.Environment`: ``async`` ``reset``/``step``, the messages it
    renders, and one ``step`` per item of ``actions`` (texts or actions) until ``done``. Returns the
    observations."""
    env = check_component(cls, "environments", config)
    for method in ("reset", "step"):
        if not inspect.iscoroutinefunction(getattr(cls, method)):
            raise _fail(cls, f"{method} must be an `async def` method")
    stops = env.stop_sequences
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise _fail(cls, f"stop_sequences must be a list of non-empty strings, got {stops!r}")
    start = _run(env.reset(task or DEFAULT_TASK))
    if not isinstance(start, EpisodeStart):
        raise _fail(cls, f"reset() must return an EpisodeStart, got {type(start).__name__}")
    _check_messages(cls, start.messages, "reset().messages")
    if not start.messages:
        raise _fail(cls, "reset() returned no messages; the prompt would be empty")
    if not all(isinstance(t, Mapping) for t in start.tools):
        raise _fail(cls, "reset().tools must be a list of tool schemas (dicts)")
    observations: list[Observation] = []
    for turn, item in enumerate(actions):
        action = item if isinstance(item, Action) else Action(text=item)
        observation = _run(env.step(action, turn))
        if not isinstance(observation, Observation):
            raise _fail(cls, f"step() must return an Observation, got {type(observation).__name__}")
        _check_messages(cls, observation.messages, f"step({turn}).messages")
        for signal in observation.rewards:
            if signal.kind == "process" and signal.turn != turn:
                raise _fail(
                    cls, f"step({turn}) emitted process reward {signal.name!r} for turn {signal.turn}"
                )
        observations.append(observation)
        if observation.done:
            if not observation.termination:
                raise _fail(cls, f"step({turn}) ended the episode without a termination reason")
            break
    return observations


def check_tool_call_format(
    cls: type[ToolCallFormat],
    *,
    config: Mapping[str, Any] | None = None,
    tools: Sequence[type[Tool]] = (),
    texts: Sequence[str] = ("", "I do not know."),
) -> ToolCallFormat:
    """Check a :class:`~agent_r1.ToolCallFormat`: stop sequences, instructions, that ``parse``
    returns a :class:`~agent_r1.ParsedAction` for each of ``texts`` and that ``render_results``
    returns messages."""
    fmt = check_component(cls, "tool_call_formats", config)
    stops = fmt.stop_sequences
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise _fail(cls, f"stop_sequences must be a list of non-empty strings, got {stops!r}")
    if not isinstance(fmt.instructions(list(tools)), str):
        raise _fail(cls, "instructions() must return a string")
    by_name = {tool.name: tool for tool in tools}
    for text in texts:
        parsed = fmt.parse(text, by_name)
        if not isinstance(parsed, ParsedAction):
            raise _fail(cls, f"parse({text!r}) must return a ParsedAction, got {type(parsed).__name__}")
        if not all(isinstance(call, ToolCall) for call in parsed.tool_calls):
            raise _fail(cls, f"parse({text!r}).tool_calls must hold ToolCall objects")
    result = ToolResult(call_id="call-0", name=tools[0].name if tools else "tool", content="42")
    messages = fmt.render_results([result], ["example parse error"])
    _check_messages(cls, messages, "render_results()")
    if not messages:
        raise _fail(cls, "render_results() returned no message for one result")
    return fmt


def example_trajectory(answer: str = "391", *, task: Task | None = None) -> Trajectory:
    """A small two-turn trajectory (a tool call, then a final answer) for checking reward shapers."""
    task = task or DEFAULT_TASK
    trajectory = Trajectory(id=f"{task.id}/0", task_id=task.id, group_id=task.id)
    trajectory.append(TokenSource.PROMPT, 0, [1, 2, 3, 4])
    trajectory.append(TokenSource.POLICY, 0, [10, 11, 12], [-0.5, -0.25, -0.125])
    trajectory.append(TokenSource.ENV, 0, [20, 21])
    trajectory.append(TokenSource.TEMPLATE, 1, [5])
    trajectory.append(TokenSource.POLICY, 1, [13, 14], [-0.75, -0.0625])
    call = ToolCall(id="call-0", name="calculator", arguments={"expression": "17 * 23"})
    trajectory.steps = [
        Step(
            turn=0,
            action=Action(token_ids=[10, 11, 12], text="calculator: 17 * 23", tool_calls=[call]),
            observation=Observation(
                messages=[{"role": "tool", "content": "391"}],
                tool_results=[ToolResult(call_id="call-0", name="calculator", content="391")],
            ),
        ),
        Step(
            turn=1,
            action=Action(token_ids=[13, 14], text=f"The answer is {answer}.", answer=answer),
            observation=Observation(done=True, termination="answer"),
        ),
    ]
    trajectory.termination = "answer"
    return trajectory


def check_reward_shaper(
    cls: type[RewardShaper],
    *,
    config: Mapping[str, Any] | None = None,
    trajectory: Trajectory | None = None,
    task: Task | None = None,
    deterministic: bool = True,
) -> list[RewardSignal]:
    """Check a :class:`~agent_r1.RewardShaper` on ``trajectory`` (default:
    :func:`example_trajectory`): it returns :class:`~agent_r1.RewardSignal`\\ s with finite values,
    process signals name a turn the trajectory has, and (unless ``deterministic=False``) scoring
    twice gives the same signals. Returns the signals."""
    shaper = check_component(cls, "reward_shapers", config)
    task = task or DEFAULT_TASK
    trajectory = trajectory or example_trajectory(task=task)
    signals = _run(shaper.score(trajectory, task))
    if not isinstance(signals, list) or not all(isinstance(s, RewardSignal) for s in signals):
        raise _fail(cls, f"score() must return a list of RewardSignal, got {signals!r}")
    turns = set(trajectory.turn_ids)
    for signal in signals:
        if signal.kind == "process" and signal.turn not in turns:
            raise _fail(
                cls, f"process signal {signal.name!r} names turn {signal.turn}, not in {sorted(turns)}"
            )
    if deterministic:
        again = _run(shaper.score(trajectory, task))
        if again != signals:
            raise _fail(cls, f"scoring the same trajectory twice gave {signals!r} then {again!r}")
    return signals


def check_dataset(
    cls: type[Dataset], *, config: Mapping[str, Any] | None = None, splits: Sequence[str] = ("train",)
) -> dict[str, list[Task]]:
    """Check a :class:`~agent_r1.Dataset`: each split loads a list of tasks with unique ids and at
    least one message, the same on a second load. Returns the tasks per split."""
    dataset = check_component(cls, "datasets", config)
    out: dict[str, list[Task]] = {}
    for split in splits:
        tasks = dataset.load(split)
        if not isinstance(tasks, list) or not all(isinstance(t, Task) for t in tasks):
            raise _fail(cls, f"load({split!r}) must return a list of Task")
        ids = [task.id for task in tasks]
        duplicates = sorted({i for i in ids if ids.count(i) > 1})
        if duplicates:
            raise _fail(cls, f"load({split!r}) repeats task ids {duplicates[:5]}")
        empty = [task.id for task in tasks if not task.messages]
        if empty:
            raise _fail(cls, f"load({split!r}) has tasks without messages: {empty[:5]}")
        if [task.id for task in dataset.load(split)] != ids:
            raise _fail(cls, f"load({split!r}) gave different tasks on a second call; seed any shuffling")
        out[split] = tasks
    return out


def check_tracker(
    cls: type[Tracker], run_dir: str | Path, *, config: Mapping[str, Any] | None = None
) -> Tracker:
    """Check a :class:`~agent_r1.Tracker` through ``start``, two ``log`` calls and ``close``."""
    tracker = check_component(cls, "trackers", config)
    tracker.start(Path(run_dir), {"seed": 0})
    try:
        tracker.log({"reward/score_mean": 0.5, "actor/loss": 0.125}, 0)
        tracker.log({"reward/score_mean": 0.75, "actor/loss": 0.0625}, 1)
    finally:
        tracker.close()
    return tracker


def check_algorithm(cls: type[Algorithm], *, registry: Any = None) -> Algorithm:
    """Check an :class:`~agent_r1.Algorithm`: its estimator and loss exist in ``registry`` (default:
    the process-wide one) and accept the algorithm's option dicts."""
    from agent_r1.registry import get_registry

    algorithm = check_component(cls, "algorithms")
    registry = registry or get_registry()
    for kind, name, options in (
        ("advantage_estimators", cls.estimator, cls.estimator_config),
        ("policy_losses", cls.loss, cls.loss_config),
    ):
        if not name:
            raise _fail(cls, f"names no {kind.replace('_', ' ')[:-1]}")
        try:
            component = registry.get(kind, name)
            component.Config.model_validate(dict(options))
        except Exception as exc:
            raise _fail(cls, f"its {kind[:-1].replace('_', ' ')} {name!r} is unusable: {exc}") from None
    return algorithm


def check_advantage_estimator(
    cls: type[AdvantageEstimator], *, config: Mapping[str, Any] | None = None, seed: int = 0
) -> Any:
    """Check an :class:`~agent_r1.AdvantageEstimator` on a random batch of two groups: advantages
    and returns are ``[B, T]``, finite, and zero outside the loss mask. Needs torch."""
    import torch

    from agent_r1.contracts import AdvantageInput

    estimator = check_component(cls, "advantage_estimators", config)
    generator = torch.Generator().manual_seed(seed)
    batch_size, length = 4, 7
    loss_mask = torch.zeros(batch_size, length, dtype=torch.bool)
    loss_mask[:, 2:6] = True
    loss_mask[1, 5] = False
    scores = torch.rand(batch_size, generator=generator)
    token_rewards = torch.zeros(batch_size, length)
    last = torch.tensor([5, 4, 5, 5])
    token_rewards[torch.arange(batch_size), last] = scores
    inputs = AdvantageInput(
        token_rewards=token_rewards,
        loss_mask=loss_mask,
        scores=scores,
        group_ids=["a", "a", "b", "b"],
        values=torch.rand(batch_size, length, generator=generator) if cls.needs_critic else None,
        baseline_scores=torch.rand(batch_size, generator=generator) if cls.needs_baseline_rollout else None,
        # two action turns (2-3 and 4-5); in group "b" the second turn starts from different states
        turn_ids=torch.where(loss_mask, (torch.arange(length) >= 4).long().expand(batch_size, length), -1),
        anchor_keys=[["s0", "s1"], ["s0", "s1"], ["s0", "s1"], ["s0", "s2"]],
    )
    advantages, returns = estimator.compute(inputs)
    for label, tensor in (("advantages", advantages), ("returns", returns)):
        if tuple(tensor.shape) != (batch_size, length):
            raise _fail(cls, f"{label} have shape {tuple(tensor.shape)}, expected {(batch_size, length)}")
        if not torch.isfinite(tensor).all():
            raise _fail(cls, f"{label} are not all finite")
        if (tensor[~loss_mask] != 0).any():
            raise _fail(cls, f"{label} are non-zero outside the loss mask (on prompt or environment tokens)")
    return estimator


def check_policy_loss(
    cls: type[PolicyLoss], *, config: Mapping[str, Any] | None = None, seed: int = 0
) -> Any:
    """Check a :class:`~agent_r1.PolicyLoss`: the per-token loss is ``[B, T]`` and finite, its
    diagnostics are ``[B, T]``, and gradients reach the log-probabilities. Needs torch."""
    import torch

    from agent_r1.contracts import LossInput

    loss_fn = check_component(cls, "policy_losses", config)
    generator = torch.Generator().manual_seed(seed)
    shape = (3, 5)
    old = -torch.rand(shape, generator=generator)
    logprobs = (old + 0.1 * torch.randn(shape, generator=generator)).requires_grad_(True)
    loss_mask = torch.ones(shape, dtype=torch.bool)
    loss_mask[:, 0] = False
    inputs = LossInput(
        logprobs=logprobs,
        old_logprobs=old,
        advantages=torch.randn(shape, generator=generator),
        loss_mask=loss_mask,
    )
    token_loss, diagnostics = loss_fn.token_loss(inputs)
    if tuple(token_loss.shape) != shape or not torch.isfinite(token_loss).all():
        raise _fail(
            cls, f"token_loss must return a finite [B, T] tensor, got shape {tuple(token_loss.shape)}"
        )
    for name, value in diagnostics.items():
        if tuple(value.shape) != shape:
            raise _fail(cls, f"diagnostic {name!r} has shape {tuple(value.shape)}, expected {shape}")
    token_loss[loss_mask].sum().backward()
    if logprobs.grad is None or not torch.isfinite(logprobs.grad).all():
        raise _fail(cls, "no finite gradient reaches the log-probabilities")
    return loss_fn


def check_plugin(plugin: object, name: str = "plugin") -> Any:
    """Register ``plugin`` (a module or object with hookimpls) in a private registry, load every
    kind and command, and raise :class:`ContractViolation` listing anything ``agent-r1 plugins
    doctor`` would report. Returns the plugin's :class:`~agent_r1.registry.PluginInfo`."""
    from agent_r1.registry import Registry

    registry = Registry(entry_points=False)
    registry.register_plugin(plugin, name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        infos = registry.doctor()
    info = next(i for i in infos if i.name == name)
    if info.errors:
        raise ContractViolation(f"{info.describe()} has problems:\n  " + "\n  ".join(info.errors))
    if not any(info.components.values()):
        raise ContractViolation(f"{info.describe()} registers no component and no command")
    return info


__all__ = [
    "DEFAULT_TASK",
    "ContractViolation",
    "PluginDistribution",
    "check_advantage_estimator",
    "check_algorithm",
    "check_component",
    "check_dataset",
    "check_environment",
    "check_plugin",
    "check_policy_loss",
    "check_reward_shaper",
    "check_tool",
    "check_tool_call_format",
    "check_tracker",
    "example_trajectory",
    "plugin_path",
    "write_plugin_distribution",
]
