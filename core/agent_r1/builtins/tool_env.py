"""``tool_env``: the generic environment that lets an agent call tools over several turns.

The run config names the tools and the tool-call format; both are looked up in the registry and
validated before any model loads (see :meth:`ToolEnv.requires`)::

    environment:
      name: tool_env
      tools: [calculator, {name: search, top_k: 3}]
      format: {name: tags, tool_tags: {calculator: calc}}
      system_prompt: "Answer the question."
      max_turns: 4

Protocol with the engine (one instance per trajectory):

1. ``start = await env.reset(task)``: render ``start.messages`` (with ``tools=start.tools`` when
   non-empty) as the prompt.
2. Each turn ``t`` (0-based): generate with ``env.stop_sequences`` besides EOS, build an
   :class:`~agent_r1.Action` whose ``text`` is the decoded sampled tokens (stop sequence included),
   then ``observation = await env.step(action, t)``. The environment fills ``action.tool_calls``,
   ``action.answer`` and ``action.parse_errors`` in place.
3. If ``observation.done`` the episode ends (``observation.termination`` says why, and
   ``observation.messages`` is empty); otherwise append ``observation.messages`` as environment
   tokens and go on with turn ``t + 1``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import Field, ValidationError, model_validator

from agent_r1.builtins.formats import (
    argument_errors,
    describe_validation_error,
    too_many_calls_error,
    unknown_tool_error,
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
from agent_r1.errors import ConfigError, ToolError
from agent_r1.mdp import Action, Message, Observation, RewardSignal, Task, ToolCall, ToolResult

NO_CALL_MESSAGE = "your reply has no tool call and no final answer. Call a tool or give the final answer."


def _spec(item: str | ComponentSpec) -> ComponentSpec:
    return ComponentSpec(name=item) if isinstance(item, str) else item


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
        max_turns: int = Field(
            4, ge=1, description="actions per episode at most (the engine has its own cap too)"
        )
        max_calls_per_turn: int = Field(
            4, ge=1, description="calls beyond this in one action are dropped with an error"
        )
        call_timeout_s: float = Field(
            30.0, gt=0, description="a call that runs longer fails with error 'timeout'"
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
        from agent_r1.registry import get_registry

        registry = get_registry()
        self.tools: dict[str, Tool] = {}
        for i, spec in enumerate(self.config.tool_specs()):
            tool = registry.build("tools", spec.name, spec.options)
            if tool.name in self.tools:
                raise ConfigError(
                    f"{self.name}.tools[{i}]: {spec.name!r} is the tool {tool.name!r}, "
                    "which is already listed",
                    path=f"tools[{i}]",
                )
            self.tools[tool.name] = tool
        format_spec = self.config.format_spec()
        self.format: ToolCallFormat = registry.build(
            "tool_call_formats", format_spec.name, format_spec.options
        )
        self.tool_classes: dict[str, type[Tool]] = {name: type(tool) for name, tool in self.tools.items()}
        try:  # surfaces format/tool mismatches (e.g. two tools on one tag) now, not mid-rollout
            self._instructions = self.format.instructions(list(self.tool_classes.values()))
            self._stop_sequences = _stop_sequences(self.format, list(self.tool_classes.values()))
        except ValueError as exc:
            raise ConfigError(
                f"{self.name}: tools {list(self.tools)} and format {format_spec.name!r}: {exc}"
            ) from None

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

    def system_text(self) -> str:
        """What this environment adds to the system message."""
        parts = [self.config.system_prompt]
        if self.config.include_format_instructions:
            parts.append(self._instructions)
        return "\n\n".join(part.strip() for part in parts if part and part.strip())

    async def reset(self, task: Task) -> EpisodeStart:
        """``task.messages`` with :meth:`system_text` merged in front of the system message (one is
        created when absent), plus the tool schemas when the format puts them in the template."""
        messages: list[Message] = [dict(message) for message in task.messages]
        addition = self.system_text()
        if addition:
            if messages and messages[0].get("role") == "system":
                existing = messages[0].get("content") or ""
                messages[0]["content"] = f"{addition}\n\n{existing}" if existing else addition
            else:
                messages.insert(0, {"role": "system", "content": addition})
        tools = [tool.schema() for tool in self.tools.values()] if self.format.tools_in_template else []
        return EpisodeStart(messages=messages, tools=tools)

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
        """Parse ``action`` (writing ``tool_calls``, ``answer`` and ``parse_errors`` into it), run its
        calls concurrently, and answer with the rendered results or end the episode."""
        parsed = self.parse(action)
        calls = [
            call.model_copy(update={"id": f"call_{turn}_{i}"}) for i, call in enumerate(parsed.tool_calls)
        ]
        errors = list(parsed.errors)
        action.tool_calls, action.answer, action.parse_errors = calls, parsed.answer, errors
        info: dict[str, Any] = {"tool_calls": 0, "tool_errors": 0, "format_errors": len(errors)}

        if parsed.answer is not None and self.config.end_on_answer:
            if calls:
                info["ignored_tool_calls"] = len(calls)
            return self._observation(turn, [], errors, info, done=True, termination="answer")
        if not calls:
            if not errors and (self.config.end_on_no_tool_call or parsed.answer is not None):
                termination = "answer" if parsed.answer is not None else "no_tool_call"
                return self._observation(turn, [], errors, info, done=True, termination=termination)
            if not errors:  # keep going, but tell the agent what was missing
                errors.append(NO_CALL_MESSAGE)
                action.parse_errors = list(errors)
                info["format_errors"] = len(errors)

        results = list(await asyncio.gather(*(self.call(call) for call in calls)))
        info["tool_calls"] = len(results)
        info["tool_errors"] = sum(not result.ok for result in results)
        done = turn + 1 >= self.config.max_turns
        return self._observation(
            turn, results, errors, info, done=done, termination="max_turns" if done else None
        )

    def _observation(
        self,
        turn: int,
        results: list[ToolResult],
        errors: list[str],
        info: dict[str, Any],
        *,
        done: bool,
        termination: str | None,
    ) -> Observation:
        messages = [] if done else self.format.render_results(results, errors)
        return Observation(
            messages=messages,
            tool_results=results,
            rewards=self._process_rewards(turn, results, len(errors)),
            done=done,
            termination=termination,
            info=info,
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
        """Run one call under ``call_timeout_s``; never raises. Sync tools run in a worker thread
        (a sync tool that hangs keeps its thread busy after the timeout: Python cannot kill it)."""
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
            if tool.is_async:
                output = await asyncio.wait_for(tool.run(arguments), timeout)
            else:
                output = await asyncio.wait_for(asyncio.to_thread(tool.run, arguments), timeout)
        except asyncio.TimeoutError:
            return self._failed(
                call, "timeout", f"the call took longer than {timeout:g} s and was stopped", started
            )
        except ToolError as exc:
            return self._failed(call, "exception", str(exc) or type(exc).__name__, started)
        except Exception as exc:
            detail = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            return self._failed(call, "exception", detail, started)
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


def _stop_sequences(fmt: ToolCallFormat, tools: Sequence[type[Tool]]) -> list[str]:
    """The format's stop sequences for ``tools``."""
    return list(fmt.stop_sequences_for(tools))


ToolEnvConfig = ToolEnv.Config
"""The options of :class:`ToolEnv` (presets subclass it)."""

__all__ = ["NO_CALL_MESSAGE", "ToolEnv", "ToolEnvConfig", "ToolError"]
