"""Bundled tool-call formats: ``hermes`` (Qwen2.5/Qwen3 ``<tool_call>`` JSON) and ``tags``
(Search-R1 style, where the tool name is the tag: ``<search>query</search>``).

Parsing never raises on what the model wrote: every problem (bad JSON, unknown tool, arguments
that do not fit the tool's ``Arguments`` model, an unclosed tag, too many calls) becomes a
human-readable entry of :attr:`ParsedAction.errors`, which the environment shows back to the agent
so that it can learn from it.

Besides the :class:`~agent_r1.ToolCallFormat` contract, both formats offer the inverse of
``parse``: :meth:`render_call` and :meth:`render_answer` write a call or an answer exactly the way
``parse`` reads them back (used for few-shot prompts, scripted policies and property tests), and
:meth:`stop_sequences_for` gives the stop sequences for a given tool set.
"""

from __future__ import annotations

import difflib
import json
import re
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, Literal

from pydantic import Field, ValidationError, field_validator

from agent_r1.contracts import ComponentConfig, ParsedAction, Tool, ToolCallFormat
from agent_r1.mdp import Message, ToolCall, ToolResult

TAG_NAME = re.compile(r"[A-Za-z_][\w.-]*")
"""What a tag name may look like (``calc``, ``web_search``, ``kb.lookup``)."""


# --------------------------------------------------------------------------------------------
# Helpers shared by both formats (and by ToolEnv)
# --------------------------------------------------------------------------------------------


def unknown_tool_error(
    prefix: str, name: str, known: Sequence[str], show: Callable[[str], str] = repr
) -> str:
    """``<prefix>unknown tool 'x'. Did you mean 'y'? Known tools: 'a', 'b'.`` (``show`` quotes names)."""
    message = f"{prefix}unknown tool {show(name)}."
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    if close:
        message += f" Did you mean {show(close[0])}?"
    return message + f" Known tools: {', '.join(map(show, known)) if known else '(none)'}."


def argument_errors(tool: type[Tool], arguments: Mapping[str, Any]) -> list[str]:
    """Validate ``arguments`` with ``tool.Arguments``; one readable line per problem, [] if valid."""
    try:
        tool.Arguments.model_validate(dict(arguments))
    except ValidationError as exc:
        return describe_validation_error(exc, tool)
    return []


def describe_validation_error(exc: ValidationError, tool: type[Tool]) -> list[str]:
    """Turn a pydantic error on a tool's arguments into lines naming the field and the reason."""
    accepted = ", ".join(tool.Arguments.model_fields) or "(none)"
    lines = []
    for error in exc.errors():
        field = ".".join(str(part) for part in error.get("loc", ())) or "<arguments>"
        if error["type"] == "missing":
            lines.append(f"missing required argument {field!r}")
        elif error["type"] == "extra_forbidden":
            lines.append(f"unexpected argument {field!r} (accepted: {accepted})")
        else:
            shown = repr(error.get("input"))
            if len(shown) > 60:
                shown = shown[:57] + "..."
            lines.append(f"argument {field!r}: {error['msg']} (got {shown})")
    return lines


def too_many_calls_error(given: int, cap: int, dropped: Sequence[ToolCall]) -> str:
    """The message for calls beyond the per-turn cap (they are dropped, not run)."""
    names = ", ".join(call.name for call in dropped)
    return (
        f"too many tool calls in one turn: {given} given, at most {cap} allowed. "
        f"Calls {cap + 1}-{given} ({names}) were not run; make at most {cap} calls per turn."
    )


def cap_calls(parsed: ParsedAction, cap: int | None) -> ParsedAction:
    """Drop the calls beyond ``cap`` (in place) and record an error naming them."""
    if cap is not None and len(parsed.tool_calls) > cap:
        dropped = parsed.tool_calls[cap:]
        parsed.errors.append(too_many_calls_error(len(parsed.tool_calls), cap, dropped))
        del parsed.tool_calls[cap:]
    return parsed


def single_string_field(tool: type[Tool]) -> str | None:
    """The field a bare tag body maps to: the only required field, when it is a string (or the
    only field at all, when none is required and it is a string). ``None`` otherwise."""
    fields = tool.Arguments.model_fields
    required = [name for name, info in fields.items() if info.is_required()]
    candidates = required if required else list(fields)
    if len(candidates) != 1:
        return None
    annotation = fields[candidates[0]].annotation
    return candidates[0] if annotation is str or _optional_str(annotation) else None


def _optional_str(annotation: Any) -> bool:
    origin = typing.get_origin(annotation)
    if origin is typing.Union or origin is types.UnionType:
        return set(typing.get_args(annotation)) == {str, type(None)}
    return False


def _json_error(exc: json.JSONDecodeError) -> str:
    return f"invalid JSON at line {exc.lineno}, column {exc.colno} (char {exc.pos}): {exc.msg}"


def _excerpt(text: str, limit: int = 40) -> str:
    text = text.strip()
    return repr(text if len(text) <= limit else text[: limit - 3] + "...")


def example_call(fmt: ToolCallFormat, tool: type[Tool]) -> str:
    """A call of ``tool`` written in ``fmt``, each required argument given as ``"..."``; empty when
    the format cannot write calls."""
    required = [name for name, info in tool.Arguments.model_fields.items() if info.is_required()]
    call = ToolCall(id="example", name=tool.name, arguments={name: "..." for name in required})
    try:
        return fmt.render_call(call, {tool.name: tool})
    except (NotImplementedError, KeyError):  # a format that cannot write calls gets no example
        return ""


def tool_schemas_text(fmt: ToolCallFormat, tools: Sequence[type[Tool]]) -> str:
    """System-message text that shows ``tools`` to a model whose chat template cannot: a
    ``# Tools`` heading, each tool's JSON schema (the ``function`` part of its ``schema()``), an
    example call written in ``fmt`` and the format's own instructions. For a format that describes
    its tools itself (``tools_in_template`` false, e.g. ``tags``), its instructions as they are.

    ``tool_env`` writes it with ``tool_schemas: system``; the policy gateway writes the same block
    for templates without tool support. Raises ``ValueError`` when the format refuses the tools."""
    if not fmt.tools_in_template or not tools:
        return fmt.instructions(list(tools))
    lines = ["# Tools", "You may call one or more of these tools (JSON schemas):"]
    lines += [json.dumps(tool.schema()["function"], ensure_ascii=False) for tool in tools]
    example = example_call(fmt, tools[0])
    if example:
        lines += ["To call a tool, write:", example]
    extra = fmt.instructions(list(tools))
    return "\n".join([*lines, extra] if extra else lines)


class FormatConfig(ComponentConfig):
    """Options both bundled formats share."""

    max_calls_per_turn: int | None = Field(
        None, ge=1, description="keep at most this many calls of a turn; the rest are dropped with an error"
    )


# --------------------------------------------------------------------------------------------
# hermes
# --------------------------------------------------------------------------------------------


class HermesFormat(ToolCallFormat):
    """Qwen2.5/Qwen3 (Hermes) tool calls: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``.

    An action may hold several calls. The tool schemas go to the chat template
    (``tools_in_template``), which also wraps each result message (role ``tool``) in
    ``<tool_response>``. The final answer is the text inside ``<answer_tag>`` or, with
    ``answer_tag: null``, the whole text of a turn that has no tool call. Reasoning inside
    ``<think>...</think>`` is ignored when ``ignore_think`` is set.
    """

    name = "hermes"
    tools_in_template: ClassVar[bool] = True
    OPEN: ClassVar[str] = "<tool_call>"
    CLOSE: ClassVar[str] = "</tool_call>"

    class Config(FormatConfig):
        answer_tag: str | None = Field(
            "answer", description="final answer tag; null makes a turn without tool calls the answer"
        )
        stop_on_call_end: bool = Field(
            False, description="stop generating at </tool_call> (Qwen emits several calls, then <|im_end|>)"
        )
        ignore_think: bool = Field(True, description="ignore calls and answers inside <think>...</think>")

        @field_validator("answer_tag")
        @classmethod
        def _tag_name(cls, tag: str | None) -> str | None:
            if tag is not None and not TAG_NAME.fullmatch(tag):
                raise ValueError(f"{tag!r} is not a valid tag name (letters, digits, _ . -)")
            return tag

    config: Config

    @property
    def stop_sequences(self) -> list[str]:
        return [self.CLOSE] if self.config.stop_on_call_end else []

    def stop_sequences_for(self, tools: Sequence[type[Tool]]) -> list[str]:
        """Stop sequences for this tool set (the same for every tool set here)."""
        return self.stop_sequences

    def instructions(self, tools: Sequence[type[Tool]]) -> str:
        """The chat template describes the tools; only the answer convention needs saying."""
        tag = self.config.answer_tag
        return f"When you have the final answer, write it as <{tag}>answer</{tag}>." if tag else ""

    def render_call(self, call: ToolCall, tools: Mapping[str, type[Tool]] | None = None) -> str:
        """The text of ``call`` in this format (what :meth:`parse` reads back)."""
        body = json.dumps({"name": call.name, "arguments": call.arguments}, ensure_ascii=False)
        return f"{self.OPEN}\n{body}\n{self.CLOSE}"

    def render_answer(self, answer: str) -> str:
        tag = self.config.answer_tag
        return f"<{tag}>{answer}</{tag}>" if tag else answer

    def parse(self, text: str, tools: Mapping[str, type[Tool]]) -> ParsedAction:
        text = self._visible(text)
        parsed = ParsedAction()
        outside: list[str] = []  # the text between calls, where the answer may be
        decoder = json.JSONDecoder()
        position, index = 0, 0
        while True:
            start = text.find(self.OPEN, position)
            if start < 0:
                outside.append(text[position:])
                break
            outside.append(text[position:start])
            index += 1
            label = f"tool call {index}: "
            body_start = start + len(self.OPEN)
            close = text.find(self.CLOSE, body_start)
            json_start = body_start + (len(text[body_start:]) - len(text[body_start:].lstrip()))
            try:
                payload, json_end = decoder.raw_decode(text, json_start)
            except json.JSONDecodeError:
                if close < 0:  # most likely cut off mid-call: the JSON error would be noise
                    parsed.errors.append(f"{label}{self.OPEN} is not closed with {self.CLOSE}.")
                    break
                try:
                    json.loads(text[body_start:close])
                    problem = "invalid JSON"  # pragma: no cover - raw_decode failed, so loads fails too
                except json.JSONDecodeError as exc:
                    problem = _json_error(exc)
                parsed.errors.append(
                    f'{label}{problem}. Write {self.OPEN}{{"name": "<tool>", "arguments": {{...}}}}'
                    f"{self.CLOSE}."
                )
                position = close + len(self.CLOSE)
                continue
            after = json_end + (len(text[json_end:]) - len(text[json_end:].lstrip()))
            if not text.startswith(self.CLOSE, after):
                if after >= len(text):
                    parsed.errors.append(f"{label}{self.OPEN} is not closed with {self.CLOSE}.")
                    break
                parsed.errors.append(
                    f"{label}expected {self.CLOSE} right after the JSON object, found "
                    f"{_excerpt(text[after:])}. Put exactly one JSON object in each {self.OPEN}."
                )
                if close < 0:
                    break
                position = close + len(self.CLOSE)
                continue
            position = after + len(self.CLOSE)
            call = self._call(payload, index, label, tools, parsed.errors)
            if call is not None:
                call.raw = text[start:position]
                parsed.tool_calls.append(call)
        rest = "".join(outside)
        tag = self.config.answer_tag
        if tag is not None:
            parsed.answer = _find_answer(rest, tag, parsed.errors)
        elif not parsed.tool_calls and not parsed.errors and text.strip():
            parsed.answer = text.strip()
        return cap_calls(parsed, self.config.max_calls_per_turn)

    def _visible(self, text: str) -> str:
        if not self.config.ignore_think:
            return text
        if "</think>" in text:  # the opening tag may sit in the prompt (Qwen3 thinking templates)
            return text.rsplit("</think>", 1)[1]
        if "<think>" in text:  # reasoning never finished: nothing after it counts
            return text.split("<think>", 1)[0]
        return text

    @staticmethod
    def _call(
        payload: Any, index: int, label: str, tools: Mapping[str, type[Tool]], errors: list[str]
    ) -> ToolCall | None:
        if not isinstance(payload, dict):
            errors.append(f"{label}expected a JSON object, got {type(payload).__name__}.")
            return None
        name = payload.get("name")
        if not isinstance(name, str) or not name:
            errors.append(f'{label}missing "name" (the tool to call). Known tools: {", ".join(tools)}.')
            return None
        if name not in tools:
            errors.append(unknown_tool_error(label, name, list(tools)))
            return None
        label = f"tool call {index} ({name}): "
        arguments = payload.get("arguments", payload.get("parameters", {}))
        if isinstance(arguments, str):  # OpenAI style: arguments as a JSON string
            try:
                arguments = json.loads(arguments) if arguments.strip() else {}
            except json.JSONDecodeError as exc:
                errors.append(f'{label}"arguments" is a string with {_json_error(exc)}.')
                return None
        if not isinstance(arguments, dict):
            errors.append(f'{label}"arguments" must be a JSON object, got {type(arguments).__name__}.')
            return None
        problems = argument_errors(tools[name], arguments)
        if problems:
            errors.extend(f"{label}{problem}." for problem in problems)
            return None
        return ToolCall(id=f"call_{index - 1}", name=name, arguments=arguments)

    def render_results(self, results: Sequence[ToolResult], errors: Sequence[str] = ()) -> list[Message]:
        """One ``tool`` message per result (the template wraps each in ``<tool_response>``), then
        one per parse error."""
        messages: list[Message] = [
            {"role": "tool", "name": result.name, "content": result.content} for result in results
        ]
        messages += [{"role": "tool", "content": f"Error: {error}"} for error in errors]
        return messages


def _find_answer(text: str, tag: str, errors: list[str]) -> str | None:
    """The body of the first complete ``<tag>...</tag>`` in ``text``; an unclosed tag is an error."""
    open_tag, close_tag = f"<{tag}>", f"</{tag}>"
    start = text.find(open_tag)
    if start < 0:
        return None
    end = text.find(close_tag, start + len(open_tag))
    if end < 0:
        errors.append(f"{open_tag} is not closed: write the final answer as {open_tag}...{close_tag}.")
        return None
    return text[start + len(open_tag) : end].strip()


# --------------------------------------------------------------------------------------------
# tags
# --------------------------------------------------------------------------------------------


class TagsFormat(ToolCallFormat):
    """Search-R1 style: the tool's tag holds its input (``<calc>12*7</calc>``), ``<answer>`` ends.

    A tool whose ``Arguments`` has a single required string field takes the tag body as that field;
    any other tool takes a JSON object body (``<lookup>{"table": "t", "key": 3}</lookup>``). The
    tag of a tool is its name unless ``tool_tags`` gives it an alias (``{calculator: calc}``).
    Generation stops after each closing tool tag; results come back as one message whose content
    wraps each result in ``<result_tag>`` (Search-R1 uses ``information``).
    """

    name = "tags"
    tools_in_template: ClassVar[bool] = False

    class Config(FormatConfig):
        tool_tags: dict[str, str] = Field(
            default_factory=dict, description="tag alias per tool name, e.g. {calculator: calc}"
        )
        answer_tag: str = Field("answer", description="the tag of the final answer")
        result_tag: str = Field("result", description="the tag wrapping each tool result")
        result_role: Literal["user", "tool"] = Field("user", description="role of the results message")
        stop_on_call: bool = Field(True, description="stop generating right after a closing tool tag")
        report_unknown_tags: bool = Field(
            True, description="a <x>...</x> pair that is no tool, answer or ignored tag is an error"
        )
        ignore_tags: list[str] = Field(
            default_factory=lambda: ["think"], description="tags that are neither calls nor errors"
        )

        @field_validator("answer_tag", "result_tag")
        @classmethod
        def _tag_name(cls, tag: str) -> str:
            if not TAG_NAME.fullmatch(tag):
                raise ValueError(f"{tag!r} is not a valid tag name (letters, digits, _ . -)")
            return tag

        @field_validator("tool_tags")
        @classmethod
        def _aliases(cls, aliases: dict[str, str]) -> dict[str, str]:
            for tool, tag in aliases.items():
                if not TAG_NAME.fullmatch(tag):
                    raise ValueError(
                        f"tag {tag!r} of tool {tool!r} is not a valid tag name (letters, digits, _ . -)"
                    )
            return aliases

    config: Config

    # -- tag table ---------------------------------------------------------------------------
    def tag_of(self, tool_name: str) -> str:
        """The tag that calls ``tool_name``."""
        return self.config.tool_tags.get(tool_name, tool_name)

    def _tags(self, tools: Mapping[str, type[Tool]] | Sequence[type[Tool]]) -> dict[str, type[Tool]]:
        """tag -> tool; raises ``ValueError`` when two tools (or a tool and the answer or result
        tag) share a tag, or a tool name is not a valid tag."""
        classes = list(tools.values()) if isinstance(tools, Mapping) else list(tools)
        table: dict[str, type[Tool]] = {}
        reserved = {self.config.answer_tag: "the answer tag", self.config.result_tag: "the result tag"}
        for tool in classes:
            tag = self.tag_of(tool.name)
            if not TAG_NAME.fullmatch(tag):
                raise ValueError(
                    f"tool {tool.name!r} cannot be called with the tags format: {tag!r} is not a valid tag; "
                    f"give it an alias with format.tool_tags: {{{tool.name}: <tag>}}"
                )
            if tag in reserved:
                raise ValueError(
                    f"tool {tool.name!r} uses the tag <{tag}>, which is {reserved[tag]}; "
                    f"set format.tool_tags to give the tool another tag"
                )
            if tag in table and table[tag] is not tool:
                raise ValueError(
                    f"tools {table[tag].name!r} and {tool.name!r} both use the tag <{tag}>; "
                    f"set format.tool_tags to tell them apart"
                )
            table[tag] = tool
        return table

    # -- contract ----------------------------------------------------------------------------
    def stop_sequences_for(self, tools: Sequence[type[Tool]]) -> list[str]:
        """The closing tag of each tool, so that generation stops right after a call."""
        if not self.config.stop_on_call:
            return []
        return [f"</{tag}>" for tag in self._tags(tools)]

    def instructions(self, tools: Sequence[type[Tool]]) -> str:
        """System-prompt text: one line per tool tag, then the result and answer tags."""
        answer, result = self.config.answer_tag, self.config.result_tag
        lines = []
        tags = self._tags(tools)
        if tags:
            lines.append(
                f"To use a tool, write its tag and stop; the result comes back as <{result}>...</{result}>."
            )
            lines.append("Tools:")
            for tag, tool in tags.items():
                description = f": {tool.description}" if tool.description else ""
                lines.append(f"- <{tag}>{self._placeholder(tool)}</{tag}>{description}")
        lines.append(f"Give the final answer as <{answer}>answer</{answer}>.")
        return "\n".join(lines)

    @staticmethod
    def _placeholder(tool: type[Tool]) -> str:
        field = single_string_field(tool)
        if field is not None:
            return field
        properties = tool.Arguments.model_json_schema().get("properties", {})
        shown = ", ".join(f'"{name}": {spec.get("type", "value")}' for name, spec in properties.items())
        return "{" + shown + "}"

    def render_call(self, call: ToolCall, tools: Mapping[str, type[Tool]]) -> str:
        """The text of ``call`` in this format (what :meth:`parse` reads back)."""
        tag = self.tag_of(call.name)
        field = single_string_field(tools[call.name])
        if field is not None and set(call.arguments) == {field} and isinstance(call.arguments[field], str):
            body = call.arguments[field]
        else:  # escaping "<" keeps a closing tag inside a JSON string from ending the call
            body = json.dumps(call.arguments, ensure_ascii=False).replace("<", "\\u003c")
        return f"<{tag}>{body}</{tag}>"

    def render_answer(self, answer: str) -> str:
        tag = self.config.answer_tag
        return f"<{tag}>{answer}</{tag}>"

    def parse(self, text: str, tools: Mapping[str, type[Tool]]) -> ParsedAction:
        tags = self._tags(tools)
        answer_tag, result_tag = self.config.answer_tag, self.config.result_tag
        ignored = {*self.config.ignore_tags, result_tag}
        parsed = ParsedAction()
        opening = re.compile(r"<(" + TAG_NAME.pattern + r")>")
        position, index = 0, 0
        while True:
            match = opening.search(text, position)
            if match is None:
                break
            tag = match.group(1)
            body_start = match.end()
            if tag in ignored:
                position = body_start  # look inside: a call within <think> still counts
                continue
            close = text.find(f"</{tag}>", body_start)
            if tag == answer_tag:
                if close < 0:
                    parsed.errors.append(
                        f"<{tag}> is not closed: write the final answer as <{tag}>...</{tag}>."
                    )
                    break
                if parsed.answer is None:
                    parsed.answer = text[body_start:close].strip()
                position = close + len(tag) + 3
                continue
            if tag not in tags:
                if close >= 0 and self.config.report_unknown_tags:
                    parsed.errors.append(self._unknown_tag_error(tag, tags))
                    position = close + len(tag) + 3
                else:  # a lone "<x>" is prose, not a call
                    position = body_start
                continue
            index += 1
            tool = tags[tag]
            label = f"tool call {index} <{tag}>: "
            if close < 0:
                parsed.errors.append(f"{label}the tag is not closed: write <{tag}>...</{tag}>.")
                break
            position = close + len(tag) + 3
            arguments = self._arguments(text[body_start:close], tool, label, parsed.errors)
            if arguments is None:
                continue
            problems = argument_errors(tool, arguments)
            if problems:
                parsed.errors.extend(f"{label}{problem}." for problem in problems)
                continue
            parsed.tool_calls.append(
                ToolCall(
                    id=f"call_{index - 1}",
                    name=tool.name,
                    arguments=arguments,
                    raw=text[match.start() : position],
                )
            )
        return cap_calls(parsed, self.config.max_calls_per_turn)

    @staticmethod
    def _unknown_tag_error(tag: str, tags: Mapping[str, type[Tool]]) -> str:
        by_name = {tool.name: known for known, tool in tags.items()}
        if tag in by_name:  # the tool's own name instead of its tag alias
            shown = ", ".join(f"<{known}>" for known in tags)
            return f"unknown tool <{tag}>. Did you mean <{by_name[tag]}>? Known tools: {shown}."
        return unknown_tool_error("", tag, list(tags), show=lambda t: f"<{t}>")

    @staticmethod
    def _arguments(body: str, tool: type[Tool], label: str, errors: list[str]) -> dict[str, Any] | None:
        body = body.strip()
        field = single_string_field(tool)
        if field is not None:
            if body.startswith("{"):  # a JSON object naming the field is accepted too
                try:
                    payload = json.loads(body)
                except json.JSONDecodeError:
                    payload = None
                if isinstance(payload, dict) and field in payload:
                    return payload
            return {field: body}
        try:
            payload = json.loads(body)
        except json.JSONDecodeError as exc:
            errors.append(f"{label}{_json_error(exc)}. The body must be a JSON object of the arguments.")
            return None
        if not isinstance(payload, dict):
            errors.append(
                f"{label}the body must be a JSON object of the arguments, got {type(payload).__name__}."
            )
            return None
        return payload

    def render_results(self, results: Sequence[ToolResult], errors: Sequence[str] = ()) -> list[Message]:
        """One message (role ``result_role``) with each result, then each error, in the result tag."""
        tag = self.config.result_tag
        parts = [f"<{tag}>{result.content}</{tag}>" for result in results]
        parts += [f"<{tag}>Error: {error}</{tag}>" for error in errors]
        if not parts:
            return []
        return [{"role": self.config.result_role, "content": "\n".join(parts)}]


__all__ = [
    "HermesFormat",
    "TagsFormat",
    "argument_errors",
    "cap_calls",
    "example_call",
    "single_string_field",
    "too_many_calls_error",
    "tool_schemas_text",
    "unknown_tool_error",
]
