"""Batched generation for concurrent gateway calls.

Agent programs call the gateway independently, but the rollout backend is fastest (and, for the
``hf`` backend, only safe) when one thread calls ``generate`` with many prompts at once.
:class:`GenerationScheduler` owns the backend: HTTP handlers :meth:`~GenerationScheduler.submit`
jobs and wait on their futures; one worker thread gathers the jobs that arrived within
``batch_wait_s`` of the first (more arrive while a batch is generating), groups them by sampling
settings and calls ``backend.generate`` once per group, each prompt with its own token budget.

Between training rollouts the trainer :meth:`~GenerationScheduler.pause` s the scheduler: new jobs
are refused and the call returns once the running batch is done, so that no generation ever
overlaps an optimizer step.

With a weights guard (``rollout.mode: async``: the rollout copy's
:class:`~agent_r1.engine.asynchrony.RolloutWeights`), every ``generate`` call runs inside
``weights.generating()``, which applies the trainer's latest pushed weights first, and each job's
result carries the version that generated it. A gateway call is always a whole assistant turn of
its own (the recorder gives every call its own turn index), so every call may take new weights:
unlike the engine's loop, no call continues a turn that older weights began.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

from agent_r1.contracts import Generation, RolloutBackend, SamplingParams
from agent_r1.gateway.protocol import UnavailableError
from agent_r1.rollout.generation import generate_within_budgets, takes_budgets

__all__ = ["Generated", "GenerationScheduler"]


@dataclass
class Generated:
    """What a job gets back: its generation and the weights version that generated it (``None``
    without a weights guard: the backend's own ``policy_version`` holds)."""

    generation: Generation
    version: int | None = None


@dataclass
class _Job:
    prompt: list[int]
    sampling: SamplingParams
    budget: int
    future: Future[Generated] = field(default_factory=Future)


class GenerationScheduler:
    """Serialises and batches ``backend.generate`` calls (see the module docstring).

    ``max_batch`` caps the prompts of one ``generate`` call. ``weights``: the guard of the backend's
    weights (``generating()``, asynchronous rollouts), or ``None``. :attr:`stats` counts batches,
    prompts and generated tokens since the last :meth:`take_stats`.
    """

    def __init__(
        self,
        backend: RolloutBackend,
        *,
        batch_wait_s: float = 0.02,
        max_batch: int = 256,
        weights: Any = None,
    ) -> None:
        self.backend = backend
        self.weights = weights
        self.batch_wait_s = batch_wait_s
        self.max_batch = max_batch
        self._jobs: list[_Job] = []
        self._condition = threading.Condition()
        self._paused = False
        self._closed = False
        self._busy = False
        self._seeds: random.Random | None = None
        self._takes_budgets = takes_budgets(backend)
        self.stats: dict[str, float] = {}
        self.take_stats()
        self._thread = threading.Thread(target=self._work, name="agent-r1-gateway-generate", daemon=True)
        self._thread.start()

    # -- control ----------------------------------------------------------------------------------
    def submit(self, prompt: Sequence[int], sampling: SamplingParams, budget: int) -> Future[Generated]:
        """Queue one prompt; the future gives its :class:`Generated`. Raises
        :class:`~agent_r1.gateway.protocol.UnavailableError` while paused or closed."""
        job = _Job(list(prompt), sampling, budget)
        with self._condition:
            if self._closed:
                raise UnavailableError("the policy gateway is shutting down")
            if self._paused:
                raise UnavailableError(
                    "the policy gateway is not taking calls now: the trainer is updating the policy "
                    "(calls are served during rollouts only)",
                    code="paused",
                )
            self._jobs.append(job)
            self._condition.notify_all()
        return job.future

    def pause(self, timeout: float | None = None) -> bool:
        """Refuse new jobs and wait until the queue is empty and no batch runs; False on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._condition:
            self._paused = True
            while self._jobs or self._busy:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._condition.wait(left)
        return True

    def resume(self, seed: int | None = None) -> None:
        """Take jobs again. With ``seed``, each batch draws its sampling seed from a generator seeded
        with it (jobs that bring their own ``seed`` keep it)."""
        with self._condition:
            self._seeds = random.Random(seed) if seed is not None else None
            self._paused = False

    @property
    def paused(self) -> bool:
        return self._paused

    def close(self) -> None:
        """Stop the worker; queued jobs fail with :class:`UnavailableError`."""
        with self._condition:
            self._closed = True
            for job in self._jobs:
                if job.future.set_running_or_notify_cancel():
                    job.future.set_exception(UnavailableError("the policy gateway shut down"))
            self._jobs.clear()
            self._condition.notify_all()
        self._thread.join(timeout=30)

    def take_stats(self) -> dict[str, float]:
        """The counters since the previous call (``batches``, ``prompts``, ``generated_tokens``,
        ``generate_s``, ``max_batch``), then reset."""
        stats = self.stats
        self.stats = {
            "batches": 0.0,
            "prompts": 0.0,
            "generated_tokens": 0.0,
            "generate_s": 0.0,
            "max_batch": 0.0,
        }
        return stats

    # -- worker -----------------------------------------------------------------------------------
    def _work(self) -> None:
        while True:
            with self._condition:
                while not self._jobs and not self._closed:
                    self._condition.wait()
                if self._closed:
                    return
                deadline = time.monotonic() + self.batch_wait_s
                while len(self._jobs) < self.max_batch and (left := deadline - time.monotonic()) > 0:
                    self._condition.wait(left)
                jobs, self._jobs = self._jobs[: self.max_batch], self._jobs[self.max_batch :]
                self._busy = True
            try:
                self._run([job for job in jobs if job.future.set_running_or_notify_cancel()])
            finally:
                with self._condition:
                    self._busy = False
                    self._condition.notify_all()

    def _run(self, jobs: list[_Job]) -> None:
        groups: dict[str, list[_Job]] = {}
        for job in jobs:  # one backend call per distinct sampling setting
            key = job.sampling.model_copy(update={"max_new_tokens": 1}).model_dump_json()
            groups.setdefault(key, []).append(job)
        for group in groups.values():
            sampling = group[0].sampling.model_copy(
                update={"max_new_tokens": max(job.budget for job in group)}
            )
            if sampling.seed is None and self._seeds is not None:
                sampling.seed = self._seeds.randrange(1 << 62)
            started = time.perf_counter()
            try:
                generations, version = self._generate(
                    [job.prompt for job in group], sampling, [job.budget for job in group]
                )
            except BaseException as exc:  # every waiting caller gets the backend's failure
                for job in group:
                    job.future.set_exception(exc)
                if not isinstance(exc, Exception):
                    raise
                continue
            self.stats["batches"] += 1
            self.stats["prompts"] += len(group)
            self.stats["generated_tokens"] += sum(len(g.token_ids) for g in generations)
            self.stats["generate_s"] += time.perf_counter() - started
            self.stats["max_batch"] = max(self.stats["max_batch"], float(len(group)))
            for job, generation in zip(group, generations, strict=True):
                job.future.set_result(Generated(generation, version))

    def _generate(
        self, prompts: list[list[int]], sampling: SamplingParams, budgets: list[int]
    ) -> tuple[list[Generation], int | None]:
        """One backend call, under the weights guard when there is one (see the module docstring);
        the generations and the version that made them."""
        guard = self.weights.generating(swap=True) if self.weights is not None else nullcontext(None)
        with guard as version:
            generations = generate_within_budgets(
                self.backend, prompts, sampling, budgets, with_budgets=self._takes_budgets
            )
        return generations, version
