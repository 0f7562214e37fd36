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

from agent_r1 import _moved, lazy

_moved.install()  # the old paths of modules that moved (agent_r1.engine.learner.batch, ...) keep working

_EXPORTS: dict[str, tuple[str, ...]] = {  # module → the names it gives this package
    "agent_r1.engine.session": ("Session", "TaskStream", "build_session"),
    "agent_r1.engine.collect": ("rollout", "score"),
    "agent_r1.engine.update": ("micro_loss",),
    "agent_r1.engine.trainer": ("train_step", "StepResult"),
    "agent_r1.rollout.loop": ("RolloutEngine",),
    "agent_r1.rollout.chat": ("ChatRenderer",),
    "agent_r1.engine.learner.batch": ("TrainBatch", "collate", "policy_forward"),
    "agent_r1.engine.learner.critic": ("ValueHead", "state_values"),
    "agent_r1.engine.learner.loss_utils": (
        "Normalizer",
        "aggregate",
        "kl_penalty",
        "masked_mean",
        "masked_sum",
        "masked_var",
        "masked_whiten",
    ),
    "agent_r1.engine.reports.stats": ("batch_metrics",),
    "agent_r1.engine.reports.evaluation": ("summarize_eval",),
}

__all__ = sorted(name for names in _EXPORTS.values() for name in names)
__getattr__ = lazy.lazy_getattr(__name__, _EXPORTS)


def __dir__() -> list[str]:
    return __all__
