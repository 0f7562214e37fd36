"""OpenAI tools through the model's chat template, and tool calls read back from sampled text.

The gateway shows a request's ``tools`` to the model the way agent-r1's own rollouts do (see
:mod:`agent_r1.rollout.chat` and :mod:`agent_r1.builtins.formats`): a :class:`~agent_r1.ToolCallFormat`
(``hermes`` by default: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``) decides how a
call is written, and the chat template renders the tool schemas when it can.

:class:`ToolRendering` probes the template once:

* a template that renders ``tools`` and assistant ``tool_calls`` itself (Qwen2.5, Llama 3.1...)
  gets them as structured data, with a ``tools_in_template`` format;
* otherwise (SmolLM2's plain ChatML, or a format such as ``tags`` that describes its tools in
  words) the tools are described in the system message, and assistant ``tool_calls`` that an agent
  wrote itself are written into the message text with the format's own ``render_call``.

Tool results (``role: tool`` messages) always go through the format's ``render_results``, as in
the bundled environments. The sampled text is parsed with the format's ``parse``; each call it
finds becomes an OpenAI ``tool_call`` with a fresh id, and the text around the calls becomes the
message content.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, create_model

from agent_r1.builtins.formats import tool_schemas_text
from agent_r1.contracts import Tool, ToolCallFormat
from agent_r1.errors import AgentR1Error
from agent_r1.gateway.protocol import RequestError
from agent_r1.mdp import Message, ToolCall, ToolResult
from agent_r1.rollout.chat import ChatRenderer

__all__ = ["ParsedReply", "ToolRendering", "tool_class"]

_JSON_TYPES: dict[str, Any] = {
    "string": str,
    "integer": int,
    "number": float,
    "boolean": bool,
    "array": list,
    "object": dict,
}
_PROBE_TOOL_NAME = "agent_r1_probe_tool"
_PROBE_CALL_NAME = "agent_r1_probe_call"


def tool_class(spec: Mapping[str, Any]) -> type[Tool]:
    """A :class:`~agent_r1.Tool` class standing for one OpenAI function tool, so that the bundled
    tool-call formats can parse calls to it. Its ``Arguments`` model follows the JSON schema's
    top-level properties (types checked leniently, missing required ones refused, unknown ones
    allowed unless ``additionalProperties`` is false); ``run`` is never called: the agent program
    runs its own tools."""
    function = dict(spec.get("function") or {})
    name = str(function.get("name"))
    parameters = function.get("parameters") or {}
    properties = parameters.get("properties") or {} if isinstance(parameters, dict) else {}
    required = set(parameters.get("required") or []) if isinstance(parameters, dict) else set()
    closed = isinstance(parameters, dict) and parameters.get("additionalProperties") is False
    fields: dict[str, Any] = {}
    usable = all(
        key.isidentifier() and not key.startswith("_") and not hasattr(BaseModel, key) for key in properties
    )
    if usable:  # names pydantic cannot take as fields leave the arguments unchecked
        for key, prop in properties.items():
            kind = prop.get("type") if isinstance(prop, dict) else None
            annotation = _JSON_TYPES.get(kind, Any) if isinstance(kind, str) else Any
            fields[key] = (annotation, ...) if key in required else (annotation | None, None)
    config = ConfigDict(extra="forbid" if closed and usable else "allow")
    arguments = create_model(f"{name}_arguments", __config__=config, **fields)
    schema = {"type": "function", "function": function}
    return type(
        f"OpenAITool_{name}",
        (Tool,),
        {
            "name": name,
            "description": str(function.get("description") or ""),
            "Arguments": arguments,
            "schema": classmethod(lambda cls: schema),
            "__doc__": f"The OpenAI tool {name!r} of a gateway request (parsed, never run here).",
        },
    )


@dataclass
class ParsedReply:
    """A sampled text as an OpenAI assistant message: ``content`` (``None`` when the text was
    nothing but tool calls), the calls, and what the format could not parse."""

    content: str | None
    tool_calls: list[ToolCall] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


class ToolRendering:
    """How a request's tools reach the model and how its calls come back, for one chat template
    (``renderer``) and one tool-call format (see the module docstring)."""

    def __init__(self, renderer: ChatRenderer, fmt: ToolCallFormat) -> None:
        self.renderer = renderer
        self.format = fmt
        self.template_renders_tools = self._probe_tools()
        self.template_renders_calls = self._probe_calls()
        self.native = bool(
            fmt.tools_in_template and self.template_renders_tools and self.template_renders_calls
        )
        """Tools and assistant tool calls go to the chat template as structured data."""
        self._classes: dict[str, dict[str, type[Tool]]] = {}

    # -- probes -----------------------------------------------------------------------------------
    def _probe_tools(self) -> bool:
        probe = {
            "type": "function",
            "function": {"name": _PROBE_TOOL_NAME, "description": "probe", "parameters": {"type": "object"}},
        }
        try:
            text = self.renderer.render_text(
                [{"role": "user", "content": "hi"}], [probe], add_generation_prompt=True
            )
        except AgentR1Error:  # a template that fails on tools does not render them
            return False
        return _PROBE_TOOL_NAME in text

    def _probe_calls(self) -> bool:
        messages: list[Message] = [
            {"role": "user", "content": "hi"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {
                        "id": "call_probe",
                        "type": "function",
                        "function": {"name": _PROBE_CALL_NAME, "arguments": {}},
                    }
                ],
            },
        ]
        try:
            text = self.renderer.render_text(messages, add_generation_prompt=False)
        except AgentR1Error:  # a template that fails on tool_calls does not render them
            return False
        return _PROBE_CALL_NAME in text

    # -- tools --------------------------------------------------------------------------------------
    def tool_classes(self, tools: Sequence[Mapping[str, Any]] | None) -> dict[str, type[Tool]]:
        """Name → tool class for the request's tools (built once per distinct tool list)."""
        if not tools:
            return {}
        key = json.dumps(list(tools), sort_keys=True, default=str)
        if key not in self._classes:
            classes = [tool_class(spec) for spec in tools]
            names = [cls.name for cls in classes]
            if len(set(names)) != len(names):
                raise RequestError(f"tools: two tools share a name ({', '.join(names)})", param="tools")
            try:  # a format may refuse a tool set (the tags format: names that are no valid tags)
                self.format.stop_sequences_for(classes)
                self.format.instructions(classes)
            except ValueError as exc:
                raise RequestError(
                    f"tools: the tool-call format {self.format.name!r} cannot use these tools: {exc}",
                    param="tools",
                ) from None
            self._classes[key] = {cls.name: cls for cls in classes}
        return self._classes[key]

    def stop_sequences(self, tools: Sequence[Mapping[str, Any]] | None) -> list[str]:
        """The format's stop sequences for these tools (e.g. ``</calc>`` for ``tags``)."""
        classes = self.tool_classes(tools)
        return list(self.format.stop_sequences_for(list(classes.values()))) if classes else []

    def instructions(self, tools: Sequence[Mapping[str, Any]] | None) -> str:
        """What the system message says about the tools when the template does not render them
        (the block ``tool_env`` writes with ``tool_schemas: system``)."""
        classes = self.tool_classes(tools)
        if not classes or self.native:
            return ""
        return tool_schemas_text(self.format, list(classes.values()))

    # -- messages -----------------------------------------------------------------------------------
    def template_input(
        self, messages: list[Message], tools: Sequence[Mapping[str, Any]] | None
    ) -> tuple[list[Message], list[dict[str, Any]] | None]:
        """A whole conversation (canonical messages) as the chat template's ``messages`` and
        ``tools``."""
        rendered = self.observation_input(messages, history=[], tools=tools)
        addition = self.instructions(tools)
        if addition:
            if rendered and rendered[0].get("role") == "system":
                existing = rendered[0].get("content") or ""
                rendered[0] = {
                    **rendered[0],
                    "content": f"{addition}\n\n{existing}" if existing else addition,
                }
            else:
                rendered.insert(0, {"role": "system", "content": addition})
        native_tools = [dict(tool) for tool in tools] if tools and self.native else None
        return rendered, native_tools

    def observation_input(
        self,
        messages: list[Message],
        *,
        history: list[Message],
        tools: Sequence[Mapping[str, Any]] | None,
    ) -> list[Message]:
        """Messages appended after ``history`` (canonical), as the chat template takes them: tool
        results through the format's ``render_results``, assistant tool calls structured or
        written out (see the module docstring)."""
        classes = self.tool_classes(tools)
        names = {
            call["id"]: call["name"] for m in [*history, *messages] for call in m.get("tool_calls") or []
        }
        out: list[Message] = []
        i = 0
        while i < len(messages):
            message = messages[i]
            if message["role"] == "tool":
                results = []
                while i < len(messages) and messages[i]["role"] == "tool":
                    m = messages[i]
                    call_id = m.get("tool_call_id", "")
                    results.append(
                        ToolResult(
                            call_id=call_id,
                            name=m.get("name") or names.get(call_id, ""),
                            content=m["content"],
                        )
                    )
                    i += 1
                out.extend(dict(m) for m in self.format.render_results(results))
                continue
            if message["role"] == "assistant" and message.get("tool_calls"):
                out.append(self._assistant(message, classes, i))
            else:
                out.append({"role": message["role"], "content": message["content"]})
            i += 1
        return out

    def _assistant(self, message: Message, classes: Mapping[str, type[Tool]], index: int) -> Message:
        calls = message["tool_calls"]
        if self.native:
            return {
                "role": "assistant",
                "content": message["content"],
                "tool_calls": [
                    {
                        "id": c["id"],
                        "type": "function",
                        "function": {"name": c["name"], "arguments": c["arguments"]},
                    }
                    for c in calls
                ],
            }
        written = []
        for c in calls:
            try:
                written.append(
                    self.format.render_call(
                        ToolCall(id=c["id"], name=c["name"], arguments=c["arguments"]), classes
                    )
                )
            except (NotImplementedError, KeyError) as exc:
                raise RequestError(
                    f"messages[{index}]: the tool-call format {self.format.name!r} cannot write the call to "
                    f"{c['name']!r} into the text the model sees ({type(exc).__name__}: {exc}); list the "
                    "tool in the request's tools",
                    param=f"messages[{index}].tool_calls",
                ) from None
        content = message["content"]
        return {"role": "assistant", "content": "\n".join([content, *written] if content else written)}

    # -- parsing ------------------------------------------------------------------------------------
    def parse(
        self, text: str, tools: Sequence[Mapping[str, Any]] | None, *, allow_calls: bool = True
    ) -> ParsedReply:
        """The sampled ``text`` as an assistant message: the format's calls (fresh ids), the text
        around them, and parse errors. Without tools (or with ``tool_choice: none``) the text is the
        content as it is."""
        classes = self.tool_classes(tools)
        if not classes or not allow_calls:
            return ParsedReply(content=text)
        parsed = self.format.parse(text, classes)
        if not parsed.tool_calls:
            return ParsedReply(content=text, errors=list(parsed.errors))
        rest = text
        calls = []
        for call in parsed.tool_calls:
            if call.raw:
                rest = rest.replace(call.raw, "", 1)
            calls.append(call.model_copy(update={"id": f"call_{uuid.uuid4().hex[:24]}"}))
        content = rest.strip()
        return ParsedReply(content=content or None, tool_calls=calls, errors=list(parsed.errors))
