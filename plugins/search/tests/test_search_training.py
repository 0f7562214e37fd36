"""A short GRPO run with the search environment, through ``agent_r1.run.training.train`` (the code
behind ``agent-r1 train``): HotpotQA sample, ``search_qa`` with BM25 over the bundled corpus in the
tags format, EM/F1/valid-search rewards, a tiny model that searches (``searching_model`` in
conftest.py). A tiny model learns no QA in two steps, so nothing here asserts learning; the run must
get through rollouts that really search, the plugin's rewards, updates, checkpoints and reports."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from transformers import AutoModelForCausalLM, AutoTokenizer

from agent_r1 import TokenSource
from agent_r1.testing.pytest_plugin import RolloutRecorder

STEPS = 2
TASKS_PER_STEP = 2
GROUP_SIZE = 4


def training_config(model_dir: Path, run_dir: Path) -> dict[str, Any]:
    return {
        "seed": 0,
        "output_dir": str(run_dir),
        "model": {"path": str(model_dir), "device": "cpu"},
        "data": {"name": "hotpotqa", "limit": 8},
        "environment": {
            "name": "search_qa",
            "format": "tags",
            "retriever": {"kind": "bm25", "corpus": "hotpotqa"},
            "topk": 2,
            "max_turns": 3,
            "max_result_chars": 300,
        },
        "rollout": {
            "group_size": GROUP_SIZE,
            "max_turns": 3,
            "max_new_tokens": 16,
            "max_context": 1536,
            "temperature": 1.0,
        },
        "rewards": [
            {"name": "qa_em", "weight": 1.0},
            {"name": "qa_f1", "weight": 0.5},
            {"name": "search_valid", "weight": 0.2, "max_rewarded_turns": 2},
        ],
        "algorithm": {"name": "grpo"},
        "trainer": {
            "steps": STEPS,
            "tasks_per_step": TASKS_PER_STEP,
            "micro_batch_size": 8,
            "lr": 1e-3,
            "checkpoint_every": 1,
            "keep_checkpoints": 5,
        },
        "eval": {"num_tasks": 2, "before_training": False, "success_signal": "qa_em"},
        "trackers": [{"name": "jsonl"}],
    }


@pytest.fixture
def recorder(agent_r1_rollout_recorder: RolloutRecorder) -> RolloutRecorder:
    return agent_r1_rollout_recorder


def test_short_grpo_run_with_search(searching_model: Path, recorder: RolloutRecorder, tmp_path: Path) -> None:
    from agent_r1.engine.artifacts import checkpoint as ckpt
    from agent_r1.run.training import train

    run_dir = tmp_path / "run"
    config_path = tmp_path / "search.yaml"
    config_path.write_text(yaml.safe_dump(training_config(searching_model, run_dir)), encoding="utf-8")
    summary = train(config_path, [])

    # -- ran end to end: every step logged, checkpoints written, reports drawn --------------------
    assert summary["steps"] == STEPS
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == list(range(1, STEPS + 1))  # as the checkpoints count
    for name in ("config.json", "report.html", "eval_after.json", "eval_after/eval.md", "summary.json"):
        assert (run_dir / name).is_file(), name
    checkpoints = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert checkpoints == [f"step_{step:06d}" for step in range(1, STEPS + 1)]

    # -- the plugin's reward signals reach the metrics --------------------------------------------
    for line in lines:
        for signal in ("qa_em", "qa_f1", "search_valid"):
            assert f"reward/{signal}" in line, (signal, sorted(line))
        assert 0.0 <= line["reward/qa_em"] <= line["reward/qa_f1"] + 1e-9 <= 1.0 + 1e-9
        assert line["tools/calls_mean"] > 0.0
    assert summary["after"]["success_signal"] == "qa_em"
    assert set(summary["after"]["rewards"]) >= {"qa_em", "qa_f1"}

    # -- the rollouts searched: real BM25 results went back to the policy as env tokens -----------
    trajectories = recorder.trajectories
    assert len(trajectories) == STEPS * TASKS_PER_STEP * GROUP_SIZE
    records = [
        record
        for t in trajectories
        for step in t.steps
        if step.observation is not None
        for record in step.observation.info.get("search", [])
    ]
    assert len(records) >= len(trajectories) // 2, "fewer searches than expected from this model"
    assert all(record["query"] and len(record["titles"]) <= 2 for record in records)  # topk = 2
    assert sum(len(record["titles"]) == 2 for record in records) >= 3  # garbled queries may find nothing
    tokenizer = AutoTokenizer.from_pretrained(searching_model)
    shown = 0
    for trajectory in trajectories:
        env_text = tokenizer.decode(
            [i for seg in trajectory.segments if seg.source is TokenSource.ENV for i in seg.token_ids]
        )
        for step in trajectory.steps:
            observation = step.observation
            # the last turn's results are recorded, but never go back to the policy
            if observation is None or observation.done or not observation.info.get("search"):
                continue
            for record in observation.info["search"]:
                if record["titles"]:
                    assert f"<information>Doc 1 (Title: {record['titles'][0]})" in env_text
                    shown += 1
        assert sum(trajectory.loss_mask) == trajectory.num_policy_tokens  # results carry no loss
    assert shown >= 2
    # search_valid: process rewards for searching turns (at most 2 per episode), weighted 0.2, and
    # the step metrics are the means of what the rollouts earned
    for trajectory in trajectories:
        valid = [r for r in trajectory.rewards if r.name == "search_valid"]
        searching_turns = sum(  # a search on the turn that ended the episode is never shown: no reward
            bool(s.observation and not s.observation.done and s.observation.info.get("search"))
            for s in trajectory.steps
        )
        assert (len(valid) > 0) == (searching_turns > 0) and len(valid) <= min(searching_turns, 2)
        assert all(r.kind == "process" and r.weight == pytest.approx(0.2) for r in valid)
    per_step = TASKS_PER_STEP * GROUP_SIZE
    for step, line in enumerate(lines):
        batch = trajectories[step * per_step : (step + 1) * per_step]
        for signal in ("qa_em", "qa_f1", "search_valid"):
            mean = sum(t.reward_by_name().get(signal, 0.0) for t in batch) / per_step
            assert line[f"reward/{signal}"] == pytest.approx(mean), (step, signal)

    # -- the updates changed the policy ------------------------------------------------------------
    before = AutoModelForCausalLM.from_pretrained(searching_model).state_dict()
    after = ckpt.load_checkpoint(run_dir / "checkpoints" / checkpoints[-1])["model"]
    changed = [name for name, value in before.items() if not torch.equal(value, after[name])]
    assert changed, "two GRPO steps with varied rewards left every weight unchanged"
