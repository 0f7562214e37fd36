"""What the TRL and verl adapters share: building environments and reward shapers from names,
scoring trajectories, and cutting a trajectory into the prompt/completion form other trainers use."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agent_r1.contracts import Environment, RewardShaper
from agent_r1.errors import AgentR1Error
from agent_r1.mdp import Task, Trajectory
from agent_r1.rollout.generation import run_sync

EnvironmentSpec = str | Callable[[], Environment]
"""An installed environment's name, or a zero-argument callable returning a fresh environment."""

ShaperSpec = tuple[str, Mapping[str, Any], float] | tuple[RewardShaper, float] | Mapping[str, Any]
"""``(name, options, weight)``, ``(shaper instance, weight)`` or ``{"name", "options", "weight"}``."""


def environment_factory(
    environment: EnvironmentSpec, options: Mapping[str, Any] | None = None
) -> Callable[[], Environment]:
    """A factory that builds one fresh environment per episode, from an installed environment's name
    (validated once, now) or from a callable."""
    if callable(environment):
        if options:
            raise AgentR1Error(
                "env_options are only used with an environment name; pass them to your environment "
                "factory yourself"
            )
        return environment
    from agent_r1.registry import get_registry

    registry = get_registry()
    registry.build("environments", environment, dict(options or {}))  # fail now, not in an episode

    def build() -> Environment:
        built: Environment = registry.build("environments", environment, dict(options or {}))
        return built

    return build


def build_shapers(specs: Sequence[ShaperSpec]) -> list[tuple[RewardShaper, float]]:
    """Reward shapers with their weights, from names (built through the registry) or instances."""
    from agent_r1.registry import get_registry

    shapers: list[tuple[RewardShaper, float]] = []
    for index, spec in enumerate(specs):
        if isinstance(spec, Mapping):
            unknown = set(spec) - {"name", "options", "weight"}
            if "name" not in spec or unknown:
                raise AgentR1Error(
                    f"reward shaper #{index}: a mapping needs 'name' and may have 'options' and 'weight' "
                    f"(got keys {sorted(spec)})"
                )
            spec = (str(spec["name"]), dict(spec.get("options") or {}), float(spec.get("weight", 1.0)))
        if isinstance(spec, tuple) and len(spec) == 2 and isinstance(spec[0], RewardShaper):
            shapers.append((spec[0], float(spec[1])))
        elif isinstance(spec, tuple) and len(spec) == 3 and isinstance(spec[0], str):
            name, options, weight = spec
            shapers.append((get_registry().build("reward_shapers", name, dict(options)), float(weight)))
        else:
            raise AgentR1Error(
                f"reward shaper #{index}: expected (name, options, weight), (RewardShaper, weight) or a "
                f"mapping, got {spec!r}"
            )
    return shapers


def score(
    trajectories: Sequence[Trajectory],
    tasks: Mapping[str, Task],
    shapers: Sequence[tuple[RewardShaper, float]],
) -> None:
    """Add every shaper's signals (times its weight) to each trajectory, as the bundled trainer does.
    A shaper that raises is recorded in ``trajectory.errors`` (the adapters then report the episode
    as unscorable instead of training on a made-up reward)."""
    for trajectory in trajectories:
        task = tasks[trajectory.task_id]
        for shaper, weight in shapers:
            try:
                signals = shaper.score(trajectory, task)
                if inspect.isawaitable(signals):
                    signals = run_sync(signals)
            except AgentR1Error:
                raise
            except Exception as exc:  # recorded on the trajectory; the episode becomes unscorable
                trajectory.errors.append(
                    f"reward shaper {shaper.name!r} raised on task {task.id!r}: {type(exc).__name__}: {exc}"
                )
                continue
            for signal in signals or []:
                signal.weight = weight * signal.weight
                signal.source = signal.source or shaper.name
                trajectory.rewards.append(signal)


@dataclass
class Split:
    """A trajectory cut after its prompt: ``completion_*`` lists are aligned with ``completion_ids``."""

    prompt_ids: list[int]
    completion_ids: list[int]
    policy_mask: list[int]
    """1 on policy-sampled tokens, 0 on environment and template tokens."""
    logprobs: list[float]
    """Sampling log-probabilities; 0.0 on tokens the policy did not sample."""


def split(trajectory: Trajectory, where: str = "") -> Split:
    """Cut ``trajectory`` before its first policy token. Raises :class:`AgentR1Error` for an episode
    without policy tokens (its prompt filled the context): other trainers cannot take an empty
    completion."""
    cut = trajectory.prompt_length
    tokens = trajectory.token_ids
    if cut >= len(tokens):
        raise AgentR1Error(
            f"{where}task {trajectory.task_id!r}: the episode has no policy tokens (termination "
            f"{trajectory.termination!r}): its prompt of {cut} tokens left no room for an action. Raise "
            "max_context or shorten the prompt."
        )
    return Split(
        prompt_ids=tokens[:cut],
        completion_ids=tokens[cut:],
        policy_mask=trajectory.loss_mask[cut:],
        logprobs=trajectory.logprobs[cut:],
    )


def reward_columns(trajectory: Trajectory) -> dict[str, Any]:
    """The trajectory's reward signals and episode facts, as plain values for another trainer's
    per-sample columns."""
    return {
        "score": None if trajectory.errors else trajectory.score,
        "rewards": trajectory.reward_by_name(),
        "num_turns": trajectory.num_turns,
        "termination": trajectory.termination,
        "truncated": trajectory.truncated,
        "errors": list(trajectory.errors),
    }
