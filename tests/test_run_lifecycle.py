"""The runner's promises: effective config shown, failures counted or fatal (never silent), the
non-finite guard that idle updates cannot reset, one run per directory, nothing left behind."""

from __future__ import annotations

import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from trainer_helpers import fixed_trajectories, toy_config, write_config

from agent_r1 import ComponentConfig, Environment, EpisodeStart, PolicyLoss, RewardShaper, hookimpl
from agent_r1.config import RunConfig, load_config, validate_components
from agent_r1.errors import AgentR1Error, EnvironmentFatalError, TrainingAborted
from agent_r1.mdp import Action, Observation, RewardSignal, Task, Trajectory

# --------------------------------------------------------------------------------------------
# The effective configuration
# --------------------------------------------------------------------------------------------


def test_config_show_prints_the_presets_effective_clip_range_and_estimator() -> None:
    shown = subprocess.run(
        [sys.executable, "-m", "agent_r1.cli", "config", "show", "demo", "algorithm.name=dapo"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert shown.returncode == 0, shown.stderr
    algorithm = yaml.safe_load(shown.stdout)["algorithm"]
    assert algorithm["estimator"]["name"] == "grpo" and algorithm["estimator"]["scale"] == "group"
    assert algorithm["loss"]["name"] == "ppo_clip"
    assert (algorithm["loss"]["clip_low"], algorithm["loss"]["clip_high"]) == (0.2, 0.28)
    assert algorithm["aggregation"] == "token-mean"


def test_an_override_of_the_presets_own_loss_merges_over_its_options() -> None:
    config = load_config("demo", ["algorithm.name=dapo", "algorithm.loss={name: ppo_clip, clip_high: 0.3}"])
    components = {c.path: c for c in validate_components(config)}
    loss = components["algorithm.loss"].config
    assert (loss.clip_low, loss.clip_high) == (0.2, 0.3)  # DAPO's clip_low kept
    other = load_config("demo", ["algorithm.name=dapo", "algorithm.estimator={name: rloo}"])
    validate_components(other)
    assert other.algorithm.estimator is not None and other.algorithm.estimator.name == "rloo"
    assert other.algorithm.estimator.options == {}  # another component: the preset's options do not apply


# --------------------------------------------------------------------------------------------
# Environment and reward failures
# --------------------------------------------------------------------------------------------


class FlakyEnv(Environment):
    """Raises in ``step`` for tasks whose number is below ``fail_below`` (``t0``, ``t1``...), or a
    fatal error when ``fatal`` is set; otherwise ends the episode with the action as the answer."""

    name = "flaky"

    class Config(ComponentConfig):
        fail_below: int = 0
        fatal: bool = False

    async def reset(self, task: Task) -> EpisodeStart:
        self.task = task
        return EpisodeStart(messages=list(task.messages))

    async def step(self, action: Action, turn: int) -> Observation:
        if self.config.fatal:
            raise EnvironmentFatalError("the retriever at 127.0.0.1:9 refused the connection")
        if int(self.task.id[1:]) < self.config.fail_below:
            raise ConnectionError("backend unavailable")
        return Observation(done=True, termination="answer", answer=action.text)


class CrashingReward(RewardShaper):
    name = "crashing"

    def score(self, trajectory: Trajectory, task: Task) -> list[RewardSignal]:
        raise ZeroDivisionError("division by zero")


class FailurePlugin:
    @hookimpl
    def register_environments(self) -> list[Any]:
        return [FlakyEnv]

    @hookimpl
    def register_reward_shapers(self) -> list[Any]:
        return [CrashingReward]


def _train(registry: Any, model_dir: Path, run_dir: Path, tmp_path: Path, **sections: Any) -> dict[str, Any]:
    from agent_r1.run.training import train

    registry.register_plugin(FailurePlugin(), "failures")
    config = toy_config(model_dir, run_dir, **sections)
    return train(write_config(tmp_path / "run.yaml", config), [])


def test_environment_errors_are_counted_and_never_trained_on(
    registry: Any, model_dir: Path, tmp_path: Path
) -> None:
    """One task in four fails: those episodes are set aside, counted in the metrics, and the run
    goes on (25% is under the default max_error_rate of 50%)."""
    summary = _train(
        registry,
        model_dir,
        tmp_path / "run",
        tmp_path,
        data={"name": "toy_target", "num_train": 4, "num_eval": 2},
        environment={"name": "flaky", "fail_below": 1},
        trainer={"steps": 2, "tasks_per_step": 4, "micro_batch_size": 8},
    )
    metrics = summary["last_metrics"]
    assert metrics["errors/failed_episodes"] == 4.0  # one task x group_size 4
    assert metrics["errors/failed_rate"] == pytest.approx(0.25)
    assert "4 failed episode(s), not trained on" in (tmp_path / "run" / "run.log").read_text()
    samples = (tmp_path / "run" / "samples.jsonl").read_text()
    assert '"t0@' not in samples  # the failed task's episodes were not trained on (nor logged as such)


def test_too_many_environment_errors_stop_the_run_with_the_first_error(
    registry: Any, model_dir: Path, tmp_path: Path
) -> None:
    with pytest.raises(TrainingAborted) as caught:
        _train(
            registry,
            model_dir,
            tmp_path / "run",
            tmp_path,
            data={"name": "toy_target", "num_train": 4, "num_eval": 2},
            environment={"name": "flaky", "fail_below": 3},
            trainer={"steps": 2, "tasks_per_step": 4, "micro_batch_size": 8},
        )
    message = str(caught.value)
    assert "12 of 16 episodes failed" in message and "max_error_rate=0.5" in message
    assert (
        "environment 'flaky' raised in step" in message and "ConnectionError: backend unavailable" in message
    )


def test_a_fatal_environment_error_aborts_and_leaves_no_run_directory(
    registry: Any, model_dir: Path, tmp_path: Path
) -> None:
    with pytest.raises(EnvironmentFatalError, match="refused the connection"):
        _train(
            registry,
            model_dir,
            tmp_path / "run",
            tmp_path,
            environment={"name": "flaky", "fatal": True},
            eval={"num_tasks": 2, "before_training": True},
        )
    assert not (tmp_path / "run").exists()


def test_a_crashing_reward_shaper_is_named_with_the_task_and_trajectory(
    registry: Any, model_dir: Path, tmp_path: Path
) -> None:
    with pytest.raises(TrainingAborted) as caught:
        _train(
            registry,
            model_dir,
            tmp_path / "run",
            tmp_path,
            rewards=[{"name": "target_char"}, {"name": "crashing"}],
            trainer={"steps": 1, "tasks_per_step": 2, "micro_batch_size": 8},
        )
    message = str(caught.value)
    assert "reward shaper 'crashing' raised on task 't" in message and "(trajectory 't" in message
    assert "ZeroDivisionError: division by zero" in message


def test_an_environments_own_turn_limit_marks_the_episode_truncated() -> None:
    """The environment's max_turns fires before the engine's: the episode is still truncated, so
    DAPO's mask_truncated masks it."""
    from agent_r1.rollout.loop import RolloutEngine
    from agent_r1.testing.models import tiny_tokenizer
    from agent_r1.testing.scripted import ScriptedBackend

    class TwoTurns(Environment):
        name = "two_turns"

        async def reset(self, task: Task) -> EpisodeStart:
            return EpisodeStart(messages=list(task.messages))

        async def step(self, action: Action, turn: int) -> Observation:
            if turn + 1 >= 2:
                return Observation(done=True, termination="max_turns")
            return Observation(messages=[{"role": "user", "content": "go on"}])

    tokenizer = tiny_tokenizer()
    backend = ScriptedBackend(tokenizer=tokenizer, responses=["thinking", "still thinking"])
    engine = RolloutEngine(backend, tokenizer, TwoTurns, max_turns=8, max_new_tokens=8, max_context=512)
    task = Task(id="q", messages=[{"role": "user", "content": "hi"}])
    [trajectory] = engine.collect([task], 1, seed=0)
    assert trajectory.termination == "max_turns" and trajectory.truncated
    assert len(trajectory.steps) == 2


# --------------------------------------------------------------------------------------------
# The non-finite guard
# --------------------------------------------------------------------------------------------


class NaNLoss(PolicyLoss):
    name = "nan_loss"

    def token_loss(self, inputs: Any) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        return inputs.logprobs * float("nan"), {}


class NaNPlugin:
    @hookimpl
    def register_policy_losses(self) -> list[Any]:
        return [NaNLoss]


def test_updates_without_a_gradient_do_not_reset_the_non_finite_count(
    registry: Any, model_dir: Path, tmp_path: Path
) -> None:
    from agent_r1.engine import build_session
    from agent_r1.engine.update import NonFiniteLossWarning, update

    registry.register_plugin(NaNPlugin(), "nan")
    config = toy_config(
        model_dir,
        tmp_path / "run",
        algorithm={"name": "grpo", "loss": {"name": "nan_loss"}},
        trainer={
            "steps": 5,
            "tasks_per_step": 2,
            "micro_batch_size": 8,
            "max_bad_steps": 2,
            "grad_clip": None,
        },
    )
    run = RunConfig.model_validate(config)
    session = build_session(run, validate_components(run, registry), tmp_path / "run", registry=registry)

    def idle() -> list[Trajectory]:  # equal scores in every group: zero advantages, nothing to learn
        trajectories = fixed_trajectories(session.tokenizer)
        for t in trajectories:
            t.rewards = [RewardSignal(name="answer_match", value=1.0)]
        return trajectories

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NonFiniteLossWarning)
        assert update(session, fixed_trajectories(session.tokenizer))["actor/skipped_updates"] == 1.0
        update(session, idle())  # no gradient: neither a good update nor a bad one
        assert session.bad_updates == 1
        with pytest.raises(TrainingAborted) as caught:
            update(session, fixed_trajectories(session.tokenizer))
    message = str(caught.value)
    assert "trainer.max_bad_steps=2" in message
    assert "enable gradient clipping (trainer.grad_clip=1.0)" in message  # the setting that applies
    assert "lower trainer.lr (now 0.03)" in message


def test_non_finite_rewards_stop_the_update_naming_their_source(
    registry: Any, model_dir: Path, tmp_path: Path
) -> None:
    from agent_r1.engine import build_session
    from agent_r1.engine.update import update

    run = RunConfig.model_validate(toy_config(model_dir, tmp_path / "run"))
    session = build_session(run, validate_components(run, registry), tmp_path / "run", registry=registry)
    trajectories = fixed_trajectories(session.tokenizer)
    # RewardSignal refuses NaN on validation; model_construct is how a careless plugin slips one by.
    bad = RewardSignal.model_construct(
        name="judge", value=float("nan"), kind="outcome", turn=None, weight=1.0, source="llm_judge"
    )
    trajectories[3].rewards.append(bad)
    with pytest.raises(AgentR1Error, match=r"NaN or infinite rewards \(first: 't3'.*from llm_judge"):
        update(session, trajectories)
