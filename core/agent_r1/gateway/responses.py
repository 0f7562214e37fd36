"""The OpenAI Responses API of a :class:`~agent_r1.gateway.server.PolicyGateway`: ``POST
/v1/responses`` (whole responses and streams of events), ``GET`` and ``DELETE
/v1/responses/{id}``.

A Responses call is a chat call in another shape, and is served by the same steps
(:func:`~agent_r1.gateway.openai_routes.chat_turn`): same episodes, token budget, batching,
timeouts, refusals and token-faithful recording. What differs is translated here:

* **Input.** ``instructions`` becomes the first system message; ``input`` (a string, or a list of
  items) becomes the rest of the conversation: ``message`` items (roles ``user``, ``system``,
  ``developer``, ``assistant``; text parts), ``function_call`` items (the assistant's tool calls,
  ``call_id`` as their id) and ``function_call_output`` items (tool messages). A call with
  ``previous_response_id`` continues a stored response: its conversation and output come first,
  its ``instructions`` do not (as in OpenAI's API). Either way the conversation reaches the
  episode recorder exactly as a chat call's would, so the prompt extends the earlier call's
  tokens instead of re-rendering them.
* **Tools** are flat (``{"type": "function", "name", "parameters"}``); only function tools are
  served (hosted tools such as ``web_search`` cannot run here).
* **Output** is a list of items: a ``message`` with one ``output_text`` part, then one
  ``function_call`` item per tool call. A reply cut by ``max_output_tokens`` (or by the room left
  in the context) has status ``incomplete`` with ``incomplete_details.reason`` set.
* **Streams** are the Responses event sequence (``response.created`` ... ``response.completed``),
  each event with its ``sequence_number``, sent when the generation is complete (the rollout
  backend contract returns whole generations).

Responses are kept in memory (the latest :data:`STORED_RESPONSES`, unless a call sets ``store:
false``) for ``previous_response_id`` and ``GET``.
"""

from __future__ import annotations

import json
import threading
import time
from collections import OrderedDict
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

from agent_r1.gateway.openai_routes import (
    ChatTurn,
    chat_turn,
    check_model,
    episode_of,
    pieces,
    token_logprobs,
)
from agent_r1.gateway.protocol import (
    IGNORED_PARAMETERS,
    NotFoundError,
    RequestError,
    _arguments,
    _content_text,
    canonical_messages,
    episode_hint,
    parse_request,
    structured_format,
)
from agent_r1.gateway.recorder import assistant_message
from agent_r1.mdp import Message

if TYPE_CHECKING:  # pragma: no cover
    from agent_r1.gateway.server import PolicyGateway

__all__ = ["ResponseStore", "ResponsesRequest", "create", "delete", "retrieve", "to_messages"]

STORED_RESPONSES = 10_000
"""How many responses a gateway keeps for ``previous_response_id`` (the oldest go first)."""

IGNORED_INCLUDES = frozenset(
    {
        "reasoning.encrypted_content",
        "file_search_call.results",
        "web_search_call.results",
        "web_search_call.action.sources",
        "message.input_image.image_url",
        "computer_call_output.output.image_url",
        "code_interpreter_call.outputs",
    }
)
"""``include`` values accepted and ignored: the policy produces no reasoning items and runs no
hosted tools, so there is nothing to include."""

RESPONSES_IGNORED_PARAMETERS = {
    **{k: v for k, v in IGNORED_PARAMETERS.items() if "." not in k},
    "include": "extra output: message.output_text.logprobs adds the sampled tokens' log-probabilities; "
    f"{', '.join(sorted(IGNORED_INCLUDES))} are accepted and have nothing to add",
    "max_tool_calls": "a limit on calls to hosted tools, which the gateway does not run",
    "prompt_cache_retention": "how long OpenAI would keep a prompt cache",
    "prompt_cache_options": "prompt cache settings",
    "text.verbosity": "only 'medium' (the default) or null; other values are refused",
}
"""Responses API parameters the gateway accepts and ignores, because they do not change what is
sampled (listed in docs/gateway.md)."""


# -- the request ------------------------------------------------------------------------------------
class ResponsesRequest(BaseModel):
    """``POST /v1/responses``: the parameters the gateway accepts (validated strictly, as the chat
    calls are: unknown parameters and those it cannot honour are one HTTP 400 naming them all)."""

    model_config = ConfigDict(extra="forbid")

    model: str
    input: str | list[dict[str, Any]] = ""
    instructions: str | None = None
    previous_response_id: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=0, description="extension (as in vLLM): 0 disables")
    seed: int | None = Field(None, description="extension: the sampling seed")
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    text: dict[str, Any] | None = None
    include: list[str] | None = None
    top_logprobs: int | None = None
    truncation: str | None = None
    reasoning: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    user: str | None = None
    store: bool | None = None
    service_tier: str | None = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: str | None = None
    prompt_cache_options: dict[str, Any] | None = None
    safety_identifier: str | None = None
    max_tool_calls: int | None = None
    background: bool | None = None
    conversation: str | dict[str, Any] | None = None
    prompt: dict[str, Any] | None = None
    context_management: list[dict[str, Any]] | None = None

    def episode_hint(self) -> str | None:
        """The episode named in the body (see :func:`~agent_r1.gateway.protocol.episode_hint`)."""
        return episode_hint(self.metadata, self.user)

    def unsupported(self) -> list[tuple[str, str]]:
        """``(parameter, why)`` for every parameter set to something the gateway cannot honour."""
        problems: list[tuple[str, str]] = []
        if self.background:
            problems.append(("background", "background responses are not served (the call waits)"))
        if self.conversation is not None:
            problems.append(("conversation", "stored conversations are not served; use previous_response_id"))
        if self.prompt is not None:
            problems.append(("prompt", "stored prompt templates are not served; send instructions and input"))
        if self.context_management:
            problems.append(("context_management", "server-side compaction would change the conversation"))
        if self.truncation not in (None, "disabled"):
            problems.append(
                ("truncation", f"{self.truncation!r}: only 'disabled' (dropping input would change it)")
            )
        if self.top_logprobs:
            problems.append(("top_logprobs", "only the sampled token's log-probability is returned"))
        effort = {k: v for k, v in (self.reasoning or {}).items() if v is not None}
        if effort:
            problems.append(("reasoning", f"{effort}: the policy has no reasoning settings"))
        wanted = set(self.include or []) - IGNORED_INCLUDES - {"message.output_text.logprobs"}
        if wanted:
            problems.append(("include", f"{sorted(wanted)} cannot be included"))
        known = {"include_obfuscation"}
        if self.stream_options and set(self.stream_options) - known:
            problems.append(
                (
                    "stream_options",
                    f"only include_obfuscation is supported, got {sorted(self.stream_options)}",
                )
            )
        text = self.text or {}
        if set(text) - {"format", "verbosity"}:
            problems.append(
                ("text", f"only text.format and text.verbosity are supported, got {sorted(text)}")
            )
        if text.get("verbosity") not in (None, "medium"):
            problems.append(
                ("text.verbosity", f"{text['verbosity']!r} would need an instruction; use 'medium'")
            )
        choice = self.tool_choice
        if isinstance(choice, dict):
            problems.append(
                ("tool_choice", "a tool cannot be forced: the policy is sampled unconstrained (use 'auto')")
            )
        elif choice not in (None, "auto", "none", "required"):
            problems.append(("tool_choice", f"{choice!r} is not one of 'auto', 'none', 'required'"))
        if choice not in (None, "none") and not self.tools:
            problems.append(("tool_choice", "tool_choice needs tools"))
        for i, tool in enumerate(self.tools or []):
            kind = tool.get("type") if isinstance(tool, dict) else None
            if kind != "function":
                problems.append(
                    (
                        f"tools[{i}]",
                        f"{kind!r}: only function tools are served (hosted tools cannot run here)",
                    )
                )
            elif not isinstance(tool.get("name"), str):
                problems.append((f"tools[{i}].name", "a function tool needs a name"))
        return problems

    def chat_tools(self) -> list[dict[str, Any]] | None:
        """The tools in the chat format the renderer and the tool-call format read."""
        if not self.tools:
            return None
        out = []
        for tool in self.tools:
            function = {"name": tool["name"], "description": tool.get("description") or ""}
            function["parameters"] = tool.get("parameters") or {"type": "object", "properties": {}}
            out.append({"type": "function", "function": function})
        return out


# -- stored responses -------------------------------------------------------------------------------
@dataclass
class StoredResponse:
    """A response kept for ``previous_response_id``: the conversation it answered (without its
    instructions) followed by its output as an assistant message, its episode and its body."""

    conversation: list[Message]
    episode_id: str | None
    body: dict[str, Any]


class ResponseStore:
    """The latest :data:`STORED_RESPONSES` responses of a gateway, by id (thread-safe)."""

    def __init__(self, capacity: int = STORED_RESPONSES) -> None:
        self.capacity = capacity
        self._items: OrderedDict[str, StoredResponse] = OrderedDict()
        self._lock = threading.Lock()

    def put(self, response_id: str, item: StoredResponse) -> None:
        with self._lock:
            self._items[response_id] = item
            while len(self._items) > self.capacity:
                self._items.popitem(last=False)

    def get(self, response_id: str, param: str = "response_id") -> StoredResponse:
        """The stored response; :class:`NotFoundError` naming ``param`` when there is none."""
        with self._lock:
            item = self._items.get(response_id)
        if item is None:
            raise NotFoundError(
                f"no stored response with id {response_id!r} (responses made with store: false are not "
                f"kept, and this gateway keeps the latest {self.capacity})",
                param=param,
                code="response_not_found",
            )
        return item

    def delete(self, response_id: str) -> None:
        self.get(response_id)
        with self._lock:
            self._items.pop(response_id, None)


# -- input items ------------------------------------------------------------------------------------
_MESSAGE_ROLES = {"user", "system", "developer", "assistant"}


def to_messages(items: str | list[dict[str, Any]]) -> list[Message]:
    """Responses ``input`` as canonical chat messages (see the module docstring); raises
    :class:`RequestError` naming the item."""
    if isinstance(items, str):
        return canonical_messages([{"role": "user", "content": items}]) if items else []
    raw: list[dict[str, Any]] = []
    names: dict[str, str] = {}
    for i, item in enumerate(items):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise RequestError(f"{where} must be an object", param=where)
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in _MESSAGE_ROLES:
                raise RequestError(
                    f"{where}.role: {role!r} is not one of {sorted(_MESSAGE_ROLES)}", param=f"{where}.role"
                )
            raw.append({"role": role, "content": _text_parts(item.get("content"), f"{where}.content")})
        elif kind == "function_call":
            call_id, name = item.get("call_id"), item.get("name")
            if not isinstance(call_id, str) or not isinstance(name, str):
                raise RequestError(f"{where}: a function_call item needs call_id and name", param=where)
            names[call_id] = name
            call = {
                "id": call_id,
                "type": "function",
                "function": {
                    "name": name,
                    "arguments": _arguments(item.get("arguments"), f"{where}.arguments"),
                },
            }
            if raw and raw[-1]["role"] == "assistant":  # the calls of one reply join its message
                raw[-1].setdefault("tool_calls", []).append(call)
            else:
                raw.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            call_id = item.get("call_id")
            if not isinstance(call_id, str):
                raise RequestError(
                    f"{where}: a function_call_output item needs call_id", param=f"{where}.call_id"
                )
            message = {
                "role": "tool",
                "tool_call_id": call_id,
                "content": _text_parts(item.get("output"), f"{where}.output"),
            }
            if call_id in names:
                message["name"] = names[call_id]
            raw.append(message)
        elif kind == "reasoning" and not item.get("summary") and not item.get("content"):
            continue  # an empty reasoning item carries nothing to show the policy
        else:
            raise RequestError(
                f"{where}: items of type {kind!r} are not served (message, function_call and "
                "function_call_output are)",
                param=where,
                code="unsupported_content",
            )
    return canonical_messages(raw)


def _text_parts(content: Any, where: str) -> str:
    """The text of a string or of a list of ``input_text`` / ``output_text`` parts."""
    if isinstance(content, list):
        parts = []
        for j, part in enumerate(content):
            kind = part.get("type") if isinstance(part, dict) else None
            if kind in ("input_text", "output_text", "text") and isinstance(part.get("text"), str):
                parts.append({"type": "text", "text": part["text"]})
            elif kind == "refusal" and isinstance(part.get("refusal"), str):
                parts.append({"type": "text", "text": part["refusal"]})
            else:
                raise RequestError(
                    f"{where}[{j}]: content parts of type {kind!r} are not supported (text only)",
                    param=f"{where}[{j}]",
                    code="unsupported_content",
                )
        content = parts
    return _content_text(content, where)


# -- the calls --------------------------------------------------------------------------------------
async def create(gateway: PolicyGateway, body: Any, path_episode: str | None) -> Any:
    """Serve one ``POST /v1/responses`` body: the response object, or an async iterator of
    server-sent events when it asks to stream."""
    request: ResponsesRequest = parse_request(ResponsesRequest, body)
    check_model(gateway, request.model)
    store: ResponseStore = gateway.responses
    history: list[Message] = []
    hint = request.episode_hint()
    if request.previous_response_id is not None:
        previous = store.get(request.previous_response_id, "previous_response_id")
        named = path_episode or hint
        if named is not None and previous.episode_id is not None and named != previous.episode_id:
            raise RequestError(
                f"previous_response_id {request.previous_response_id!r} belongs to episode "
                f"{previous.episode_id!r}, not {named!r}",
                param="previous_response_id",
            )
        history = previous.conversation
        hint = hint or previous.episode_id
    conversation = [*history, *to_messages(request.input)]
    if not conversation:
        raise RequestError("input is empty", param="input")
    messages = conversation
    if request.instructions:
        messages = [{"role": "system", "content": request.instructions}, *conversation]
    episode = episode_of(gateway, path_episode, hint)
    structured = structured_format((request.text or {}).get("format"), "text.format")
    tools = request.chat_tools()
    turn = await chat_turn(
        gateway,
        request,
        episode,
        messages,
        tools,
        tool_choice=request.tool_choice,
        user_stops=[],
        token_limit=request.max_output_tokens,
        structured=structured,
        id_prefix="resp",
    )
    logprobs = "message.output_text.logprobs" in (request.include or [])
    response = _response_body(gateway, request, turn, logprobs)
    if request.store is not False:
        reply = assistant_message(turn.reply)
        assert reply is not None
        store.put(
            turn.completion_id,
            StoredResponse([*conversation, reply], episode.id if episode is not None else None, response),
        )
    if request.stream:
        return _events(gateway, response, turn)
    return response


def retrieve(gateway: PolicyGateway, response_id: str) -> dict[str, Any]:
    """``GET /v1/responses/{id}``: a stored response."""
    return gateway.responses.get(response_id).body


def delete(gateway: PolicyGateway, response_id: str) -> dict[str, Any]:
    """``DELETE /v1/responses/{id}``."""
    gateway.responses.delete(response_id)
    return {"id": response_id, "object": "response", "deleted": True}


# -- the response -----------------------------------------------------------------------------------
def _output_items(
    gateway: PolicyGateway, turn: ChatTurn, status: str, logprobs: bool
) -> list[dict[str, Any]]:
    reply = turn.reply
    items: list[dict[str, Any]] = []
    suffix = turn.completion_id.split("-", 1)[-1]
    if reply.content or not reply.tool_calls:
        part: dict[str, Any] = {"type": "output_text", "text": reply.content or "", "annotations": []}
        if logprobs:
            part["logprobs"] = token_logprobs(gateway, turn.call.generation)
        items.append(
            {
                "type": "message",
                "id": f"msg_{suffix}",
                "status": status,
                "role": "assistant",
                "content": [part],
            }
        )
    for index, call in enumerate(reply.tool_calls):
        items.append(
            {
                "type": "function_call",
                "id": f"fc_{suffix}_{index}",
                "call_id": call.id,
                "name": call.name,
                "arguments": json.dumps(call.arguments, ensure_ascii=False),
                "status": "completed",
            }
        )
    return items


def _response_body(
    gateway: PolicyGateway, request: ResponsesRequest, turn: ChatTurn, logprobs: bool
) -> dict[str, Any]:
    call = turn.call
    cut = call.finish in ("length", "context")
    status = "incomplete" if cut else "completed"
    prompt_tokens, completion_tokens = len(call.prompt), len(call.generation.token_ids)
    now = int(time.time())
    return {
        "id": turn.completion_id,
        "object": "response",
        "created_at": now,
        "completed_at": now,
        "status": status,
        "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
        "instructions": request.instructions,
        "max_output_tokens": request.max_output_tokens,
        "model": request.model,
        "output": _output_items(gateway, turn, status, logprobs),
        "parallel_tool_calls": request.parallel_tool_calls
        if request.parallel_tool_calls is not None
        else True,
        "previous_response_id": request.previous_response_id,
        "reasoning": {"effort": None, "summary": None},
        "store": request.store is not False,
        "temperature": request.temperature,
        "text": {"format": (request.text or {}).get("format") or {"type": "text"}},
        "tool_choice": request.tool_choice or "auto",
        "tools": list(request.tools or []),
        "top_p": request.top_p,
        "truncation": "disabled",
        "usage": {
            "input_tokens": prompt_tokens,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": completion_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt_tokens + completion_tokens,
        },
        "user": request.user,
        "metadata": dict(request.metadata or {}),
    }


async def _events(gateway: PolicyGateway, response: dict[str, Any], turn: ChatTurn) -> AsyncIterator[str]:
    """The Responses event stream of a finished response (see the module docstring)."""
    sequence = 0

    def event(kind: str, **fields: Any) -> str:
        nonlocal sequence
        data = {"type": kind, "sequence_number": sequence, **fields}
        sequence += 1
        return f"event: {kind}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"

    started = {
        **response,
        "status": "in_progress",
        "output": [],
        "usage": None,
        "completed_at": None,
        "incomplete_details": None,
    }
    yield event("response.created", response=started)
    yield event("response.in_progress", response=started)
    for index, item in enumerate(response["output"]):
        if item["type"] == "message":
            part = item["content"][0]
            yield event(
                "response.output_item.added",
                output_index=index,
                item={**item, "status": "in_progress", "content": []},
            )
            where = {"item_id": item["id"], "output_index": index, "content_index": 0}
            yield event(
                "response.content_part.added",
                **where,
                part={"type": "output_text", "text": "", "annotations": []},
            )
            for piece in pieces(gateway, turn.call.generation.token_ids, part["text"]):
                yield event("response.output_text.delta", **where, delta=piece, logprobs=[])
            yield event(
                "response.output_text.done", **where, text=part["text"], logprobs=part.get("logprobs", [])
            )
            yield event("response.content_part.done", **where, part=part)
        else:
            yield event(
                "response.output_item.added",
                output_index=index,
                item={**item, "status": "in_progress", "arguments": ""},
            )
            where = {"item_id": item["id"], "output_index": index}
            yield event("response.function_call_arguments.delta", **where, delta=item["arguments"])
            yield event(
                "response.function_call_arguments.done",
                **where,
                name=item["name"],
                arguments=item["arguments"],
            )
        yield event("response.output_item.done", output_index=index, item=item)
    yield event(f"response.{response['status']}", response=response)
