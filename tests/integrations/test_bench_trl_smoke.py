"""``benchmarks/bench.py --smoke --only trl``: agent-r1 and TRL's GRPOTrainer side by side, each arm
in its own subprocess of this interpreter (which has trl 1.16), on the tiny model, for two steps of
each task. Checks that both arms ran the same work: the same prompts (token for token, by length),
the same number of trajectories per step, tokens sampled, the reward logged, memory measured."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("trl")

REPO = Path(__file__).resolve().parents[2]


def test_trl_side_by_side_smoke(tmp_path: Path) -> None:
    out, work = tmp_path / "out", tmp_path / "work"
    command = [sys.executable, str(REPO / "benchmarks" / "bench.py"), "--smoke", "--only", "trl"]
    command += ["--trl-python", sys.executable, "--out", str(out), "--work", str(work)]
    process = subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=900,
        cwd=REPO,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert process.returncode == 0, process.stdout[-3000:] + process.stderr[-3000:]
    results = json.loads((out / "bench.json").read_text(encoding="utf-8"))
    assert results["failures"] == []

    cases = {case["case"]: case for case in results["trl"]["cases"]}
    assert set(cases) == {"single-tiny", "tools-tiny-50ms"}
    for case in cases.values():
        runs = {run["arm"]: run for run in case["runs"]}
        assert set(runs) == {"agent-r1", "trl"} and all("error" not in run for run in runs.values())
        batch = case["tasks_per_step"] * case["group_size"]
        prompts = {}
        for arm, run in runs.items():
            assert len(run["steps"]) == case["steps"]
            assert all(step["trajectories"] == batch for step in run["steps"]), arm
            assert all(step["generated_tokens"] > 0 and step["wall_s"] > 0 for step in run["steps"]), arm
            assert all(step["reward_mean"] is not None for step in run["steps"]), arm
            assert run["peak_rss_mib"] >= run["rss_loaded_mib"] > 0
            prompts[arm] = [step["prompt_tokens_mean"] for step in run["steps"]]
        # the same prompts, rendered the same way, in the same order, on both sides
        assert prompts["agent-r1"] == prompts["trl"]
        ratio = case["summary"]["ratio_agent_r1_over_trl"]["steps_per_s"]
        assert ratio is not None and ratio > 0
    # TRL ran its own multi-turn tool loop (environment_factory), not a plain single turn
    trl_tools = next(run for run in cases["tools-tiny-50ms"]["runs"] if run["arm"] == "trl")
    assert len(trl_tools["trl_log"]) == cases["tools-tiny-50ms"]["steps"]
    assert all("tools/call_frequency" in entry for entry in trl_tools["trl_log"])

    report = (out / "bench.md").read_text(encoding="utf-8")
    assert "## Side by side with TRL" in report and "**ratio**" in report
