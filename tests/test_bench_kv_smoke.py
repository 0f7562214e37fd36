"""Smoke runs, in real subprocesses with the tiny random model, of benchmarks/bench_kv_reuse.py
(KV-cache reuse across turns, on vs off: both modes give the same trajectories and the report says
where the prompt tokens went), benchmarks/bench_shared_prefix_value.py and
benchmarks/bench_step_prefix.py (the same gradients)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = str(ROOT / "benchmarks" / "bench_kv_reuse.py")


def test_bench_kv_reuse_tiny_smoke(tmp_path: Path) -> None:
    out = tmp_path / "bench"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    completed = subprocess.run(
        [sys.executable, SCRIPT, "--tiny", "--repeats", "2", "--tasks", "2", "--out", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr
    assert "tokens identical: True" in completed.stdout
    results = json.loads((out / "results.json").read_text(encoding="utf-8"))
    assert results["tokens_identical"] is True and results["max_logprob_diff"] < 1e-4
    reuse, plain = results["reuse"], results["no reuse"]
    assert len(reuse["times_s"]) == len(plain["times_s"]) == 2
    assert reuse["turns_per_episode"] == plain["turns_per_episode"] == 3  # --tiny keeps episodes going
    assert plain["reused_prefix_tokens"] == 0 and reuse["reused_prefix_tokens"] > 0
    assert reuse["prefill_tokens"] < plain["prefill_tokens"]
    assert reuse["generated_tokens"] == plain["generated_tokens"] > 0
    assert results["speedup_median"] > 0 and results["temperature"] == 1.0  # the demo's


def test_bench_kv_reuse_reports_a_bad_override(tmp_path: Path) -> None:
    completed = subprocess.run(
        [sys.executable, SCRIPT, "--tiny", "--out", str(tmp_path), "rollout.no_such_option=1"],
        cwd=ROOT,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert completed.returncode == 2
    assert completed.stdout.startswith("error: ") and "no_such_option" in completed.stdout


def run_gradient_bench(script: str, out: Path) -> dict[str, Any]:
    """Run a gradient-comparison benchmark once on the tiny model; its results.json."""
    completed = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), "--tiny", "--repeats", "1", "--out", str(out)],
        cwd=ROOT,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr
    results: dict[str, Any] = json.loads((out / "results.json").read_text(encoding="utf-8"))
    assert results["max_relative_grad_gap"] < 1e-4
    return results


def test_bench_shared_prefix_value_tiny_smoke(tmp_path: Path) -> None:
    """benchmarks/bench_shared_prefix_value.py: the shared-prefix PPO forward/backward with a value
    head gives the plain pass's gradients."""
    results = run_gradient_bench("bench_shared_prefix_value.py", tmp_path)
    assert results["shared_prompt_tokens"] > 32 and results["rows"] == 4
    assert len(results["shared"]["times_s"]) == len(results["plain"]["times_s"]) == 1


def test_bench_step_prefix_tiny_smoke(tmp_path: Path) -> None:
    """benchmarks/bench_step_prefix.py: the prompt prefix run once per optimizer step gives the
    gradients of running it in every micro-batch."""
    results = run_gradient_bench("bench_step_prefix.py", tmp_path)
    assert results["rows"] == 16 and results["micro_batch_size"] == 8
    assert len(results["step"]["times_s"]) == len(results["micro"]["times_s"]) == 1
