"""Short GRPO runs with the code and the math environment, through ``agent_r1.run.training.train``
(the code behind ``agent-r1 train``): a tiny model that calls python (``python_calling_model`` in
conftest.py), real sandboxed runs, the plugin's rewards. A tiny model learns no programming or
arithmetic in two steps, so nothing here asserts learning; the runs must get through rollouts that
really run code, the plugin's rewards, updates, checkpoints and the before/after evaluation."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent_r1.testing.pytest_plugin import RolloutRecorder
from agent_r1_plugin_code.sandbox import namespace_prefix

pytestmark = [
    pytest.mark.skipif(namespace_prefix() is None, reason="needs Linux namespaces (unshare)"),
    pytest.mark.slow,
    pytest.mark.timeout(300),
]

STEPS = 2
TASKS_PER_STEP = 2
GROUP_SIZE = 4


def training_config(model_dir: Path, run_dir: Path, kind: str) -> dict[str, Any]:
    if kind == "code":
        data = {"name": "humaneval", "limit": 8}
        environment = {"name": "code", "max_turns": 2, "sandbox": {"timeout_s": 5}}
        rewards = [
            {"name": "code_tests", "weight": 1.0},
            {"name": "code_solved", "weight": 0.0},
            {"name": "code_runs", "weight": 0.2},
        ]
        success = "code_solved"
    else:
        data = {"name": "gsm8k", "limit": 8}
        environment = {"name": "math", "max_turns": 2, "sandbox": {"timeout_s": 5}}
        rewards = [{"name": "math_correct", "weight": 1.0}, {"name": "code_runs", "weight": 0.2}]
        success = "math_correct"
    return {
        "seed": 0,
        "output_dir": str(run_dir),
        "model": {"path": str(model_dir), "device": "cpu"},
        "data": data,
        "environment": environment,
        "rollout": {
            "group_size": GROUP_SIZE,
            "max_turns": 2,
            "max_new_tokens": 24,
            "max_context": 2048,
            "temperature": 1.0,
        },
        "rewards": rewards,
        "algorithm": {"name": "grpo"},
        "trainer": {
            "steps": STEPS,
            "tasks_per_step": TASKS_PER_STEP,
            "micro_batch_size": 8,
            "lr": 1e-3,
            "checkpoint_every": 1,
        },
        "eval": {"num_tasks": 2, "samples": 2, "before_training": False, "success_signal": success},
        "trackers": [{"name": "jsonl"}],
    }


@pytest.fixture
def recorder(agent_r1_rollout_recorder: RolloutRecorder) -> RolloutRecorder:
    return agent_r1_rollout_recorder


@pytest.mark.parametrize("kind", ["code", "math"])
def test_short_grpo_run(
    kind: str, python_calling_model: Path, recorder: RolloutRecorder, tmp_path: Path
) -> None:
    from agent_r1.run.training import train

    run_dir = tmp_path / "run"
    config_path = tmp_path / f"{kind}.yaml"
    config_path.write_text(yaml.safe_dump(training_config(python_calling_model, run_dir, kind)))
    summary = train(config_path, [])

    assert summary["steps"] == STEPS
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(lines) == STEPS
    checkpoints = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert checkpoints == [f"step_{step:06d}" for step in range(1, STEPS + 1)]
    outcome = "code_tests" if kind == "code" else "math_correct"
    for line in lines:
        assert f"reward/{outcome}" in line, sorted(line)
        assert line["tools/calls_mean"] > 0.0

    # the rollouts ran code in the sandbox, and the results went back to the policy
    trajectories = recorder.trajectories
    assert len(trajectories) == STEPS * TASKS_PER_STEP * GROUP_SIZE
    records = [
        record
        for t in trajectories
        for step in t.steps
        if step.observation is not None
        for record in step.observation.info.get("code", [])
    ]
    assert sum(record["tool"] == "python" and record["status"] == "ok" for record in records) >= 4
    outputs = [
        r.content for t in trajectories for s in t.steps if s.observation for r in s.observation.tool_results
    ]
    assert sum(content == "stdout:\n3" for content in outputs) >= 4  # print(1 + 2), really run
    runs = [r for t in trajectories for r in t.rewards if r.name == "code_runs"]
    assert runs and all(r.kind == "process" and r.weight == pytest.approx(0.2) for r in runs)

    # the evaluation reports the plugin's success signal, with pass@k over 2 samples per task
    after = summary["after"]
    assert after["success_signal"] == ("code_solved" if kind == "code" else "math_correct")
    assert set(after["pass_at_k"]) == {"pass@1", "pass@2"}
    assert after["num_trajectories"] == 4 and after["tool_calls_mean"] > 0
