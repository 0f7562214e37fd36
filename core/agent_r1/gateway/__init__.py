"""The policy gateway: train agents written with any framework, token-faithfully.

An OpenAI-compatible server (:class:`PolicyGateway`, ``agent-r1 serve-policy``) in front of a
rollout backend records the exact prompt tokens, sampled tokens and log-probabilities of every
call and assembles each episode into :class:`~agent_r1.Trajectory` segments
(:mod:`agent_r1.gateway.recorder`). In a training run with ``rollout.source: gateway`` the trainer
starts it in-process and launches the user's agent program once per episode
(:mod:`agent_r1.gateway.launcher`, :mod:`agent_r1.gateway.training`). See docs/gateway.md.

Modules: ``protocol`` (the OpenAI wire format), ``tools`` (tools through the chat template, tool
calls out of sampled text), ``scheduler`` (batched generation), ``recorder`` (episodes and their
trajectories), ``server`` (the HTTP app), ``launcher`` (agent programs), ``training`` (the rollout
source). Names are imported on first use: FastAPI and uvicorn (``agent-r1[gateway]``) load only
when a server is built.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS: dict[str, str] = {
    "PolicyGateway": "agent_r1.gateway.server",
    "GatewaySettings": "agent_r1.gateway.server",
    "EpisodeRecorder": "agent_r1.gateway.recorder",
    "Episode": "agent_r1.gateway.recorder",
    "ToolRendering": "agent_r1.gateway.tools",
    "GenerationScheduler": "agent_r1.gateway.scheduler",
    "AgentLauncher": "agent_r1.gateway.launcher",
    "AgentOutcome": "agent_r1.gateway.launcher",
    "gateway_rollout": "agent_r1.gateway.training",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'agent_r1.gateway' has no attribute {name!r}")


def __dir__() -> list[str]:
    return __all__
