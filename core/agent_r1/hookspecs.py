# mypy: disable-error-code="empty-body"
"""Every hook agent-r1 calls. Each docstring is the reference entry for its hook.

Two families:

* ``register_<kind>()`` hooks take nothing and return a list of component classes. They are called
  lazily, the first time a component of that kind is looked up, never at import time.
* ``on_<event>(...)`` hooks observe a whole batch or episode. They are never called per token or
  per micro-batch. Their return values are ignored.

Every class a registration hook returns must subclass the contract of its kind, set a non-empty
``name`` (without ``:``) and have a pydantic ``Config``; a class that does not is skipped and its
plugin reported as broken (``agent-r1 plugins doctor`` explains why).

Implement a hook with :data:`agent_r1.hookimpl` in a module that your distribution declares under
the ``agent_r1`` entry-point group::

    [project.entry-points.agent_r1]
    my_plugin = "my_package.plugin"
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import pluggy

from agent_r1.contracts import KINDS

if TYPE_CHECKING:  # pragma: no cover
    from agent_r1.contracts import (
        AdvantageEstimator,
        Algorithm,
        Dataset,
        Environment,
        PolicyLoss,
        RewardShaper,
        RolloutBackend,
        Tool,
        ToolCallFormat,
        Tracker,
    )
    from agent_r1.mdp import Trajectory

PROJECT = "agent_r1"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


# --------------------------------------------------------------------------------------------
# Registration hooks
# --------------------------------------------------------------------------------------------


@hookspec
def register_tools() -> list[type[Tool]]:
    """Return :class:`~agent_r1.Tool` subclasses this plugin provides.

    Called once, the first time a tool is looked up. Each class needs a unique ``name``, a
    ``description`` and an ``Arguments`` model; environments refer to tools by ``name``.

    Since: 0.1.0
    """


@hookspec
def register_environments() -> list[type[Environment]]:
    """Return :class:`~agent_r1.Environment` subclasses this plugin provides.

    Called once, the first time an environment is looked up. The run config selects one with
    ``environment.name``; the rest of that section is validated by the class's ``Config``.

    Since: 0.1.0
    """


@hookspec
def register_tool_call_formats() -> list[type[ToolCallFormat]]:
    """Return :class:`~agent_r1.ToolCallFormat` subclasses (how actions spell tool calls).

    Called once, the first time a format is looked up. Built in: ``hermes`` and ``tags``.

    Since: 0.1.0
    """


@hookspec
def register_reward_shapers() -> list[type[RewardShaper]]:
    """Return :class:`~agent_r1.RewardShaper` subclasses this plugin provides.

    Called once, the first time a reward shaper is looked up. The run config's ``rewards`` list
    names shapers with weights.

    Since: 0.1.0
    """


@hookspec
def register_advantage_estimators() -> list[type[AdvantageEstimator]]:
    """Return :class:`~agent_r1.AdvantageEstimator` subclasses this plugin provides.

    Called once, the first time an estimator is looked up (usually while the trainer is built).

    Since: 0.1.0
    """


@hookspec
def register_policy_losses() -> list[type[PolicyLoss]]:
    """Return :class:`~agent_r1.PolicyLoss` subclasses this plugin provides.

    Called once, the first time a policy loss is looked up. A loss returns per-token values; the
    framework aggregates them.

    Since: 0.1.0
    """


@hookspec
def register_algorithms() -> list[type[Algorithm]]:
    """Return :class:`~agent_r1.Algorithm` subclasses (named bundles of estimator, loss, defaults).

    Called once, the first time an algorithm is looked up; ``algorithm.name`` in the run config
    selects one.

    Since: 0.1.0
    """


@hookspec
def register_rollout_backends() -> list[type[RolloutBackend]]:
    """Return :class:`~agent_r1.RolloutBackend` subclasses (engines that sample actions).

    Called once, the first time a backend is looked up. Built in: ``hf``.

    Since: 0.1.0
    """


@hookspec
def register_trackers() -> list[type[Tracker]]:
    """Return :class:`~agent_r1.Tracker` subclasses (metric sinks such as JSONL or TensorBoard).

    Called once, the first time a tracker is looked up.

    Since: 0.1.0
    """


@hookspec
def register_datasets() -> list[type[Dataset]]:
    """Return :class:`~agent_r1.Dataset` subclasses (sources of tasks).

    Called once, the first time a dataset is looked up; ``data.name`` in the run config selects one.

    Since: 0.1.0
    """


@hookspec
def register_commands() -> list[Any]:
    """Return commands to add to ``agent-r1``: ``typer.Typer`` apps (each with one command, or
    with a name) or ``click.Command`` objects.

    Called only when the command line names a subcommand that is not built in, and by
    ``agent-r1 plugins list`` and ``plugins doctor``; ``agent-r1 --help`` never calls it, so a broken
    plugin cannot break the help text. Built-in command names win over plugin commands; a name that
    two plugins provide is an error naming both when it is run.

    Since: 0.1.0
    """


# --------------------------------------------------------------------------------------------
# Observer hooks
# --------------------------------------------------------------------------------------------


@hookspec
def on_train_start(run_dir: Path, config: dict[str, Any]) -> None:
    """Called once before the first training step, after every component was built.

    :param run_dir: The run's directory (``output_dir``), where ``config.json``, ``metrics.jsonl``,
        ``samples.jsonl`` and the checkpoints are written.
    :param config: The resolved run config as plain data (what ``config.json`` holds).

    Since: 0.1.0
    """


@hookspec
def on_rollout_end(step: int, trajectories: list[Trajectory]) -> None:
    """Called once per training step with the scored trajectories this process trained on.

    :param step: The step's number (the N-th update, counted from 1, as in ``metrics.jsonl``).
    :param trajectories: The step's scored trajectories that this process trained on. Observers
        may read them (e.g. to log examples); they must not modify them.

    Since: 0.1.0. Changed in 0.2.0: called after the step's update (the runner fires every hook),
    with 1-based step numbers.
    """


@hookspec
def on_update_end(step: int, metrics: dict[str, float]) -> None:
    """Called once per training step after the optimizer update, with the step's metrics.

    :param step: The step's number (1-based, as ``metrics["step"]``).
    :param metrics: The step's metrics as the trackers log them (the line of ``metrics.jsonl``):
        losses, rewards, timings, and ``eval/success`` on a step with a mid-run evaluation.

    Since: 0.1.0
    """


@hookspec
def on_eval_end(step: int, report: dict[str, Any]) -> None:
    """Called after each evaluation with its report (success, pass@k, per-category figures...).

    :param step: The updates the evaluated policy has had: 0 before training, ``N`` after the N-th
        step (a checkpoint's step under ``agent-r1 eval --checkpoint``).
    :param report: The evaluation's summary, with its ``step`` and ``label`` (``before``,
        ``step<N>``, ``after``, or ``eval`` for ``agent-r1 eval``).

    Since: 0.1.0
    """


@hookspec
def on_checkpoint(step: int, path: Path) -> None:
    """Called after a checkpoint was written atomically to ``path``.

    :param step: The step the checkpoint holds (training resumes after it).
    :param path: The checkpoint's directory, under ``<run_dir>/checkpoints``.

    Since: 0.1.0
    """


@hookspec
def on_train_end(run_dir: Path, metrics: dict[str, float]) -> None:
    """Called once when training finishes (also after an abort), with the last metrics.

    :param run_dir: The run's directory (as in :func:`on_train_start`).
    :param metrics: The metrics of the last step that completed (empty when none did).

    Since: 0.1.0
    """


REGISTRATION_HOOKS: dict[str, str] = {kind: f"register_{kind}" for kind in KINDS}
"""Component kind → the hook that registers it."""
