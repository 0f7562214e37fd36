"""The OpenAI calls of a :class:`~agent_r1.gateway.server.PolicyGateway`: ``/v1/chat/completions``
and ``/v1/completions``.

Each call goes through the same steps: validate the body, find its episode, build the prompt (a
:class:`~agent_r1.gateway.recorder.CallPlan` that extends an earlier call of the episode where it
can), cap the tokens it may sample by its limit and the room left in the context, pick its
sampling settings (a training rollout's replace a request's own), generate through the
:class:`~agent_r1.gateway.scheduler.GenerationScheduler`, record the call in its episode, and
answer with an OpenAI response object or a stream of server-sent events. Every response object and
chunk names the weights version that generated the call in its ``system_fingerprint``
(``agent-r1-policy-v{N}``, :func:`~agent_r1.gateway.protocol.policy_fingerprint`).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections.abc import AsyncIterator
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agent_r1.contracts import Generation, SamplingParams
from agent_r1.errors import AgentR1Error
from agent_r1.gateway.protocol import (
    CallTimeoutError,
    ChatRequest,
    CompletionRequest,
    GatewayHTTPError,
    RequestError,
    ServerError,
    UnavailableError,
    canonical_messages,
    chat_chunk,
    chat_response,
    completion_chunk,
    completion_response,
    finish_reason,
    new_id,
    openai_tool_calls,
    parse_request,
    policy_fingerprint,
    structured_format,
    structured_instruction,
    with_instruction,
)
from agent_r1.gateway.recorder import CallPlan, Episode
from agent_r1.gateway.scheduler import Generated
from agent_r1.gateway.tools import ParsedReply
from agent_r1.mdp import Message

if TYPE_CHECKING:  # pragma: no cover
    from agent_r1.gateway.server import PolicyGateway

__all__ = [
    "ChatTurn",
    "chat",
    "chat_turn",
    "check_model",
    "complete",
    "episode_of",
    "fingerprint",
    "pieces",
    "token_logprobs",
]


@dataclass
class SampledCall:
    """One call's generation and what the gateway made of it: the finish reason (``context`` when
    the room left in the conversation cut it), the action text, the generation time, and the
    weights version that generated it (``None`` without a weights guard: the backend's
    ``policy_version``)."""

    prompt: list[int]
    generation: Generation
    finish: str
    text: str
    generation_s: float
    version: int | None = None


# -- the two calls ----------------------------------------------------------------------------------
async def chat(gateway: PolicyGateway, body: Any, path_episode: str | None) -> Any:
    """Serve one ``/v1/chat/completions`` body: the response object, or an async iterator of
    server-sent events when it asks to stream."""
    request: ChatRequest = parse_request(ChatRequest, body)
    check_model(gateway, request.model)
    episode = episode_of(gateway, path_episode, request.episode_hint())
    messages = canonical_messages(request.messages)
    structured = structured_format(request.response_format, "response_format")
    tools = [dict(tool) for tool in request.tools] if request.tools else None
    turn = await chat_turn(
        gateway,
        request,
        episode,
        messages,
        tools,
        tool_choice=request.tool_choice,
        user_stops=request.stop_list(),
        token_limit=request.token_limit(),
        structured=structured,
        id_prefix="chatcmpl",
    )
    call, reply = turn.call, turn.reply
    reason = finish_reason(call.finish, bool(reply.tool_calls))
    logprobs = token_logprobs(gateway, call.generation) if request.logprobs else None
    if request.stream:
        include_usage = bool((request.stream_options or {}).get("include_usage"))
        return _chat_events(
            gateway, turn.completion_id, request.model, reply, reason, call, logprobs, include_usage
        )
    message: dict[str, Any] = {"role": "assistant", "content": reply.content, "refusal": None}
    if reply.tool_calls:
        message["tool_calls"] = openai_tool_calls(reply.tool_calls)
    return chat_response(
        response_id=turn.completion_id,
        model=request.model,
        message=message,
        finish=reason,
        prompt_tokens=len(call.prompt),
        completion_tokens=len(call.generation.token_ids),
        logprobs=logprobs,
        fingerprint=fingerprint(gateway, call),
    )


@dataclass
class ChatTurn:
    """One chat-shaped call, generated and recorded: what was sampled, the assistant message the
    gateway made of it, and its response id."""

    call: SampledCall
    reply: ParsedReply
    completion_id: str


async def chat_turn(
    gateway: PolicyGateway,
    request: Any,
    episode: Episode | None,
    messages: list[Message],
    tools: list[dict[str, Any]] | None,
    *,
    tool_choice: Any,
    user_stops: list[str],
    token_limit: int | None,
    structured: dict[str, Any] | None,
    id_prefix: str,
) -> ChatTurn:
    """The steps every chat-shaped call shares (``/v1/chat/completions`` and ``/v1/responses``):
    plan the prompt against the episode, sample within the token budget, read the tool calls back
    and record the call. ``request`` carries the sampling settings (``temperature``, ``top_p``,
    ``top_k``, ``seed``); ``structured`` is a normalised output format (see
    :func:`~agent_r1.gateway.protocol.structured_format`), served only in the gateway's
    ``prompted`` mode."""
    if structured is not None:
        messages = _prompted(gateway, messages, structured)
    allow_calls = tool_choice != "none"
    if tool_choice == "required":
        gateway.notice(
            "required",
            "tool_choice='required' is served like 'auto': the policy is sampled unconstrained, so it "
            "may answer without a tool call",
        )
    plan = _chat_plan(gateway, episode, messages, tools)
    stops = sorted({*user_stops, *(gateway.rendering.stop_sequences(tools) if allow_calls else [])})
    call = await _sample(gateway, request, plan.prompt_ids, token_limit, stops)
    reply = gateway.rendering.parse(_visible(call, user_stops), tools, allow_calls=allow_calls)
    completion_id = new_id(id_prefix)
    _record(gateway, episode, plan, call, reply, completion_id)
    if structured is not None and not reply.tool_calls and not _is_json_object(reply.content or ""):
        gateway.count("structured_output_invalid")
    return ChatTurn(call=call, reply=reply, completion_id=completion_id)


def _prompted(gateway: PolicyGateway, messages: list[Message], structured: dict[str, Any]) -> list[Message]:
    """The conversation with the instruction that asks for ``structured`` output (the gateway's
    ``prompted`` mode), or a refusal naming the setting that allows it."""
    if gateway.settings.structured_output != "prompted":
        where = structured["param"]
        raise RequestError(
            f"{where}: structured output ({structured['type']}) is not served by default: the policy is "
            "sampled unconstrained, so its output is not guaranteed to be JSON. Start the gateway with "
            "rollout.gateway.structured_output=prompted to accept it as an instruction added to the "
            "system message (the trajectory records the prompt with it; nothing constrains sampling)",
            param=where,
            code="unsupported_parameter",
        )
    gateway.count("structured_output_prompted")
    gateway.notice(
        "prompted",
        "structured output is served in 'prompted' mode: the schema is added to the system message as "
        "an instruction and sampling stays unconstrained, so a reply may not be valid JSON "
        "(counted in structured_output_invalid)",
    )
    return with_instruction(messages, structured_instruction(structured))


def _is_json_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except ValueError:
        return False


async def complete(gateway: PolicyGateway, body: Any, path_episode: str | None) -> Any:
    """Serve one ``/v1/completions`` body (text or token-id prompt)."""
    request: CompletionRequest = parse_request(CompletionRequest, body)
    check_model(gateway, request.model)
    episode = episode_of(gateway, path_episode, request.episode_hint())
    prompt = _completion_prompt(gateway, request)
    plan = (
        gateway.recorder.plan_tokens(episode, prompt) if episode is not None else CallPlan(prompt_ids=prompt)
    )
    user_stops = request.stop_list()
    asked = 16 if request.max_tokens is None else request.max_tokens
    call = await _sample(gateway, request, prompt, asked, user_stops)
    completion_id = new_id("cmpl")
    _record(gateway, episode, plan, call, None, completion_id)
    visible = _visible(call, user_stops)
    reason = finish_reason(call.finish, False)
    logprobs = None
    if request.logprobs == 0:
        tokens = token_logprobs(gateway, call.generation)
        logprobs = {
            "tokens": [t["token"] for t in tokens],
            "token_logprobs": [t["logprob"] for t in tokens],
        }
    if request.stream:
        include_usage = bool((request.stream_options or {}).get("include_usage"))
        return _completion_events(gateway, completion_id, request.model, visible, reason, call, include_usage)
    return completion_response(
        response_id=completion_id,
        model=request.model,
        text=visible,
        finish=reason,
        prompt_tokens=len(prompt),
        completion_tokens=len(call.generation.token_ids),
        logprobs=logprobs,
        fingerprint=fingerprint(gateway, call),
    )


# -- before generating ------------------------------------------------------------------------------
def episode_of(gateway: PolicyGateway, path_id: str | None, hint: str | None) -> Episode | None:
    """The call's episode: named by its URL, else by the body (``None``: served, not recorded;
    refused by a training gateway)."""
    episode_id = path_id or hint
    if episode_id is None:
        if not gateway.settings.open_on_demand:
            raise RequestError(
                "this call names no episode: use the per-episode base URL the agent was given "
                "(OPENAI_BASE_URL, /episodes/{id}/v1) or set metadata.episode_id",
                code="no_episode",
            )
        gateway.count("unrecorded_calls")
        gateway.notice(
            "unrecorded",
            "calls that name no episode (no /episodes/{id}/v1 URL, metadata.episode_id or user) are "
            "served but not recorded",
        )
        return None
    return gateway.recorder.get(episode_id)


def check_model(gateway: PolicyGateway, model: str) -> None:
    if model != gateway.settings.served_model_name:
        raise RequestError(
            f"the model {model!r} does not exist on this gateway; it serves "
            f"{gateway.settings.served_model_name!r}",
            param="model",
            code="model_not_found",
        )


def _chat_plan(
    gateway: PolicyGateway,
    episode: Episode | None,
    messages: list[Any],
    tools: list[dict[str, Any]] | None,
) -> CallPlan:
    """The prompt of a chat call: planned against the episode's earlier calls, or rendered whole
    when the call belongs to no episode."""
    if episode is not None:
        return gateway.recorder.plan_chat(episode, messages, tools)
    try:
        template_messages, template_tools = gateway.rendering.template_input(messages, tools)
        return CallPlan(prompt_ids=gateway.renderer.render_prompt(template_messages, template_tools))
    except AgentR1Error as exc:
        raise RequestError(f"the chat template cannot render this conversation: {exc}") from None


def _completion_prompt(gateway: PolicyGateway, request: CompletionRequest) -> list[int]:
    """The prompt token ids of a ``/v1/completions`` call: its text encoded, or its token ids
    checked against the vocabulary."""
    prompt_value = request.prompt_value()
    if isinstance(prompt_value, str):
        if not prompt_value:
            raise RequestError("prompt is empty", param="prompt")
        return list(gateway.tokenizer.encode(prompt_value))
    vocab = len(gateway.tokenizer)
    bad = [t for t in prompt_value if not 0 <= t < vocab]
    if not prompt_value or bad:
        raise RequestError(
            f"prompt token ids must be a non-empty list of ids in [0, {vocab}); got {bad[:5] or 'none'}",
            param="prompt",
        )
    return list(prompt_value)


def _sampling(
    gateway: PolicyGateway, request: ChatRequest | CompletionRequest, stops: list[str], budget: int
) -> SamplingParams:
    forced = gateway.rollout_sampling
    if forced is None:
        return SamplingParams(
            temperature=1.0 if request.temperature is None else request.temperature,
            top_p=1.0 if request.top_p is None else request.top_p,
            top_k=request.top_k or 0,
            max_new_tokens=budget,
            stop=stops,
            seed=request.seed,
        )
    asked = (request.temperature, request.top_p, request.top_k)
    kept = (forced.temperature, forced.top_p, forced.top_k)
    if any(a is not None and a != k for a, k in zip(asked, kept, strict=True)):
        gateway.count("sampling_overrides")
        gateway.notice(
            "override",
            f"training rollouts sample at the run's temperature={forced.temperature}, "
            f"top_p={forced.top_p}, top_k={forced.top_k} (the log-probabilities the update uses "
            "assume them); a request's own sampling settings are replaced",
        )
    return forced.model_copy(update={"max_new_tokens": budget, "stop": stops, "seed": request.seed})


def _budget(gateway: PolicyGateway, prompt: list[int], asked: int | None) -> tuple[int, int]:
    """``(budget, limit)``: the tokens this call may sample (the smaller of its limit and the
    room left in the context), and its limit (``max_tokens`` capped by the gateway's
    ``max_new_tokens``)."""
    settings = gateway.settings
    room = settings.max_context - len(prompt)
    if room <= 0:
        raise RequestError(
            f"this prompt has {len(prompt)} tokens, which leaves no room in the gateway's maximum "
            f"context of {settings.max_context} tokens; shorten the conversation",
            param="messages",
            code="context_length_exceeded",
        )
    limit = settings.max_new_tokens if asked is None else min(asked, settings.max_new_tokens)
    return min(limit, room), limit


# -- generating -------------------------------------------------------------------------------------
async def _sample(
    gateway: PolicyGateway,
    request: ChatRequest | CompletionRequest,
    prompt: list[int],
    asked: int | None,
    stops: list[str],
) -> SampledCall:
    """Generate one call within its token budget; its finish reason and action text."""
    budget, limit = _budget(gateway, prompt, asked)
    sampling = _sampling(gateway, request, stops, budget)
    generated, elapsed = await _generate(gateway, prompt, sampling, budget)
    generation = generated.generation
    finish = generation.finish_reason
    if finish == "length" and budget < limit:
        finish = "context"  # the conversation's room, not the call's token limit, cut it
    text = gateway.renderer.action_text(generation.token_ids, finish)
    return SampledCall(
        prompt=prompt,
        generation=generation,
        finish=finish,
        text=text,
        generation_s=elapsed,
        version=generated.version,
    )


async def _generate(
    gateway: PolicyGateway, prompt: list[int], sampling: SamplingParams, budget: int
) -> tuple[Generated, float]:
    try:
        future: Future[Generated] = gateway.scheduler.submit(prompt, sampling, budget)
    except UnavailableError:
        gateway.count("rejected_calls")
        raise
    started = time.perf_counter()
    timeout = gateway.settings.request_timeout_s
    try:
        generated = await asyncio.wait_for(asyncio.wrap_future(future), timeout)
    except asyncio.TimeoutError:
        future.cancel()
        gateway.count("timeouts")
        raise CallTimeoutError(
            f"the call did not finish within the gateway's request timeout of {timeout:g} s",
            code="timeout",
        ) from None
    except GatewayHTTPError:
        raise
    except Exception as exc:
        gateway.count("backend_errors")
        raise ServerError(
            f"the rollout backend {gateway.backend.name!r} failed: {type(exc).__name__}: {exc}",
            code="backend_error",
        ) from exc
    return generated, time.perf_counter() - started


def fingerprint(gateway: PolicyGateway, call: SampledCall) -> str:
    """The ``system_fingerprint`` of a call: the version of the weights that generated it (the
    guard's in asynchronous rollouts, else the backend's ``policy_version``)."""
    version = call.version if call.version is not None else getattr(gateway.backend, "policy_version", 0)
    return policy_fingerprint(version)


def _record(
    gateway: PolicyGateway,
    episode: Episode | None,
    plan: CallPlan,
    call: SampledCall,
    reply: ParsedReply | None,
    completion_id: str,
) -> None:
    """Record the call in its episode (calls that name no episode are not recorded)."""
    if episode is None:
        return
    gateway.recorder.record(
        episode,
        plan,
        call.generation,
        text=call.text,
        reply=reply,
        completion_id=completion_id,
        generation_s=call.generation_s,
        finish_reason=call.finish,
        version=call.version,
    )


# -- answering --------------------------------------------------------------------------------------
def _visible(call: SampledCall, user_stops: list[str]) -> str:
    """The text a client sees: cut before a stop sequence of the request (OpenAI leaves it out)."""
    text, generation = call.text, call.generation
    stop = generation.stop_sequence
    if generation.finish_reason == "stop" and stop in user_stops and stop:
        at = text.find(stop)
        if at >= 0:
            return text[:at]
    return text


def _decode(gateway: PolicyGateway, token_ids: list[int]) -> str:
    return gateway.tokenizer.decode(token_ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)


def token_logprobs(gateway: PolicyGateway, generation: Generation) -> list[dict[str, Any]]:
    out = []
    for token_id, logprob in zip(generation.token_ids, generation.logprobs, strict=False):
        token = _decode(gateway, [token_id])
        out.append(
            {"token": token, "logprob": logprob, "bytes": list(token.encode("utf-8")), "top_logprobs": []}
        )
    return out


def pieces(gateway: PolicyGateway, token_ids: list[int], content: str) -> list[str]:
    """``content`` split where the decoded text of a prefix of the tokens ends (token-sized
    stream deltas that join to ``content`` exactly)."""
    cuts = []
    for i in range(1, len(token_ids) + 1):
        decoded = _decode(gateway, token_ids[:i])
        if content.startswith(decoded) and 0 < len(decoded) < len(content):
            cuts.append(len(decoded))
    bounds = [0, *sorted(set(cuts)), len(content)]
    return [content[a:b] for a, b in itertools.pairwise(bounds) if b > a]


def _event(chunk: dict[str, Any], *, ensure_ascii: bool = True) -> str:
    return f"data: {json.dumps(chunk, ensure_ascii=ensure_ascii)}\n\n"


async def _chat_events(
    gateway: PolicyGateway,
    completion_id: str,
    model: str,
    reply: ParsedReply,
    reason: Any,
    call: SampledCall,
    logprobs: list[dict[str, Any]] | None,
    include_usage: bool,
) -> AsyncIterator[str]:
    stamp = fingerprint(gateway, call)

    def event(**fields: Any) -> str:
        chunk = chat_chunk(response_id=completion_id, model=model, fingerprint=stamp, **fields)
        return _event(chunk, ensure_ascii=False)

    yield event(delta={"role": "assistant", "content": ""})
    content = reply.content or ""
    if not reply.tool_calls:
        deltas = pieces(gateway, call.generation.token_ids, content)
    else:
        deltas = [content] if content else []
    for piece in deltas:
        yield event(delta={"content": piece})
    for index, tool_call in enumerate(openai_tool_calls(reply.tool_calls)):
        yield event(delta={"tool_calls": [{"index": index, **tool_call}]})
    yield event(delta={}, finish=reason, logprobs=logprobs)
    if include_usage:
        yield event(delta=None, usage=(len(call.prompt), len(call.generation.token_ids)))
    yield "data: [DONE]\n\n"


async def _completion_events(
    gateway: PolicyGateway,
    completion_id: str,
    model: str,
    visible: str,
    reason: Any,
    call: SampledCall,
    include_usage: bool,
) -> AsyncIterator[str]:
    stamp = fingerprint(gateway, call)

    def event(**fields: Any) -> str:
        return _event(completion_chunk(response_id=completion_id, model=model, fingerprint=stamp, **fields))

    for piece in pieces(gateway, call.generation.token_ids, visible):
        yield event(text=piece)
    yield event(text="", finish=reason)
    if include_usage:
        yield event(text=None, usage=(len(call.prompt), len(call.generation.token_ids)))
    yield "data: [DONE]\n\n"
