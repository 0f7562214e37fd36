"""The OpenAI wire format the gateway speaks: requests, their validation, responses and errors.

Requests are validated strictly, as the OpenAI API does: an unknown parameter, and a parameter the
gateway cannot honour without changing what the policy samples (``n > 1``, ``logit_bias``,
penalties, ``top_logprobs``, ``response_format`` unless the gateway serves it as an instruction, a
forced tool), is an HTTP 400 with an
OpenAI-style error body that names every such parameter at once. The sampling the gateway does is
exactly the rollout backend's: one continuation per call, its tokens and log-probabilities
recorded for training.

Messages are brought into one canonical form (:func:`canonical_messages`) so that the gateway can
recognise a conversation it has seen before whatever client library re-sent it: ``content`` is a
string (text parts joined), ``tool_calls`` carry parsed ``arguments``, and the fields a client adds
with null values (``refusal``, ``audio``...) are dropped.

This module imports neither torch nor the web framework.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from agent_r1.mdp import Message, ToolCall

__all__ = [
    "ChatRequest",
    "CompletionRequest",
    "ConflictError",
    "GatewayHTTPError",
    "RequestError",
    "canonical_messages",
    "chat_chunk",
    "chat_response",
    "completion_chunk",
    "completion_response",
    "episode_hint",
    "error_body",
    "finish_reason",
    "openai_tool_calls",
    "parse_request",
    "policy_fingerprint",
    "structured_format",
    "structured_instruction",
    "with_instruction",
]


class GatewayHTTPError(Exception):
    """An error answered as an OpenAI-style error body with an HTTP status."""

    status: int = 400
    kind: str = "invalid_request_error"

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code

    def body(self) -> dict[str, Any]:
        """The JSON body: ``{"error": {"message", "type", "param", "code"}}``."""
        return error_body(self.message, kind=self.kind, param=self.param, code=self.code)


class RequestError(GatewayHTTPError):
    """A request the gateway cannot serve as it is (HTTP 400); the message says what to change."""


class NotFoundError(GatewayHTTPError):
    """An unknown episode (HTTP 404)."""

    status = 404
    kind = "not_found_error"


class UnavailableError(GatewayHTTPError):
    """The gateway is not taking calls now (HTTP 503): the trainer is updating the policy, or the
    server is shutting down."""

    status = 503
    kind = "service_unavailable"


class CallTimeoutError(GatewayHTTPError):
    """A call did not finish within the gateway's request timeout (HTTP 504)."""

    status = 504
    kind = "timeout"


class ServerError(GatewayHTTPError):
    """The rollout backend failed (HTTP 500)."""

    status = 500
    kind = "server_error"


class ConflictError(GatewayHTTPError):
    """A request on an episode that has ended (HTTP 409): a finished or idle-closed episode id
    cannot be reopened, rewarded or finished again; a new episode needs a new id."""

    status = 409
    kind = "conflict_error"


def error_body(
    message: str, *, kind: str = "invalid_request_error", param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    """An OpenAI-style error object."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


# --------------------------------------------------------------------------------------------
# Requests
# --------------------------------------------------------------------------------------------


IGNORED_PARAMETERS = {
    "user": "an end-user identifier (also read as the episode id when no other names one)",
    "metadata": "free-form tags (metadata.episode_id names the episode)",
    "store": "whether OpenAI would store the completion",
    "service_tier": "the processing tier",
    "prompt_cache_key": "a hint for routing requests to a prompt cache",
    "safety_identifier": "an end-user identifier for abuse monitoring",
    "stream_options.include_obfuscation": "random padding of stream events (none is added)",
    "parallel_tool_calls": "whether several tool calls may come in one turn (the policy decides)",
}
"""Parameters the gateway accepts and ignores, because they do not change what is sampled."""


def episode_hint(metadata: dict[str, Any] | None, user: str | None) -> str | None:
    """The episode a request body names: ``metadata.episode_id`` (or ``agent_r1_episode``), else
    ``user``."""
    for key in ("episode_id", "agent_r1_episode"):
        value = (metadata or {}).get(key)
        if isinstance(value, str) and value:
            return value
    return user or None


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=0, description="extension (as in vLLM): 0 disables")
    max_tokens: int | None = Field(None, ge=1)
    stop: str | list[str] | None = None
    seed: int | None = None
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    n: int | None = None
    logit_bias: dict[str, float] | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    user: str | None = None
    metadata: dict[str, Any] | None = None
    store: bool | None = None
    service_tier: str | None = None
    prompt_cache_key: str | None = None
    """Accepted and ignored: a cache-routing hint (see :data:`IGNORED_PARAMETERS`)."""
    safety_identifier: str | None = None
    """Accepted and ignored: an end-user identifier for abuse monitoring."""

    def stop_list(self) -> list[str]:
        """``stop`` as a list (OpenAI takes a string or up to four strings)."""
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else [s for s in self.stop if s]

    def episode_hint(self) -> str | None:
        """The episode named in the body (see :func:`episode_hint`)."""
        return episode_hint(self.metadata, self.user)

    def unsupported(self) -> list[tuple[str, str]]:
        """``(parameter, why)`` for every parameter set to something the gateway cannot honour."""
        problems: list[tuple[str, str]] = []
        if self.n not in (None, 1):
            problems.append(("n", f"n={self.n}: one completion per call (send n separate calls)"))
        if self.logit_bias:
            problems.append(("logit_bias", "logit_bias would change the sampling distribution"))
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if value not in (None, 0, 0.0):
                problems.append((name, f"{name}={value} would change the sampling distribution"))
        known = {"include_usage", "include_obfuscation"}
        if self.stream_options and set(self.stream_options) - known:
            extra = sorted(set(self.stream_options) - known)
            problems.append(
                ("stream_options", f"only include_usage and include_obfuscation are supported, got {extra}")
            )
        return problems


class ChatRequest(_Request):
    """``POST /v1/chat/completions``: the parameters the gateway accepts."""

    messages: list[dict[str, Any]] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool | None = None
    top_logprobs: int | None = None
    response_format: dict[str, Any] | None = None

    def token_limit(self) -> int | None:
        """``max_completion_tokens`` (the current name), else ``max_tokens``."""
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def unsupported(self) -> list[tuple[str, str]]:
        problems = super().unsupported()
        if self.top_logprobs:
            problems.append(("top_logprobs", "only the sampled token's log-probability is returned"))
        choice = self.tool_choice
        if isinstance(choice, dict):
            problems.append(
                (
                    "tool_choice",
                    "a named tool cannot be forced: the policy is sampled unconstrained (use 'auto')",
                )
            )
        elif choice not in (None, "auto", "none", "required"):
            problems.append(("tool_choice", f"{choice!r} is not one of 'auto', 'none', 'required'"))
        if choice not in (None, "none") and not self.tools:
            problems.append(("tool_choice", "tool_choice needs tools"))
        for i, tool in enumerate(self.tools or []):
            function = tool.get("function") if isinstance(tool, dict) else None
            if not isinstance(tool, dict) or tool.get("type", "function") != "function":
                problems.append((f"tools[{i}]", "only tools of type 'function' are supported"))
            elif not isinstance(function, dict) or not isinstance(function.get("name"), str):
                problems.append((f"tools[{i}].function", "a function tool needs function.name"))
        return problems


class CompletionRequest(_Request):
    """``POST /v1/completions``: a text prompt or a list of token ids."""

    prompt: str | list[int] | list[str] | list[list[int]]
    logprobs: int | None = None
    echo: bool | None = None
    best_of: int | None = None
    suffix: str | None = None

    def unsupported(self) -> list[tuple[str, str]]:
        problems = super().unsupported()
        prompt = self.prompt
        if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int) and len(prompt) != 1:
            problems.append(("prompt", f"{len(prompt)} prompts in one call: send one prompt per call"))
        if self.logprobs:
            problems.append(
                ("logprobs", f"logprobs={self.logprobs}: only 0 (the sampled tokens') is supported")
            )
        if self.echo:
            problems.append(("echo", "echo is not supported"))
        if self.best_of not in (None, 1):
            problems.append(("best_of", f"best_of={self.best_of}: one completion per call"))
        if self.suffix:
            problems.append(("suffix", "suffix (insertion) is not supported"))
        return problems

    def prompt_value(self) -> str | list[int]:
        """The one prompt: text or token ids."""
        prompt: Any = self.prompt
        if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):
            prompt = prompt[0]
        return prompt


def parse_request(kind: type[BaseModel], data: Any) -> Any:
    """Validate a request body; every problem (unknown or unsupported parameters, bad values) is
    gathered into one :class:`RequestError` that names the parameters."""
    if not isinstance(data, dict):
        raise RequestError("the request body must be a JSON object")
    try:
        request = kind.model_validate(data)
    except ValidationError as exc:
        unknown = [str(e["loc"][0]) for e in exc.errors() if e["type"] == "extra_forbidden" and e["loc"]]
        other = [e for e in exc.errors() if e["type"] != "extra_forbidden"]
        parts = []
        if unknown:
            parts.append(f"unrecognized request argument(s) supplied: {', '.join(unknown)}")
        for error in other:
            where = ".".join(str(p) for p in error.get("loc", ())) or "<body>"
            parts.append(f"{where}: {error['msg']}")
        first = unknown[0] if unknown else ".".join(str(p) for p in other[0].get("loc", ()))
        raise RequestError("; ".join(parts), param=first or None, code="invalid_parameter") from None
    problems = request.unsupported()  # type: ignore[attr-defined]
    if problems:
        names = ", ".join(name for name, _ in problems)
        details = "; ".join(why for _, why in problems)
        raise RequestError(
            f"unsupported parameter(s) for the agent-r1 policy gateway: {names} ({details})",
            param=problems[0][0],
            code="unsupported_parameter",
        )
    return request


# --------------------------------------------------------------------------------------------
# Structured output
# --------------------------------------------------------------------------------------------


def structured_format(value: Any, param: str) -> dict[str, Any] | None:
    """A request's output format (chat ``response_format``, or the Responses API's ``text.format``)
    in one form: ``None`` for plain text, else ``{"type": "json_object" | "json_schema", "name",
    "schema", "param"}``. Raises :class:`RequestError` naming ``param`` for a malformed one."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise RequestError(f"{param} must be an object such as {{'type': 'text'}}", param=param)
    kind = value.get("type", "text")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object", "name": None, "schema": None, "param": param}
    if kind != "json_schema":
        raise RequestError(
            f"{param}.type: {kind!r} is not one of 'text', 'json_object', 'json_schema'",
            param=f"{param}.type",
        )
    # chat nests the schema under json_schema; the Responses API puts it beside type
    spec = value.get("json_schema") if "json_schema" in value else value
    where = f"{param}.json_schema" if "json_schema" in value else param
    if not isinstance(spec, dict) or not isinstance(spec.get("schema"), dict):
        raise RequestError(f"{where}.schema must be a JSON schema object", param=f"{where}.schema")
    name = spec.get("name")
    return {
        "type": "json_schema",
        "name": name if isinstance(name, str) else None,
        "schema": spec["schema"],
        "param": param,
    }


def structured_instruction(structured: dict[str, Any]) -> str:
    """The instruction the ``prompted`` structured-output mode adds to the system message."""
    ending = "Reply with the JSON object alone: no code fence, no text before or after it."
    if structured["type"] == "json_object":
        return f"Answer with one JSON object. {ending}"
    name = f" {structured['name']!r}" if structured.get("name") else ""
    schema = json.dumps(structured["schema"], ensure_ascii=False, sort_keys=True)
    return f"Answer with one JSON object that follows the JSON schema{name} below. {ending}\n{schema}"


def with_instruction(messages: list[Message], instruction: str) -> list[Message]:
    """``messages`` with ``instruction`` at the end of the first system message (one is added in
    front when there is none). The same request always gives the same conversation, so a later
    call of the episode still extends the earlier call's tokens."""
    out = [dict(message) for message in messages]
    if out and out[0].get("role") == "system":
        existing = out[0].get("content") or ""
        out[0]["content"] = f"{existing}\n\n{instruction}" if existing else instruction
    else:
        out.insert(0, {"role": "system", "content": instruction})
    return out


# --------------------------------------------------------------------------------------------
# Messages
# --------------------------------------------------------------------------------------------

_ROLES = {"system", "developer", "user", "assistant", "tool"}


def _content_text(content: Any, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for j, part in enumerate(content):
            if isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str):
                texts.append(part["text"])
            else:
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise RequestError(
                    f"{where}[{j}]: content parts of type {kind!r} are not supported (text only)",
                    param=f"{where}[{j}]",
                    code="unsupported_content",
                )
        return "".join(texts)
    raise RequestError(f"{where} must be a string or a list of text parts", param=where)


def _arguments(raw: Any, where: str) -> dict[str, Any]:
    if isinstance(raw, dict):
        return raw
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return {}
    if isinstance(raw, str):
        try:
            value = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise RequestError(f"{where} is not valid JSON: {exc.msg}", param=where) from None
        if isinstance(value, dict):
            return value
    raise RequestError(f"{where} must be a JSON object (or a string holding one)", param=where)


def canonical_messages(messages: list[dict[str, Any]]) -> list[Message]:
    """The request's messages in the gateway's canonical form (see the module docstring):
    ``{"role", "content"}`` plus ``tool_calls`` (``[{"id", "name", "arguments": dict}]``) on
    assistant messages, ``tool_call_id`` and ``name`` where given. ``developer`` becomes
    ``system``. Raises :class:`RequestError` naming the message."""
    out: list[Message] = []
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise RequestError(f"{where} must be an object", param=where)
        role = message.get("role")
        if role not in _ROLES:
            raise RequestError(
                f"{where}.role: {role!r} is not supported (use system, developer, user, assistant or tool)",
                param=f"{where}.role",
            )
        canonical: Message = {
            "role": "system" if role == "developer" else role,
            "content": _content_text(message.get("content"), f"{where}.content"),
        }
        if role == "assistant" and message.get("function_call"):
            raise RequestError(
                f"{where}.function_call: the deprecated functions API is not supported; use tool_calls",
                param=f"{where}.function_call",
            )
        calls = message.get("tool_calls") or []
        if calls and role != "assistant":
            raise RequestError(f"{where}: only assistant messages carry tool_calls", param=where)
        if calls:
            canonical["tool_calls"] = []
            for j, call in enumerate(calls):
                at = f"{where}.tool_calls[{j}]"
                function = call.get("function") if isinstance(call, dict) else None
                if not isinstance(function, dict) or not isinstance(function.get("name"), str):
                    raise RequestError(f"{at}.function.name is missing", param=at)
                canonical["tool_calls"].append(
                    {
                        "id": str(call.get("id") or ""),
                        "name": function["name"],
                        "arguments": _arguments(function.get("arguments"), f"{at}.function.arguments"),
                    }
                )
        if role == "tool":
            canonical["tool_call_id"] = str(message.get("tool_call_id") or "")
        if isinstance(message.get("name"), str) and message["name"]:
            canonical["name"] = message["name"]
        out.append(canonical)
    return out


def openai_tool_calls(calls: list[ToolCall]) -> list[dict[str, Any]]:
    """Parsed calls in the OpenAI response format (``arguments`` as a JSON string)."""
    return [
        {
            "id": call.id,
            "type": "function",
            "function": {"name": call.name, "arguments": json.dumps(call.arguments, ensure_ascii=False)},
        }
        for call in calls
    ]


# --------------------------------------------------------------------------------------------
# Responses
# --------------------------------------------------------------------------------------------

OpenAIFinish = Literal["stop", "length", "tool_calls"]


def finish_reason(backend_reason: str, has_tool_calls: bool) -> OpenAIFinish:
    """The OpenAI finish reason of a generation: ``tool_calls`` when the text held calls and the
    policy ended its turn itself, ``length`` when a token budget cut it, ``stop`` otherwise."""
    if backend_reason in ("length", "context"):
        return "length"
    return "tool_calls" if has_tool_calls else "stop"


def new_id(prefix: str) -> str:
    """A fresh response id such as ``chatcmpl-<hex>``."""
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def policy_fingerprint(version: int) -> str:
    """The ``system_fingerprint`` of a call generated by the weights of ``version`` (completed
    updates): ``agent-r1-policy-v{version}``, how an agent program sees which policy answered it."""
    return f"agent-r1-policy-v{version}"


def _completion_object(
    kind: str,
    response_id: str,
    model: str,
    choices: list[dict[str, Any]],
    usage: tuple[int, int] | None,
    fingerprint: str | None,
) -> dict[str, Any]:
    """The fields of every completion object and stream chunk, in OpenAI's order; ``usage``
    (prompt and completion tokens) is left out when ``None``; ``fingerprint`` is the
    ``system_fingerprint`` (:func:`policy_fingerprint`)."""
    body: dict[str, Any] = {
        "id": response_id,
        "object": kind,
        "created": int(time.time()),
        "model": model,
        "system_fingerprint": fingerprint,
        "choices": choices,
    }
    if usage is not None:
        body["usage"] = _usage(*usage)
    return body


def _chat_choice(
    key: str, content: dict[str, Any], finish: OpenAIFinish | None, logprobs: list[dict[str, Any]] | None
) -> dict[str, Any]:
    """The one choice of a chat completion (``key="message"``) or chunk (``key="delta"``)."""
    return {
        "index": 0,
        key: content,
        "logprobs": {"content": logprobs} if logprobs is not None else None,
        "finish_reason": finish,
    }


def chat_response(
    *,
    response_id: str,
    model: str,
    message: dict[str, Any],
    finish: OpenAIFinish,
    prompt_tokens: int,
    completion_tokens: int,
    logprobs: list[dict[str, Any]] | None,
    fingerprint: str | None = None,
) -> dict[str, Any]:
    """A ``chat.completion`` object with one choice."""
    choice = _chat_choice("message", message, finish, logprobs)
    usage = (prompt_tokens, completion_tokens)
    return _completion_object("chat.completion", response_id, model, [choice], usage, fingerprint)


def chat_chunk(
    *,
    response_id: str,
    model: str,
    delta: dict[str, Any] | None,
    finish: OpenAIFinish | None = None,
    usage: tuple[int, int] | None = None,
    logprobs: list[dict[str, Any]] | None = None,
    fingerprint: str | None = None,
) -> dict[str, Any]:
    """One ``chat.completion.chunk`` of a stream (``delta=None`` gives the usage-only chunk)."""
    choices = [] if delta is None else [_chat_choice("delta", delta, finish, logprobs)]
    return _completion_object("chat.completion.chunk", response_id, model, choices, usage, fingerprint)


def completion_response(
    *,
    response_id: str,
    model: str,
    text: str,
    finish: OpenAIFinish,
    prompt_tokens: int,
    completion_tokens: int,
    logprobs: dict[str, Any] | None,
    fingerprint: str | None = None,
) -> dict[str, Any]:
    """A ``text_completion`` object with one choice."""
    choice = {"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish}
    usage = (prompt_tokens, completion_tokens)
    return _completion_object("text_completion", response_id, model, [choice], usage, fingerprint)


def completion_chunk(
    *,
    response_id: str,
    model: str,
    text: str | None,
    finish: OpenAIFinish | None = None,
    usage: tuple[int, int] | None = None,
    fingerprint: str | None = None,
) -> dict[str, Any]:
    """One streamed ``text_completion`` chunk (``text=None`` gives the usage-only chunk)."""
    choices = [] if text is None else [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}]
    return _completion_object("text_completion", response_id, model, choices, usage, fingerprint)
