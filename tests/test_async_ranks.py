"""``rollout.async_worker: ranks``: ``agent-r1 train`` under ``torchrun``, rank 0 training and the
other ranks rolling out, weights and trajectories through a gloo group of their own (real CPU
processes, real rollouts of the tiny model on the multi-turn toy task).

At ``max_staleness: 0`` the run is sync mode's, step for step (the same metrics), also when every
process is killed after a checkpoint and the run resumes; at 1 with two
rollout ranks, the ranks take turns, no trained trajectory is older than the bound, every
episode is trained, and the checks refuse a launch that does not match the config before any model
loads.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from trainer_helpers import process_tree, torchrun, toy_config, write_config, write_toy_plugin

pytestmark = pytest.mark.slow
TIMING = ("time/", "perf/", "memory/", "async/", "backend/")  # the machine's figures, not results


@pytest.fixture(scope="module")
def plugin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_toy_plugin(tmp_path_factory.mktemp("plugin"))


def _config(model_dir: Path, tmp_path: Path, name: str, checkpoint_every: int = 0, **rollout: Any) -> Path:
    trainer = {"steps": 3, "tasks_per_step": 2, "micro_batch_size": 4, "lr": 3e-2}
    if checkpoint_every:
        trainer["checkpoint_every"] = checkpoint_every
    raw = toy_config(
        model_dir,
        tmp_path / name,
        environment={"name": "toy_multi_turn", "turns": 2},
        rollout={"group_size": 2, "max_turns": 2, "max_new_tokens": 6, "max_context": 256, **rollout},
        trainer=trainer,
    )
    raw["eval"] = {"num_tasks": 2, "before_training": False}
    return write_config(tmp_path / f"{name}.yaml", raw)


def _command(config: Path, plugin: Path, nproc: int, *extra: str, delay: float = 0.0) -> dict[str, Any]:
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": str(plugin),
        "AGENT_R1_STRICT_PLUGINS": "1",
        "TOY_STEP_DELAY": str(delay),
    }
    command = ["-m", "agent_r1.cli", "train", str(config), *extra]
    return {"args": torchrun(nproc, *command) if nproc else [sys.executable, *command], "env": env}


def _train(config: Path, plugin: Path, nproc: int, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        **_command(config, plugin, nproc, *extra), capture_output=True, text=True, timeout=600
    )


def _metrics(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _results(metrics: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in m.items() if not k.startswith(TIMING)} for m in metrics]


def _kill_after_checkpoint(config: Path, plugin: Path, run_dir: Path, step: int) -> None:
    """Start the launch, and SIGKILL the launcher and every process under it once the checkpoint
    of ``step`` is there."""
    victim = subprocess.Popen(
        **_command(config, plugin, 2, delay=0.5), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    checkpoint = run_dir / "checkpoints" / f"step_{step:06d}"
    deadline = time.monotonic() + 300
    while not checkpoint.is_dir():
        assert victim.poll() is None, victim.communicate()[0][-3000:]
        assert time.monotonic() < deadline, "no checkpoint appeared"
        time.sleep(0.05)
    for pid in process_tree(victim.pid):
        os.kill(pid, signal.SIGKILL)
    victim.communicate(timeout=60)
    assert not (run_dir / "summary.json").exists(), "the run finished before it was killed"


def _same(expected: list[dict[str, Any]], got: list[dict[str, Any]]) -> None:
    assert [m["step"] for m in got] == [m["step"] for m in expected]
    for want, have in zip(expected, got, strict=True):
        assert want.keys() == have.keys()
        for key, value in want.items():
            assert have[key] == pytest.approx(value, rel=1e-4, abs=1e-6), (want["step"], key)


def test_rank_rollouts_at_staleness_zero_are_sync_mode_and_resume(
    model_dir: Path, tmp_path: Path, plugin: Path
) -> None:
    sync = _train(_config(model_dir, tmp_path, "sync"), plugin, 0)
    assert sync.returncode == 0, sync.stderr[-3000:]
    options = {"mode": "async", "async_worker": "ranks", "max_staleness": 0}
    ranks = _train(_config(model_dir, tmp_path, "ranks", **options), plugin, 2)
    assert ranks.returncode == 0, ranks.stdout[-2000:] + ranks.stderr[-4000:]
    expected = _results(_metrics(tmp_path / "sync"))
    assert len(expected) == 3
    _same(expected, _results(_metrics(tmp_path / "ranks")))
    assert all(m["async/staleness_max"] == 0 for m in _metrics(tmp_path / "ranks"))
    assert not (tmp_path / "ranks" / "rollout-rank-1").exists()  # a rollout rank writes nothing

    killed = _config(model_dir, tmp_path, "killed", **options, checkpoint_every=1)
    _kill_after_checkpoint(killed, plugin, tmp_path / "killed", 1)
    resumed = _train(killed, plugin, 2, "--resume")
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-4000:]
    _same(expected, _results(_metrics(tmp_path / "killed")))


def test_two_rollout_ranks_take_turns_within_the_bound(model_dir: Path, tmp_path: Path, plugin: Path) -> None:
    config = _config(
        model_dir, tmp_path, "two", mode="async", async_worker="ranks", max_staleness=1, rollout_processes=2
    )
    run = _train(config, plugin, 3)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-4000:]
    metrics = _metrics(tmp_path / "two")
    assert len(metrics) == 3
    for m in metrics:
        assert m["async/staleness_max"] <= 1
        assert m["async/staleness_0"] + m["async/staleness_1"] == 4  # 2 tasks x 2 samples, all trained
        assert m["errors/failed_episodes"] == 0
        assert m["async/lanes"] == 2  # each rollout process runs up to max_staleness + 1 batches at once
    assert any(m["async/staleness_1"] > 0 for m in metrics[1:])  # the rollouts really ran ahead

    wrong = _train(config, plugin, 2)  # the config asks for 2 rollout processes: 3 in all
    assert wrong.returncode != 0  # torchrun's own status; each process exits with 2
    assert "exitcode  : 2" in wrong.stderr
    assert "error: preflight found 1 problem(s); nothing was loaded or created" in wrong.stderr
    assert "ranks trains on one process and rolls out on the others, but 2 process(es)" in wrong.stderr
    assert "launch 3" in wrong.stderr
