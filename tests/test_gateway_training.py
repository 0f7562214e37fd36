"""Training through the policy gateway: ``rollout.source: gateway`` with the user's agent program
(``gateway_agent.py toy``, written with the ``openai`` client) launched in subprocesses, on the
toy target-character task and a tiny model.
"""

from __future__ import annotations

import copy
import json
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import torch
from gateway_helpers import AGENT
from trainer_helpers import toy_config, write_config

from agent_r1.config import RunConfig, load_config, validate_components
from agent_r1.engine import train_step
from agent_r1.engine.collect import collect
from agent_r1.engine.learner.batch import collate, policy_forward
from agent_r1.engine.update import update
from agent_r1.errors import ConfigError
from agent_r1.mdp import TokenSource, load_trajectories


def _config(
    model_dir: Path, run_dir: Path, *, mode: str = "toy", env: dict[str, str] | None = None
) -> dict[str, Any]:
    agent = {"command": [sys.executable, str(AGENT), mode], "timeout_s": 120, "env": env or {}}
    return toy_config(
        model_dir,
        run_dir,
        rollout={"group_size": 2, "max_new_tokens": 6, "source": "gateway", "agent": agent},
        trainer={"steps": 2, "tasks_per_step": 2, "micro_batch_size": 4, "lr": 3e-2, "checkpoint_every": 0},
        eval={"num_tasks": 2, "before_training": False},
    )


def _gateway_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("agent-r1-gateway")]


@pytest.mark.slow
def test_agent_r1_train_runs_two_steps_through_the_gateway(
    registry: Any, model_dir: Path, tmp_path: Path
) -> None:
    from agent_r1.run.training import train

    run_dir = tmp_path / "run"
    path = write_config(tmp_path / "run.yaml", _config(model_dir, run_dir))
    summary = train(str(path), [])

    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2]
    for m in metrics:  # 2 tasks x 2 samples, 2 calls each; the agent asks for temperature 0.7
        assert m["gateway/episodes"] == 4 and m["gateway/calls"] == 8
        assert m["gateway/agent_failures"] == 0 and m["errors/failed_episodes"] == 0
        assert m["gateway/sampling_overrides"] == 8 and m["gateway/segments_per_episode"] == 1
        assert m["response/turns_mean"] == 2
    samples = load_trajectories(run_dir / "samples.jsonl")
    assert {t.policy_version for t in samples} == {0, 1}
    for trajectory in samples:
        assert [s.source for s in trajectory.segments if s.turn == 0][:2] == [
            TokenSource.PROMPT,
            TokenSource.POLICY,
        ]
        assert trajectory.num_turns == 2 and trajectory.steps[-1].action.answer is not None
        assert "answer_match" in trajectory.reward_by_name()
        policy = [i for i, m in enumerate(trajectory.loss_mask) if m]
        assert (
            len(policy)
            == trajectory.num_policy_tokens
            == sum(len(s.action.token_ids) for s in trajectory.steps)
        )
    assert summary["after"]["num_tasks"] == 2  # evaluation went through the agent program too
    assert (run_dir / "final" / "config.json").exists()
    assert _gateway_threads() == []  # the run stopped its gateway


@pytest.mark.slow
def test_updates_reach_the_gateway_and_crashing_agents_are_failed_episodes(
    registry: Any, model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from agent_r1.engine.session import TaskStream, build_session
    from agent_r1.gateway.training import GatewaySource

    # A reward that differs between almost any two answers, so that step 1 surely updates.
    (tmp_path / "spread_reward.py").write_text(
        "def char_sum(trajectory, task):\n"
        "    answer = trajectory.steps[-1].action.answer or ''\n"
        "    return sum(map(ord, answer)) % 101 / 100\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    plain = _config(model_dir, tmp_path / "run")
    plain["rewards"] = [{"name": "spread_reward:char_sum"}]
    plain["rollout"]["group_size"] = 4
    plain["eval"]["success_signal"] = "char_sum"
    run = RunConfig.model_validate(plain)
    tasks = registry.get("datasets", "toy_target")(run.data.options).load("train")
    doomed = TaskStream(tasks, run.seed).take(run.trainer.tasks_per_step)[0].id  # a task of step 1
    plain["rollout"]["agent"] = {**plain["rollout"]["agent"], "env": {"CRASH_ON": doomed}}
    plain["rollout"]["agent"]["command"][-1] = "flaky"
    run = RunConfig.model_validate(plain)
    components = validate_components(run, registry)
    with pytest.raises(ConfigError, match=r"source=agent_r1\.gateway\.training\.GatewaySource"):
        build_session(run, components, tmp_path / "refused", registry=registry)  # the source is not guessed
    session = build_session(run, components, tmp_path / "run", registry=registry, source=GatewaySource)
    assert isinstance(session.source, GatewaySource)
    initial = copy.deepcopy(session.unwrapped)
    try:
        first = train_step(session)
        assert first.metrics["errors/failed_episodes"] == 4 and first.metrics["gateway/agent_failures"] == 4
        assert len(first.failed) == 4 and len(first.trajectories) == 4
        assert all(doomed in t.task_id and "the agent program broke" in t.errors[0] for t in first.failed)
        pairs = zip(initial.parameters(), session.unwrapped.parameters(), strict=True)
        assert any(not torch.equal(a, b) for a, b in pairs)  # the first update moved the weights

        gateway = session.gateway
        assert gateway.backend is session.backend and session.backend.policy_version == 1
        trajectories, failed, _ = collect(session, 1)  # step 2's rollout, after the first update
        assert len(trajectories) + len(failed) == 8 and {t.policy_version for t in trajectories} == {1}
        batch = collate(trajectories, session.pad_id)
        mask = batch.loss_mask
        with torch.no_grad():
            now = policy_forward(session.unwrapped, batch.input_ids, batch.attention_mask).logprobs
            before = policy_forward(initial, batch.input_ids, batch.attention_mask).logprobs
        assert (now - batch.rollout_logprobs)[mask].abs().max() < 1e-4  # sampled by the updated weights
        assert (before - batch.rollout_logprobs)[mask].abs().max() > 1e-3
        update(session, trajectories)
        assert session.step == 2
    finally:
        session.close()
    assert _gateway_threads() == []


def test_gateway_config_errors_name_the_setting() -> None:
    with pytest.raises(ConfigError, match=r"rollout.agent.command .* or rollout.agent.callable"):
        load_config(None, ["rollout.source=gateway"])
    gateway = ["rollout.source=gateway", "rollout.agent.command=[a]"]
    with pytest.raises(ConfigError, match="either command or callable"):
        load_config(None, [*gateway, "rollout.agent.callable=m:f"])
    with pytest.raises(ConfigError, match="unknown key 'timeout'"):
        load_config(None, [*gateway, "+rollout.agent.timeout=3"])
    config = load_config(None, gateway)
    assert config.rollout.gateway.tool_call_format is None  # hermes without an answer tag
    assert "rollout.gateway.tool_call_format" not in {c.path for c in validate_components(config)}
    tags = load_config(
        None, [*gateway, "rollout.gateway.tool_call_format={name: tags, tool_tags: {calculator: c}}"]
    )
    [fmt] = [c for c in validate_components(tags) if c.path == "rollout.gateway.tool_call_format"]
    assert fmt.name == "tags" and fmt.config.tool_tags == {"calculator": "c"}
    with pytest.raises(ConfigError, match=r"rollout\.gateway\.tool_call_format\.name"):
        validate_components(load_config(None, [*gateway, "rollout.gateway.tool_call_format={name: x}"]))
    bad = "rollout.gateway.tool_call_format={name: hermes, answer_tg: a}"
    with pytest.raises(ConfigError, match=r"rollout\.gateway\.tool_call_format\.answer_tg: unknown key"):
        validate_components(load_config(None, [*gateway, bad]))


def test_preflight_checks_the_agent_program_before_any_model_loads(model_dir: Path, tmp_path: Path) -> None:
    from agent_r1.run.preflight import preflight

    config = load_config(
        None,
        [
            f"model.path={model_dir}",
            f"output_dir={tmp_path / 'run'}",
            "rollout.source=gateway",
            "rollout.agent.command=[no-such-agent-program, --fast]",
        ],
    )
    report = preflight(config, validate_components(config))
    [agent] = [c for c in report.checks if c.name == "agent"]
    assert agent.status == "fail" and "'no-such-agent-program' is not on PATH" in agent.message
    assert "prompts" not in {c.name for c in report.checks}  # the agent renders its own prompts


def test_the_sdk_example_agent_rolls_out_through_agent_r1_rollout(model_dir: Path, tmp_path: Path) -> None:
    """``sdk/examples/gateway_agent``: the ``openai``-client calculator agent, as a callable, through
    the ``agent-r1 rollout`` path, with the ``tags`` format (the tiny model writes garbage, but the
    prompts, the calls and the scoring are the real ones)."""
    from agent_r1.run.commands import collect as run_collect

    example = Path(__file__).resolve().parents[1] / "sdk" / "examples" / "gateway_agent"
    out = tmp_path / "rollout" / "trajectories.jsonl"
    count = run_collect(
        str(example / "train.yaml"),
        [
            f"model.path={model_dir}",
            "model.freeze_embeddings=false",
            f"output_dir={tmp_path / 'rollout'}",
            f"rollout.agent.cwd={example}",
            "rollout.group_size=1",
            "rollout.max_new_tokens=8",
        ],
        out=out,
        num_tasks=2,
    )
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    trajectories = load_trajectories(out)
    assert count == len(trajectories) == 2
    for trajectory in trajectories:
        prompt = tokenizer.decode(trajectory.token_ids[: trajectory.prompt_length])
        assert "- <calc>expression</calc>: Evaluate" in prompt  # the tool, described by the tags format
        assert "<|im_start|>assistant\n<calc>23*41</calc><|im_end|>" in prompt  # the example's call
        assert "<|im_start|>user\n<result>943</result><|im_end|>" in prompt  # and its result
        assert not trajectory.errors and trajectory.termination == "agent_done"
        assert 1 <= trajectory.num_turns <= 3 and "answer_match" in trajectory.reward_by_name()
        assert trajectory.metrics["gateway_segments"] == 1.0
    assert _gateway_threads() == []
