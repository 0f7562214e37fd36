"""Asynchronous rollouts in one process (``rollout.mode: async``): the next steps' episodes are
sampled while the trainer updates, never more than ``rollout.max_staleness`` updates behind.

Read top to bottom:

1. :class:`StalenessGate`, the capacity rule: the batch that update ``k`` will train may start
   only once update ``k - max_staleness`` has finished (its weights pushed). Since updates take
   batches in order, every trajectory trained at update ``n`` started on weights of update
   ``n - max_staleness`` or newer; nothing is produced that will not be trained, so nothing
   finished is dropped. ``max_staleness: 0`` is sync mode: batch ``k`` starts after update ``k - 1``.
2. :class:`RolloutWeights`, the rollout copy of the policy: the trainer pushes its weights after
   every update (copied into a staging buffer, so the trainer does not wait for generation); the
   rollout applies them at the start of its next backend call that does not continue a turn, and
   every action turn records the version that generated it (``Trajectory.turn_versions``). An
   episode whose weights changed between turns is a *partial rollout*: its later turns come from
   the newer weights (the ``hf`` backend's KV caches are keyed on the weights, so it re-prefills).
3. :class:`AsyncRollouts`, the producer: a daemon thread that collects batch after batch
   (:func:`~agent_r1.engine.collect.collect`, with the run's seeds and task order) on its own
   backend over the rollout copy, and hands each to the trainer through a queue, with the
   figures of the ``async/`` metrics.

The rollouts on other processes of a launch (``rollout.async_worker: ranks``) are in
:mod:`agent_r1.engine.asynchrony.ranks`.

The trainer corrects for the lag with the existing rollout correction: its importance weights
compare the rollout's log-probabilities (the behaviour policy) with those of the weights at the
start of the update (the proximal policy), which is the decoupled PPO objective of AReaL
(docs/algorithms.md, "Asynchronous rollouts").
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from agent_r1.mdp import Trajectory

__all__ = [
    "AsyncRollouts",
    "ProcessRollouts",
    "RolloutWeights",
    "RolloutsClosed",
    "SharedWeights",
    "StalenessGate",
    "async_source",
    "rollout_lanes",
    "rollout_replica",
    "staleness_metrics",
]


class StalenessGate:
    """The capacity rule of asynchronous rollouts (see the module docstring)."""

    def __init__(self, max_staleness: int, version: int = 0) -> None:
        if max_staleness < 0:
            raise ValueError(f"max_staleness must be >= 0, got {max_staleness}")
        self.max_staleness = max_staleness
        self.version = version
        """Updates finished (and pushed) so far."""
        self._condition = threading.Condition()
        self._closed = False

    def admit(self, batch: int) -> float:
        """Block until the batch for update ``batch`` may start; returns the seconds waited.
        Raises :class:`RuntimeError` when the gate was closed meanwhile."""
        started = time.perf_counter()
        with self._condition:
            while batch - self.version > self.max_staleness and not self._closed:
                self._condition.wait()
            if self._closed:
                raise RuntimeError("the rollout gate was closed")
        return time.perf_counter() - started

    def advance(self, version: int) -> None:
        """Update ``version`` has finished and its weights are pushed."""
        with self._condition:
            self.version = max(self.version, version)
            self._condition.notify_all()

    def close(self) -> None:
        with self._condition:
            self._closed = True
            self._condition.notify_all()

    @property
    def closed(self) -> bool:
        return self._closed


class RolloutsClosed(Exception):
    """Raised inside a rollout whose producer was closed (it ends the batch in progress)."""


class RolloutWeights:
    """The rollout copy of the policy, its version, and the trainer's pushes (see the module
    docstring). ``generating()`` is the :attr:`~agent_r1.rollout.loop.RolloutEngine.weights` guard."""

    def __init__(self, model: torch.nn.Module, version: int) -> None:
        self.model = model
        self.version = version
        self.stopped = False
        """Set by :meth:`stop`: the next backend call raises :class:`RolloutsClosed`."""
        self._staged: dict[str, torch.Tensor] | None = None
        self._staged_version: int | None = None
        self._lock = threading.Lock()
        """Guards the staged push: a push waits at most for a load, never for a backend call."""
        self._calls = threading.Lock()
        """Backend calls take turns (several lanes share the one copy of the weights)."""
        self.push_s = 0.0
        self.pushes = 0
        self.applied = 0

    def push(self, source: torch.nn.Module, version: int) -> None:
        """Stage ``source``'s weights as ``version`` (the trainer's thread; returns at once after
        the copy). A push not yet applied is replaced."""
        started = time.perf_counter()
        with self._lock, torch.no_grad():
            state = source.state_dict()
            if self._staged is None:
                self._staged = {name: tensor.detach().clone() for name, tensor in state.items()}
            else:
                for name, tensor in state.items():
                    self._staged[name].copy_(tensor)
            self._staged_version = version
        self.push_s += time.perf_counter() - started
        self.pushes += 1

    def stop(self) -> None:
        """End the rollouts in progress at their next backend call (the producer is closing)."""
        self.stopped = True

    @contextmanager
    def generating(self, swap: bool = True) -> Iterator[int]:
        """Hold the weights for one backend call; with ``swap``, apply a staged push first.
        Yields the version the call runs with."""
        if self.stopped:
            raise RolloutsClosed("the asynchronous rollouts were closed")
        with self._calls:
            if swap and self._staged_version is not None:
                with self._lock, torch.no_grad():
                    assert self._staged is not None
                    self.model.load_state_dict(self._staged)
                    self.version, self._staged_version = self._staged_version, None
                    self.applied += 1
            yield self.version


def staleness_metrics(trajectories: list[Trajectory], update: int, max_staleness: int) -> dict[str, float]:
    """``async/`` figures of the trajectories trained at ``update``: staleness (``update`` minus
    the version of each trajectory's first action turn) as max, mean and a histogram up to
    ``max_staleness``, and the share of partial rollouts (turns from more than one version)."""
    lags = []
    partial = 0
    for trajectory in trajectories:
        versions = trajectory.versions()
        if not versions:
            continue
        lags.append(update - versions[0])
        partial += len(set(versions)) > 1
    out = {
        "async/staleness_max": float(max(lags, default=0)),
        "async/staleness_mean": sum(lags) / max(len(lags), 1),
        "async/partial_share": partial / max(len(lags), 1),
    }
    for lag in range(max_staleness + 1):
        out[f"async/staleness_{lag}"] = float(sum(1 for x in lags if x == lag))
    return out


Batch = tuple[list[Trajectory], list[Trajectory], dict[str, float]]


def _receive(source: Any, update: int, stopped: Callable[[], str | None]) -> tuple[Batch, Any, float]:
    """The batch of ``update`` from ``source`` (a queue of ``(batch, result, extra)``), what came
    with it, and the seconds waited; raises what the producer raised, or why it stopped
    (``stopped()``, polled every second)."""
    started = time.perf_counter()
    while True:
        try:
            batch, result, extra = source.get(timeout=1.0)
            break
        except queue.Empty:
            reason = stopped()
            if reason is not None:
                raise RuntimeError(f"{reason} without a batch for update {update}") from None
    if isinstance(result, BaseException):
        raise result
    if batch != update:
        raise RuntimeError(f"asynchronous rollouts: expected the batch of update {update}, got {batch}")
    return result, extra, time.perf_counter() - started


def _with_metrics(
    result: Batch,
    update: int,
    max_staleness: int,
    waited: float,
    queued: int,
    idle_share: float,
    push_s: float,
) -> Batch:
    """``result`` with the ``async/`` metrics of the update that takes it."""
    trajectories, failed, metrics = result
    return (
        trajectories,
        failed,
        {
            **metrics,
            **staleness_metrics(trajectories, update, max_staleness),
            "async/trainer_wait_s": waited,
            "async/queue_length": float(queued),
            "async/rollout_idle_share": idle_share,
            "async/weight_push_s": push_s,
        },
    )


def rollout_replica(backend: Any, version: int) -> tuple[Any, Any]:
    """``backend.async_replica(version)``: the backend the rollouts generate with and the guard of
    its weights; a clear error for a backend without one."""
    replica = getattr(backend, "async_replica", None)
    if replica is None:
        from agent_r1.errors import AgentR1Error

        raise AgentR1Error(
            f"rollout backend {getattr(backend, 'name', type(backend).__name__)!r} has no async_replica(): "
            "it cannot run rollout.mode async; use rollout.mode: sync, or the 'hf' or 'vllm' backend"
        )
    return replica(version)  # type: ignore[no-any-return]


def async_source(source: Any, backend: Any, weights: Any) -> Any:
    """The session's rollout source over the rollouts' ``backend`` and weights guard (its
    ``async_copy``)."""
    copy_ = getattr(source, "async_copy", None)
    if copy_ is None:
        from agent_r1.errors import AgentR1Error

        raise AgentR1Error(
            f"rollout source {getattr(source, 'name', type(source).__name__)!r} has no async_copy(): it "
            "cannot run rollout.mode async; use rollout.mode: sync"
        )
    return copy_(backend, weights)


def rollout_lanes(
    session: Any, source: Any, backend: Any, weights: Any, wanted: int | None = None
) -> list[tuple[Any, Any]]:
    """The (source, backend) pairs the rollouts run batches on at once: ``(source, backend)``,
    then one more per further batch, each a ``lane()`` of ``backend`` (a backend of its own over
    the same weights, calls taking turns under ``weights``). As many as ``wanted``, by default
    ``rollout.async_batches`` or ``max_staleness + 1`` (the most the staleness bound lets start),
    never more than that; one when the backend has no lanes, the session's source is not
    agent-r1's own loop, or dynamic sampling draws an unknown number of tasks per batch."""
    config = session.config
    most = config.rollout.max_staleness + 1
    count = min(wanted or config.rollout.async_batches or most, most)
    engine = getattr(session.source, "name", "") == "engine"
    if not hasattr(backend, "lane") or not engine or config.algorithm.dynamic_sampling:
        count = 1
    lanes = [(source, backend)]
    for _ in range(count - 1):
        other = backend.lane()
        lanes.append((async_source(session.source, other, weights), other))
    return lanes


class AsyncRollouts:
    """The producer of ``rollout.mode: async`` for one session (see the module docstring).

    ``produce(batch, lane, tasks)`` collects the batch for update ``batch`` on lane ``lane`` (the
    default: :func:`~agent_r1.engine.collect.collect` on that lane's source), with ``tasks``
    already drawn when several batches run at once (None: the batch draws its own). Up to
    ``lanes`` batches run at once, each on a lane of its own (its own source and backend over the
    one rollout copy of the weights, backend calls taking turns), so that the next batch starts
    while the slow episodes of the previous one finish; the capacity rule still decides when each
    batch may start. :meth:`take` hands the trainer the batch of the update it is about to run;
    :meth:`pushed` records that an update finished."""

    def __init__(
        self,
        session: Any,
        *,
        produce: Callable[[int, int, Any], Batch] | None = None,
        steps: int | None = None,
        lanes: int | None = None,
    ) -> None:
        config = session.config
        self.session = session
        self.max_staleness = config.rollout.max_staleness
        self.steps = config.trainer.steps if steps is None else steps
        self.gate = StalenessGate(self.max_staleness, version=session.step)
        self.weights: Any = None
        """The guard of the rollout backend's weights: ``push``, ``generating``, ``version``."""
        self.source: Any = None
        self.backend: Any = None
        self._lanes: list[tuple[Any, Any]] = []
        """Each lane's (source, backend)."""
        if produce is None:
            self._build_rollout_copy(lanes)
            produce = self._collect
        else:
            self._lanes = [(None, None)] * (lanes or 1)
        self._produce = produce
        self._results: dict[int, tuple[Batch | BaseException, float]] = {}
        self._arrived = threading.Condition()
        self._failed = False
        self._positions: dict[int, Any] = {}
        """The task stream's state before each batch's tasks were drawn (checkpoints)."""
        self._running = 0
        self._idle_since: float | None = time.perf_counter()
        self._idle_s = 0.0
        self._started = time.perf_counter()
        self._workers: list[threading.Thread] = []
        self._thread = threading.Thread(target=self._run, name="agent-r1-rollouts", daemon=True)
        self._thread.start()

    @property
    def lanes(self) -> int:
        return len(self._lanes)

    # -- the rollout side ---------------------------------------------------------------------
    def _build_rollout_copy(self, lanes: int | None) -> None:
        """The rollout side: the backend's replica (:meth:`~agent_r1.contracts.RolloutBackend.async_replica`:
        a backend to generate with and the guard of its weights), the session's source over it
        (its ``async_copy``), and its lanes (:func:`rollout_lanes`)."""
        session = self.session
        backend, self.weights = rollout_replica(session.backend, session.step)
        self.backend = backend
        self.source = async_source(session.source, backend, self.weights)
        self._lanes = rollout_lanes(session, self.source, backend, self.weights, lanes)

    def _collect(self, batch: int, lane: int, tasks: Any) -> Batch:
        from agent_r1.engine.collect import collect

        source, backend = self._lanes[lane]
        trajectories, failed, metrics = collect(
            self.session, batch, source=source, version=self.weights.version, tasks=tasks
        )
        metrics.update(backend.step_metrics())  # this batch's prefill figures
        metrics["async/lanes"] = float(self.lanes)
        return trajectories, failed, metrics

    def _run(self) -> None:
        batch = self.session.step
        self._positions[batch] = self._stream_state()
        free: queue.Queue[int] = queue.Queue()
        for lane in range(self.lanes):
            free.put(lane)
        while batch < self.steps and not self._failed:
            try:
                self.gate.admit(batch)
            except RuntimeError:  # closed
                return
            lane = free.get()
            if self._failed or self.gate.closed:
                return
            self._begin()
            if self.lanes == 1:  # one batch at a time: it draws its own tasks (dynamic sampling too)
                self._produce_one(batch, lane, None, free)
                self._positions[batch + 1] = self._stream_state()
            else:  # drawn here, in order, then rolled out beside the batches in progress
                tasks = self._draw()
                self._positions[batch + 1] = self._stream_state()
                worker = threading.Thread(
                    target=self._produce_one,
                    args=(batch, lane, tasks, free),
                    name=f"agent-r1-lane-{lane}",
                    daemon=True,
                )
                self._workers.append(worker)
                worker.start()
            batch += 1

    def _draw(self) -> Any:
        from agent_r1.engine.collect import my_tasks

        return my_tasks(self.session) if self.session.stream is not None else None

    def _begin(self) -> None:
        with self._arrived:
            if self._running == 0 and self._idle_since is not None:
                self._idle_s += time.perf_counter() - self._idle_since
                self._idle_since = None
            self._running += 1

    def _produce_one(self, batch: int, lane: int, tasks: Any, free: queue.Queue[int]) -> None:
        try:
            result: Batch | BaseException = self._produce(batch, lane, tasks)
        except BaseException as exc:  # handed to the trainer, which raises it
            result = exc
        with self._arrived:
            self._results[batch] = (result, time.perf_counter())
            self._failed = self._failed or isinstance(result, BaseException)
            self._running -= 1
            if self._running == 0:
                self._idle_since = time.perf_counter()
            self._arrived.notify_all()
        free.put(lane)

    # -- the trainer side ---------------------------------------------------------------------
    def take(self, update: int) -> Batch:
        """The batch for ``update`` (blocks until it is there), with the ``async/`` metrics."""
        started = time.perf_counter()
        with self._arrived:
            while update not in self._results:
                failed = next((r for r, _ in self._results.values() if isinstance(r, BaseException)), None)
                if failed is not None:
                    raise failed
                if not self._thread.is_alive() and self._running == 0:
                    raise RuntimeError(f"the rollout thread stopped without a batch for update {update}")
                self._arrived.wait(timeout=1.0)
            result, finished = self._results.pop(update)
            queued = len(self._results)
            idle = self._idle_s + (time.perf_counter() - self._idle_since if self._idle_since else 0.0)
            self._idle_s = 0.0
            if self._idle_since is not None:
                self._idle_since = time.perf_counter()
        if isinstance(result, BaseException):
            raise result
        waited = time.perf_counter() - started
        wall = max(time.perf_counter() - self._started, 1e-9)
        push_s = self.weights.push_s if self.weights is not None else 0.0
        if self.weights is not None:
            self.weights.push_s = 0.0
        extra = {"async/batch_age_s": time.perf_counter() - finished}
        out = _with_metrics(result, update, self.max_staleness, waited, queued, idle / wall, push_s)
        self._started = time.perf_counter()
        return out[0], out[1], {**out[2], **extra}

    def stream_state(self, update: int) -> Any:
        """The task stream's state before the tasks of ``update`` were drawn: what a checkpoint
        after ``update - 1`` updates records, so that a resumed run draws the same tasks for the
        batches this producer had started (and loses with the process)."""
        if update in self._positions:
            return self._positions[update]
        return self._stream_state()  # not started: nothing drawn beyond it

    def _stream_state(self) -> Any:
        return self.session.stream.state() if self.session.stream is not None else None

    def pushed(self, model: torch.nn.Module | None, version: int) -> None:
        """Update ``version`` finished: stage its weights for the rollouts, open the gate."""
        if model is not None and self.weights is not None:
            self.weights.push(model, version)
        self.gate.advance(version)

    def close(self, timeout_s: float = 60.0) -> None:
        """Stop producing: batches in progress end at their next backend call (their environments
        closed), the threads are joined, and the lanes' sources released (e.g. the gateway
        source's own gateway)."""
        self.gate.close()
        stop = getattr(self.weights, "stop", None)
        if stop is not None:
            stop()
        deadline = time.monotonic() + timeout_s
        for thread in [self._thread, *self._workers]:
            thread.join(timeout=max(deadline - time.monotonic(), 0.1))
        for source, _ in self._lanes:
            if source is not None:
                source.close()


# --------------------------------------------------------------------------------------------
# A rollout worker process (rollout.async_worker: process)
# --------------------------------------------------------------------------------------------


class SharedWeights:
    """The trainer's weights in shared memory for a rollout worker process: the trainer copies
    into them after each update (:meth:`push`), the worker loads them at the start of its next
    backend call that does not continue a turn (:meth:`generating`, the engine's weights guard).
    ``version`` is the pushed update count; ``-1`` until the first push."""

    def __init__(self, model: torch.nn.Module, context: Any) -> None:
        self.tensors = {
            name: tensor.detach().to("cpu", copy=True).share_memory_()
            for name, tensor in model.state_dict().items()
        }
        self.shared_version = context.Value("q", -1)
        self.lock = context.Lock()
        self.model: torch.nn.Module | None = None  # the worker's copy, set in the worker
        self.version = -1  # the version the worker's copy holds
        self.push_s = 0.0

    def push(self, model: torch.nn.Module, version: int) -> None:
        started = time.perf_counter()
        with self.lock, torch.no_grad():
            for name, tensor in model.state_dict().items():
                self.tensors[name].copy_(tensor)
            self.shared_version.value = version
        self.push_s += time.perf_counter() - started

    def pushed_version(self) -> int:
        return int(self.shared_version.value)

    @contextmanager
    def generating(self, swap: bool = True) -> Iterator[int]:
        assert self.model is not None
        if swap and self.pushed_version() > self.version:
            with self.lock, torch.no_grad():
                device = next(self.model.parameters()).device
                self.model.load_state_dict({k: v.to(device) for k, v in self.tensors.items()})
                self.version = int(self.shared_version.value)
        yield self.version

    def __getstate__(self) -> dict[str, Any]:  # what the worker process receives
        state = dict(self.__dict__)
        state["model"] = None
        return state


def _worker_registry(plugins: list[tuple[str, str, str, str]], entry_points: bool, loaded: bool) -> Any:
    """The parent's plugins in this process: its entry points, then its in-process plugins
    re-imported by module name."""
    import importlib

    from agent_r1.registry import Registry, reset_registry

    registry = Registry(entry_points=entry_points)
    if loaded:
        registry.load()
    known = {p.name for p in registry.plugins()}
    for name, module, distribution, version in plugins:
        if name not in known:
            plugin = importlib.import_module(module.split(":")[0])
            registry.register_plugin(plugin, name, distribution=distribution, version=version)
    return reset_registry(registry)


def _worker_main(job: dict[str, Any], weights: SharedWeights, results: Any) -> None:
    """The rollout worker process: a rollout-only session on the run's config, batches from
    ``job["start"]`` to ``job["steps"]``, each admitted by the pushed version (the capacity rule)
    and put on ``results`` with the task stream's state after it."""
    from agent_r1.config import RunConfig, validate_components
    from agent_r1.engine.collect import collect
    from agent_r1.engine.session import TaskStream, build_session

    try:
        registry = _worker_registry(job["plugins"], job["entry_points"], job["loaded"])
        run = RunConfig.model_validate_json(job["config"])
        session = build_session(
            run, validate_components(run, registry), job["run_dir"], training=False, registry=registry
        )
        session.stream = TaskStream(session.dataset.load("train"), run.seed)
        session.stream.restore(job["stream"])
        weights.model = session.unwrapped
        assert session.source is not None
        session.source.engine.weights = weights  # type: ignore[attr-defined]
        for batch in range(job["start"], job["steps"]):
            waited = time.perf_counter()
            while batch - weights.pushed_version() > job["max_staleness"] or weights.pushed_version() < 0:
                time.sleep(0.005)
            idle = time.perf_counter() - waited
            with weights.generating():  # the newest weights before the batch starts
                pass
            trajectories, failed, metrics = collect(session, batch, version=weights.version)
            metrics.update(session.backend.step_metrics())
            metrics["async/worker_idle_s"] = idle
            results.put((batch, (trajectories, failed, metrics), session.stream.state()))
        session.close()
    except BaseException as exc:  # handed to the trainer, which raises it
        import traceback

        results.put(
            (-1, RuntimeError(f"rollout worker: {type(exc).__name__}: {exc}\n{traceback.format_exc()}"), None)
        )


class ProcessRollouts:
    """:class:`AsyncRollouts` with the rollouts in a worker process of their own (spawned; the
    same config, plugins, seeds and task order), weights through shared memory and batches
    through a multiprocessing queue. Same interface: :meth:`take`, :meth:`pushed`,
    :meth:`stream_state`, :meth:`close`."""

    def __init__(self, session: Any) -> None:
        import torch.multiprocessing as mp

        from agent_r1.registry import get_registry

        context = mp.get_context("spawn")
        self.session = session
        self.max_staleness = session.config.rollout.max_staleness
        self.weights = SharedWeights(session.unwrapped, context)
        self.weights.push(session.unwrapped, session.step)  # the worker starts from these weights
        registry = get_registry()
        plugins = [
            (p.name, p.module, p.distribution, p.version) for p in registry.plugins() if p.status == "loaded"
        ]
        assert session.stream is not None
        self._positions: dict[int, Any] = {session.step: session.stream.state()}
        job = {
            "config": session.config.model_dump_json(),
            "run_dir": str(session.run_dir / "rollout-worker"),
            "plugins": plugins,
            "entry_points": getattr(registry, "_use_entry_points", True),
            "loaded": getattr(registry, "_loaded", False),
            "stream": session.stream.state(),
            "start": session.step,
            "steps": session.config.trainer.steps,
            "max_staleness": self.max_staleness,
        }
        self._results = context.Queue()
        self._process = context.Process(
            target=_worker_main,
            args=(job, self.weights, self._results),
            name="agent-r1-rollout-worker",
            daemon=True,
        )
        self._process.start()
        self._started = time.perf_counter()

    def take(self, update: int) -> Batch:
        """The batch for ``update`` (blocks until it is there), with the ``async/`` metrics."""

        def stopped() -> str | None:
            code = self._process.exitcode
            return None if self._process.is_alive() else f"the rollout worker process exited (code {code})"

        result, stream, waited = _receive(self._results, update, stopped)
        self._positions[update + 1] = stream
        wall = max(time.perf_counter() - self._started, 1e-9)
        idle = result[2].pop("async/worker_idle_s", 0.0) / wall
        out = _with_metrics(
            result, update, self.max_staleness, waited, self._results.qsize(), idle, self.weights.push_s
        )
        self.weights.push_s, self._started = 0.0, time.perf_counter()
        return out

    def pushed(self, model: torch.nn.Module | None, version: int) -> None:
        if model is not None:
            self.weights.push(model, version)

    def stream_state(self, update: int) -> Any:
        if update in self._positions:
            return self._positions[update]
        assert self.session.stream is not None
        return self.session.stream.state()

    def close(self) -> None:
        if self._process.is_alive():
            self._process.terminate()
        self._process.join(timeout=10)
