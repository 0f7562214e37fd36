"""Errors, not tracebacks: each failure a user can cause around models, tokenizers, checkpoints,
output directories and ``view`` prints ``error: ...`` (what, where, what to do), exits 2, shows no
traceback unless ``AGENT_R1_DEBUG=1``, and leaves no run directory or partial file behind. Each
test runs the real ``agent-r1`` command in a subprocess.

"Disk full" uses a real 256 KiB tmpfs where this process may mount one (root on Linux); elsewhere
it falls back to a documented simulation, a file size limit (``RLIMIT_FSIZE``) on the child
process, whose writes then fail with ``EFBIG`` (see ``storage_helpers``).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from foundation_helpers import agent_r1_command, run_cli
from storage_helpers import file_size_limit, small_tmpfs
from trainer_helpers import toy_config, write_config, write_tiny_checkpoint

from agent_r1.config import ModelConfig, RunConfig, resolved_dict
from agent_r1.engine.artifacts import checkpoint as ckpt
from agent_r1.testing import write_plugin_distribution

ENV = {"AGENT_R1_DISABLE_PLUGINS": "search,code", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("toy-site")
    write_plugin_distribution(
        root, "agent-r1-toy-plugin", files={}, entry_points={"toy": "agent_r1.testing.toy"}
    )
    return root


def agent_r1(args: list[str], site: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return run_cli(args, sites=[site], env={**ENV, **env}, isolate=False)


def _error(result: subprocess.CompletedProcess[str]) -> str:
    """stderr on one line, after checking the contract: exit 2, ``error:``, no traceback."""
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert "error:" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    return " ".join(result.stderr.split())


def _train_config(tmp_path: Path, model_dir: Path) -> tuple[Path, Path]:
    run_dir = tmp_path / "runs" / "run"
    return write_config(tmp_path / "run.yaml", toy_config(model_dir, run_dir)), run_dir


def _write_run(run_dir: Path, model_dir: Path, *, step: int = 2) -> Path:
    """A run directory with one checkpoint in the trainer's format, for the tiny model."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir))
    config = resolved_dict(RunConfig(model=ModelConfig(path=str(model_dir)), output_dir=str(run_dir)))
    state = {"step": step, "model": {k: v.detach().cpu() for k, v in model.state_dict().items()}}
    return ckpt.save_checkpoint(run_dir / "checkpoints", step, state, config)


# --------------------------------------------------------------------------------------------
# model and tokenizer files
# --------------------------------------------------------------------------------------------


def test_missing_weights(site: Path, tmp_path: Path) -> None:
    model_dir = write_tiny_checkpoint(tmp_path / "model")
    (model_dir / "model.safetensors").unlink()
    config, _ = _train_config(tmp_path, model_dir)
    message = _error(agent_r1(["train", str(config)], site))
    assert f"the model in {model_dir}" in message and "cannot be loaded: no weights" in message
    assert "point model.path at a complete model directory" in message
    assert not (tmp_path / "runs").exists(), "a failed run left a run directory"


def test_truncated_weights(site: Path, tmp_path: Path) -> None:
    model_dir = write_tiny_checkpoint(tmp_path / "model")
    weights = model_dir / "model.safetensors"
    size = weights.stat().st_size
    weights.write_bytes(weights.read_bytes()[: size - 1000])
    config, _ = _train_config(tmp_path, model_dir)
    message = _error(agent_r1(["train", str(config)], site))
    assert f"model.safetensors is truncated: {size - 1000} bytes, its header describes {size}" in message
    assert not (tmp_path / "runs").exists()


def test_a_launch_for_sharded_training_stops_before_the_model_loads(site: Path, tmp_path: Path) -> None:
    # `accelerate launch` with an FSDP configuration file sets ACCELERATE_USE_FSDP for the process;
    # agent-r1 shards itself (trainer.sharding: fsdp2), so a config left at 'none' is refused.
    model_dir = write_tiny_checkpoint(tmp_path / "model")
    config, _ = _train_config(tmp_path, model_dir)
    message = _error(agent_r1(["train", str(config)], site, ACCELERATE_USE_FSDP="true"))
    assert "launched for sharded training with FSDP (ACCELERATE_USE_FSDP=true)" in message
    assert "set trainer.sharding: fsdp2" in message and "docs/gpu.md" in message
    assert not (tmp_path / "runs").exists(), "a refused run left a run directory"
    message = _error(agent_r1(["train", str(config)], site, ACCELERATE_USE_DEEPSPEED="true"))
    assert "DeepSpeed (ACCELERATE_USE_DEEPSPEED=true), which agent-r1 does not support" in message


def test_missing_tokenizer_files(site: Path, tmp_path: Path) -> None:
    model_dir = write_tiny_checkpoint(tmp_path / "model")
    (model_dir / "tokenizer.json").unlink()
    config, _ = _train_config(tmp_path, model_dir)
    message = _error(agent_r1(["train", str(config)], site))
    assert f"cannot load the tokenizer of {model_dir}: no tokenizer files" in message
    assert "tokenizer.save_pretrained" in message
    assert not (tmp_path / "runs").exists()


def test_checkpoint_given_as_model_path_says_how_to_export_it(site: Path, tmp_path: Path) -> None:
    model_dir = write_tiny_checkpoint(tmp_path / "model")
    checkpoint = _write_run(tmp_path / "old-run", model_dir)
    config, _ = _train_config(tmp_path, checkpoint)
    message = _error(agent_r1(["train", str(config)], site))
    assert f"model.path {checkpoint} is a training checkpoint" in message
    assert f"`agent-r1 export {checkpoint} --out DIR`, then model.path=DIR" in message
    unfinished = _error(agent_r1(["train", str(_train_config(tmp_path, tmp_path / "old-run")[0])], site))
    assert "is an agent-r1 run directory without a final model" in unfinished


# --------------------------------------------------------------------------------------------
# checkpoints
# --------------------------------------------------------------------------------------------


def test_checkpoint_path_that_does_not_exist(site: Path, tmp_path: Path) -> None:
    (tmp_path / "runs" / "demo-a" / "checkpoints").mkdir(parents=True)
    missing = tmp_path / "runs" / "demo-b"
    message = _error(agent_r1(["export", str(missing), "--out", str(tmp_path / "out")], site))
    assert f"checkpoint path {missing} does not exist" in message
    assert "Run directories in" in message and "demo-a" in message
    assert "manifest" not in message
    assert not (tmp_path / "out").exists()


def test_model_checkpoint_architecture_mismatch(site: Path, tmp_path: Path) -> None:
    from agent_r1.testing.models import save_tiny_model

    model_dir = write_tiny_checkpoint(tmp_path / "model")
    _write_run(tmp_path / "run", model_dir)
    # The base model the run recorded is replaced by a narrower one.
    for path in model_dir.iterdir():
        path.unlink()
    save_tiny_model(model_dir, hidden=32)
    message = _error(agent_r1(["export", str(tmp_path / "run"), "--out", str(tmp_path / "out")], site))
    assert "model/checkpoint architecture mismatch" in message
    assert re.search(
        r"weight\(s\) of another shape \(e\.g\. \S+: checkpoint \[[\d, ]*64\], model \[[\d, ]*32\]\)", message
    )
    assert "Use the model.path and model.lora the checkpoint was trained with" in message
    assert not (tmp_path / "out").exists()


def test_corrupt_checkpoint_names_the_problem_and_the_good_one_beside(site: Path, tmp_path: Path) -> None:
    model_dir = write_tiny_checkpoint(tmp_path / "model")
    _write_run(tmp_path / "run", model_dir, step=1)
    bad = _write_run(tmp_path / "run", model_dir, step=2)
    (bad / "state.pt").write_bytes((bad / "state.pt").read_bytes()[:100])
    message = _error(agent_r1(["export", str(bad), "--out", str(tmp_path / "out")], site))
    assert f"checkpoint {bad} is not usable: state.pt has 100 bytes" in message
    assert "step_000001" in message


# --------------------------------------------------------------------------------------------
# output directories
# --------------------------------------------------------------------------------------------


def test_disk_full_while_exporting(site: Path, tmp_path: Path) -> None:
    model_dir = write_tiny_checkpoint(tmp_path / "model")
    _write_run(tmp_path / "run", model_dir)
    with small_tmpfs(tmp_path, size="256k") as disk:
        if disk is not None:
            out = disk / "exported"
            result = agent_r1(["export", str(tmp_path / "run"), "--out", str(out)], site)
            leftovers = sorted(p.name for p in disk.iterdir())
        else:  # the documented simulation: a 256 KiB file size limit on the child process
            out = tmp_path / "exported"
            command = [*agent_r1_command(), "export", str(tmp_path / "run"), "--out", str(out)]
            env = {**os.environ, **ENV, "PYTHONPATH": str(site)}
            result = subprocess.run(
                command, capture_output=True, text=True, env=env, preexec_fn=file_size_limit(256 * 1024)
            )
            leftovers = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".exported"))
    message = _error(result)
    assert "disk full while writing the exported model" in message
    assert "Nothing partial was kept" in message and "--out" in message
    assert leftovers == [], "a failed export left files behind"


def test_disk_full_during_a_training_run(site: Path, tmp_path: Path) -> None:
    model_dir = write_tiny_checkpoint(tmp_path / "model")
    with small_tmpfs(tmp_path, size="600k") as disk:
        if disk is None:
            pytest.skip("cannot mount a small tmpfs here (needs root on Linux)")
        config = write_config(tmp_path / "run.yaml", toy_config(model_dir, disk / "run"))
        message = _error(agent_r1(["train", str(config)], site))
        # The preflight sees it coming ("nearly full"); without it the first checkpoint hits it.
        assert "disk full while writing the checkpoint" in message or "the disk is nearly full" in message
        assert "output_dir" in message
        assert not list(disk.rglob("*.tmp-*")), "a partial checkpoint was left"


def test_disk_full_while_checkpointing_keeps_older_checkpoints(tmp_path: Path) -> None:
    with small_tmpfs(tmp_path, size="256k") as disk:
        if disk is None:
            pytest.skip("cannot mount a small tmpfs here (needs root on Linux)")
        root = disk / "checkpoints"
        ckpt.save_checkpoint(root, 1, {"step": 1}, {}, keep=2)
        with pytest.raises(ckpt.StorageError, match="disk full while writing the checkpoint of step 2"):
            ckpt.save_checkpoint(root, 2, {"step": 2, "w": torch.zeros(200_000)}, {}, keep=2)
        assert sorted(p.name for p in root.iterdir()) == ["step_000001"]
        assert ckpt.latest_checkpoint(root) == root / "step_000001"


def test_unwritable_output_directory(site: Path, tmp_path: Path) -> None:
    model_dir = write_tiny_checkpoint(tmp_path / "model")
    _write_run(tmp_path / "run", model_dir)
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    message = _error(agent_r1(["export", str(tmp_path / "run"), "--out", str(blocker / "out")], site))
    assert f"cannot write the exported model to {blocker / 'out'}" in message
    assert "Check that the directory is writable" in message
    with small_tmpfs(tmp_path, read_only=True) as read_only:
        if read_only is None:
            return  # the read-only mount needs root; the case above ran everywhere
        message = _error(agent_r1(["export", str(tmp_path / "run"), "--out", str(read_only / "out")], site))
        assert "Read-only file system" in message


# --------------------------------------------------------------------------------------------
# view
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "why"),
    [
        (b"\x89PNG\r\n\x1a\n\x00\x00\xff\xfe binary", "it holds binary data, not JSON lines"),
        (b'{"step": 0, "reward/mean": 0.5}\n', "its first record has unexpected or missing fields"),
        (b"seed: 0\nmodel: {path: x}\n", "its first line is not a JSON trajectory"),
    ],
    ids=["binary", "metrics-jsonl", "yaml"],
)
def test_view_on_a_file_that_is_not_a_trajectory_file(
    site: Path, tmp_path: Path, content: bytes, why: str
) -> None:
    path = tmp_path / "file"
    path.write_bytes(content)
    message = _error(agent_r1(["view", str(path)], site))
    assert f"{path} is not a trajectory file: {why}" in message
    assert "<run>/samples.jsonl" in message
    missing = _error(agent_r1(["view", str(tmp_path / "nope.jsonl")], site))
    assert "nope.jsonl does not exist" in missing


# --------------------------------------------------------------------------------------------
# the top-level handler, --version
# --------------------------------------------------------------------------------------------

_CRASH = """
import sys
import agent_r1.engine.reports.viewer as viewer
from agent_r1.cli import main

def crash(*args, **kwargs):
    raise KeyError("boom: a bug, not a user error")

viewer.show_trajectories = crash
main(sys.argv[1:])
"""


def _crash(path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if k != "AGENT_R1_DEBUG"}
    full.update({**ENV, **env})
    return subprocess.run(
        [sys.executable, "-c", _CRASH, "view", str(path)],
        capture_output=True,
        text=True,
        env=full,
        check=False,
    )


def test_an_unexpected_exception_is_one_line_and_exit_1(tmp_path: Path) -> None:
    path = tmp_path / "empty.jsonl"
    path.write_text("")
    result = _crash(path)
    assert result.returncode == 1, result.stderr
    assert "error: internal error: KeyError: 'boom: a bug, not a user error'" in result.stderr
    assert "set AGENT_R1_DEBUG=1 for the traceback" in result.stderr
    assert "Traceback" not in result.stderr
    debug = _crash(path, AGENT_R1_DEBUG="1")
    assert debug.returncode == 1
    assert "Traceback (most recent call last)" in debug.stderr and "def crash" not in debug.stderr
    assert "in crash" in debug.stderr


def test_debug_shows_the_traceback_of_a_user_error(site: Path, tmp_path: Path) -> None:
    result = agent_r1(
        ["export", str(tmp_path / "missing"), "--out", str(tmp_path / "out")], site, AGENT_R1_DEBUG="1"
    )
    assert result.returncode == 2
    assert "Traceback (most recent call last)" in result.stderr
    assert "error: checkpoint path" in " ".join(result.stderr.split())


def test_version_names_agent_r1_torch_and_transformers(site: Path) -> None:
    import transformers

    from agent_r1 import __version__

    result = agent_r1(["--version"], site)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"agent-r1 {__version__} (torch {torch.__version__}, ")
    assert f"transformers {transformers.__version__}" in result.stdout
