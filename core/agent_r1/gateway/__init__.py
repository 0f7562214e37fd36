"""The policy gateway: train agents written with any framework, token-faithfully.

An OpenAI-compatible server (:class:`PolicyGateway`, ``agent-r1 serve-policy``) in front of a
rollout backend records the exact prompt tokens, sampled tokens and log-probabilities of every
call and assembles each episode into :class:`~agent_r1.Trajectory` segments
(:mod:`agent_r1.gateway.recorder`). In a training run with ``rollout.source: gateway`` the trainer
starts it in-process and launches the user's agent program once per episode
(:mod:`agent_r1.gateway.launcher`, :mod:`agent_r1.gateway.training`). See docs/gateway.md.

Modules: ``protocol`` (the OpenAI wire format), ``tools`` (tools through the chat template, tool
calls out of sampled text), ``scheduler`` (batched generation), ``recorder`` (episodes and their
trajectories), ``server`` (the gateway's state and lifecycle), ``openai_routes`` and ``episodes``
(its handlers), ``app`` (the HTTP routes), ``launcher`` (agent programs), ``training`` (the rollout
source). Names are imported on first use: FastAPI and uvicorn (``agent-r1[gateway]``) load only
when a server is built.
"""

from __future__ import annotations

from agent_r1 import lazy

_EXPORTS: dict[str, tuple[str, ...]] = {  # module → the names it gives this package
    "agent_r1.gateway.server": ("PolicyGateway", "GatewaySettings"),
    "agent_r1.gateway.recorder": ("EpisodeRecorder", "Episode"),
    "agent_r1.gateway.tools": ("ToolRendering",),
    "agent_r1.gateway.scheduler": ("GenerationScheduler",),
    "agent_r1.gateway.launcher": ("AgentLauncher", "AgentOutcome"),
    "agent_r1.gateway.training": ("gateway_rollout",),
}

__all__ = sorted(name for names in _EXPORTS.values() for name in names)
__getattr__ = lazy.lazy_getattr(__name__, _EXPORTS)


def __dir__() -> list[str]:
    return __all__
