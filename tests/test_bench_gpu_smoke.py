"""benchmarks/bench_gpu.py on the CPU: its smoke run in a real subprocess (both arms of both
sections do the same work), its report rewritten from JSON, and its FLOP count checked against
torch's own FLOP counter on the tiny shape."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "bench_gpu.py"


def test_bench_gpu_smoke_runs_both_sections(tmp_path: Path) -> None:
    out = tmp_path / "gpu"
    completed = subprocess.run(
        [sys.executable, str(SCRIPT), "--smoke", "--out", str(out)],
        cwd=ROOT,
        env={**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr
    results = json.loads((out / "results.json").read_text(encoding="utf-8"))
    assert results["setup"]["device_name"] == "CPU" and results["setup"]["peak_tflops"] is None
    rollout, training = results["rollout"], results["training"]
    rows = results["setup"]["rows"]
    # both rollout arms generate every row's full budget (random weights, no stop id sampled)
    assert rollout["agent-r1 hf backend"]["generated_tokens"] == rollout["model.generate"]["generated_tokens"]
    assert rollout["model.generate"]["generated_tokens"] == rows * results["setup"]["new"]
    assert training["agent-r1 update"]["tokens"] == training["plain step"]["tokens"]
    assert training["plain step"]["tokens"] == rows * (results["setup"]["prompt"] + results["setup"]["new"])
    assert all(
        arm["mfu"] is None and arm["median_s"] > 0
        for arm in (rollout["model.generate"], training["plain step"])
    )
    split = training["agent-r1 update"]["split_s"]
    assert split["time/forward_backward_s"] > 0 and split["time/optimizer_s"] > 0
    sharding = results["sharding"]
    sharded, plain = sharding["update, sharding fsdp2"], sharding["update, unsharded"]
    assert (
        sharded["tokens"] == plain["tokens"] == rows * (results["setup"]["prompt"] + results["setup"]["new"])
    )
    session = sharding["sharded session"]
    assert session["checkpoint_gather_s"] > 0 and session["export_copy_s"] > 0
    assert session["rollout_tokens_per_s"] > 0
    packing = results["packing"]
    arms = (
        "padded, 2 rows",
        "token budget",
        "packed, sdpa_varlen",
        "packed, sdpa block mask",
        "padded, 4 rows",
    )
    assert all(packing[arm]["tokens"] == sum(packing["lengths"]) for arm in arms)
    assert packing["padded, 4 rows"]["padding_share"] > packing["token budget"]["padding_share"] > 0
    assert packing["packed, sdpa_varlen"]["padding_share"] == 0.0
    assert packing["exactness"] and all(diff < 1e-4 for diff in packing["exactness"].values())
    synchronous, asynchronous = results["async"]["sync"], results["async"]["async"]
    assert synchronous["wall_s"] > 0 and asynchronous["wall_s"] > 0 and results["async"]["speedup"] > 0
    assert synchronous["staleness_max"] == 0 and asynchronous["staleness_max"] <= 1
    report = (out / "results.md").read_text(encoding="utf-8")
    assert "| packing | packed, sdpa_varlen |" in report and "Packing (16 rows" in report
    assert "| training | agent-r1 update |" in report and "| rollout | model.generate |" in report
    assert "| sharding | update, sharding fsdp2 |" in report and "Sharding (FSDP2, one process)" in report

    (out / "results.md").unlink()
    rewrite = subprocess.run(
        [sys.executable, str(SCRIPT), "--from-json", str(out / "results.json")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert rewrite.returncode == 0, rewrite.stderr
    assert (out / "results.md").read_text(encoding="utf-8") == report


@pytest.fixture
def bench_gpu() -> Iterator[Any]:
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import bench_gpu

        yield bench_gpu
    finally:
        sys.path.remove(str(SCRIPT.parent))


def test_forward_flops_match_torch_flop_counter(bench_gpu: Any) -> None:
    from torch.utils.flop_counter import FlopCounterMode

    model = bench_gpu.build_model(bench_gpu.TINY, torch.device("cpu"), torch.float32, 0)
    model.set_attn_implementation("eager")  # attention as plain matmuls, which the counter sees
    length = 20
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(input_ids=torch.randint(3, 1000, (1, length)))
    config = model.config
    linear = 2 * bench_gpu.linear_weights(model) * length
    full_attention = 4 * config.num_hidden_layers * config.hidden_size * length * length
    # eager attention multiplies the whole square (the mask zeroes its upper half afterwards)
    assert counter.get_total_flops() == linear + full_attention
    # the benchmark charges each position for itself and the positions before it only
    causal = full_attention * (length + 1) / (2 * length)
    assert bench_gpu.forward_flops(model, 0, length) == pytest.approx(linear + causal)
    # a continuation (decode) from position 12 is the rest of the same sum
    head = bench_gpu.forward_flops(model, 0, 12)
    assert head + bench_gpu.forward_flops(model, 12, length) == pytest.approx(linear + causal)
