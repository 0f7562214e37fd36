"""``tool_env``: the generic environment that lets an agent call tools over several turns.

The run config names the tools and the tool-call format; both are looked up in the registry and
validated before any model loads (see :meth:`ToolEnv.requires`)::

    environment:
      name: tool_env
      tools: [calculator, {name: search, topk: 3}]
      format: {name: tags, tool_tags: {calculator: calc}}
      system_prompt: "Answer the question."
      max_turns: 4

Protocol with the engine (one instance per trajectory):

1. ``start = await env.reset(task)``: render ``start.messages`` (with ``tools=start.tools`` when
   non-empty) as the prompt.
2. Each turn ``t`` (0-based): generate with ``env.stop_sequences`` besides EOS, build an
   :class:`~agent_r1.Action` whose ``text`` is the decoded sampled tokens (stop sequence included),
   then ``observation = await env.step(action, t)``. What the environment parsed out of the action
   comes back in ``observation.tool_calls``, ``observation.answer`` and
   ``observation.parse_errors`` (the engine records them in its :class:`~agent_r1.Action`; the
   environment never writes into the action).
3. If ``observation.done`` the episode ends (``observation.termination`` says why, and
   ``observation.messages`` is empty); otherwise append ``observation.messages`` as environment
   tokens and go on with turn ``t + 1``.

The tools and the format are built once per distinct tool/format configuration (and registry) and
shared by every episode; a tool that sets ``per_episode`` is built for each episode instead.
"""

from __future__ import annotations

import asyncio
import json
import pickle
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field, ValidationError, model_validator

from agent_r1.builtins.formats import (
    argument_errors,
    describe_validation_error,
    too_many_calls_error,
    tool_schemas_text,
    unknown_tool_error,
)
from agent_r1.builtins.tool_runner import (
    CallAborted,
    CallTimedOut,
    ChildProcessSetupFailed,
    TooManyHungCalls,
    run_in_process,
    run_in_thread,
)
from agent_r1.contracts import (
    ComponentConfig,
    ComponentSpec,
    Environment,
    EpisodeStart,
    ParsedAction,
    Tool,
    ToolCallFormat,
)
from agent_r1.errors import ConfigError, EnvironmentFatalError, ToolError, ToolInfrastructureError
from agent_r1.mdp import Action, Message, Observation, RewardSignal, Task, ToolCall, ToolResult

_HANG_ADVICE = (
    "those tools probably hang: fix them, or set isolation = 'process' on their classes so that "
    "their calls are killed at the timeout"
)
_SETUP_ADVICE = "make the tool's class importable and its instance picklable, or use isolation = 'thread'"

NO_CALL_MESSAGE = "your reply has no tool call and no final answer. Call a tool or give the final answer."


def _spec(item: str | ComponentSpec) -> ComponentSpec:
    return ComponentSpec(name=item) if isinstance(item, str) else item


# --------------------------------------------------------------------------------------------
# Tools built once per configuration
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Toolkit:
    """What every episode of one tool/format configuration shares."""

    order: tuple[str, ...]
    shared_tools: Mapping[str, Tool]
    per_episode_tools: Mapping[str, tuple[type[Tool], ComponentConfig]]
    """Tools with ``per_episode``: their class and validated config; each episode builds its own."""
    tool_classes: Mapping[str, type[Tool]]
    format: ToolCallFormat
    instructions: str
    stop_sequences: tuple[str, ...]


TOOLKIT_CACHE_SIZE = 16
"""Distinct tool/format configurations whose built tools are kept (per registry, least recently
used dropped first); a run uses one or two."""

_toolkits: weakref.WeakKeyDictionary[Any, OrderedDict[str, _Toolkit]] = weakref.WeakKeyDictionary()
_toolkits_lock = threading.RLock()  # reentrant: a tool's constructor may itself build a ToolEnv


def _toolkit(env_name: str, config: ToolEnv.Config) -> _Toolkit:
    """The tools and format of ``config``, built on the first call for each configuration and
    registry (a new registry, e.g. after :func:`agent_r1.registry.reset_registry`, builds anew)."""
    from agent_r1.registry import get_registry

    registry = get_registry()
    tool_specs, format_spec = config.tool_specs(), config.format_spec()
    key = _toolkit_key(tool_specs, format_spec)
    with _toolkits_lock:
        cache = _toolkits.setdefault(registry, OrderedDict())
        if key is not None and key in cache:
            cache.move_to_end(key)
            return cache[key]
        toolkit = _build_toolkit(env_name, registry, tool_specs, format_spec)
        if key is not None:
            cache[key] = toolkit
            while len(cache) > TOOLKIT_CACHE_SIZE:
                cache.popitem(last=False)
        return toolkit


def _toolkit_key(tool_specs: Sequence[ComponentSpec], format_spec: ComponentSpec) -> str | None:
    try:
        sections = {
            "tools": [spec.model_dump(mode="json") for spec in tool_specs],
            "format": format_spec.model_dump(mode="json"),
        }
        return json.dumps(sections, sort_keys=True)
    except (TypeError, ValueError):  # pydantic's serialisation errors are ValueErrors
        return None  # options that are not plain data: build for each episode, as before 0.2.0


def _build_toolkit(
    env_name: str, registry: Any, tool_specs: Sequence[ComponentSpec], format_spec: ComponentSpec
) -> _Toolkit:
    from agent_r1.registry import validate_component_config

    shared: dict[str, Tool] = {}
    per_episode: dict[str, tuple[type[Tool], ComponentConfig]] = {}
    classes: dict[str, type[Tool]] = {}
    for i, spec in enumerate(tool_specs):
        cls = registry.get("tools", spec.name)
        if cls.name in classes:
            raise ConfigError(
                f"{env_name}.tools[{i}]: {spec.name!r} is the tool {cls.name!r}, which is already listed",
                path=f"tools[{i}]",
            )
        if cls.per_episode:
            tool_config = validate_component_config(cls, spec.options, where=f"tool {spec.name!r}")
            per_episode[cls.name] = (cls, tool_config)
        else:
            tool = registry.build("tools", spec.name, spec.options)
            if cls.isolation == "process":
                _check_sendable(env_name, i, tool)
            shared[cls.name] = tool
        classes[cls.name] = cls
    fmt: ToolCallFormat = registry.build("tool_call_formats", format_spec.name, format_spec.options)
    try:  # surfaces format/tool mismatches (e.g. two tools on one tag) now, not mid-rollout
        instructions = fmt.instructions(list(classes.values()))
        stop_sequences = _stop_sequences(fmt, list(classes.values()))
    except ValueError as exc:
        raise ConfigError(
            f"{env_name}: tools {list(classes)} and format {format_spec.name!r}: {exc}"
        ) from None
    return _Toolkit(
        order=tuple(classes),
        shared_tools=shared,
        per_episode_tools=per_episode,
        tool_classes=classes,
        format=fmt,
        instructions=instructions,
        stop_sequences=tuple(stop_sequences),
    )


def _check_sendable(env_name: str, index: int, tool: Tool) -> None:
    """A tool with ``isolation = "process"`` travels to its child process with pickle: check now."""
    cls = type(tool)
    where = f"{env_name}.tools[{index}]: tool {cls.name!r} ({cls.__module__}.{cls.__qualname__})"
    if cls.__module__ == "__main__":
        raise ConfigError(
            f"{where} has isolation 'process' but is defined in the __main__ script, which its child "
            "processes cannot import. Move the class into a module.",
            path=f"tools[{index}]",
        )
    try:
        pickle.loads(pickle.dumps(tool))
    except Exception as exc:
        raise ConfigError(
            f"{where} has isolation 'process' but cannot be pickled to its child process "
            f"({type(exc).__name__}: {exc}). Keep only picklable state on the instance (open "
            "resources lazily in run), or use isolation 'thread'.",
            path=f"tools[{index}]",
        ) from None


class ToolEnv(Environment):
    """Generic multi-turn tool environment: parses each action with a :class:`ToolCallFormat`,
    runs the calls concurrently (each under a timeout), and answers with the format's rendering of
    the results.

    Termination (``observation.done`` with ``observation.termination``; ``messages`` is then empty):

    * ``answer``: the action holds a final answer (with ``end_on_answer``). Calls written in the
      same action are not run (``info["ignored_tool_calls"]`` counts them). Without
      ``end_on_answer`` the calls run, and the episode ends at the first action with an answer and
      no call.
    * ``no_tool_call``: no call, no answer and no format error (with ``end_on_no_tool_call``;
      otherwise the agent is told what is missing and the episode goes on). An action whose only
      calls were malformed is answered with the errors, so that the agent can fix them.
    * ``max_turns``: ``turn + 1 >= max_turns``, after running that turn's calls (their results are
      in ``tool_results`` for the logs, though the agent never sees them).

    Tool failures: :class:`~agent_r1.ToolError` and ordinary exceptions become error results the
    agent reads; :class:`~agent_r1.errors.ToolInfrastructureError` makes :meth:`step` raise (unless
    the tool sets ``infrastructure_errors_visible``: then an error result of kind
    ``infrastructure``); :class:`~agent_r1.errors.EnvironmentFatalError` always makes it raise. A
    call past ``call_timeout_s`` is abandoned (thread) or killed (``isolation = "process"``); see
    :meth:`call`.

    Where the model reads the tools: a format that describes them itself (``tags``) writes them
    into the system message; one that hands schemas to the chat template (``hermes``) returns them
    in :attr:`EpisodeStart.tools <agent_r1.EpisodeStart.tools>` (``tool_schemas: template``), or,
    for a template that cannot show them (SmolLM2's), this environment writes them into the system
    message (``tool_schemas: system``, see :meth:`describe_tools`). The run's preflight checks that
    the first prompt shows every tool.

    Optional process rewards (``tool_success_reward``, ``tool_failure_reward``,
    ``format_error_reward``) are emitted per turn as :class:`~agent_r1.RewardSignal`\\ s named
    ``tool_success``, ``tool_failure`` and ``format_error``, valued reward x count.
    """

    name = "tool_env"

    class Config(ComponentConfig):
        """Options of :class:`ToolEnv` (and of presets built on it)."""

        tools: list[str | ComponentSpec] = Field(
            default_factory=list, description="tool names, or {name: ..., <tool options>} sections"
        )
        format: str | ComponentSpec = Field(
            default_factory=lambda: ComponentSpec(name="tags"),
            description="tool-call format: a name or {name: ..., <format options>}",
        )
        system_prompt: str | None = Field(
            None, description="put before the format instructions in the system message"
        )
        include_format_instructions: bool = Field(
            True, description="add the format's description of the tools to the system message"
        )
        tool_schemas: Literal["template", "system"] = Field(
            "template",
            description="where the tool schemas go with a format that hands them to the chat template "
            "(hermes): template: the template's tools argument (it must render them: Qwen2.5's does, "
            "SmolLM2's does not); system: this environment writes them (JSON) into the system message, "
            "which works with any template. Formats that describe their tools themselves (tags) "
            "ignore it",
        )
        max_turns: int = Field(
            4, ge=1, description="actions per episode at most (the engine has its own cap too)"
        )
        max_calls_per_turn: int = Field(
            4, ge=1, description="calls beyond this in one action are dropped with an error"
        )
        call_timeout_s: float = Field(
            30.0,
            gt=0,
            description="a call that runs longer fails with error 'timeout'; the step does not wait for it",
        )
        max_result_chars: int | None = Field(
            4000, ge=1, description="longer tool outputs are cut to this many characters (null: no limit)"
        )
        end_on_answer: bool = Field(True, description="a final answer ends the episode")
        end_on_no_tool_call: bool = Field(
            True, description="a turn with neither tool call nor answer ends the episode"
        )
        tool_success_reward: float = Field(0.0, description="process reward per successful call (0 = off)")
        tool_failure_reward: float = Field(0.0, description="process reward per failed call (0 = off)")
        format_error_reward: float = Field(0.0, description="process reward per format error (0 = off)")

        @model_validator(mode="after")
        def _unique_tools(self) -> ToolEnv.Config:
            names = [_spec(item).name for item in self.tools]
            duplicates = sorted({name for name in names if names.count(name) > 1})
            if duplicates:
                raise ValueError(f"tools lists {', '.join(map(repr, duplicates))} more than once")
            return self

        def tool_specs(self) -> list[ComponentSpec]:
            return [_spec(item) for item in self.tools]

        def format_spec(self) -> ComponentSpec:
            return _spec(self.format)

    config: Config

    def __init__(self, config: ComponentConfig | Mapping[str, Any] | None = None) -> None:
        super().__init__(config)
        toolkit = _toolkit(self.name, self.config)
        self.format: ToolCallFormat = toolkit.format
        self.tools: dict[str, Tool] = dict(toolkit.shared_tools)
        for tool_name, (cls, tool_config) in toolkit.per_episode_tools.items():
            self.tools[tool_name] = cls(tool_config)
        self.tools = {name: self.tools[name] for name in toolkit.order}  # the configured order
        self.tool_classes: dict[str, type[Tool]] = dict(toolkit.tool_classes)
        self._instructions = toolkit.instructions
        if self.writes_tool_schemas:
            self._instructions = self.describe_tools(list(self.tool_classes.values()))
        self._stop_sequences = list(toolkit.stop_sequences)

    @classmethod
    def requires(cls, config: Any) -> list[tuple[Any, ...]]:
        """The tools and the format, so that a run checks them before loading a model."""
        tool_specs = config.tool_specs()
        format_spec = config.format_spec()
        return [("tools", spec.name, spec.options, f"tools[{i}]") for i, spec in enumerate(tool_specs)] + [
            ("tool_call_formats", format_spec.name, format_spec.options, "format")
        ]

    # -- episode -------------------------------------------------------------------------------
    @property
    def stop_sequences(self) -> list[str]:
        return list(self._stop_sequences)

    @property
    def writes_tool_schemas(self) -> bool:
        """True when this environment writes the tool schemas into the system message itself
        (``tool_schemas: system`` with a format that would hand them to the chat template)."""
        return self.config.tool_schemas == "system" and self.format.tools_in_template

    def add_tools(self, tools: Sequence[Tool]) -> None:
        """Offer ``tools`` besides the configured ones (an environment whose tools come from
        elsewhere: an MCP server's listing, a package's tool server), after them in this order; the
        system text and the stop sequences then cover every tool. Raises
        :class:`~agent_r1.errors.ConfigError` when the format cannot take the tools."""
        for tool in tools:
            self.tools[tool.name] = tool
            self.tool_classes[tool.name] = type(tool)
        every = list(self.tool_classes.values())
        try:
            self._instructions = self.describe_tools(every)
            self._stop_sequences = _stop_sequences(self.format, every)
        except ValueError as exc:
            fmt = self.config.format_spec().name
            raise ConfigError(
                f"{self.name}: tools {list(self.tool_classes)} and format {fmt!r}: {exc}",
                path="environment.format",
            ) from None

    def describe_tools(self, tools: Sequence[type[Tool]]) -> str:
        """What the system message says about ``tools``: the format's instructions, or with
        :attr:`writes_tool_schemas` the schemas themselves with an example call
        (:func:`~agent_r1.builtins.formats.tool_schemas_text`). Raises ``ValueError`` when the
        format refuses the tools."""
        if self.writes_tool_schemas:
            return tool_schemas_text(self.format, tools)
        return self.format.instructions(list(tools))

    def system_text(self) -> str:
        """What this environment adds to the system message."""
        parts = [self.config.system_prompt]
        if self.config.include_format_instructions:
            parts.append(self._instructions)
        return "\n\n".join(part.strip() for part in parts if part and part.strip())

    async def reset(self, task: Task) -> EpisodeStart:
        """``task.messages`` with :meth:`system_text` merged in front of the system message (one is
        created when absent) and :meth:`few_shot_messages` right after it, plus the tool schemas
        when the format puts them in the template (and ``tool_schemas`` is ``template``)."""
        messages: list[Message] = [dict(message) for message in task.messages]
        addition = self.system_text()
        if addition:
            if messages and messages[0].get("role") == "system":
                existing = messages[0].get("content") or ""
                messages[0]["content"] = f"{addition}\n\n{existing}" if existing else addition
            else:
                messages.insert(0, {"role": "system", "content": addition})
        at = 1 if messages and messages[0].get("role") == "system" else 0
        messages[at:at] = self.few_shot_messages()
        in_template = self.format.tools_in_template and not self.writes_tool_schemas
        tools = [tool.schema() for tool in self.tools.values()] if in_template else []
        return EpisodeStart(messages=messages, tools=tools)

    def few_shot_messages(self) -> list[Message]:
        """Worked examples shown as earlier turns of every episode, between the system message and
        the task (none by default). Override to demonstrate tool use: write the calls with
        ``self.format`` so that they look exactly like the policy's own."""
        return []

    def parse(self, action: Action) -> ParsedAction:
        """Parse ``action.text`` with the format and apply ``max_calls_per_turn``."""
        parsed = self.format.parse(action.text, self.tool_classes)
        stops = self._stop_sequences
        if (
            parsed.errors
            and action.finish_reason == "stop"
            and stops
            and not any(action.text.rstrip().endswith(stop) for stop in stops)
        ):
            # Some backends (vLLM by default) leave the matched stop sequence out of the text.
            candidates = [self.format.parse(action.text + stop, self.tool_classes) for stop in stops]
            best = min(candidates, key=lambda c: (len(c.errors), -len(c.tool_calls)))
            if len(best.errors) < len(parsed.errors):
                parsed = best
        cap = self.config.max_calls_per_turn
        if len(parsed.tool_calls) > cap:
            parsed.errors.append(too_many_calls_error(len(parsed.tool_calls), cap, parsed.tool_calls[cap:]))
            del parsed.tool_calls[cap:]
        return parsed

    async def step(self, action: Action, turn: int) -> Observation:
        """Parse ``action``, run its calls concurrently, and answer with the rendered results or end
        the episode. What was parsed comes back in the observation's ``tool_calls``, ``answer`` and
        ``parse_errors``; ``action`` is not modified.

        Raises :class:`~agent_r1.errors.ToolInfrastructureError` (a tool's infrastructure failed,
        and the tool does not show such failures to the agent) or
        :class:`~agent_r1.errors.EnvironmentFatalError`; the other calls of the turn are cancelled.
        """
        parsed = self.parse(action)
        calls = [
            call.model_copy(update={"id": f"call_{turn}_{i}"}) for i, call in enumerate(parsed.tool_calls)
        ]
        errors = list(parsed.errors)
        info: dict[str, Any] = {"tool_calls": 0, "tool_errors": 0, "format_errors": len(errors)}
        parsed_parts = {"tool_calls": calls, "answer": parsed.answer, "parse_errors": errors}

        if parsed.answer is not None and self.config.end_on_answer:
            if calls:
                info["ignored_tool_calls"] = len(calls)
            return self._observation(turn, [], parsed_parts, info, done=True, termination="answer")
        if not calls:
            if not errors and (self.config.end_on_no_tool_call or parsed.answer is not None):
                termination = "answer" if parsed.answer is not None else "no_tool_call"
                return self._observation(turn, [], parsed_parts, info, done=True, termination=termination)
            if not errors:  # keep going, but tell the agent what was missing
                errors.append(NO_CALL_MESSAGE)
                info["format_errors"] = len(errors)

        results = await self._run_calls(calls)
        info["tool_calls"] = len(results)
        info["tool_errors"] = sum(not result.ok for result in results)
        done = turn + 1 >= self.config.max_turns
        return self._observation(
            turn, results, parsed_parts, info, done=done, termination="max_turns" if done else None
        )

    async def _run_calls(self, calls: Sequence[ToolCall]) -> list[ToolResult]:
        """Run ``calls`` concurrently. When one raises (an infrastructure or fatal error), the others
        are cancelled (process-isolated ones killed) and that error is raised."""
        tasks = [asyncio.ensure_future(self.call(call)) for call in calls]
        if not tasks:
            return []
        try:
            done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        except BaseException:  # cancelled (Ctrl-C, a timeout around the step): stop every call
            await _cancel(tasks)
            raise
        if pending:
            await _cancel(list(pending))
        failed = [exc for task in tasks if task in done and (exc := task.exception()) is not None]
        if failed:
            fatal = [exc for exc in failed if isinstance(exc, EnvironmentFatalError)]
            raise (fatal or failed)[0]
        return [task.result() for task in tasks]

    def _observation(
        self,
        turn: int,
        results: list[ToolResult],
        parsed_parts: dict[str, Any],
        info: dict[str, Any],
        *,
        done: bool,
        termination: str | None,
    ) -> Observation:
        errors: list[str] = parsed_parts["parse_errors"]
        messages = [] if done else self.format.render_results(results, errors)
        return Observation(
            messages=messages,
            tool_results=results,
            rewards=self._process_rewards(turn, results, len(errors)),
            done=done,
            termination=termination,
            info=info,
            tool_calls=parsed_parts["tool_calls"],
            answer=parsed_parts["answer"],
            parse_errors=list(errors),
        )

    def _process_rewards(
        self, turn: int, results: Sequence[ToolResult], format_errors: int
    ) -> list[RewardSignal]:
        succeeded = sum(result.ok for result in results)
        counts = {
            "tool_success": (self.config.tool_success_reward, succeeded),
            "tool_failure": (self.config.tool_failure_reward, len(results) - succeeded),
            "format_error": (self.config.format_error_reward, format_errors),
        }
        return [
            RewardSignal(name=name, value=reward * count, kind="process", turn=turn, source=self.name)
            for name, (reward, count) in counts.items()
            if reward != 0.0 and count > 0
        ]

    # -- calls ---------------------------------------------------------------------------------
    async def call(self, call: ToolCall) -> ToolResult:
        """Run one call under ``call_timeout_s`` and return its result; failures the agent should
        read become error results (kinds ``unknown_tool``, ``bad_arguments``, ``timeout``,
        ``exception``, ``infrastructure``).

        A synchronous tool runs in a daemon worker thread that is abandoned at the timeout, or with
        ``isolation = "process"`` in a child process that is killed at the timeout (see
        :mod:`agent_r1.builtins.tool_runner`); either way the call returns at the timeout and its
        ``finished_at`` says so. Raises :class:`~agent_r1.errors.ToolInfrastructureError` (unless the
        tool sets ``infrastructure_errors_visible``) and :class:`~agent_r1.errors.EnvironmentFatalError`.
        """
        started = time.monotonic()
        tool = self.tools.get(call.name)
        if tool is None:
            return self._failed(
                call, "unknown_tool", unknown_tool_error("", call.name, list(self.tools)), started
            )
        problems = argument_errors(type(tool), call.arguments)
        if problems:
            return self._failed(call, "bad_arguments", "; ".join(problems), started)
        try:
            arguments = tool.Arguments.model_validate(call.arguments)
        except ValidationError as exc:  # pragma: no cover - argument_errors caught it already
            return self._failed(
                call, "bad_arguments", "; ".join(describe_validation_error(exc, type(tool))), started
            )
        timeout = self.config.call_timeout_s
        try:
            output = await _execute(tool, arguments, timeout)
        except CallTimedOut as exc:
            detail = f"the call took longer than {timeout:g} s and was stopped"
            if not exc.started:
                detail = f"the call waited {timeout:g} s for a free worker and never started"
            return self._failed(call, "timeout", detail, started)
        except EnvironmentFatalError as exc:
            raise EnvironmentFatalError(f"tool {call.name!r} (call {call.id}): {exc}") from exc
        except (ToolInfrastructureError, ChildProcessSetupFailed, TooManyHungCalls) as exc:
            if isinstance(exc, ToolInfrastructureError):
                detail = str(exc) or type(exc).__name__
            else:
                detail = f"{exc}; {_HANG_ADVICE if isinstance(exc, TooManyHungCalls) else _SETUP_ADVICE}"
            if type(tool).infrastructure_errors_visible:
                return self._failed(call, "infrastructure", detail, started)
            raise ToolInfrastructureError(f"tool {call.name!r} (call {call.id}) failed: {detail}") from exc
        except (ToolError, CallAborted) as exc:
            return self._failed(call, "exception", str(exc) or type(exc).__name__, started)
        except Exception as exc:
            return self._failed(call, "exception", _describe(exc), started)
        finished = time.monotonic()
        if isinstance(output, ToolResult):
            result = output.model_copy(update={"call_id": call.id, "name": call.name})
        else:
            result = ToolResult(
                call_id=call.id, name=call.name, content="" if output is None else str(output)
            )
        result.started_at, result.finished_at = started, finished
        return self._truncate(result)

    def _failed(self, call: ToolCall, kind: str, detail: str, started: float) -> ToolResult:
        result = ToolResult(
            call_id=call.id,
            name=call.name,
            content=f"Error: {detail}",
            ok=False,
            error=kind,
            started_at=started,
            finished_at=time.monotonic(),
        )
        return self._truncate(result)

    def _truncate(self, result: ToolResult) -> ToolResult:
        limit = self.config.max_result_chars
        if limit is None or len(result.content) <= limit:
            return result
        cut = len(result.content) - limit
        result.content = f"{result.content[:limit]}\n[truncated: {cut} more characters]"
        result.truncated = True
        return result


async def _execute(tool: Tool, arguments: Any, timeout: float) -> Any:
    """``tool.run(arguments)`` under ``timeout`` (raises :class:`CallTimedOut`), in the way the
    tool's ``isolation`` asks for."""
    if type(tool).isolation == "process":
        return await run_in_process(tool, arguments, timeout=timeout)
    if tool.is_async:
        task = asyncio.ensure_future(tool.run(arguments))
        try:
            done, _ = await asyncio.wait({task}, timeout=timeout)
        except BaseException:
            await _cancel([task])
            raise
        if not done:
            await _cancel([task])
            raise CallTimedOut(timeout, started=True)
        return task.result()
    return await run_in_thread(tool.run, arguments, timeout=timeout, label=tool.name)


async def _cancel(tasks: Sequence[asyncio.Future[Any]]) -> None:
    """Cancel ``tasks`` and wait until they have unwound (a process-isolated call kills its child
    on the way out). Their outcomes are dropped: the caller is already failing or timing out."""
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def _stop_sequences(fmt: ToolCallFormat, tools: Sequence[type[Tool]]) -> list[str]:
    """The format's stop sequences for ``tools``."""
    return list(fmt.stop_sequences_for(tools))


ToolEnvConfig = ToolEnv.Config
"""The options of :class:`ToolEnv` (presets subclass it)."""

__all__ = ["NO_CALL_MESSAGE", "ToolEnv", "ToolEnvConfig", "ToolError"]
