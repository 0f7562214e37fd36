"""``agent-r1 eval`` with the code environment, run as the real command in a subprocess: a tiny model
that calls python (``python_calling_model`` in conftest.py), two HumanEval problems, two samples
each at temperature 1. The report must give success and pass@1 / pass@2 over ``code_solved``, the
share of hidden tests, turns and tool calls per task, and agree with the saved trajectories."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from agent_r1 import load_trajectories
from agent_r1_plugin_code.sandbox import namespace_prefix

pytestmark = [
    pytest.mark.skipif(namespace_prefix() is None, reason="needs Linux namespaces (unshare)"),
    pytest.mark.slow,
    pytest.mark.timeout(300),
]


def agent_r1_command() -> list[str]:
    script = Path(sys.executable).parent / "agent-r1"
    return [str(script)] if script.exists() else [sys.executable, "-m", "agent_r1.cli"]


def test_agent_r1_eval_reports_pass_at_k_for_code(python_calling_model: Path, tmp_path: Path) -> None:
    config = {
        "seed": 0,
        "model": {"path": str(python_calling_model), "device": "cpu"},
        "data": {"name": "humaneval"},
        "environment": {"name": "code", "max_turns": 2, "sandbox": {"timeout_s": 5}},
        "rollout": {"max_turns": 2, "max_new_tokens": 24, "max_context": 2048},
        "rewards": [{"name": "code_tests"}, {"name": "code_solved"}, {"name": "code_runs"}],
        "eval": {"num_tasks": 2, "samples": 2, "temperature": 1.0, "success_signal": "code_solved"},
    }
    path = tmp_path / "code_eval.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    out = tmp_path / "eval"
    result = subprocess.run(
        [*agent_r1_command(), "eval", str(path), "eval.split=all", "--out", str(out)],
        capture_output=True,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "200"},
        cwd=tmp_path,
        timeout=280,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    summary = json.loads((out / "eval.json").read_text(encoding="utf-8"))
    assert summary["success_signal"] == "code_solved"
    assert summary["num_tasks"] == 2 and summary["num_trajectories"] == 4
    assert set(summary["pass_at_k"]) == {"pass@1", "pass@2"}
    humaneval = summary["categories"]["humaneval"]
    assert set(humaneval["rewards"]) == {"code_tests", "code_solved", "code_runs"}
    assert set(humaneval["pass_at_k"]) == {"pass@1", "pass@2"}

    trajectories = load_trajectories(out / "eval_eval.jsonl")
    assert len(trajectories) == 4 and {t.task_id for t in trajectories} == {"HumanEval/0", "HumanEval/1"}
    calls = [sum(len(s.observation.tool_results) for s in t.steps if s.observation) for t in trajectories]
    assert humaneval["tool_calls_mean"] == sum(calls) / 4 and sum(calls) > 0  # this model runs code
    assert humaneval["turns_mean"] == sum(len(t.steps) for t in trajectories) / 4
    solved = [t.reward_by_name().get("code_solved", 0.0) for t in trajectories]
    assert summary["success"] == pytest.approx(sum(solved) / 4)
    markdown = (out / "eval.md").read_text(encoding="utf-8")
    assert "| pass@1 | pass@2 |" in markdown and "| humaneval | 2 | 4 |" in markdown
