"""Checkpoint/resume: a run killed with SIGKILL and resumed ends with the same metrics as an
uninterrupted run; corrupt checkpoints are detected and skipped."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from trainer_helpers import toy_config, write_config, write_tiny_checkpoint, write_toy_plugin

from agent_r1.engine.artifacts import checkpoint as ckpt

TIMING = ("time/", "perf/", "memory/")  # measurements of the machine, not results


def _train(config_path: Path, plugin_dir: Path, *extra: str, delay: float = 0.0) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "PYTHONPATH": str(plugin_dir),
        "AGENT_R1_STRICT_PLUGINS": "1",
        "TOY_STEP_DELAY": str(delay),
    }
    command = [sys.executable, "-m", "agent_r1.cli", "train", str(config_path), *extra]
    return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def _metrics(run_dir: Path) -> list[dict[str, float]]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if not k.startswith(TIMING)} for line in lines]


@pytest.mark.slow
def test_sigkill_and_resume_matches_uninterrupted_run(tmp_path: Path) -> None:
    model_dir = write_tiny_checkpoint(tmp_path / "model")
    plugin_dir = write_toy_plugin(tmp_path / "plugin")
    steps = 6
    common = {
        "trainer": {
            "steps": steps,
            "tasks_per_step": 2,
            "micro_batch_size": 4,
            "lr": 3e-3,
            "checkpoint_every": 1,
        }
    }

    reference_dir = tmp_path / "reference"
    reference_cfg = write_config(tmp_path / "reference.yaml", toy_config(model_dir, reference_dir, **common))
    done = _train(reference_cfg, plugin_dir)
    output = done.communicate(timeout=300)[0].decode()
    assert done.returncode == 0, output

    killed_dir = tmp_path / "killed"
    killed_cfg = write_config(tmp_path / "killed.yaml", toy_config(model_dir, killed_dir, **common))
    victim = _train(killed_cfg, plugin_dir, delay=0.4)
    checkpoints = killed_dir / "checkpoints"
    deadline = time.monotonic() + 240
    while not (checkpoints.is_dir() and any(p.name.startswith("step_00000") for p in checkpoints.iterdir())):
        assert victim.poll() is None, victim.communicate()[0].decode()
        assert time.monotonic() < deadline, "no checkpoint appeared"
        time.sleep(0.05)
    # kill at a random moment of the next steps (each lasts at least 0.4 s, the run 6 steps)
    time.sleep(random.Random().uniform(0.0, 1.5))
    victim.send_signal(signal.SIGKILL)
    victim.communicate(timeout=60)
    assert not (killed_dir / "summary.json").exists(), "the run finished before it was killed"

    resumed = _train(killed_cfg, plugin_dir, "--resume")
    output = resumed.communicate(timeout=300)[0].decode()
    assert resumed.returncode == 0, output

    reference, after_resume = _metrics(reference_dir), _metrics(killed_dir)
    assert [m["step"] for m in after_resume] == list(range(1, steps + 1))
    assert len(reference) == len(after_resume)
    for expected, got in zip(reference, after_resume, strict=False):
        assert expected.keys() == got.keys()
        for key in expected:
            assert got[key] == pytest.approx(expected[key], rel=1e-5, abs=1e-6), (expected["step"], key)
    final_a = torch.load(
        ckpt.latest_checkpoint(reference_dir / "checkpoints") / "state.pt", weights_only=False
    )
    final_b = torch.load(ckpt.latest_checkpoint(checkpoints) / "state.pt", weights_only=False)
    for name, tensor in final_a["model"].items():
        assert torch.allclose(tensor, final_b["model"][name], atol=1e-6), name


def test_corrupt_checkpoint_falls_back_to_previous(tmp_path: Path) -> None:
    root = tmp_path / "checkpoints"
    for step in (1, 2, 3):
        ckpt.save_checkpoint(
            root, step, {"step": step, "w": torch.full((4,), float(step))}, {"seed": 0}, keep=5
        )
    assert ckpt.latest_checkpoint(root) == root / "step_000003"

    # a bit flip in the newest one
    state = root / "step_000003" / "state.pt"
    data = bytearray(state.read_bytes())
    data[len(data) // 2] ^= 0xFF
    state.write_bytes(bytes(data))
    with pytest.warns(ckpt.CheckpointWarning, match="step_000003.*checksum"):
        assert ckpt.latest_checkpoint(root) == root / "step_000002"

    # a partial one (no manifest: the process died while writing)
    (root / "step_000002" / "manifest.json").unlink()
    with pytest.warns(ckpt.CheckpointWarning, match="no manifest"):
        best = ckpt.latest_checkpoint(root)
    assert best == root / "step_000001"
    assert ckpt.load_checkpoint(best)["step"] == 1
    from agent_r1.errors import AgentR1Error

    with pytest.raises(AgentR1Error, match="not usable"):
        ckpt.load_checkpoint(root / "step_000003")


def test_save_is_atomic_and_prunes(tmp_path: Path) -> None:
    root = tmp_path / "checkpoints"
    (root / "step_000009.tmp-1234").mkdir(parents=True)  # a leftover of a killed writer
    for step in range(1, 5):
        ckpt.save_checkpoint(root, step, {"step": step}, {}, keep=2)
    assert sorted(p.name for p in root.iterdir()) == ["step_000003", "step_000004"]


def test_a_fresh_run_refuses_a_directory_that_holds_run_files(tmp_path: Path) -> None:
    """Checkpoints or not: any run file (here only a metrics log) marks the directory as taken, and
    the advice names --resume; a resume with a changed config is refused unless allowed."""
    from agent_r1.errors import AgentR1Error
    from agent_r1.run.rundir import check_run_dir

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    check_run_dir(run_dir, {"seed": 0}, resume=False, allow_config_change=False)  # empty: fine
    (run_dir / "metrics.jsonl").write_text("")
    with pytest.raises(AgentR1Error, match=r"already holds a run \(metrics.jsonl\).*--resume"):
        check_run_dir(run_dir, {"seed": 0}, resume=False, allow_config_change=False)
    (run_dir / "config.json").write_text(json.dumps({"seed": 0, "trainer": {"lr": 0.1}}))
    check_run_dir(run_dir, {"seed": 0, "trainer": {"lr": 0.1}}, resume=True, allow_config_change=False)
    changed = {"seed": 0, "trainer": {"lr": 0.2}}
    with pytest.raises(AgentR1Error, match=r"trainer.lr: 0.1 -> 0.2(.|\n)*--allow-config-change"):
        check_run_dir(run_dir, changed, resume=True, allow_config_change=False)
    check_run_dir(run_dir, changed, resume=True, allow_config_change=True)


def test_a_section_added_by_a_newer_version_is_no_change_at_its_defaults(tmp_path: Path) -> None:
    """A run started before the config had a section (here ``health``, and a new field of
    ``trainer``) resumes when the section holds its defaults; a value the user chose is a change."""
    from agent_r1.config import HealthConfig, TrainerConfig
    from agent_r1.errors import AgentR1Error
    from agent_r1.run.rundir import check_run_dir

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    trainer = TrainerConfig().model_dump(mode="json")
    older_trainer = {k: v for k, v in trainer.items() if k != "skip_idle_rows"}
    (run_dir / "config.json").write_text(json.dumps({"seed": 0, "trainer": older_trainer}))
    health = HealthConfig().model_dump(mode="json")
    now = {"seed": 0, "trainer": trainer, "health": health}
    check_run_dir(run_dir, now, resume=True, allow_config_change=False)
    with pytest.raises(AgentR1Error, match=r"health: \"<unset>\" -> \{\"enabled\": false"):
        check_run_dir(
            run_dir, {**now, "health": {**health, "enabled": False}}, resume=True, allow_config_change=False
        )
    flipped = {**trainer, "skip_idle_rows": not trainer["skip_idle_rows"]}
    with pytest.raises(AgentR1Error, match=r"trainer\.skip_idle_rows"):
        check_run_dir(run_dir, {**now, "trainer": flipped}, resume=True, allow_config_change=False)


def _wait_for_metrics(run_dir: Path, process: subprocess.Popen[bytes], lines: int) -> None:
    deadline = time.monotonic() + 240
    path = run_dir / "metrics.jsonl"
    while not (path.exists() and len(path.read_text().splitlines()) >= lines):
        assert process.poll() is None, process.communicate()[0].decode()
        assert time.monotonic() < deadline, "the run made no progress"
        time.sleep(0.05)


@pytest.mark.slow
def test_sigterm_checkpoints_at_the_next_step_and_resume_matches(tmp_path: Path) -> None:
    """SIGTERM mid-run: the step in progress finishes, a checkpoint is written, the run says so
    and exits 143; --resume then ends exactly where an uninterrupted run ends."""
    model_dir = write_tiny_checkpoint(tmp_path / "model")
    plugin_dir = write_toy_plugin(tmp_path / "plugin")
    trainer = {"steps": 5, "tasks_per_step": 2, "micro_batch_size": 4, "lr": 3e-3, "checkpoint_every": 0}
    reference_dir = tmp_path / "reference"
    reference_cfg = write_config(tmp_path / "ref.yaml", toy_config(model_dir, reference_dir, trainer=trainer))
    done = _train(reference_cfg, plugin_dir)
    assert done.wait(timeout=300) == 0, done.communicate()[0].decode()

    run_dir = tmp_path / "stopped"
    config = write_config(tmp_path / "stopped.yaml", toy_config(model_dir, run_dir, trainer=trainer))
    victim = _train(config, plugin_dir, delay=0.5)
    _wait_for_metrics(run_dir, victim, 1)
    victim.send_signal(signal.SIGTERM)
    output = victim.communicate(timeout=120)[0].decode()
    assert victim.returncode == 128 + signal.SIGTERM, output
    stopped_at = len(_metrics(run_dir))
    assert 1 <= stopped_at < 5, output
    assert f"interrupted (SIGTERM) at step {stopped_at}; checkpoint written; continue with --resume" in output
    assert "Traceback" not in output and "error:" not in output
    assert ckpt.latest_checkpoint(run_dir / "checkpoints") == ckpt.checkpoint_dir(
        run_dir / "checkpoints", stopped_at
    )
    assert "interrupted (SIGTERM)" in (run_dir / "run.log").read_text()

    resumed = _train(config, plugin_dir, "--resume")
    output = resumed.communicate(timeout=300)[0].decode()
    assert resumed.returncode == 0, output
    assert f"--resume: continuing from {ckpt.checkpoint_dir(run_dir / 'checkpoints', stopped_at)}" in output
    reference, after = _metrics(reference_dir), _metrics(run_dir)
    assert [m["step"] for m in after] == [1, 2, 3, 4, 5]
    for expected, got in zip(reference, after, strict=True):
        for key in expected:
            assert got[key] == pytest.approx(expected[key], rel=1e-5, abs=1e-6), (expected["step"], key)


@pytest.mark.slow
def test_a_second_sigint_stops_at_once(tmp_path: Path) -> None:
    model_dir = write_tiny_checkpoint(tmp_path / "model")
    plugin_dir = write_toy_plugin(tmp_path / "plugin")
    trainer = {"steps": 50, "tasks_per_step": 2, "micro_batch_size": 4, "checkpoint_every": 0}
    run_dir = tmp_path / "run"
    config = write_config(tmp_path / "run.yaml", toy_config(model_dir, run_dir, trainer=trainer))
    victim = _train(config, plugin_dir, delay=5.0)  # each step then waits 5 s in an observer
    _wait_for_metrics(run_dir, victim, 1)
    victim.send_signal(signal.SIGINT)
    time.sleep(0.3)
    started = time.monotonic()
    victim.send_signal(signal.SIGINT)
    output = victim.communicate(timeout=60)[0].decode()
    assert time.monotonic() - started < 4.0, "the second signal did not stop the run at once"
    assert victim.returncode == 128 + signal.SIGINT, output
    assert "finishing the current step, then writing a checkpoint" in output
    assert "interrupted again (SIGINT)" in output and "--resume" in output
