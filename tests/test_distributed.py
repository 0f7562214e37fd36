"""Two CPU processes (gloo, through accelerate) make the same update as one process on the
combined batch: loss normalisation and batch-level advantage statistics span all processes."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from trainer_helpers import write_tiny_checkpoint

WORKER = Path(__file__).with_name("distributed_worker.py")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _launch(nproc: int, model_dir: Path, out: Path, estimator: str) -> None:
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(_free_port()),
    }
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc_per_node={nproc}",
        "--master_addr=127.0.0.1",
        f"--master_port={env['MASTER_PORT']}",
        str(WORKER),
        str(model_dir),
        str(out),
        estimator,
    ]
    if nproc == 1:
        command = [sys.executable, str(WORKER), str(model_dir), str(out), estimator]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


@pytest.mark.slow
@pytest.mark.parametrize("estimator", ["grpo", "reinforce_pp"])
def test_two_processes_match_one_process(estimator: str, tmp_path: Path) -> None:
    model_dir = write_tiny_checkpoint(tmp_path / "model")
    _launch(1, model_dir, tmp_path / "single.pt", estimator)
    _launch(2, model_dir, tmp_path / "double.pt", estimator)
    single = torch.load(tmp_path / "single.pt")
    double = torch.load(tmp_path / "double.pt")
    params = torch.load(tmp_path / "double.pt.params")
    moved = max((params["final"][k] - params["initial"][k]).abs().max().item() for k in params["final"])
    assert moved > 1e-4, "the update did not change the weights: the test would prove nothing"
    assert single.keys() == double.keys() and len(single) > 5
    for name in single:
        assert single[name].abs().max() > 0 or name.endswith("embed_tokens.weight")
        assert torch.allclose(single[name], double[name], atol=1e-7, rtol=1e-4), name
