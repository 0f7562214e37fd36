"""Asynchronous rollouts (``rollout.mode: async``): the capacity rule under random durations, sync
equality at ``max_staleness: 0``, a weight sync in the middle of an episode with the real ``hf``
backend, and whole training runs with their ``async/`` metrics and checkpoints."""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from trainer_helpers import toy_config

from agent_r1.config import RunConfig, validate_components
from agent_r1.engine import train_step
from agent_r1.engine.asynchrony import (
    AsyncRollouts,
    RolloutsClosed,
    RolloutWeights,
    StalenessGate,
    staleness_metrics,
)
from agent_r1.mdp import TokenSource, Trajectory

# ---------------------------------------------------------------------------------------------
# The capacity rule, with random durations
# ---------------------------------------------------------------------------------------------


def _fake_session(max_staleness: int, steps: int) -> Any:
    """What AsyncRollouts reads of a session when it is given its own ``produce`` (the scheduling
    alone; the real session is tested below)."""
    config = SimpleNamespace(
        rollout=SimpleNamespace(max_staleness=max_staleness), trainer=SimpleNamespace(steps=steps)
    )
    return SimpleNamespace(config=config, step=0, stream=None)


@settings(max_examples=12, deadline=None)
@given(
    eta=st.sampled_from([0, 1, 2, 4]),
    steps=st.integers(1, 7),
    seed=st.integers(0, 10_000),
    lanes=st.integers(1, 3),
)
def test_no_trained_trajectory_exceeds_the_staleness_bound_and_nothing_is_lost(
    eta: int, steps: int, seed: int, lanes: int
) -> None:
    """Random rollout and update durations, up to ``lanes`` batches rolled out at once."""
    rng = random.Random(seed)
    rollout_times = [rng.uniform(0, 0.004) for _ in range(steps)]
    train_times = [rng.uniform(0, 0.004) for _ in range(steps)]
    pushed = [0]  # the trainer's version, as the rollout sees it
    produced: list[tuple[int, int]] = []
    lock = threading.Lock()

    busy: set[int] = set()

    def produce(batch: int, lane: int, tasks: Any) -> Any:
        with lock:
            assert lane not in busy and 0 <= lane < lanes  # a lane runs one batch at a time
            busy.add(lane)
            version = pushed[0]
            produced.append((batch, version))
        trajectories = []
        for i in range(3):  # episodes of several turns: later turns may see newer weights
            trajectory = Trajectory(id=f"{batch}/{i}", task_id="t", policy_version=version)
            for turn in range(3):
                trajectory.append(TokenSource.POLICY, turn, [1], [0.0])
                with lock:
                    trajectory.turn_versions[turn] = max(version, pushed[0] if turn else version)
                time.sleep(rollout_times[batch] / 3)
            trajectories.append(trajectory)
        with lock:
            busy.discard(lane)
        return trajectories, [], {}

    producer = AsyncRollouts(_fake_session(eta, steps), produce=produce, lanes=lanes)
    try:
        for update in range(steps):
            trajectories, _failed, metrics = producer.take(update)
            assert [t.id for t in trajectories] == [f"{update}/{i}" for i in range(3)]  # in order, whole
            assert metrics["async/staleness_max"] <= eta
            assert all(update - t.versions()[0] <= eta for t in trajectories)
            time.sleep(train_times[update])
            with lock:
                pushed[0] = update + 1
            producer.pushed(None, update + 1)
    finally:
        producer.close()
    assert sorted(batch for batch, _ in produced) == list(range(steps))  # each batch once, none extra
    assert all(batch - version <= eta for batch, version in produced)
    if eta == 0:
        assert all(batch == version for batch, version in produced)  # sync: after the previous update


def test_the_gate_holds_a_batch_until_its_update_is_close_enough() -> None:
    gate = StalenessGate(1)
    assert gate.admit(1) < 0.1  # one ahead: allowed at once
    opened = threading.Event()

    def later() -> None:
        gate.admit(2)
        opened.set()

    thread = threading.Thread(target=later)
    thread.start()
    assert not opened.wait(0.05)  # two ahead: waits for update 1
    gate.advance(1)
    assert opened.wait(1.0)
    thread.join()
    gate.close()
    with pytest.raises(RuntimeError, match="closed"):
        gate.admit(10)


def test_staleness_metrics_count_lags_and_partial_rollouts() -> None:
    trajectories = []
    for versions in ([3, 3], [2, 3], [3]):
        trajectory = Trajectory(id=str(len(trajectories)), task_id="t", policy_version=versions[0])
        for turn, version in enumerate(versions):
            trajectory.append(TokenSource.POLICY, turn, [1])
            trajectory.turn_versions[turn] = version
        trajectories.append(trajectory)
    metrics = staleness_metrics(trajectories, 4, 2)
    assert metrics["async/staleness_max"] == 2 and metrics["async/staleness_mean"] == pytest.approx(4 / 3)
    assert (metrics["async/staleness_0"], metrics["async/staleness_1"], metrics["async/staleness_2"]) == (
        0,
        2,
        1,
    )
    assert metrics["async/partial_share"] == pytest.approx(1 / 3)


# ---------------------------------------------------------------------------------------------
# A weight sync in the middle of an episode, real backend
# ---------------------------------------------------------------------------------------------


def test_a_push_waits_for_no_backend_call_and_closing_ends_the_next_one() -> None:
    model = torch.nn.Linear(2, 2)
    weights = RolloutWeights(model, version=0)
    inside, leave = threading.Event(), threading.Event()

    def call() -> None:
        with weights.generating():
            inside.set()
            leave.wait(5)

    thread = threading.Thread(target=call)
    thread.start()
    assert inside.wait(5)
    pusher = threading.Thread(target=weights.push, args=(torch.nn.Linear(2, 2), 1))
    pusher.start()
    pusher.join(2)
    assert not pusher.is_alive() and not leave.is_set()  # staged while the call still ran
    leave.set()
    thread.join()
    with weights.generating() as version:  # the next call applies it
        assert version == 1 and weights.applied == 1
    weights.stop()
    with pytest.raises(RolloutsClosed), weights.generating():
        pass


def test_turns_after_a_mid_episode_weight_sync_come_from_the_new_weights(tiny_tokenizer: Any) -> None:
    """Two-turn episodes on the ``hf`` backend over a rollout copy: the new weights are pushed
    while turn 0's observation is pending; turn 1's tokens are then sampled from them (their
    recomputed log-probabilities under the new model match, under the old one they do not) and
    the trajectory records versions 0 and 1."""
    from agent_r1.builtins.hf_backend import HFBackend
    from agent_r1.contracts import SamplingParams
    from agent_r1.engine.learner.batch import collate
    from agent_r1.engine.learner.packing import no_grad_logprobs
    from agent_r1.mdp import Task
    from agent_r1.rollout.loop import RolloutEngine
    from agent_r1.testing.models import tiny_model
    from agent_r1.testing.toy import ToyMultiTurnEnv

    old = tiny_model(tiny_tokenizer, seed=1)
    new = tiny_model(tiny_tokenizer, seed=2)
    weights = RolloutWeights(tiny_model(tiny_tokenizer, seed=1), version=0)

    class SyncingEnv(ToyMultiTurnEnv):
        async def step(self, action: Any, turn: int) -> Any:
            if turn == 0:
                weights.push(new, 1)  # the trainer finished update 1 meanwhile
            return await super().step(action, turn)

    backend = HFBackend(model=weights.model, tokenizer=tiny_tokenizer)
    engine = RolloutEngine(
        backend,
        tiny_tokenizer,
        lambda: SyncingEnv({"turns": 2}),
        max_turns=2,
        max_new_tokens=8,
        max_context=256,
        sampling=SamplingParams(temperature=1.0),
    )
    engine.weights = weights
    tasks = [Task(id=f"t{i}", messages=[{"role": "user", "content": f"go {i}"}]) for i in range(2)]
    trajectories = engine.collect(tasks, 2, seed=3)
    assert all(t.turn_versions == {0: 0, 1: 1} for t in trajectories)
    assert all(t.versions() == [0, 1] for t in trajectories)
    batch = collate(trajectories, tiny_tokenizer.pad_token_id)
    turn = torch.zeros_like(batch.loss_mask, dtype=torch.long)
    for row, trajectory in enumerate(trajectories):
        position = 0
        for segment in trajectory.segments:
            turn[row, position : position + len(segment.token_ids)] = segment.turn
            position += len(segment.token_ids)
    first, second = batch.loss_mask & (turn == 0), batch.loss_mask & (turn == 1)
    under_old = no_grad_logprobs(old, batch, 1.0, 8)
    under_new = no_grad_logprobs(new, batch, 1.0, 8)
    assert (under_old - batch.rollout_logprobs)[first].abs().max() < 1e-4
    assert (under_new - batch.rollout_logprobs)[second].abs().max() < 1e-4
    assert (under_old - batch.rollout_logprobs)[second].abs().max() > 1e-2  # not the old weights'


# ---------------------------------------------------------------------------------------------
# Whole runs
# ---------------------------------------------------------------------------------------------


def _session(config: dict[str, Any], registry: Any) -> Any:
    from agent_r1.engine import build_session

    run = RunConfig.model_validate(config)
    return build_session(run, validate_components(run, registry), Path(run.output_dir), registry=registry)


def _multi_turn(model_dir: Path, run_dir: Path, **rollout: Any) -> dict[str, Any]:
    return toy_config(
        model_dir,
        run_dir,
        environment={"name": "toy_multi_turn", "turns": 2},
        rollout={"group_size": 2, "max_turns": 2, "max_new_tokens": 6, "max_context": 256, **rollout},
        trainer={"steps": 3, "tasks_per_step": 2, "micro_batch_size": 4, "lr": 3e-2},
    )


def _content(metrics: dict[str, float]) -> dict[str, float]:
    return {k: v for k, v in metrics.items() if not k.startswith(("time/", "perf/", "async/", "memory/"))}


def test_max_staleness_zero_is_sync_mode_token_for_token(
    registry: Any, model_dir: Path, tmp_path: Path
) -> None:
    runs = {}
    for mode in ("sync", "async"):
        session = _session(_multi_turn(model_dir, tmp_path / mode, mode=mode, max_staleness=0), registry)
        try:
            runs[mode] = [train_step(session) for _ in range(3)]
        finally:
            session.close()
    for sync, asynchronous in zip(runs["sync"], runs["async"], strict=True):
        assert [t.token_ids for t in sync.trajectories] == [t.token_ids for t in asynchronous.trajectories]
        assert [t.versions() for t in sync.trajectories] == [t.versions() for t in asynchronous.trajectories]
        # the rollout thread's kernels may split float sums differently: noise, not a difference
        assert _content(sync.metrics) == pytest.approx(_content(asynchronous.metrics), rel=1e-5, abs=1e-6)
        assert asynchronous.metrics["async/staleness_max"] == 0


def test_async_run_trains_within_its_bound_and_checkpoints_the_untrained_tasks(
    registry: Any, model_dir: Path, tmp_path: Path
) -> None:
    session = _session(_multi_turn(model_dir, tmp_path / "a", mode="async", max_staleness=1), registry)
    sync = _session(_multi_turn(model_dir, tmp_path / "s"), registry)
    try:
        results = [train_step(session) for _ in range(3)]
        synced = [train_step(sync) for _ in range(3)]
        for result, same in zip(results, synced, strict=True):
            metrics = result.metrics
            # two batches rolled out at once (max_staleness + 1), each on the tasks sync mode trains
            assert metrics["async/lanes"] == 2
            assert [t.task_id for t in result.trajectories] == [t.task_id for t in same.trajectories]
            assert metrics["async/staleness_max"] <= 1
            assert metrics["async/staleness_0"] + metrics["async/staleness_1"] == len(result.trajectories)
            for name in ("trainer_idle_share", "rollout_idle_share", "queue_length", "weight_push_s"):
                assert f"async/{name}" in metrics
            assert all(t.turn_versions for t in result.trajectories)
        # the task stream's position is that of the trained batches, not of the ones ahead
        assert session.state_dict()["data"] == sync.state_dict()["data"]
    finally:
        session.close()
        sync.close()


def test_the_next_batch_starts_while_the_previous_one_finishes(
    registry: Any, model_dir: Path, tmp_path: Path
) -> None:
    """Lanes: batch 1 (allowed at once under ``max_staleness: 1``) starts before batch 0 ends;
    with ``async_batches: 1`` it waits for it."""
    events: dict[int, list[tuple[str, int]]] = {}
    for lanes in (1, 2):
        config = _multi_turn(
            model_dir, tmp_path / str(lanes), mode="async", max_staleness=1, async_batches=lanes
        )
        config["environment"]["latency_s"] = 0.05  # every observation waits, like a tool
        session = _session(config, registry)
        log: list[tuple[str, int]] = []

        class Recording(AsyncRollouts):
            def _collect(self, batch: int, lane: int, tasks: Any, log: list[Any] = log) -> Any:
                log.append(("start", batch))
                try:
                    return super()._collect(batch, lane, tasks)
                finally:
                    log.append(("end", batch))

        try:
            session.async_rollouts = Recording(session)
            for _ in range(2):
                train_step(session)
        finally:
            session.close()
        events[lanes] = log
    assert events[1][:3] == [("start", 0), ("end", 0), ("start", 1)]
    assert events[2][:2] == [("start", 0), ("start", 1)]


def test_a_worker_process_needs_the_engine_and_the_hf_backend(model_dir: Path, tmp_path: Path) -> None:
    config = _multi_turn(
        model_dir, tmp_path / "x", mode="async", backend={"name": "vllm"}, async_worker="process"
    )
    with pytest.raises(ValueError, match=r"rollout\.async_worker 'process' runs agent-r1's own agent loop"):
        RunConfig.model_validate(config)


def test_a_backend_without_a_replica_is_refused_by_name() -> None:
    from agent_r1.engine.asynchrony import async_source, rollout_replica
    from agent_r1.errors import AgentR1Error

    class Plain:
        name = "plain"

    with pytest.raises(AgentR1Error, match=r"rollout backend 'plain' has no async_replica\(\)"):
        rollout_replica(Plain(), 0)
    with pytest.raises(AgentR1Error, match=r"rollout source 'plain' has no async_copy\(\)"):
        async_source(Plain(), None, None)


# ---------------------------------------------------------------------------------------------
# A rollout worker process
# ---------------------------------------------------------------------------------------------


def test_a_worker_process_at_staleness_zero_samples_what_sync_mode_samples(
    registry: Any, model_dir: Path, tmp_path: Path
) -> None:
    """``async_worker: process``: a spawned process with its own session (the same config,
    plugins, seeds and task order) and the trainer's weights through shared memory; at
    ``max_staleness: 0`` its trajectories are sync mode's, token for token."""
    runs = {}
    for mode in ("sync", "async"):
        config = _multi_turn(model_dir, tmp_path / mode, mode=mode, max_staleness=0, async_worker="process")
        session = _session(config, registry)
        try:
            runs[mode] = [train_step(session) for _ in range(3)]
        finally:
            session.close()
    for sync, worker in zip(runs["sync"], runs["async"], strict=True):
        assert [t.token_ids for t in sync.trajectories] == [t.token_ids for t in worker.trajectories]
        assert _content(sync.metrics) == pytest.approx(_content(worker.metrics), rel=1e-5, abs=1e-6)
    assert all(r.metrics["async/staleness_max"] == 0 for r in runs["async"])


def test_a_worker_process_keeps_the_bound_and_the_checkpoint_position(
    registry: Any, model_dir: Path, tmp_path: Path
) -> None:
    session = _session(_multi_turn(model_dir, tmp_path / "a", mode="async", async_worker="process"), registry)
    sync = _session(_multi_turn(model_dir, tmp_path / "s"), registry)
    try:
        for _ in range(3):
            result = train_step(session)
            train_step(sync)
            assert result.metrics["async/staleness_max"] <= 1
            assert all(t.turn_versions for t in result.trajectories)
        assert session.state_dict()["data"] == sync.state_dict()["data"]
    finally:
        session.close()
        sync.close()


def test_async_mode_is_refused_where_it_does_not_run_yet(
    registry: Any, model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from agent_r1.run.preflight import preflight

    sharded = _multi_turn(model_dir, tmp_path / "x", mode="async")
    sharded["trainer"]["sharding"] = "fsdp2"
    with pytest.raises(ValueError, match="unsharded training process"):
        RunConfig.model_validate(sharded)
    monkeypatch.setenv("WORLD_SIZE", "2")
    config = RunConfig.model_validate(_multi_turn(model_dir, tmp_path / "y", mode="async"))
    checks = preflight(config, validate_components(config, registry)).checks
    assert any(
        c.name == "distributed" and c.status == "fail" and "2 were launched" in c.message for c in checks
    )
