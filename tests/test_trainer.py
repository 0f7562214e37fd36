"""End-to-end trainer tests on a tiny random model and the toy target-character task."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from trainer_helpers import fixed_trajectories, toy_config, write_config

from agent_r1.config import RunConfig, validate_components
from agent_r1.engine import train_step
from agent_r1.engine.collect import flat_groups
from agent_r1.engine.update import update
from agent_r1.mdp import RewardSignal, Trajectory


def _session(config: dict[str, Any], registry: Any) -> Any:
    from agent_r1.engine import build_session

    run = RunConfig.model_validate(config)
    return build_session(run, validate_components(run, registry), Path(run.output_dir), registry=registry)


def _reward_curve(session: Any, steps: int) -> list[float]:
    return [train_step(session).metrics["reward/answer_match"] for _ in range(steps)]


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", ["grpo", "rloo", "reinforce_pp"])
def test_reward_rises_on_toy_task(algorithm: str, registry: Any, model_dir: Path, tmp_path: Path) -> None:
    config = toy_config(model_dir, tmp_path / "run", algorithm={"name": algorithm})
    session = _session(config, registry)
    curve = _reward_curve(session, 10)
    early, late = sum(curve[:3]) / 3, sum(curve[-3:]) / 3
    assert early < 0.2 and late > early + 0.5, f"{algorithm}: reward did not rise: {curve}"


@pytest.mark.slow
def test_ppo_with_critic_learns(registry: Any, model_dir: Path, tmp_path: Path) -> None:
    config = toy_config(
        model_dir,
        tmp_path / "run",
        algorithm={"name": "ppo", "critic": {"kind": "value_head", "lr": 1e-3}},
        trainer={
            "steps": 12,
            "tasks_per_step": 4,
            "micro_batch_size": 8,
            "lr": 3e-2,
            "epochs": 2,
            "mini_batches": 2,
        },
    )
    session = _session(config, registry)
    assert session.value_head is not None and session.ref_model is None
    metrics = [train_step(session).metrics for _ in range(12)]
    curve = [m["reward/answer_match"] for m in metrics]
    assert sum(curve[-3:]) / 3 > sum(curve[:3]) / 3 + 0.5, curve
    assert all("critic/value_loss" in m for m in metrics)


@pytest.mark.parametrize(
    ("aggregation", "shared_prompt"),
    [("token-mean", 0), ("seq-mean-token-mean", 0), ("seq-mean-token-sum-norm", 0), ("token-mean", 40)],
)
def test_update_does_not_depend_on_micro_batch_size(
    aggregation: str, shared_prompt: int, registry: Any, model_dir: Path, tmp_path: Path, monkeypatch: Any
) -> None:
    """The same trajectories give the same gradient for micro-batches of 1, 3 and 8 (the gradient
    the optimizer stepped with stays in ``.grad``; Adam's first step would hide scale errors).
    With a long prompt that all rows share, the smaller micro-batches run it once per optimizer
    step (StepPrefix) and the single micro-batch of 8 shares it within itself."""
    import agent_r1.engine.update as update_module

    prefixes: list[int] = []

    class CountedStepPrefix(update_module.StepPrefix):
        def __init__(self, model: Any, ids: torch.Tensor) -> None:
            prefixes.append(int(ids.shape[1]))
            super().__init__(model, ids)

    monkeypatch.setattr(update_module, "StepPrefix", CountedStepPrefix)
    results = []
    for micro in (1, 3, 8):
        config = toy_config(
            model_dir,
            tmp_path / f"run{micro}",
            algorithm={"name": "grpo", "aggregation": aggregation},
            trainer={
                "steps": 1,
                "tasks_per_step": 2,
                "micro_batch_size": micro,
                "lr": 1e-2,
                "grad_clip": None,
            },
        )
        session = _session(config, registry)
        update(session, fixed_trajectories(session.tokenizer, shared_prompt=shared_prompt))
        results.append(
            torch.cat([p.grad.flatten() for p in session.unwrapped.parameters() if p.grad is not None])
        )
    # one step-wide prefix for micro-batches of 1 and of 3 (none for one micro-batch of 8), covering
    # at least the shared prompt (template tokens before it are shared too)
    assert len(prefixes) == (2 if shared_prompt else 0)
    assert all(length >= shared_prompt for length in prefixes)
    assert results[0].abs().max() > 1e-3
    assert torch.allclose(results[0], results[1], atol=1e-7, rtol=1e-5)
    assert torch.allclose(results[0], results[2], atol=1e-7, rtol=1e-5)


def test_kl_loads_reference_only_when_needed(registry: Any, model_dir: Path, tmp_path: Path) -> None:
    no_kl = _session(toy_config(model_dir, tmp_path / "a"), registry)
    assert no_kl.ref_model is None
    with_kl = _session(
        toy_config(
            model_dir, tmp_path / "b", algorithm={"name": "grpo", "kl": {"coef": 0.1, "estimator": "k3"}}
        ),
        registry,
    )
    assert with_kl.ref_model is not None
    metrics = update(with_kl, fixed_trajectories(with_kl.tokenizer))
    assert metrics["actor/kl"] == pytest.approx(0.0, abs=1e-6)  # same weights before the update
    metrics = update(with_kl, fixed_trajectories(with_kl.tokenizer))
    assert metrics["actor/kl"] > 0.0


def test_nan_loss_is_skipped_then_aborts(registry: Any, model_dir: Path, tmp_path: Path) -> None:
    from agent_r1 import ComponentConfig, PolicyLoss, hookimpl
    from agent_r1.engine.update import NonFiniteLossWarning
    from agent_r1.errors import TrainingAborted

    class NaNLoss(PolicyLoss):
        name = "nan_loss"

        class Config(ComponentConfig):
            pass

        def token_loss(self, inputs: Any) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
            return inputs.logprobs * float("nan"), {}

    class Plugin:
        @hookimpl
        def register_policy_losses(self) -> list[Any]:
            return [NaNLoss]

    registry.register_plugin(Plugin(), "nan-plugin")
    config = toy_config(
        model_dir,
        tmp_path / "run",
        algorithm={"name": "grpo", "loss": {"name": "nan_loss"}},
        trainer={"steps": 5, "tasks_per_step": 2, "micro_batch_size": 8, "max_bad_steps": 2},
    )
    session = _session(config, registry)
    before = [p.detach().clone() for p in session.unwrapped.parameters()]
    with pytest.warns(NonFiniteLossWarning, match="skipped"):
        metrics = update(session, fixed_trajectories(session.tokenizer))
    assert metrics["actor/skipped_updates"] == 1.0
    assert all(torch.equal(a, b) for a, b in zip(before, session.unwrapped.parameters(), strict=False))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NonFiniteLossWarning)
        with pytest.raises(TrainingAborted, match="max_bad_steps=2"):
            update(session, fixed_trajectories(session.tokenizer))


@pytest.mark.slow
@pytest.mark.covers_hook("on_train_start")
@pytest.mark.covers_hook("on_rollout_end")
@pytest.mark.covers_hook("on_update_end")
@pytest.mark.covers_hook("on_eval_end")
@pytest.mark.covers_hook("on_checkpoint")
@pytest.mark.covers_hook("on_train_end")
def test_train_run_writes_everything_and_calls_observers(
    registry: Any, model_dir: Path, tmp_path: Path
) -> None:
    from agent_r1 import hookimpl
    from agent_r1.run.training import train

    calls: list[tuple[str, Any]] = []

    class Observer:
        @hookimpl
        def on_train_start(self, run_dir: Path, config: dict[str, Any]) -> None:
            calls.append(("on_train_start", config["algorithm"]["name"]))

        @hookimpl
        def on_rollout_end(self, step: int, trajectories: list[Trajectory]) -> None:
            calls.append(("on_rollout_end", (step, len(trajectories))))

        @hookimpl
        def on_update_end(self, step: int, metrics: dict[str, float]) -> None:
            calls.append(("on_update_end", step))

        @hookimpl
        def on_eval_end(self, step: int, report: dict[str, Any]) -> None:
            calls.append(("on_eval_end", report["label"]))

        @hookimpl
        def on_checkpoint(self, step: int, path: Path) -> None:
            calls.append(("on_checkpoint", path.name))

        @hookimpl
        def on_train_end(self, run_dir: Path, metrics: dict[str, float]) -> None:
            calls.append(("on_train_end", metrics["step"]))

    registry.register_plugin(Observer(), "observer")
    config = toy_config(model_dir, tmp_path / "run", eval={"num_tasks": 4, "before_training": True})
    path = write_config(tmp_path / "run.yaml", config)
    summary = train(path, ["trainer.steps=3", "trainer.checkpoint_every=2", "trainer.keep_checkpoints=5"])
    run_dir = tmp_path / "run"
    names = [name for name, _ in calls]
    assert names[0] == "on_eval_end" and calls[0][1] == "before"
    assert names[1] == "on_train_start"
    assert names.count("on_rollout_end") == 3 and names.count("on_update_end") == 3
    assert [v for n, v in calls if n == "on_checkpoint"] == ["step_000002", "step_000003"]
    assert names[-2:] == ["on_train_end", "on_eval_end"]
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == [1, 2, 3]
    for key in ("reward/answer_match", "actor/entropy", "time/generation_s", "batch/zero_variance_groups"):
        assert key in lines[0], key
    for name in ("report.html", "reward_curve.png", "eval_before.json", "eval_after.json", "config.json"):
        assert (run_dir / name).is_file(), name
    assert summary["after"]["success"] >= 0.0
    provenance = json.loads((run_dir / "provenance.json").read_text())
    assert {"toy", "builtins"} <= {p["plugin"] for p in provenance}


def test_remax_gets_a_greedy_baseline_per_task(registry: Any, model_dir: Path, tmp_path: Path) -> None:
    config = toy_config(
        model_dir,
        tmp_path / "run",
        algorithm={"name": "grpo", "estimator": {"name": "remax"}},
        trainer={"steps": 1, "tasks_per_step": 2, "micro_batch_size": 8},
    )
    session = _session(config, registry)
    result = train_step(session)
    metrics = result.metrics
    assert "reward/baseline_score_mean" in metrics
    baselines = {t.task_id: t.metrics["baseline_score"] for t in result.trajectories}
    assert len(baselines) == 2
    # advantage = score - baseline of the task, broadcast over the policy tokens
    expected = [t.score - t.metrics["baseline_score"] for t in result.trajectories]
    assert metrics["advantages/max"] == pytest.approx(max(expected), abs=1e-5)
    assert metrics["advantages/min"] == pytest.approx(min(expected), abs=1e-5)


def test_kl_in_the_reward_reaches_score_based_estimators(
    registry: Any, model_dir: Path, tmp_path: Path
) -> None:
    results = {}
    for coef in (0.0, 5.0):
        config = toy_config(
            model_dir,
            tmp_path / f"run{coef}",
            algorithm={"name": "rloo", "kl": {"coef": coef, "placement": "reward", "estimator": "k1"}},
            trainer={"steps": 2, "tasks_per_step": 2, "micro_batch_size": 8, "lr": 1e-2},
        )
        session = _session(config, registry)
        update(session, fixed_trajectories(session.tokenizer))  # moves the policy away from the reference
        results[coef] = update(session, fixed_trajectories(session.tokenizer))
    assert results[0.0]["advantages/max"] != pytest.approx(results[5.0]["advantages/max"], abs=1e-4)


def test_lora_trains_only_the_adapters(registry: Any, model_dir: Path, tmp_path: Path) -> None:
    config = toy_config(
        model_dir,
        tmp_path / "run",
        model={"path": str(model_dir), "lora": {"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]}},
        trainer={"steps": 2, "tasks_per_step": 2, "micro_batch_size": 8, "lr": 1e-2},
    )
    session = _session(config, registry)
    before = {n: p.detach().clone() for n, p in session.unwrapped.named_parameters()}
    update(session, fixed_trajectories(session.tokenizer))
    changed = {n for n, p in session.unwrapped.named_parameters() if not torch.equal(p, before[n])}
    assert changed and all("lora_" in n for n in changed), sorted(changed)[:5]
    metrics = train_step(session).metrics  # rollouts run through the adapted model too
    assert metrics["response/length_mean"] > 0


@pytest.mark.parametrize("pieces", [[1.0], [4.95, 0.7, 1 / 3], [4.95, 0.7, 0.3]])
def test_skipping_idle_rows_gives_the_same_update(
    registry: Any, model_dir: Path, tmp_path: Path, pieces: list[float]
) -> None:
    """Rows with all-zero advantages (a group whose scores are all equal) are skipped without
    changing the gradient, and a step with no busy row still moves the optimizer as usual. The
    group's equal scores are sums of fractional outcome and process rewards on different turns,
    summed in float32: the estimator must still see them as equal (exact zeros), as the
    zero-variance metric does."""
    grads = {}
    for skip in (True, False):
        config = toy_config(
            model_dir,
            tmp_path / f"run{skip}",
            trainer={
                "steps": 1,
                "tasks_per_step": 2,
                "micro_batch_size": 2,
                "lr": 1e-2,
                "skip_idle_rows": skip,
            },
        )
        session = _session(config, registry)
        trajectories = fixed_trajectories(session.tokenizer)
        for i, t in enumerate(trajectories[:4]):  # first group: equal scores, zero advantages under grpo
            order = pieces[i % len(pieces) :] + pieces[: i % len(pieces)]  # same total, other tokens
            t.rewards = [RewardSignal(name="answer_match", value=order[0])] + [
                RewardSignal(name=f"part{k}", value=v, kind="process", turn=k % 2)
                for k, v in enumerate(order[1:])
            ]
        assert flat_groups(trajectories) == {"g0"}
        metrics = update(session, trajectories)
        grads[skip] = torch.cat(
            [p.grad.flatten() for p in session.unwrapped.parameters() if p.grad is not None]
        )
        assert metrics.get("batch/idle_rows_skipped", 0.0) == (4.0 if skip else 0.0)
    assert torch.allclose(grads[True], grads[False], atol=1e-7, rtol=1e-5)
