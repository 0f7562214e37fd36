"""Where a session's trajectories come from: one rollout source, built once with the session.

A :class:`RolloutSource` rolls out a batch of tasks at a given temperature and decoding strategy,
reports its figures since the last step, and releases what it started. What a source needs is
checked before the model loads, by the run layer's preflight (``agent-r1 check``: the prompts for
the engine, the agent program for the gateway), since no source exists yet at that point. Two are
bundled:

* :class:`EngineSource` (``rollout.source: engine``, the default): agent-r1's own agent loop
  (:class:`~agent_r1.rollout.loop.RolloutEngine`) over the session's rollout backend and
  environments; the loop, its chat renderer (with the template check it runs once) and each
  decoder are built once and reused by every rollout;
* :class:`~agent_r1.gateway.training.GatewaySource` (``rollout.source: gateway``, in the gateway
  package): the user's own agent program, served by the policy gateway.

The engine never imports the gateway: the run layer (:mod:`agent_r1.run`) builds the gateway source
and hands it to :func:`~agent_r1.engine.session.build_session`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from agent_r1.mdp import Trajectory
from agent_r1.rollout.generation import RolloutRequest, run_sampling

if TYPE_CHECKING:
    from agent_r1.config import DecodingConfig
    from agent_r1.engine.session import Session
    from agent_r1.rollout.decoder import TurnDecoder
    from agent_r1.rollout.loop import RolloutEngine

__all__ = ["EngineSource", "RolloutRequest", "RolloutSource"]


@runtime_checkable
class RolloutSource(Protocol):
    """What the training step and the evaluation ask of a source of trajectories."""

    name: str

    def rollout(self, request: RolloutRequest) -> list[Trajectory]:
        """Roll out every task of ``request`` ``group_size`` times (unscored trajectories, task by
        task)."""
        ...

    def step_metrics(self) -> dict[str, float]:
        """The source's figures since the previous call (and forgets them)."""
        ...

    def close(self) -> None:
        """Release what the source started (servers, workers); idempotent."""
        ...


class EngineSource:
    """agent-r1's own agent loop over the session's backend and environments, built once."""

    name = "engine"

    def __init__(self, session: Session, backend: Any = None) -> None:
        """``backend``: another backend than the session's (asynchronous rollouts' own copy)."""
        from agent_r1.rollout.loop import RolloutEngine

        rollout = session.config.rollout
        self.session = session
        self.engine: RolloutEngine = RolloutEngine(
            backend if backend is not None else session.backend,
            session.tokenizer,
            session.env_factory,
            max_turns=rollout.max_turns,
            max_new_tokens=rollout.max_new_tokens,
            max_context=rollout.max_context,
            sampling=run_sampling(rollout, rollout.temperature),
            on_env_error="end",  # a faulty environment step ends that episode (counted), not the run
        )
        self._decoders: dict[tuple[str, float], TurnDecoder | None] = {}

    def decoder(self, decoding: DecodingConfig | None, temperature: float) -> TurnDecoder | None:
        """The decoder of ``decoding`` at ``temperature`` (built on first use, then kept)."""
        from agent_r1.engine.experimental.decoding import build_decoder

        decoding = decoding or self.session.config.rollout.decoding
        key = (decoding.model_dump_json(), temperature)
        if key not in self._decoders:
            self._decoders[key] = build_decoder(self.session, decoding, temperature)
        return self._decoders[key]

    def rollout(self, request: RolloutRequest) -> list[Trajectory]:
        engine = self.engine
        engine.sampling = request.sampling(self.session.config.rollout)
        engine.decoder = self.decoder(request.decoding, request.temperature)
        engine.on_progress = request.on_progress
        try:
            return engine.collect(
                request.tasks,
                request.group_size,
                seed=request.seed,
                policy_version=request.policy_version,
                group_salt=request.salt,
            )
        finally:
            engine.on_progress = None

    def async_copy(self, backend: Any, weights: Any) -> EngineSource:
        """This source over another backend, generating under ``weights`` (asynchronous rollouts'
        replica: :meth:`~agent_r1.contracts.RolloutBackend.async_replica`)."""
        source = EngineSource(self.session, backend=backend)
        source.engine.weights = weights
        return source

    def step_metrics(self) -> dict[str, float]:
        return {}

    def close(self) -> None:
        return None

    def __repr__(self) -> str:
        return f"EngineSource(backend={self.session.backend.name!r})"
