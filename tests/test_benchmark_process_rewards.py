"""benchmarks/process_rewards.py in its smoke mode, in subprocesses as a user runs it: three arms
(outcome, process, gigpo) on the tiny random model, held-out success before and after, the 95%
intervals and paired differences, a resumed study that keeps its finished runs, and a merge of two
output directories into one report."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "process_rewards.py"
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "AGENT_R1_DISABLE_PLUGINS": "search"}
GIGPO = "gigpo: algorithm.name=gigpo"

sys.path.insert(0, str(ROOT / "benchmarks"))
import process_rewards  # noqa: E402  (benchmarks/ is not a package; the path is set just above)


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=600
    )


def test_ci95_is_the_t_interval_of_the_mean() -> None:
    # three values 1, 2, 3: sd 1, t(0.975, 2) = 4.303, half-width 4.303 / sqrt(3)
    assert process_rewards.ci95([1.0, 2.0, 3.0]) == pytest.approx(4.303 / math.sqrt(3))
    assert math.isnan(process_rewards.ci95([1.0]))
    assert math.isnan(process_rewards.ci95([1.0, float("nan")]))


def test_paired_differences_pair_runs_of_the_same_seed() -> None:
    arms = [process_rewards.Arm("outcome", "o", []), process_rewards.Arm("gigpo", "g", [])]
    runs = [
        {"arm": "outcome", "seed": 0, "summary": {"score_var": 1.0}},
        {"arm": "gigpo", "seed": 0, "summary": {"score_var": 1.5}},
        {"arm": "outcome", "seed": 1, "summary": {"score_var": 3.0}},
        {"arm": "gigpo", "seed": 1, "summary": {"score_var": 3.5}},
        {"arm": "gigpo", "seed": 2, "summary": {"score_var": 9.0}},  # no outcome run of seed 2: unpaired
        {"arm": "outcome", "seed": 3, "error": "boom"},
    ]
    agg = process_rewards.aggregate(runs, arms)
    diff = agg["paired_difference"]["gigpo"]["score_var"]
    assert diff["n"] == 2 and diff["mean"] == pytest.approx(0.5) and diff["sd"] == pytest.approx(0.0)
    assert agg["per_arm"]["gigpo"]["score_var"]["n"] == 3
    assert agg["ratio_over_outcome"]["gigpo"]["score_var"] == pytest.approx((1.5 + 3.5 + 9.0) / 3 / 2.0)


def test_a_bad_arm_is_refused_before_any_model_loads(tmp_path: Path) -> None:
    result = _run("--tiny", "--arm", "process: trainer.lr=1", "--out", str(tmp_path / "x"))
    assert result.returncode == 2, result.stdout + result.stderr
    assert "error: --arm" in result.stdout and "not outcome or process" in result.stdout
    result = _run("--tiny", "--arm", "fast: trainer.nonexistent=1", "--out", str(tmp_path / "y"))
    assert result.returncode == 2, result.stdout + result.stderr
    assert "nonexistent" in result.stdout
    assert not (tmp_path / "y" / "tiny-model").exists()


def test_three_arm_study_resumes_and_merges(tmp_path: Path) -> None:
    first = tmp_path / "seed0"
    result = _run("--tiny", "--steps", "2", "--seeds", "0", "--eval", "--arm", GIGPO, "--out", str(first))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    data = json.loads((first / "results.json").read_text())
    assert [a["name"] for a in data["arms"]] == ["outcome", "process", "gigpo"]
    assert "algorithm.name=gigpo" in data["arms"][2]["overrides"]
    assert data["runs_ok"] == 3 and data["runs_failed"] == 0
    assert 0.0 <= data["eval_before"]["success"] <= 1.0 and data["eval_before"]["num_tasks"] == 4
    for run in data["runs"]:
        assert len(run["steps"]) == 2
        assert 0.0 <= run["summary"]["eval_success"] <= 1.0
    config = json.loads((first / "runs" / "gigpo-seed0" / "config.json").read_text())
    assert config["algorithm"]["estimator"]["name"] == "gigpo" or config["algorithm"]["name"] == "gigpo"
    summary = (first / "summary.md").read_text()
    assert "gigpo / outcome" in summary and "gigpo − outcome" in summary
    assert "before training" in summary
    assert (first / "curves.png").stat().st_size > 0

    # the same command again: every run is already finished there, nothing is trained again
    again = _run("--tiny", "--steps", "2", "--seeds", "0", "--eval", "--arm", GIGPO, "--out", str(first))
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "resuming: 3 finished run(s) kept" in again.stdout
    assert "== outcome arm" not in again.stdout
    assert json.loads((first / "results.json").read_text())["runs"] == data["runs"]

    # a different study in the same directory is refused, not mixed in
    other = _run("--tiny", "--steps", "3", "--seeds", "0", "--arm", GIGPO, "--out", str(first))
    assert other.returncode == 2 and "different study" in other.stdout

    second = tmp_path / "seed1"
    result = _run("--tiny", "--steps", "2", "--seeds", "1", "--arm", GIGPO, "--out", str(second))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    merged = tmp_path / "merged"
    result = _run("--merge", str(first), str(second), "--out", str(merged))
    assert result.returncode == 0, result.stdout + result.stderr
    out = json.loads((merged / "results.json").read_text())
    assert out["seeds"] == [0, 1] and out["runs_ok"] == 6
    diff = out["aggregate"]["paired_difference"]["gigpo"]["score_var"]
    assert diff["n"] == 2 and diff["ci95"] is not None
    assert out["eval_before"] == data["eval_before"]

    result = _run("--merge", str(first), str(tmp_path / "missing"), "--out", str(tmp_path / "m2"))
    assert result.returncode == 2 and "no results.json" in result.stdout
