"""The policy gateway: an OpenAI-compatible HTTP server in front of a rollout backend.

:class:`PolicyGateway` serves ``/v1/chat/completions`` (tools and tool calls in the OpenAI format,
streaming), ``/v1/responses`` (the Responses API, :mod:`agent_r1.gateway.responses`),
``/v1/completions`` and ``/v1/models`` on FastAPI + uvicorn (``pip install
agent-r1[gateway]``), and records every call of every episode for training
(:mod:`agent_r1.gateway.recorder`). A call belongs to an episode named by its URL
(``/episodes/{id}/v1/...``, what agent programs get as ``OPENAI_BASE_URL``), or by the request's
``metadata.episode_id`` or ``user`` field.

Episode endpoints: ``POST /episodes`` opens one (standalone server), ``GET /episodes/{id}`` shows
its calls and trajectories so far, ``POST /episodes/{id}/reward`` adds a reward signal,
``POST /episodes/{id}/finish`` closes it and returns its trajectories (written to the server's
``--out`` file too). ``GET /health`` reports the state. An episode id is used once: a request on a
finished id is answered HTTP 409, and with ``episode_idle_s`` set, an episode with no call, reward
or show for that long is closed as failed (a sweep thread wakes at most every
``min(episode_idle_s / 4, 5)`` s, and every request sweeps first; see
:meth:`PolicyGateway.close_idle`).

Streaming (``stream: true``) follows the OpenAI server-sent-event format; the chunks are sent when
the generation is complete (the rollout backend contract returns whole generations).

In a training run the trainer drives the gateway: :meth:`PolicyGateway.begin_rollout` fixes the
sampling settings the trainer's log-probabilities assume (the run's temperature, top-p and top-k
replace a request's own), :meth:`PolicyGateway.end_rollout` stops taking calls until the next
rollout, so no generation overlaps an update.

This module holds the gateway's state and lifecycle; the handlers live beside it:
:mod:`agent_r1.gateway.openai_routes` (the OpenAI calls), :mod:`agent_r1.gateway.episodes` (the
episode endpoints) and :mod:`agent_r1.gateway.app` (the routes that call them).
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent_r1.contracts import RolloutBackend, SamplingParams, ToolCallFormat
from agent_r1.errors import AgentR1Error
from agent_r1.gateway.recorder import Episode, EpisodeRecorder
from agent_r1.gateway.responses import ResponseStore
from agent_r1.gateway.scheduler import GenerationScheduler
from agent_r1.gateway.tools import ToolRendering
from agent_r1.mdp import Trajectory, save_trajectories
from agent_r1.rollout.chat import ChatRenderer

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
    structured_output: str = "refuse"
    """``refuse``: a ``response_format`` / ``text.format`` asking for JSON is an HTTP 400;
    ``prompted``: it is served as an instruction added to the system message (sampling stays
    unconstrained)."""
    episode_idle_s: float | None = None
    """Close an open episode after this many seconds without a call, reward or show, as failed
    (``None``: never). ``agent-r1 serve-policy`` sets 900 s; a training gateway leaves it off, as
    the trainer finishes every episode when its program exits or is killed at its timeout."""

    def __post_init__(self) -> None:
        if self.episode_idle_s is not None and not self.episode_idle_s > 0:
            raise AgentR1Error(
                f"episode_idle_s must be a positive number of seconds (or None to never close idle "
                f"episodes); got {self.episode_idle_s!r}"
            )


class PolicyGateway:
    """An OpenAI-compatible server over ``backend`` that records token-faithful episodes (see the
    module docstring). ``fmt`` is the tool-call format used to show tools and read calls back.
    ``weights``: the guard of the backend's weights in asynchronous rollouts
    (:class:`~agent_r1.engine.asynchrony.RolloutWeights`): every generation then runs under it,
    takes the trainer's latest pushed weights, and records their version on its call's turn.

    Run it in a background thread with :meth:`start` (training, tests) or in the foreground with
    :meth:`serve` (``agent-r1 serve-policy``).
    """

    def __init__(
        self,
        backend: RolloutBackend,
        tokenizer: Any,
        fmt: ToolCallFormat,
        settings: GatewaySettings,
        *,
        weights: Any = None,
    ) -> None:
        require_server_packages()
        self.backend = backend
        self.weights = weights
        self.tokenizer = tokenizer
        self.settings = settings
        self.renderer = ChatRenderer(tokenizer)
        self.rendering = ToolRendering(self.renderer, fmt)
        self.recorder = EpisodeRecorder(self.renderer, self.rendering, open_on_demand=settings.open_on_demand)
        self.scheduler = GenerationScheduler(backend, batch_wait_s=settings.batch_wait_s, weights=weights)
        self.responses = ResponseStore()
        """Responses API responses kept for ``previous_response_id``."""
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
        self._counter_lock = threading.Lock()
        self._sweeper: threading.Thread | None = None
        self._stop_sweeping = threading.Event()
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
        self._start_sweeper()
        return self.url

    def serve(self, host: str = "127.0.0.1", port: int = 8000) -> None:
        """Serve in the foreground until interrupted."""
        import uvicorn

        self.url = f"http://{host}:{port}"
        self._start_sweeper()
        try:
            uvicorn.run(self.app, host=host, port=port, log_level="info", lifespan="off")
        finally:
            self._stop_sweeper()
            self.scheduler.close()

    def stop(self) -> None:
        """Stop serving, the idle sweep and the generation worker (idempotent)."""
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None
        self._stop_sweeper()
        self.scheduler.close()

    def episode_url(self, episode_id: str) -> str:
        """The OpenAI base URL of one episode (``{root}/episodes/{id}/v1``)."""
        if self.url is None:
            raise AgentR1Error("the policy gateway is not running: call start() first")
        return f"{self.url}/episodes/{episode_id}/v1"

    # -- idle episodes ----------------------------------------------------------------------------
    def close_idle(self, *, now: float | None = None) -> list[str]:
        """Close the episodes idle for ``settings.episode_idle_s`` at ``now`` (``time.monotonic()``
        by default; see :meth:`EpisodeRecorder.close_idle`): counted in ``idle_closed``, appended
        to ``settings.out`` like finished episodes, and noted once on stderr. Returns their ids;
        nothing when the setting is off."""
        idle_s = self.settings.episode_idle_s
        if idle_s is None:
            return []
        closed = self.recorder.close_idle(idle_s, now=now)
        for _ in closed:
            self.count("idle_closed")
        for episode, trajectories in closed:
            if episode.calls:  # as POST /finish: an episode without calls has nothing to keep
                self.save_finished(trajectories)
        if closed:
            where = " and written to --out" if self.settings.out is not None else ""
            self.notice(
                "idle_closed",
                f"episode {closed[0][0].id!r} had no call, reward or show for {idle_s:g} s and was closed "
                f"as failed (termination 'idle_timeout'; its trajectories carry the error{where}); a later "
                "request on its id gets HTTP 409. /health counts such episodes in counters.idle_closed; "
                "--episode-idle-s sets the limit. This note is shown once.",
            )
        return [episode.id for episode, _ in closed]

    def _sweep(self) -> None:
        """:meth:`close_idle`, for the sweep thread and each request: a failure (the ``--out``
        file cannot be written) is counted in ``idle_close_errors`` and printed, so that neither
        the sweep nor the request that triggered it dies of it."""
        try:
            self.close_idle()
        except Exception as exc:
            self.count("idle_close_errors")
            print(
                f"policy gateway: closing idle episodes failed ({type(exc).__name__}: {exc}); the "
                "trajectories of the episodes it closed may be missing from --out",
                file=sys.stderr,
                flush=True,
            )

    def _start_sweeper(self) -> None:
        """Start the thread that closes idle episodes (when ``episode_idle_s`` is set): it sleeps
        ``min(episode_idle_s / 4, 5)`` s between sweeps, so an episode closes at most that late."""
        idle_s = self.settings.episode_idle_s
        if idle_s is None or self._sweeper is not None:
            return
        wake_s = min(idle_s / 4, 5.0)
        self._stop_sweeping.clear()

        def sweep_until_stopped() -> None:
            while not self._stop_sweeping.wait(wake_s):
                self._sweep()

        self._sweeper = threading.Thread(
            target=sweep_until_stopped, name="agent-r1-gateway-idle", daemon=True
        )
        self._sweeper.start()

    def _stop_sweeper(self) -> None:
        self._stop_sweeping.set()
        if self._sweeper is not None:
            self._sweeper.join(timeout=30)
            self._sweeper = None

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

    def finish_for_training(self, episode: Episode, **kwargs: Any) -> list[Trajectory]:
        """Close an episode the trainer opened (see :meth:`EpisodeRecorder.finish`)."""
        return self.recorder.finish(episode, **kwargs)

    # -- state the handlers share -----------------------------------------------------------------
    def count(self, name: str) -> None:
        """Add one to the counter ``name`` (reported by ``/health`` and :meth:`end_rollout`)."""
        with self._counter_lock:  # the sweep thread counts too
            self.counters[name] = self.counters.get(name, 0.0) + 1

    def notice(self, key: str, message: str) -> None:
        """Print a message once per gateway (behaviour a client may not expect)."""
        if key not in self._notices:
            self._notices.add(key)
            print(f"policy gateway: {message}", file=sys.stderr, flush=True)

    def save_finished(self, trajectories: Sequence[Trajectory]) -> None:
        """Append a finished episode's trajectories to ``settings.out`` (when set), one writer at a
        time."""
        if self.settings.out is None:
            return
        with self._out_lock:
            save_trajectories(self.settings.out, trajectories, append=True)

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

        app = build_app(self)
        app.add_middleware(_EpisodeActivity, gateway=self)
        return app


class _EpisodeActivity:
    """ASGI middleware around the gateway's app: before each request, the idle episodes are
    closed (so a call on one is refused, whenever the sweep thread last ran); during it, the
    episodes it uses are held (:meth:`EpisodeRecorder.request_scope`), so that a call is never
    cut off by an idle close, however long it generates or however it ends."""

    def __init__(self, app: Any, gateway: PolicyGateway) -> None:
        self.app = app
        self.gateway = gateway

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        self.gateway._sweep()
        with self.gateway.recorder.request_scope():
            await self.app(scope, receive, send)
