"""The policy gateway: an OpenAI-compatible HTTP server in front of a rollout backend.

:class:`PolicyGateway` serves ``/v1/chat/completions`` (tools and tool calls in the OpenAI format,
streaming), ``/v1/completions`` and ``/v1/models`` on FastAPI + uvicorn (``pip install
agent-r1[gateway]``), and records every call of every episode for training
(:mod:`agent_r1.gateway.recorder`). A call belongs to an episode named by its URL
(``/episodes/{id}/v1/...``, what agent programs get as ``OPENAI_BASE_URL``), or by the request's
``metadata.episode_id`` or ``user`` field.

Episode endpoints: ``POST /episodes`` opens one (standalone server), ``GET /episodes/{id}`` shows
its calls and trajectories so far, ``POST /episodes/{id}/reward`` adds a reward signal,
``POST /episodes/{id}/finish`` closes it and returns its trajectories (written to the server's
``--out`` file too). ``GET /health`` reports the state.

Streaming (``stream: true``) follows the OpenAI server-sent-event format; the chunks are sent when
the generation is complete (the rollout backend contract returns whole generations).

In a training run the trainer drives the gateway: :meth:`PolicyGateway.begin_rollout` fixes the
sampling settings the trainer's log-probabilities assume (the run's temperature, top-p and top-k
replace a request's own), :meth:`PolicyGateway.end_rollout` stops taking calls until the next
rollout, so no generation overlaps an update.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import sys
import threading
import time
from collections.abc import AsyncIterator
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent_r1.contracts import Generation, RolloutBackend, SamplingParams, ToolCallFormat
from agent_r1.engine.chat import ChatRenderer
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
)
from agent_r1.gateway.recorder import CallPlan, Episode, EpisodeRecorder
from agent_r1.gateway.scheduler import GenerationScheduler
from agent_r1.gateway.tools import ParsedReply, ToolRendering
from agent_r1.mdp import RewardSignal, Task, Trajectory, save_trajectories

__all__ = ["GatewaySettings", "PolicyGateway", "require_server_packages"]


def require_server_packages() -> None:
    """Raise :class:`~agent_r1.AgentR1Error` naming the extra to install when FastAPI or uvicorn is
    missing."""
    import importlib.util

    missing = [name for name in ("fastapi", "uvicorn") if importlib.util.find_spec(name) is None]
    if missing:
        raise AgentR1Error(
            f"the policy gateway needs {' and '.join(missing)}, which are not installed: "
            "pip install 'agent-r1[gateway]'"
        )


@dataclass
class GatewaySettings:
    """What a gateway serves and how: the model name clients must send, token limits, the time a
    call may take, and whether unknown episode ids open episodes (standalone) or are refused
    (training)."""

    served_model_name: str
    max_new_tokens: int = 256
    max_context: int = 2048
    request_timeout_s: float = 600.0
    batch_wait_s: float = 0.02
    open_on_demand: bool = True
    out: Path | None = None
    """JSONL file that finished episodes' trajectories are appended to (standalone server)."""


class PolicyGateway:
    """An OpenAI-compatible server over ``backend`` that records token-faithful episodes (see the
    module docstring). ``fmt`` is the tool-call format used to show tools and read calls back.

    Run it in a background thread with :meth:`start` (training, tests) or in the foreground with
    :meth:`serve` (``agent-r1 serve-policy``).
    """

    def __init__(
        self,
        backend: RolloutBackend,
        tokenizer: Any,
        fmt: ToolCallFormat,
        settings: GatewaySettings,
    ) -> None:
        require_server_packages()
        self.backend = backend
        self.tokenizer = tokenizer
        self.settings = settings
        self.renderer = ChatRenderer(tokenizer)
        self.rendering = ToolRendering(self.renderer, fmt)
        self.recorder = EpisodeRecorder(self.renderer, self.rendering, open_on_demand=settings.open_on_demand)
        self.scheduler = GenerationScheduler(backend, batch_wait_s=settings.batch_wait_s)
        if not settings.open_on_demand:  # a trainer's gateway takes calls during its rollouts only
            self.scheduler.pause()
        self.rollout_sampling: SamplingParams | None = None
        """The sampling settings of the current training rollout (``None``: a request's own)."""
        self.counters: dict[str, float] = {}
        self.step_figures: dict[str, float] = {}
        """Gateway figures of a training step's rollouts (see :mod:`agent_r1.gateway.training`)."""
        self.url: str | None = None
        self._notices: set[str] = set()
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self._out_lock = threading.Lock()
        self.app = self._build_app()

    # -- lifecycle --------------------------------------------------------------------------------
    def start(self, host: str = "127.0.0.1", port: int = 0, *, timeout: float = 30.0) -> str:
        """Serve in a background thread (``port=0`` picks a free port); returns the root URL."""
        import uvicorn

        config = uvicorn.Config(
            self.app, host=host, port=port, log_level="warning", access_log=False, lifespan="off"
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, name="agent-r1-gateway-http", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise AgentR1Error(
                    f"the policy gateway could not start on {host}:{port} (is the port in use? see the "
                    "messages above)"
                )
            time.sleep(0.01)
        bound = self._server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://{host}:{bound}"
        return self.url

    def serve(self, host: str = "127.0.0.1", port: int = 8000) -> None:
        """Serve in the foreground until interrupted."""
        import uvicorn

        self.url = f"http://{host}:{port}"
        uvicorn.run(self.app, host=host, port=port, log_level="info", lifespan="off")
        self.scheduler.close()

    def stop(self) -> None:
        """Stop serving and the generation worker (idempotent)."""
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None
        self.scheduler.close()

    def episode_url(self, episode_id: str) -> str:
        """The OpenAI base URL of one episode (``{root}/episodes/{id}/v1``)."""
        if self.url is None:
            raise AgentR1Error("the policy gateway is not running: call start() first")
        return f"{self.url}/episodes/{episode_id}/v1"

    # -- training ---------------------------------------------------------------------------------
    def begin_rollout(self, sampling: SamplingParams, *, seed: int | None = None) -> None:
        """Take calls with ``sampling``'s temperature, top-p and top-k (a request's own are
        replaced, counted in ``sampling_overrides``) and at most its ``max_new_tokens`` per call."""
        self.rollout_sampling = sampling
        self.scheduler.take_stats()
        self.counters.clear()
        self.scheduler.resume(seed)

    def end_rollout(self) -> dict[str, float]:
        """Stop taking calls and wait for the running batch (at most the request timeout); returns
        the rollout's gateway figures (``gateway/...``)."""
        timeout = self.settings.request_timeout_s
        if not self.scheduler.pause(timeout):
            raise AgentR1Error(
                f"the policy gateway's running generation did not finish within {timeout:g} s after the "
                "rollout ended; the update cannot start while it runs"
            )
        self.rollout_sampling = None
        stats = self.scheduler.take_stats()
        figures = {
            "gateway/calls": stats["prompts"],
            "gateway/batches": stats["batches"],
            "gateway/batch_size_mean": stats["prompts"] / max(stats["batches"], 1.0),
            "gateway/batch_size_max": stats["max_batch"],
            "gateway/generate_s": stats["generate_s"],
        }
        for name in ("rejected_calls", "timeouts", "sampling_overrides", "backend_errors"):
            figures[f"gateway/{name}"] = self.counters.get(name, 0.0)
        return figures

    def _count(self, name: str) -> None:
        self.counters[name] = self.counters.get(name, 0.0) + 1

    def _notice(self, key: str, message: str) -> None:
        """Print a message once per gateway (behaviour a client may not expect)."""
        if key not in self._notices:
            self._notices.add(key)
            print(f"policy gateway: {message}", file=sys.stderr, flush=True)

    # -- calls ------------------------------------------------------------------------------------
    def _episode(self, path_id: str | None, hint: str | None) -> Episode | None:
        episode_id = path_id or hint
        if episode_id is None:
            if not self.settings.open_on_demand:
                raise RequestError(
                    "this call names no episode: use the per-episode base URL the agent was given "
                    "(OPENAI_BASE_URL, /episodes/{id}/v1) or set metadata.episode_id",
                    code="no_episode",
                )
            self._count("unrecorded_calls")
            self._notice(
                "unrecorded",
                "calls that name no episode (no /episodes/{id}/v1 URL, metadata.episode_id or user) are "
                "served but not recorded",
            )
            return None
        return self.recorder.get(episode_id)

    def _check_model(self, model: str) -> None:
        if model != self.settings.served_model_name:
            raise RequestError(
                f"the model {model!r} does not exist on this gateway; it serves "
                f"{self.settings.served_model_name!r}",
                param="model",
                code="model_not_found",
            )

    def _sampling(
        self, request: ChatRequest | CompletionRequest, stops: list[str], budget: int
    ) -> SamplingParams:
        forced = self.rollout_sampling
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
            self._count("sampling_overrides")
            self._notice(
                "override",
                f"training rollouts sample at the run's temperature={forced.temperature}, "
                f"top_p={forced.top_p}, top_k={forced.top_k} (the log-probabilities the update uses "
                "assume them); a request's own sampling settings are replaced",
            )
        return forced.model_copy(update={"max_new_tokens": budget, "stop": stops, "seed": request.seed})

    def _budget(self, prompt: list[int], asked: int | None) -> tuple[int, int]:
        """``(budget, limit)``: the tokens this call may sample (the smaller of its limit and the
        room left in the context), and its limit (``max_tokens`` capped by the gateway's
        ``max_new_tokens``)."""
        room = self.settings.max_context - len(prompt)
        if room <= 0:
            raise RequestError(
                f"this prompt has {len(prompt)} tokens, which leaves no room in the gateway's maximum "
                f"context of {self.settings.max_context} tokens; shorten the conversation",
                param="messages",
                code="context_length_exceeded",
            )
        limit = self.settings.max_new_tokens if asked is None else min(asked, self.settings.max_new_tokens)
        return min(limit, room), limit

    async def _generate(
        self, prompt: list[int], sampling: SamplingParams, budget: int
    ) -> tuple[Generation, float]:
        try:
            future: Future[Generation] = self.scheduler.submit(prompt, sampling, budget)
        except UnavailableError:
            self._count("rejected_calls")
            raise
        started = time.perf_counter()
        try:
            generation = await asyncio.wait_for(asyncio.wrap_future(future), self.settings.request_timeout_s)
        except asyncio.TimeoutError:
            future.cancel()
            self._count("timeouts")
            raise CallTimeoutError(
                f"the call did not finish within the gateway's request timeout of "
                f"{self.settings.request_timeout_s:g} s",
                code="timeout",
            ) from None
        except GatewayHTTPError:
            raise
        except Exception as exc:
            self._count("backend_errors")
            raise ServerError(
                f"the rollout backend {self.backend.name!r} failed: {type(exc).__name__}: {exc}",
                code="backend_error",
            ) from exc
        return generation, time.perf_counter() - started

    @staticmethod
    def _finish(generation: Generation, budget: int, limit: int) -> str:
        finish = generation.finish_reason
        if finish == "length" and budget < limit:
            return "context"  # the conversation's room, not the call's token limit, cut it
        return finish

    def _visible(self, text: str, generation: Generation, user_stops: list[str]) -> str:
        """The text a client sees: cut before a stop sequence of the request (OpenAI leaves it out)."""
        stop = generation.stop_sequence
        if generation.finish_reason == "stop" and stop in user_stops and stop:
            at = text.find(stop)
            if at >= 0:
                return text[:at]
        return text

    def _token_logprobs(self, generation: Generation) -> list[dict[str, Any]]:
        out = []
        for token_id, logprob in zip(generation.token_ids, generation.logprobs, strict=False):
            token = self.tokenizer.decode(
                [token_id], skip_special_tokens=False, clean_up_tokenization_spaces=False
            )
            out.append(
                {"token": token, "logprob": logprob, "bytes": list(token.encode("utf-8")), "top_logprobs": []}
            )
        return out

    async def chat(self, body: Any, path_episode: str | None) -> Any:
        """Serve one ``/v1/chat/completions`` body: the response object, or an async iterator of
        server-sent events when it asks to stream."""
        request: ChatRequest = parse_request(ChatRequest, body)
        self._check_model(request.model)
        episode = self._episode(path_episode, request.episode_hint())
        messages = canonical_messages(request.messages)
        tools = [dict(tool) for tool in request.tools] if request.tools else None
        allow_calls = request.tool_choice != "none"
        if request.tool_choice == "required":
            self._notice(
                "required",
                "tool_choice='required' is served like 'auto': the policy is sampled unconstrained, so it "
                "may answer without a tool call",
            )
        if episode is not None:
            plan = self.recorder.plan_chat(episode, messages, tools)
        else:
            try:
                template_messages, template_tools = self.rendering.template_input(messages, tools)
                plan = CallPlan(prompt_ids=self.renderer.render_prompt(template_messages, template_tools))
            except AgentR1Error as exc:
                raise RequestError(f"the chat template cannot render this conversation: {exc}") from None
        prompt = plan.prompt_ids
        budget, limit = self._budget(prompt, request.token_limit())
        user_stops = request.stop_list()
        stops = sorted({*user_stops, *(self.rendering.stop_sequences(tools) if allow_calls else [])})
        sampling = self._sampling(request, stops, budget)
        generation, elapsed = await self._generate(prompt, sampling, budget)
        finish = self._finish(generation, budget, limit)
        text = self.renderer.action_text(generation.token_ids, finish)
        reply = self.rendering.parse(
            self._visible(text, generation, user_stops), tools, allow_calls=allow_calls
        )
        completion_id = new_id("chatcmpl")
        if episode is not None:
            self.recorder.record(
                episode,
                plan,
                generation,
                text=text,
                reply=reply,
                completion_id=completion_id,
                generation_s=elapsed,
                finish_reason=finish,
            )
        reason = finish_reason(finish, bool(reply.tool_calls))
        logprobs = self._token_logprobs(generation) if request.logprobs else None
        if request.stream:
            include_usage = bool((request.stream_options or {}).get("include_usage"))
            return self._chat_events(
                completion_id, request.model, reply, reason, generation, len(prompt), logprobs, include_usage
            )
        message: dict[str, Any] = {"role": "assistant", "content": reply.content, "refusal": None}
        if reply.tool_calls:
            message["tool_calls"] = openai_tool_calls(reply.tool_calls)
        return chat_response(
            response_id=completion_id,
            model=request.model,
            message=message,
            finish=reason,
            prompt_tokens=len(prompt),
            completion_tokens=len(generation.token_ids),
            logprobs=logprobs,
        )

    def _pieces(self, token_ids: list[int], content: str) -> list[str]:
        """``content`` split where the decoded text of a prefix of the tokens ends (token-sized
        stream deltas that join to ``content`` exactly)."""
        cuts, decoded = [], ""
        for i in range(1, len(token_ids) + 1):
            decoded = self.tokenizer.decode(
                token_ids[:i], skip_special_tokens=False, clean_up_tokenization_spaces=False
            )
            if content.startswith(decoded) and 0 < len(decoded) < len(content):
                cuts.append(len(decoded))
        bounds = [0, *sorted(set(cuts)), len(content)]
        return [content[a:b] for a, b in itertools.pairwise(bounds) if b > a]

    async def _chat_events(
        self,
        completion_id: str,
        model: str,
        reply: ParsedReply,
        reason: Any,
        generation: Generation,
        prompt_tokens: int,
        logprobs: list[dict[str, Any]] | None,
        include_usage: bool,
    ) -> AsyncIterator[str]:
        def event(chunk: dict[str, Any]) -> str:
            return f"data: {json.dumps(chunk, ensure_ascii=False)}\n\n"

        yield event(
            chat_chunk(response_id=completion_id, model=model, delta={"role": "assistant", "content": ""})
        )
        content = reply.content or ""
        pieces = (
            self._pieces(generation.token_ids, content)
            if not reply.tool_calls
            else ([content] if content else [])
        )
        for piece in pieces:
            yield event(chat_chunk(response_id=completion_id, model=model, delta={"content": piece}))
        for index, call in enumerate(openai_tool_calls(reply.tool_calls)):
            yield event(
                chat_chunk(
                    response_id=completion_id, model=model, delta={"tool_calls": [{"index": index, **call}]}
                )
            )
        yield event(
            chat_chunk(response_id=completion_id, model=model, delta={}, finish=reason, logprobs=logprobs)
        )
        if include_usage:
            usage = (prompt_tokens, len(generation.token_ids))
            yield event(chat_chunk(response_id=completion_id, model=model, delta=None, usage=usage))
        yield "data: [DONE]\n\n"

    async def complete(self, body: Any, path_episode: str | None) -> Any:
        """Serve one ``/v1/completions`` body (text or token-id prompt)."""
        request: CompletionRequest = parse_request(CompletionRequest, body)
        self._check_model(request.model)
        episode = self._episode(path_episode, request.episode_hint())
        prompt_value = request.prompt_value()
        if isinstance(prompt_value, str):
            if not prompt_value:
                raise RequestError("prompt is empty", param="prompt")
            prompt = list(self.tokenizer.encode(prompt_value))
        else:
            vocab = len(self.tokenizer)
            bad = [t for t in prompt_value if not 0 <= t < vocab]
            if not prompt_value or bad:
                raise RequestError(
                    f"prompt token ids must be a non-empty list of ids in [0, {vocab}); got "
                    f"{bad[:5] or 'none'}",
                    param="prompt",
                )
            prompt = list(prompt_value)
        plan = (
            self.recorder.plan_tokens(episode, prompt) if episode is not None else CallPlan(prompt_ids=prompt)
        )
        budget, limit = self._budget(prompt, 16 if request.max_tokens is None else request.max_tokens)
        user_stops = request.stop_list()
        generation, elapsed = await self._generate(
            prompt, self._sampling(request, user_stops, budget), budget
        )
        finish = self._finish(generation, budget, limit)
        text = self.renderer.action_text(generation.token_ids, finish)
        completion_id = new_id("cmpl")
        if episode is not None:
            self.recorder.record(
                episode,
                plan,
                generation,
                text=text,
                reply=None,
                completion_id=completion_id,
                generation_s=elapsed,
                finish_reason=finish,
            )
        visible = self._visible(text, generation, user_stops)
        reason = finish_reason(finish, False)
        logprobs = None
        if request.logprobs == 0:
            tokens = self._token_logprobs(generation)
            logprobs = {
                "tokens": [t["token"] for t in tokens],
                "token_logprobs": [t["logprob"] for t in tokens],
            }
        if request.stream:
            include_usage = bool((request.stream_options or {}).get("include_usage"))

            async def events() -> AsyncIterator[str]:
                for piece in self._pieces(generation.token_ids, visible):
                    chunk = completion_chunk(response_id=completion_id, model=request.model, text=piece)
                    yield f"data: {json.dumps(chunk)}\n\n"
                last = completion_chunk(
                    response_id=completion_id, model=request.model, text="", finish=reason
                )
                yield f"data: {json.dumps(last)}\n\n"
                if include_usage:
                    usage = (len(prompt), len(generation.token_ids))
                    chunk = completion_chunk(
                        response_id=completion_id, model=request.model, text=None, usage=usage
                    )
                    yield f"data: {json.dumps(chunk)}\n\n"
                yield "data: [DONE]\n\n"

            return events()
        return completion_response(
            response_id=completion_id,
            model=request.model,
            text=visible,
            finish=reason,
            prompt_tokens=len(prompt),
            completion_tokens=len(generation.token_ids),
            logprobs=logprobs,
        )

    # -- episodes ---------------------------------------------------------------------------------
    def open_episode(self, body: Any) -> dict[str, Any]:
        """``POST /episodes``: open an episode (standalone server only)."""
        if not self.settings.open_on_demand:
            raise RequestError("in a training run the trainer opens the episodes", code="training_gateway")
        body = body if isinstance(body, dict) else {}
        task = None
        if body.get("task") is not None:
            try:
                task = Task.model_validate(body["task"])
            except ValueError as exc:
                raise RequestError(f"task: {exc}", param="task") from None
        episode = self.recorder.open(body.get("id"), task=task)
        return {"id": episode.id, "base_url": self.episode_url(episode.id) if self.url else None}

    def show_episode(self, episode_id: str) -> dict[str, Any]:
        """``GET /episodes/{id}``: the calls and trajectories of an open episode so far."""
        episode = self.recorder.find(episode_id)
        trajectories = self.recorder.assemble(episode)
        return {
            "id": episode.id,
            "calls": len(episode.calls),
            "segments": len(episode.chains),
            "counters": dict(episode.counters),
            "trajectories": [json.loads(t.to_json_line()) for t in trajectories],
        }

    def post_reward(self, episode_id: str, body: Any) -> dict[str, Any]:
        """``POST /episodes/{id}/reward``: ``{"value", "name"?, "kind"?, "completion_id"?, "weight"?}``;
        a ``process`` reward needs the ``completion_id`` (response id) of the call it rewards."""
        if not isinstance(body, dict) or "value" not in body:
            raise RequestError('the body must be a JSON object with a numeric "value"', param="value")
        unknown = sorted(set(body) - {"value", "name", "kind", "completion_id", "weight"})
        if unknown:
            raise RequestError(f"unrecognized field(s): {', '.join(unknown)}", param=unknown[0])
        kind = body.get("kind", "outcome")
        completion_id = body.get("completion_id")
        if kind == "process" and not completion_id:
            raise RequestError(
                "a process reward needs the completion_id of the call it rewards", param="completion_id"
            )
        episode = self.recorder.find(episode_id)
        try:
            signal = RewardSignal(
                name=str(body.get("name") or "reward"),
                value=body["value"],
                kind=kind,
                turn=0 if kind == "process" else None,  # the call's turn, set when the episode is assembled
                weight=body.get("weight", 1.0),
                source="gateway",
            )
        except ValueError as exc:
            raise RequestError(f"invalid reward: {exc}") from None
        self.recorder.add_reward(episode, signal, completion_id)
        return {"ok": True}

    def finish_episode(self, episode_id: str, body: Any) -> dict[str, Any]:
        """``POST /episodes/{id}/finish``: ``{"answer"?}``; closes the episode (standalone server)."""
        if not self.settings.open_on_demand:
            raise RequestError("in a training run the trainer finishes the episodes", code="training_gateway")
        body = body if isinstance(body, dict) else {}
        answer = body.get("answer")
        episode = self.recorder.find(episode_id)
        trajectories = self.recorder.finish(episode, answer=None if answer is None else str(answer))
        if self.settings.out is not None and episode.calls:
            with self._out_lock:
                save_trajectories(self.settings.out, trajectories, append=True)
        return {"id": episode.id, "trajectories": [json.loads(t.to_json_line()) for t in trajectories]}

    def finish_for_training(self, episode: Episode, **kwargs: Any) -> list[Trajectory]:
        """Close an episode the trainer opened (see :meth:`EpisodeRecorder.finish`)."""
        return self.recorder.finish(episode, **kwargs)

    def health(self) -> dict[str, Any]:
        """``GET /health``."""
        return {
            "status": "paused" if self.scheduler.paused else "ok",
            "model": self.settings.served_model_name,
            "open_episodes": len(self.recorder.open_ids()),
            "counters": dict(self.counters),
        }

    # -- the app ----------------------------------------------------------------------------------
    def _build_app(self) -> Any:
        from agent_r1.gateway.app import build_app

        return build_app(self)
