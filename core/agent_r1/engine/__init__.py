"""The RL engine: the public API for embedders and estimator authors.

Build a :class:`Session` once from a validated config (:func:`build_session`), then step plainly:
``agent_r1.engine.collect.collect`` rolls out and scores one step's trajectories,
``agent_r1.engine.update.update`` turns scored trajectories into an optimizer update, and
:func:`train_step` does both (the modules ``collect`` and ``update`` carry the functions' names,
so import the functions from them). The pieces underneath are
usable on their own: the agent loop (:class:`RolloutEngine`), padding (:func:`collate`), per-token
log-probabilities (:func:`policy_forward`), the critic's state values (:func:`state_values`), and
the masked statistics and loss aggregation that estimators and losses are written with.

Names are imported on first use, so ``import agent_r1.engine`` stays light.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS: dict[str, str] = {
    "Session": "agent_r1.engine.session",
    "TaskStream": "agent_r1.engine.session",
    "build_session": "agent_r1.engine.session",
    "rollout": "agent_r1.engine.collect",
    "score": "agent_r1.engine.collect",
    "micro_loss": "agent_r1.engine.update",
    "train_step": "agent_r1.engine.trainer",
    "StepResult": "agent_r1.engine.trainer",
    "RolloutEngine": "agent_r1.engine.rollout",
    "ChatRenderer": "agent_r1.engine.chat",
    "TrainBatch": "agent_r1.engine.batch",
    "collate": "agent_r1.engine.batch",
    "policy_forward": "agent_r1.engine.batch",
    "ValueHead": "agent_r1.engine.critic",
    "state_values": "agent_r1.engine.critic",
    "Normalizer": "agent_r1.engine.loss_utils",
    "aggregate": "agent_r1.engine.loss_utils",
    "kl_penalty": "agent_r1.engine.loss_utils",
    "masked_mean": "agent_r1.engine.loss_utils",
    "masked_sum": "agent_r1.engine.loss_utils",
    "masked_var": "agent_r1.engine.loss_utils",
    "masked_whiten": "agent_r1.engine.loss_utils",
    "batch_metrics": "agent_r1.engine.stats",
    "summarize_eval": "agent_r1.engine.evaluation",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'agent_r1.engine' has no attribute {name!r}")


def __dir__() -> list[str]:
    return __all__
