"""Asynchronous rollouts on processes of their own, launched with the trainer by ``torchrun`` or
``accelerate launch`` (``rollout.async_worker: ranks``): the processes can be on other GPUs or
other machines, and weights and trajectories travel through ``torch.distributed``.

Read top to bottom:

1. :func:`launch_role`: which process does what. Rank 0 of the launch trains, every other rank
   rolls out (``rollout.rollout_processes``, checked against the launch). Each process then sees
   itself as a single process (``WORLD_SIZE=1``, no ``LOCAL_RANK``), so that the trainer's
   accelerate state is that of one process; the launch's ranks meet in a gloo group of their own,
   :class:`RankChannel`, built on the launcher's store under a prefix of its own (no home-made
   socket protocol, no second rendezvous).
2. :class:`RankRollouts`, the trainer's side, with the interface of
   :class:`~agent_r1.engine.asynchrony.AsyncRollouts` (``take``, ``pushed``, ``stream_state``,
   ``close``): it sends each rollout rank where to start (the training step and the task stream's
   position, so resumed runs work) and the weights after every update (staged in the trainer's
   thread, sent by a sender thread: the trainer never waits for a rollout), and receives finished
   batches on one receiver thread per rollout rank, so that a finished batch waits in a queue
   rather than holding up its rank.
3. :func:`rollout_rank_main`, a rollout rank: a rollout-only session over the run's config, the
   trainer's weights applied between backend calls (partial rollouts, as in the other modes), the
   batches ``start + j, start + j + K, ...`` of rollout rank ``j`` of ``K`` (the task stream
   skips the others' tasks), each started under the capacity rule of
   :class:`~agent_r1.engine.asynchrony.StalenessGate`: batch ``k`` starts once the weights of
   update ``k - max_staleness`` have arrived.

Messages: objects are pickled into a byte tensor (length, then bytes); weights are sent tensor by
tensor in the ``state_dict`` order both sides share, in fp32 or the model's own dtype, through host
memory (a GPU trainer's weights are copied to the CPU first).
"""

from __future__ import annotations

import datetime
import os
import pickle
import queue
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from agent_r1.engine.asynchrony import Batch, RolloutsClosed, RolloutWeights, _with_metrics, rollout_lanes
from agent_r1.errors import AgentR1Error

if TYPE_CHECKING:
    from agent_r1.config import ResolvedComponent, RunConfig
    from agent_r1.engine.session import Session

__all__ = ["LaunchRole", "RankChannel", "RankRollouts", "launch_role", "rollout_rank_main"]

TRAINER = 0
"""The training process's rank in the launch."""

_CONTROL = 1  # trainer -> rollout ranks: job, weights, stop
_RESULTS = 2  # rollout ranks -> trainer: batches, end, errors


# --------------------------------------------------------------------------------------------
# Roles and the channel
# --------------------------------------------------------------------------------------------


class RankChannel:
    """A gloo process group over every process of the launch, apart from the default group (which
    stays free for training), with object and tensor messages between two ranks."""

    def __init__(self, rank: int, world: int, timeout_s: float = 86400.0) -> None:
        import torch.distributed as dist

        host = os.environ.get("MASTER_ADDR", "127.0.0.1")
        port = int(os.environ.get("MASTER_PORT", "29500"))
        timeout = datetime.timedelta(seconds=timeout_s)
        agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"
        store = dist.TCPStore(
            host,
            port,
            world,
            is_master=rank == 0 and not agent_store,
            timeout=timeout,
            wait_for_workers=False,
        )
        self.rank, self.world = rank, world
        self.group = dist.ProcessGroupGloo(
            dist.PrefixStore("agent-r1/async-ranks", store), rank, world, timeout
        )

    def send_object(self, obj: Any, dst: int, tag: int) -> None:
        payload = torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8)
        self.group.send([torch.tensor([payload.numel()], dtype=torch.int64)], dst, tag).wait()
        self.group.send([payload], dst, tag).wait()

    def recv_object(self, src: int, tag: int) -> Any:
        size = torch.zeros(1, dtype=torch.int64)
        self.group.recv([size], src, tag).wait()
        payload = torch.empty(int(size[0]), dtype=torch.uint8)
        self.group.recv([payload], src, tag).wait()
        return pickle.loads(payload.numpy().tobytes())

    def send_tensors(self, tensors: list[torch.Tensor], dst: int, tag: int) -> None:
        for tensor in tensors:
            self.group.send([tensor], dst, tag).wait()

    def recv_tensors(self, into: list[torch.Tensor], src: int, tag: int) -> None:
        for tensor in into:
            self.group.recv([tensor], src, tag).wait()


@dataclass
class LaunchRole:
    """What this process of a ``rollout.async_worker: ranks`` launch does."""

    rank: int
    world: int
    local_rank: int
    channel: RankChannel

    @property
    def trains(self) -> bool:
        return self.rank == TRAINER

    @property
    def rollout_ranks(self) -> list[int]:
        return [rank for rank in range(self.world) if rank != TRAINER]


def launch_role(config: RunConfig) -> LaunchRole | None:
    """This process's role when the run asks for ``rollout.async_worker: ranks`` (None
    otherwise): checks the launch, builds the channel, and makes this process a single process to
    accelerate (see the module docstring). Every process of the launch must call it."""
    rollout = config.rollout
    if rollout.mode != "async" or rollout.async_worker != "ranks":
        return None
    world = int(os.environ.get("WORLD_SIZE", "1"))
    wanted = rollout.rollout_processes
    if world < 2 or (wanted is not None and world != wanted + 1):
        expected = 2 if wanted is None else wanted + 1
        raise AgentR1Error(
            f"rollout.async_worker ranks trains on one process and rolls out on the others, but {world} "
            f"process(es) were launched: launch {expected} (e.g. torchrun --nproc_per_node {expected} -m "
            "agent_r1.cli train run.yaml ...), or use rollout.async_worker: thread or process"
        )
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    channel = RankChannel(rank, world)
    if torch.cuda.is_available():  # each process on the GPU of its local rank
        torch.cuda.set_device(local_rank % torch.cuda.device_count())
    for name in ("LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK", "ROLE_WORLD_SIZE"):
        os.environ.pop(name, None)
    os.environ["WORLD_SIZE"], os.environ["RANK"] = "1", "0"
    return LaunchRole(rank, world, local_rank, channel)


# --------------------------------------------------------------------------------------------
# The trainer's side
# --------------------------------------------------------------------------------------------


class RankRollouts:
    """The trainer's end of ``rollout.async_worker: ranks`` (see the module docstring)."""

    def __init__(self, session: Session, role: LaunchRole) -> None:
        if session.stream is None:
            raise AgentR1Error("asynchronous rollouts need a training session (its task stream)")
        self.session = session
        self.role = role
        self.max_staleness = session.config.rollout.max_staleness
        self.start = session.step
        self.ranks = role.rollout_ranks
        self._positions: dict[int, Any] = {self.start: session.stream.state()}
        self._batches: dict[int, tuple[Batch, Any, float, float]] = {}
        self._errors: list[BaseException] = []
        self._ended: dict[int, str] = {}
        """How each rollout rank said it ended."""
        self._arrived = threading.Condition()
        self._outbox: queue.Queue[tuple[str, Any] | None] = queue.Queue()
        self.push_s = 0.0
        self.send_s = 0.0
        self._started = time.perf_counter()
        job = {
            "start": self.start,
            "stream": session.stream.state(),
            "steps": session.config.trainer.steps,
            "ranks": self.ranks,
        }
        self._outbox.put(("job", job))
        self._stage(session.unwrapped, session.step)  # the rollouts start from the trainer's weights
        self._sender = threading.Thread(target=self._send_loop, name="agent-r1-weights-sender", daemon=True)
        self._sender.start()
        self._receivers = [
            threading.Thread(
                target=self._receive_loop, args=(rank,), name=f"agent-r1-results-{rank}", daemon=True
            )
            for rank in self.ranks
        ]
        for thread in self._receivers:
            thread.start()

    def _stage(self, model: torch.nn.Module, version: int) -> None:
        started = time.perf_counter()
        with torch.no_grad():
            tensors = [t.detach().to("cpu", copy=True).contiguous() for t in model.state_dict().values()]
        self._outbox.put(("weights", (version, tensors)))
        self.push_s += time.perf_counter() - started

    def _send_loop(self) -> None:
        channel = self.role.channel
        while (message := self._outbox.get()) is not None:
            kind, payload = message
            started = time.perf_counter()
            try:
                for rank in self.ranks:
                    if kind == "weights":
                        version, tensors = payload
                        channel.send_object(("weights", version, len(tensors)), rank, _CONTROL)
                        channel.send_tensors(tensors, rank, _CONTROL)
                    else:
                        channel.send_object((kind, payload), rank, _CONTROL)
            except BaseException as exc:
                with self._arrived:
                    self._errors.append(RuntimeError(f"sending {kind} to the rollout ranks failed: {exc}"))
                    self._arrived.notify_all()
                return
            if kind == "weights":
                self.send_s += time.perf_counter() - started

    def _receive_loop(self, rank: int) -> None:
        channel = self.role.channel
        try:
            while True:
                kind, batch, payload = channel.recv_object(rank, _RESULTS)
                with self._arrived:
                    if kind == "batch":
                        self._batches[batch] = (*payload, time.perf_counter())
                    elif kind == "error":
                        self._errors.append(RuntimeError(f"rollout rank {rank}: {payload}"))
                    else:  # end
                        self._ended[rank] = str(payload)
                    self._arrived.notify_all()
                if kind != "batch":
                    return
        except BaseException as exc:
            with self._arrived:
                self._errors.append(RuntimeError(f"receiving from rollout rank {rank} failed: {exc}"))
                self._arrived.notify_all()

    def take(self, update: int) -> Batch:
        """The batch for ``update`` (blocks until it arrives), with the ``async/`` metrics."""
        started = time.perf_counter()
        with self._arrived:
            while update not in self._batches and not self._errors:
                self._arrived.wait(timeout=1.0)
            if update not in self._batches:
                raise self._errors[0]
            result, stream, idle_s, arrived = self._batches.pop(update)
            queued = len(self._batches)
        waited = time.perf_counter() - started
        self._positions[update + 1] = stream
        wall = max(time.perf_counter() - self._started, 1e-9)
        out = _with_metrics(result, update, self.max_staleness, waited, queued, idle_s / wall, self.push_s)
        out[2]["async/batch_age_s"] = time.perf_counter() - arrived
        out[2]["async/weight_send_s"] = self.send_s
        self.push_s = self.send_s = 0.0
        self._started = time.perf_counter()
        return out

    def pushed(self, model: torch.nn.Module | None, version: int) -> None:
        """Update ``version`` finished: its weights go to every rollout rank."""
        if model is not None:
            self._stage(model, version)

    def stream_state(self, update: int) -> Any:
        if update in self._positions:
            return self._positions[update]
        assert self.session.stream is not None
        return self.session.stream.state()

    def close(self, timeout_s: float = 300.0) -> None:
        """Tell the rollout ranks to stop (a batch in progress stops at its next backend call) and
        wait until each says it has ended, taking what they still send."""
        self._outbox.put(("stop", None))
        self._outbox.put(None)
        deadline = time.monotonic() + timeout_s
        with self._arrived:
            while len(self._ended) < len(self.ranks) and not self._errors and time.monotonic() < deadline:
                self._arrived.wait(timeout=1.0)
            silent = [rank for rank in self.ranks if rank not in self._ended]
        self._sender.join(timeout=max(deadline - time.monotonic(), 0.0))
        if silent:  # the launcher stops them with this process; say so rather than wait on
            import warnings

            why = f" ({self._errors[0]})" if self._errors else f" within {timeout_s:g} s"
            warnings.warn(
                f"rollout rank(s) {silent} did not say they had ended{why}; the launcher stops them "
                "when this process exits",
                RuntimeWarning,
                stacklevel=2,
            )


# --------------------------------------------------------------------------------------------
# A rollout rank
# --------------------------------------------------------------------------------------------


class _RankWeights(RolloutWeights):
    """The rollout rank's weights guard: the receiver thread stages what the trainer sent; a stop
    request ends the batch in progress at its next backend call."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__(model, version=-1)
        self.received = -1
        self.arrived = threading.Condition()

    def stage(self, tensors: dict[str, torch.Tensor], version: int) -> None:
        with self._lock:
            self._staged, self._staged_version = tensors, version
        with self.arrived:
            self.received = version
            self.arrived.notify_all()

    def stop(self) -> None:
        with self.arrived:
            super().stop()
            self.arrived.notify_all()

    def wait_for(self, version: int) -> float:
        """Block until the weights of ``version`` (or newer) have arrived; the seconds waited."""
        started = time.perf_counter()
        with self.arrived:
            while self.received < version and not self.stopped:
                self.arrived.wait()
        if self.stopped:
            raise RolloutsClosed("the trainer said stop")
        return time.perf_counter() - started


def _receive_control(channel: RankChannel, weights: _RankWeights, jobs: queue.Queue[Any]) -> None:
    names = list(weights.model.state_dict())
    shapes = {name: t for name, t in weights.model.state_dict().items()}
    try:
        while True:
            message = channel.recv_object(TRAINER, _CONTROL)
            if message[0] == "job":
                jobs.put(message[1])
            elif message[0] == "weights":
                _, version, count = message
                if count != len(names):
                    raise RuntimeError(
                        f"the trainer sent {count} weight tensors, this model has {len(names)}"
                    )
                into = [torch.empty_like(shapes[name], device="cpu") for name in names]
                channel.recv_tensors(into, TRAINER, _CONTROL)
                weights.stage(dict(zip(names, into, strict=True)), version)
            else:  # stop
                weights.stop()
                return
    except BaseException as exc:
        jobs.put(exc)
        weights.stop()


def rollout_rank_main(config: RunConfig, components: list[ResolvedComponent], role: LaunchRole) -> None:
    """A rollout rank of ``rollout.async_worker: ranks`` (see the module docstring): returns when
    the trainer says stop."""
    from agent_r1.engine.session import TaskStream, build_session

    channel = role.channel
    session = build_session(
        config, components, f"{config.output_dir}/rollout-rank-{role.rank}", training=False
    )
    sending = threading.Lock()  # lanes finish in any order; one message at a time

    def send(message: tuple[str, int, Any]) -> None:
        with sending:
            channel.send_object(message, TRAINER, _RESULTS)

    try:
        session.stream = TaskStream(session.dataset.load("train"), config.seed)
        weights = _RankWeights(session.unwrapped)
        assert session.source is not None
        session.source.engine.weights = weights  # type: ignore[attr-defined]
        jobs: queue.Queue[Any] = queue.Queue()
        threading.Thread(
            target=_receive_control, args=(channel, weights, jobs), name="agent-r1-control", daemon=True
        ).start()
        job = jobs.get()
        if isinstance(job, BaseException):
            raise job
        session.stream.restore(job["stream"])
        ended = "every batch of the run rolled out"
        try:
            _roll_out_batches(session, weights, job, job["ranks"].index(role.rank), send)
            weights.wait_for(10**12)  # until the trainer says stop
        except RolloutsClosed as stop:  # the trainer's stop: it ends a batch in progress too
            ended = str(stop)
        send(("end", -1, ended))
    except BaseException as exc:
        import traceback

        send(("error", -1, f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))
        raise
    finally:
        session.close()


def _roll_out_batches(
    session: Session, weights: _RankWeights, job: dict[str, Any], me: int, send: Any
) -> None:
    """This rank's batches of the run, each started under the capacity rule; up to
    ``rollout.async_batches`` at once (default ``max_staleness + 1``), each on a lane of its own (a
    backend over the same weights, calls taking turns), their tasks drawn in order here: as
    :class:`~agent_r1.engine.asynchrony.AsyncRollouts` does in one process."""
    from agent_r1.engine.collect import collect, my_tasks

    config = session.config
    eta, count = config.rollout.max_staleness, len(job["ranks"])
    lanes = rollout_lanes(session, session.source, session.backend, weights)
    free: queue.Queue[int] = queue.Queue()
    for lane in range(len(lanes)):
        free.put(lane)
    failures: list[BaseException] = []
    workers: list[threading.Thread] = []

    def roll_out(batch: int, lane: int, tasks: Any, stream: Any, idle: float) -> None:
        source, backend = lanes[lane]
        try:
            with weights.generating():  # the newest weights before the batch starts
                pass
            result = collect(session, batch, source=source, version=weights.version, tasks=tasks)
            result[2].update(backend.step_metrics())
            result[2]["async/lanes"] = float(len(lanes))
            send(("batch", batch, (result, stream if stream is not None else session.stream.state(), idle)))
        except BaseException as exc:
            failures.append(exc)
        finally:
            free.put(lane)

    assert session.stream is not None
    for batch in range(job["start"], job["steps"]):
        if (batch - job["start"]) % count != me:
            session.stream.take(config.trainer.tasks_per_step)  # another rank's tasks
            continue
        idle = weights.wait_for(batch - eta)
        waited = time.perf_counter()
        lane = free.get()
        idle += time.perf_counter() - waited
        if failures:
            break
        if len(lanes) == 1:  # one batch at a time: it draws its own tasks
            roll_out(batch, lane, None, None, idle)
            continue
        tasks = my_tasks(session)
        worker = threading.Thread(
            target=roll_out, args=(batch, lane, tasks, session.stream.state(), idle), daemon=True
        )
        workers.append(worker)
        worker.start()
    for worker in workers:
        worker.join()
    if failures:
        raise failures[0]
