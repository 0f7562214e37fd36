"""``agent-r1 eval`` with the search environment, run as the real command in a subprocess: a tiny
model that searches (``searching_model`` in conftest.py), HotpotQA and NQ samples combined with
``qa_mix``, BM25 over the bundled corpus. The report must give EM and F1 per dataset, with turns and
searches per question, in eval.json and eval.md, and agree with the saved trajectories."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent_r1 import load_trajectories

TASKS_PER_DATASET = 3


def eval_config(model_dir: Path) -> dict[str, Any]:
    return {
        "seed": 0,
        "model": {"path": str(model_dir), "device": "cpu"},
        "data": {"name": "qa_mix", "datasets": [{"name": "hotpotqa"}, {"name": "nq"}]},
        "environment": {
            "name": "search_qa",
            "format": "tags",
            "retriever": {"kind": "bm25", "corpus": "hotpotqa"},
            "topk": 2,
            "max_turns": 3,
            "max_result_chars": 300,
        },
        "rollout": {"max_turns": 3, "max_new_tokens": 16, "max_context": 1536},
        "rewards": [{"name": "qa_em"}, {"name": "qa_f1"}],
        "eval": {"num_tasks": 64, "temperature": 0.0, "success_signal": "qa_em"},
    }


def agent_r1_command() -> list[str]:
    script = Path(sys.executable).parent / "agent-r1"
    return [str(script)] if script.exists() else [sys.executable, "-m", "agent_r1.cli"]


def test_agent_r1_eval_reports_em_f1_turns_and_searches_per_dataset(
    searching_model: Path, search_cache: Path, tmp_path: Path
) -> None:
    config = tmp_path / "search_eval.yaml"
    config.write_text(yaml.safe_dump(eval_config(searching_model)), encoding="utf-8")
    out = tmp_path / "eval"
    environment = {
        **os.environ,
        "AGENT_R1_SEARCH_CACHE": str(search_cache),
        "OMP_NUM_THREADS": "1",
        "COLUMNS": "200",
    }
    result = subprocess.run(
        [
            *agent_r1_command(),
            "eval",
            str(config),
            f"eval.num_tasks={2 * TASKS_PER_DATASET}",  # an override on the command line, too
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        env=environment,
        cwd=tmp_path,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    summary = json.loads((out / "eval.json").read_text(encoding="utf-8"))
    markdown = (out / "eval.md").read_text(encoding="utf-8")
    assert "## By dataset" in result.stdout  # the command prints the report too

    # -- per dataset: EM, F1, turns and searches per question --------------------------------------
    assert summary["success_signal"] == "qa_em"
    assert summary["num_tasks"] == 2 * TASKS_PER_DATASET  # qa_mix interleaves: 3 of each
    datasets = summary["datasets"]
    assert set(datasets) == {"hotpotqa", "nq"}
    assert datasets["nq"]["categories"] == ["nq"]
    assert all(c.startswith("hotpotqa/") for c in datasets["hotpotqa"]["categories"])
    for entry in datasets.values():
        assert entry["tasks"] == entry["trajectories"] == TASKS_PER_DATASET
        assert set(entry["rewards"]) == {"qa_em", "qa_f1"}
        assert 0.0 <= entry["rewards"]["qa_em"] <= entry["rewards"]["qa_f1"] + 1e-9 <= 1.0 + 1e-9
        assert 1.0 <= entry["turns_mean"] <= 3.0

    # -- the numbers agree with the trajectories the command saved ---------------------------------
    trajectories = load_trajectories(out / "eval_eval.jsonl")
    assert len(trajectories) == 2 * TASKS_PER_DATASET
    per_dataset: dict[str, list[Any]] = defaultdict(list)
    for trajectory in trajectories:
        per_dataset[trajectory.task_id.split(":", 1)[0]].append(trajectory)
    for name, group in per_dataset.items():
        searches = [
            sum(len(s.observation.info.get("search", [])) for s in t.steps if s.observation is not None)
            for t in group
        ]
        em = [t.reward_by_name().get("qa_em", 0.0) for t in group]
        f1 = [t.reward_by_name().get("qa_f1", 0.0) for t in group]
        assert datasets[name]["tool_calls_mean"] == sum(searches) / len(group), name
        assert datasets[name]["rewards"] == pytest.approx(
            {"qa_em": sum(em) / len(group), "qa_f1": sum(f1) / len(group)}
        )
        assert datasets[name]["turns_mean"] == sum(len(t.steps) for t in group) / len(group)
    assert sum(entry["tool_calls_mean"] for entry in datasets.values()) > 0  # this model searches

    # -- eval.md shows them in a table ---------------------------------------------------------------
    lines = markdown.splitlines()
    table = lines.index("## By dataset") + 2
    assert lines[table].startswith("| dataset | tasks | trajectories | success | qa_em | qa_f1 |")
    assert lines[table].endswith("| turns / episode | tool calls / episode |")
    for offset, name in enumerate(("hotpotqa", "nq"), start=2):
        entry = datasets[name]
        expected = (
            f"| {name} | {TASKS_PER_DATASET} | {TASKS_PER_DATASET} | {100 * entry['success']:.1f}% "
            f"| {entry['rewards']['qa_em']:.3f} | {entry['rewards']['qa_f1']:.3f} "
            f"| {entry['turns_mean']:.2f} | {entry['tool_calls_mean']:.2f} |"
        )
        assert lines[table + offset] == expected
