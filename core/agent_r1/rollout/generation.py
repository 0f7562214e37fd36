"""The shared edges of generation, written once for the agent loop, the gateway and the integrations.

* :func:`takes_budgets` and :func:`generate_within_budgets`: one batched backend call with a token
  budget per prompt; a row that comes back longer than its budget is cut to it (the kept tokens
  are still exact samples), and a backend without per-prompt budgets (deprecated) is called with
  the largest one;
* :func:`group_id` and :func:`group_samples`: the id shared by the samples of one task in one step,
  and every sample of a step with its group;
* :func:`action_from_generation`: the :class:`~agent_r1.mdp.Action` a generation becomes, with a
  ``length`` stop under a budget smaller than ``max_new_tokens`` named ``context`` (the context
  cut it, not the action budget);
* :class:`RolloutRequest`: one batch of rollouts asked of a rollout source, and
  :func:`run_sampling`, the sampling settings of a run's ``rollout`` section at a temperature;
* :func:`run_sync`: run a coroutine to completion from synchronous code, in a worker thread when an
  event loop already runs in this thread (notebooks, async web servers).
"""

from __future__ import annotations

import asyncio
import inspect
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from agent_r1.contracts import Generation, RolloutBackend, SamplingParams
from agent_r1.errors import AgentR1Error
from agent_r1.mdp import Action, Task

if TYPE_CHECKING:
    from agent_r1.config import DecodingConfig, RolloutConfig

__all__ = [
    "RolloutRequest",
    "action_from_generation",
    "generate_within_budgets",
    "group_id",
    "group_samples",
    "run_sampling",
    "run_sync",
    "takes_budgets",
]

T = TypeVar("T")


def takes_budgets(backend: RolloutBackend) -> bool:
    """Whether ``backend.generate`` accepts per-prompt budgets (``max_new_tokens=[...]``)."""
    return "max_new_tokens" in inspect.signature(backend.generate).parameters


def generate_within_budgets(
    backend: RolloutBackend,
    prompts: list[list[int]],
    sampling: SamplingParams,
    budgets: Sequence[int],
    *,
    with_budgets: bool,
) -> list[Generation]:
    """One backend call for ``prompts``; every row ends within its budget. ``with_budgets`` is
    :func:`takes_budgets` of the backend (looked up once by the caller)."""
    if with_budgets:
        generations = backend.generate(prompts, sampling, max_new_tokens=list(budgets))
    else:  # deprecated: a backend written before budgets were part of the contract
        generations = backend.generate(prompts, sampling.model_copy(update={"max_new_tokens": max(budgets)}))
    if len(generations) != len(prompts):
        raise AgentR1Error(
            f"rollout backend {backend.name!r} returned {len(generations)} generations for "
            f"{len(prompts)} prompts"
        )
    for generation, budget in zip(generations, budgets, strict=True):
        if len(generation.token_ids) > budget:
            generation.token_ids = generation.token_ids[:budget]
            generation.logprobs = generation.logprobs[:budget]
            generation.finish_reason, generation.stop_sequence = "length", None
    return generations


def group_id(task_id: str, salt: str, repeat: int = 0) -> str:
    """The group id of the samples of task ``task_id`` in one step (``salt``); ``repeat`` counts
    earlier groups of the same task in the same step (a task drawn twice)."""
    return f"{task_id}@{salt}" + (f"#{repeat}" if repeat else "")


def group_samples(tasks: Sequence[Task], group_size: int, salt: str) -> Iterator[tuple[Task, str, int]]:
    """``(task, group id, sample index)`` of every sample of one step (``salt``): each task
    ``group_size`` times, task by task; a task drawn twice gets a second group (:func:`group_id`)."""
    seen: Counter[str] = Counter()
    for task in tasks:
        group = group_id(task.id, salt, seen[task.id])
        seen[task.id] += 1
        for sample in range(group_size):
            yield task, group, sample


def action_from_generation(
    generation: Generation, *, budget: int, max_new_tokens: int, text: str = ""
) -> Action:
    """The action of one generation (``text``: its rendering for the environment, which the caller
    may also set afterwards from the action's ``finish_reason``). A ``length`` stop under a budget
    smaller than ``max_new_tokens`` was the context's doing: ``context``."""
    ids = list(generation.token_ids)
    finish = generation.finish_reason
    if finish == "length" and budget < max_new_tokens:
        finish = "context"
    logprobs = list(generation.logprobs) if len(generation.logprobs) == len(ids) else None
    return Action(
        token_ids=ids,
        logprobs=logprobs,
        text=text,
        finish_reason=finish,
        stop_sequence=generation.stop_sequence if finish == "stop" else None,
    )


@dataclass(frozen=True)
class RolloutRequest:
    """One batch of rollouts asked of a rollout source: every task ``group_size`` times, sampled at
    ``temperature`` from ``seed``, grouped under ``salt`` (:func:`group_samples`), stamped with
    ``policy_version``; ``decoding`` is the decoding strategy (``None``: the run's
    ``rollout.decoding``; a source that picks no actions itself, the gateway, ignores it) and
    ``on_progress(done, total)`` is told of every finished episode."""

    tasks: Sequence[Task]
    group_size: int
    seed: int
    temperature: float
    salt: str
    policy_version: int = 0
    decoding: DecodingConfig | None = None
    on_progress: Callable[[int, int], None] | None = None

    def sampling(self, rollout: RolloutConfig) -> SamplingParams:
        """The run's sampling settings (``rollout``: its config section) at this temperature."""
        return run_sampling(rollout, self.temperature)


def run_sampling(rollout: RolloutConfig, temperature: float) -> SamplingParams:
    """The sampling settings of the ``rollout`` config section at ``temperature``."""
    return SamplingParams(
        temperature=temperature,
        top_p=rollout.top_p,
        top_k=rollout.top_k,
        max_new_tokens=rollout.max_new_tokens,
    )


def run_sync(awaitable: Awaitable[T]) -> T:
    """Run ``awaitable`` to completion from synchronous code (in a worker thread when an event loop
    is already running in this thread)."""

    async def wait() -> T:
        return await awaitable

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(wait())
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, wait()).result()
