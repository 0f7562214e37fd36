"""benchmarks/value_guided.py in its smoke mode: a tiny model trained with PPO on the toy task for
two steps, then every evaluation row (greedy, sampling with the oracle pass@K, value-guided K = 4
and 8) and the critic diagnostics, in a subprocess as a user runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_value_guided_benchmark_smoke(tmp_path: Path) -> None:
    out = tmp_path / "vg"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "AGENT_R1_DISABLE_PLUGINS": "search"}
    result = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "value_guided.py"),
            "--tiny",
            "--seeds",
            "0",
            "1",
            "--diagnose",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    results = json.loads((out / "results.json").read_text(encoding="utf-8"))
    assert results["training"]["steps"] == 2
    assert (Path(results["training"]["run_dir"]) / "final" / "critic" / "critic.json").is_file()
    evals = results["evals"]
    assert sorted(evals) == [
        "greedy/seed0",
        "sampling/seed0",
        "sampling/seed1",
        "value_guided_k4/seed0",
        "value_guided_k4/seed1",
        "value_guided_k8/seed0",
        "value_guided_k8/seed1",
    ]
    assert set(evals["sampling/seed0"]["pass_at_k"]) == {"pass@1", "pass@4", "pass@8"}
    for k in (4, 8):
        decoding = evals[f"value_guided_k{k}/seed0"]["decoding"]
        assert (decoding["kind"], decoding["candidates"]) == ("value_guided", k)
        # one turn of 4 tokens per episode: K candidates of at most 4 tokens each
        assert decoding["kept_tokens_mean"] < decoding["generated_tokens_mean"] <= 4 * k
        assert decoding["scored_tokens_mean"] > 0
    assert evals["greedy/seed0"]["decoding"]["kind"] == "sample"
    diagnostics = results["diagnostics"]
    assert diagnostics["episodes"] == 4 * 8  # the sampled episodes of seed 0: 4 tasks x 8 samples
    assert set(diagnostics["last_action"]) >= {"auc", "auc_within_task", "value_failure_mean"}
    table = (out / "results.md").read_text(encoding="utf-8")
    for label in ("greedy (T = 0)", "sampling (T = 1)", "oracle best-of-4 (pass@4)", "value_guided_k8"):
        assert label in table
