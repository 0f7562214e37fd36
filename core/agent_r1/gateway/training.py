"""The ``gateway`` rollout source: training on episodes of the user's own agent program.

With ``rollout.source: gateway`` in the run config, :func:`agent_r1.engine.collect.rollout` hands
each rollout (training steps, evaluation, ReMax baselines) to :func:`gateway_rollout`, which

1. starts the session's policy gateway on the first call (in-process, on ``rollout.gateway.host``,
   a free port by default) over the session's own rollout backend: the weight sync after every
   update (``backend.sync_weights``) therefore reaches it with no extra step;
2. opens ``group_size`` episodes per task (group ids as in agent-r1's own rollouts) and lets the
   gateway take calls at the rollout's sampling settings (the temperature the update assumes);
3. launches the agent program once per episode (:class:`~agent_r1.gateway.launcher.AgentLauncher`)
   and waits for every one (killing those past ``rollout.agent.timeout_s``);
4. stops the gateway taking calls (no generation overlaps the update), closes the episodes and
   returns their trajectories: a failed program's trajectories carry the error, so the caller sets
   them aside and counts them like environment failures.

The reward shapers then score the trajectories as usual (the final answer the program printed is
on each segment's last step).

**Asynchronous rollouts** (``rollout.mode: async``): :meth:`GatewaySource.async_copy` gives the
background rollouts a source of their own, with a second gateway (on a free port of the same host)
over the rollout replica of the backend. Every generation of that gateway runs under the replica's
weights guard: it takes the trainer's latest pushed weights first, and each call records the
version that generated it on its turn (``Trajectory.turn_versions``) and shows it to the agent
program as the response's ``system_fingerprint`` (``agent-r1-policy-v{N}``). Episodes are
admitted batch by batch by the staleness gate, so an episode starts on weights at most
``rollout.max_staleness`` updates behind the update that trains it; a push in the middle of an
episode reaches its next call. The session's own gateway stays for evaluation.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import ValidationError

from agent_r1.contracts import ComponentSpec
from agent_r1.errors import AgentR1Error, ConfigError, validation_error_message
from agent_r1.gateway.launcher import AgentLauncher, AgentOutcome
from agent_r1.gateway.server import GatewaySettings, PolicyGateway
from agent_r1.mdp import Trajectory
from agent_r1.rollout.generation import RolloutRequest, group_samples, run_sync

__all__ = [
    "GATEWAY_METRICS",
    "GatewaySource",
    "gateway_for",
    "gateway_rollout",
    "served_model_name",
    "take_gateway_metrics",
    "tool_call_format",
    "training_gateway",
]

GATEWAY_METRICS: dict[str, str] = {
    "gateway/calls": "model calls the agent programs made",
    "gateway/batches": "backend generate calls the gateway made for them",
    "gateway/batch_size_mean": "calls per backend generate call (concurrent calls batched together)",
    "gateway/batch_size_max": "the largest such batch",
    "gateway/generate_s": "seconds the backend spent generating for the gateway",
    "gateway/rejected_calls": "calls refused because the gateway was not taking calls",
    "gateway/timeouts": "calls that ran past rollout.gateway.request_timeout_s (HTTP 504)",
    "gateway/sampling_overrides": "calls whose own temperature/top_p/top_k the run's settings replaced",
    "gateway/backend_errors": "calls the rollout backend failed (HTTP 500)",
    "gateway/episodes": "episodes run (agent program launches)",
    "gateway/agent_failures": "episodes whose program exited with an error or was killed",
    "gateway/agent_timeouts": "episodes whose program was killed at rollout.agent.timeout_s",
    "gateway/segments_per_episode": "trajectories per episode (more than 1 when an agent rewrote its "
    "history)",
    "gateway/agent_s": "mean wall time of an episode's program",
}
"""Every step metric the gateway source adds (summed over the step's rollouts)."""


def served_model_name(model_path: str) -> str:
    """The model name a gateway serves by default: the last part of ``model.path``."""
    return Path(model_path.rstrip("/")).name or model_path


def tool_call_format(spec: ComponentSpec | None, registry: Any) -> Any:
    """The gateway's tool-call format: ``rollout.gateway.tool_call_format``, or ``hermes`` without
    an answer tag when it is not set (the agent program decides what a final answer is)."""
    spec = spec or ComponentSpec(name="hermes", answer_tag=None)
    where = "rollout.gateway.tool_call_format"
    try:
        cls = registry.get("tool_call_formats", spec.name)
        return cls(cls.Config.model_validate(spec.options))
    except ValidationError as exc:
        message = validation_error_message(exc, prefix=f"tool-call format {spec.name!r}", root=where)
        raise ConfigError(message, path=where) from None
    except AgentR1Error as exc:
        raise ConfigError(f"{where}.name: {exc}", path=f"{where}.name") from None


def training_gateway(
    session: Any, backend: Any, *, weights: Any = None, port: int | None = None
) -> PolicyGateway:
    """A started training gateway over ``backend`` with the run's ``rollout.gateway`` settings
    (taking calls during rollouts only); ``weights``: the guard of ``backend``'s weights
    (asynchronous rollouts), ``port``: another port than ``rollout.gateway.port`` (0: a free one)."""
    config = session.config
    settings = config.rollout.gateway
    fmt = tool_call_format(settings.tool_call_format, session.registry)
    gateway = PolicyGateway(
        backend,
        session.tokenizer,
        fmt,
        GatewaySettings(
            served_model_name=settings.served_model_name or served_model_name(config.model.path),
            max_new_tokens=config.rollout.max_new_tokens,
            max_context=config.rollout.max_context,
            request_timeout_s=settings.request_timeout_s,
            batch_wait_s=settings.batch_wait_s,
            open_on_demand=False,
            structured_output=settings.structured_output,
        ),
        weights=weights,
    )
    gateway.start(settings.host, settings.port if port is None else port)
    return gateway


def gateway_for(session: Any) -> PolicyGateway:
    """The session's policy gateway, started on first use over the session's backend."""
    gateway: PolicyGateway | None = getattr(session, "gateway", None)
    if gateway is None:
        gateway = session.gateway = training_gateway(session, session.backend)
    return gateway


def take_gateway_metrics(session: Any, gateway: PolicyGateway | None = None) -> dict[str, float]:
    """The gateway figures (``gateway/...``) of the rollouts since the previous call, then reset:
    those of ``gateway``, by default the session's."""
    gateway = gateway if gateway is not None else getattr(session, "gateway", None)
    if gateway is None:
        return {}
    figures = dict(gateway.step_figures)
    gateway.step_figures.clear()
    episodes = figures.get("gateway/episodes", 0.0)
    if episodes:
        figures["gateway/segments_per_episode"] = figures.pop("_segments", 0.0) / episodes
        figures["gateway/agent_s"] = figures.pop("_agent_s", 0.0) / episodes
    return figures


def gateway_rollout(
    session: Any, request: RolloutRequest, *, gateway: PolicyGateway | None = None
) -> list[Trajectory]:
    """Roll out the tasks of ``request`` (each ``group_size`` times) with the agent program (see the
    module docstring) through ``gateway`` (by default the session's); trajectories come back task
    by task, sample by sample, segments in order. The agent program picks its own actions: a
    ``decoding`` other than plain sampling is refused when the config is validated. The episodes'
    ``policy_version`` is the request's; under a weights guard each call also records its own."""
    gateway = gateway if gateway is not None else gateway_for(session)
    rollout = session.config.rollout
    episodes = []
    for task, group, sample in group_samples(request.tasks, request.group_size, request.salt):
        episode = gateway.recorder.open(
            task=task,
            trajectory_id=f"{group}/{sample}",
            group_id=group,
            sample_index=sample,
            policy_version=request.policy_version,
        )
        episodes.append((episode, task))
    assert gateway.url is not None
    launcher = AgentLauncher(
        rollout.agent, model_name=gateway.settings.served_model_name, gateway_url=gateway.url
    )
    jobs = [(episode.id, gateway.episode_url(episode.id), task) for episode, task in episodes]
    gateway.begin_rollout(request.sampling(rollout), seed=request.seed)
    outcomes: list[AgentOutcome] | None = None
    try:
        outcomes = run_sync(launcher.run_many(jobs, on_done=request.on_progress))
    finally:
        figures = gateway.end_rollout()
        if outcomes is None:  # interrupted or failed: close what was opened, then let the error out
            for episode, _ in episodes:
                gateway.recorder.finish(episode, error="the rollout was interrupted")
    trajectories: list[Trajectory] = []
    for (episode, _), outcome in zip(episodes, outcomes, strict=True):
        segments = gateway.recorder.finish(
            episode,
            answer=outcome.answer,
            error=outcome.error,
            termination=outcome.termination,
            metrics={"agent_s": outcome.wall_s},
        )
        figures["_segments"] = figures.get("_segments", 0.0) + len(segments)
        figures["_agent_s"] = figures.get("_agent_s", 0.0) + outcome.wall_s
        trajectories.extend(segments)
    figures["gateway/episodes"] = float(len(outcomes))
    figures["gateway/agent_failures"] = float(sum(o.error is not None for o in outcomes))
    figures["gateway/agent_timeouts"] = float(sum(o.timed_out for o in outcomes))
    for name, value in figures.items():
        if name == "gateway/batch_size_max":
            gateway.step_figures[name] = max(gateway.step_figures.get(name, 0.0), value)
        elif name != "gateway/batch_size_mean":
            gateway.step_figures[name] = gateway.step_figures.get(name, 0.0) + value
    batches = gateway.step_figures.get("gateway/batches", 0.0)
    gateway.step_figures["gateway/batch_size_mean"] = gateway.step_figures.get("gateway/calls", 0.0) / max(
        batches, 1.0
    )
    return trajectories


class GatewaySource:
    """The ``gateway`` rollout source (:class:`~agent_r1.engine.source.RolloutSource`): episodes of
    the user's agent program, served by the session's policy gateway (started on the first
    rollout, stopped by :meth:`close`). Pass the class itself as ``build_session(source=...)``.

    ``gateway``: a gateway of the source's own instead of the session's (what :meth:`async_copy`
    builds), stopped by :meth:`close` too."""

    name = "gateway"

    def __init__(self, session: Any, *, gateway: PolicyGateway | None = None) -> None:
        self.session = session
        self.own_gateway = gateway
        self._copies: list[GatewaySource] = []
        self._closed = False

    def rollout(self, request: RolloutRequest) -> list[Trajectory]:
        """:func:`gateway_rollout` (through the source's own gateway when it has one)."""
        if self.own_gateway is None:
            return gateway_rollout(self.session, request)
        if self._closed:
            raise AgentR1Error(
                "the asynchronous rollouts' gateway source was closed (the session is closing); it "
                "rolls out nothing more"
            )
        return gateway_rollout(self.session, request, gateway=self.own_gateway)

    def async_copy(self, backend: Any, weights: Any) -> GatewaySource:
        """This source for asynchronous rollouts (see the module docstring): a gateway of its own
        on a free port over ``backend`` (the rollout replica), generating under ``weights`` (its
        guard: :meth:`~agent_r1.contracts.RolloutBackend.async_replica`). Closing this source
        closes the copy too."""
        gateway = training_gateway(self.session, backend, weights=weights, port=0)
        copy_ = GatewaySource(self.session, gateway=gateway)
        self._copies.append(copy_)
        return copy_

    def step_metrics(self) -> dict[str, float]:
        return take_gateway_metrics(self.session, self.own_gateway)

    def close(self) -> None:
        """Stop the source's gateway and those of its copies (idempotent)."""
        for copy_ in self._copies:
            copy_.close()
        self._copies.clear()
        if self.own_gateway is not None:
            self._closed = True
            self.own_gateway.stop()
            return
        gateway = getattr(self.session, "gateway", None)
        if gateway is not None:
            gateway.stop()
            self.session.gateway = None
