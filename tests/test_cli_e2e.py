"""The real ``agent-r1`` commands end to end, each in a subprocess: ``rollout`` and ``eval`` on a
tiny model saved to disk, ``train`` refusing bad input without losing or littering anything,
``config show`` and ``models list``.

The task is the toy target-character task of :mod:`agent_r1.testing.toy`, made discoverable to
the subprocesses by a distribution with a ``.dist-info`` on ``PYTHONPATH``.
"""

from __future__ import annotations

import json
import math
import os
import string
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
import yaml
from foundation_helpers import run_cli
from trainer_helpers import toy_config, write_config

from agent_r1.mdp import TokenSource, Trajectory, load_trajectories
from agent_r1.testing import write_plugin_distribution

ENV = {
    "AGENT_R1_DISABLE_PLUGINS": "search",  # only the bundled plugins and the toy task
    "AGENT_R1_STRICT_PLUGINS": "1",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
}
LETTERS = string.ascii_letters + " "


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("toy-site")
    write_plugin_distribution(
        root, "agent-r1-toy-plugin", files={}, entry_points={"toy": "agent_r1.testing.toy"}
    )
    return root


def agent_r1(args: list[str], site: Path) -> Any:
    """``agent-r1 ARGS`` in a subprocess that discovers the bundled plugins and the toy task."""
    return run_cli(args, sites=[site], env=ENV, isolate=False)


def _config(path: Path, model_dir: Path, run_dir: Path, **sections: Any) -> Path:
    return write_config(path, toy_config(model_dir, run_dir, **sections))


def _snapshot(directory: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()
    }


# --------------------------------------------------------------------------------------------
# rollout
# --------------------------------------------------------------------------------------------


def test_rollout_writes_token_faithful_trajectories(site: Path, model_dir: Path, tmp_path: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agent_r1.engine.learner.batch import collate, policy_forward

    config = _config(tmp_path / "run.yaml", model_dir, tmp_path / "run")
    out = tmp_path / "out" / "trajectories.jsonl"
    result = agent_r1(["rollout", str(config), "--out", str(out), "--num-tasks", "3"], site)
    assert result.returncode == 0, result.stderr
    assert f"wrote 12 trajectories to {out}" in result.stdout
    assert not (tmp_path / "run").exists(), "rollout writes only --out"

    trajectories = load_trajectories(out)
    assert len(trajectories) == 12
    groups: defaultdict[str, list[Trajectory]] = defaultdict(list)
    for trajectory in trajectories:
        groups[trajectory.group_id].append(trajectory)
    assert sorted(len(g) for g in groups.values()) == [4, 4, 4]
    assert sorted({t.task_id for t in trajectories}) == ["t0", "t1", "t2"]

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    for trajectory in trajectories:
        sources = trajectory.sources
        # the loss mask is exactly the policy-sampled tokens
        assert trajectory.loss_mask == [int(s is TokenSource.POLICY) for s in sources]
        assert len(trajectory.token_ids) == len(sources) == len(trajectory.logprobs) == len(trajectory)
        assert trajectory.num_policy_tokens >= 1 and trajectory.prompt_length > 0
        assert all(
            lp == 0.0
            for lp, s in zip(trajectory.logprobs, sources, strict=True)
            if s is not TokenSource.POLICY
        )
        assert all(lp <= 0.0 and math.isfinite(lp) for lp in trajectory.logprobs)
        # the prompt is the chat-rendered task; the action text is the decoded policy tokens
        prompt = tokenizer.decode(trajectory.token_ids[: trajectory.prompt_length])
        assert f"Write only digits ({trajectory.task_id[1:]})." in prompt
        policy = [t for t, s in zip(trajectory.token_ids, sources, strict=True) if s is TokenSource.POLICY]
        assert tokenizer.decode(policy, skip_special_tokens=True) == trajectory.steps[-1].action.text
        assert [r.name for r in trajectory.rewards] == ["answer_match"]

    # the stored log-probabilities are the model's for the stored tokens (same weights)
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    batch = collate(trajectories, tokenizer.pad_token_id)
    with torch.no_grad():
        logprobs = policy_forward(model, batch.input_ids, batch.attention_mask).logprobs  # [B, T]
    gap = (logprobs - batch.rollout_logprobs).abs()[batch.loss_mask]
    assert float(gap.max()) < 1e-4


# --------------------------------------------------------------------------------------------
# eval
# --------------------------------------------------------------------------------------------


def _pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased estimator, written out naively: 1 - C(n - c, k) / C(n, k)."""
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def test_eval_writes_a_json_and_a_markdown_report(site: Path, model_dir: Path, tmp_path: Path) -> None:
    # Short answers scored against letters: some samples succeed, some fail.
    config = _config(
        tmp_path / "run.yaml",
        model_dir,
        tmp_path / "run",
        data={"name": "toy_target", "num_train": 16, "num_eval": 4, "target_chars": LETTERS},
        rollout={"max_new_tokens": 2},
        eval={"num_tasks": 4, "samples": 4, "temperature": 1.0, "before_training": False},
    )
    out = tmp_path / "eval"
    result = agent_r1(["eval", str(config), "--out", str(out)], site)
    assert result.returncode == 0, result.stderr
    assert "# Evaluation" in result.stdout
    assert sorted(p.name for p in out.iterdir()) == ["eval.json", "eval.md", "eval_eval.jsonl"]

    report = json.loads((out / "eval.json").read_text(encoding="utf-8"))
    assert (report["num_tasks"], report["num_trajectories"]) == (4, 16)
    trajectories = load_trajectories(out / "eval_eval.jsonl")
    wins = [t.reward_by_name()["answer_match"] >= 1.0 for t in trajectories]
    assert report["success"] == pytest.approx(sum(wins) / len(wins))
    assert 0 < sum(wins) < len(wins), "the setup should give both successes and failures"
    per_task: defaultdict[str, list[bool]] = defaultdict(list)
    for trajectory, won in zip(trajectories, wins, strict=True):
        per_task[trajectory.task_id].append(won)
    assert set(report["pass_at_k"]) == {"pass@1", "pass@2", "pass@4"}
    for k in (1, 2, 4):
        expected = sum(_pass_at_k(len(w), sum(w), k) for w in per_task.values()) / len(per_task)
        assert report["pass_at_k"][f"pass@{k}"] == pytest.approx(expected)

    markdown = (out / "eval.md").read_text(encoding="utf-8")
    assert markdown.startswith("# Evaluation")
    assert f"{report['successes']} of 16 trajectories, 4 tasks" in markdown
    assert "pass@4" in markdown


# --------------------------------------------------------------------------------------------
# train refuses bad input and loses nothing
# --------------------------------------------------------------------------------------------


def _previous_run(run_dir: Path) -> dict[str, bytes]:
    """A run directory as an earlier run left it."""
    (run_dir / "checkpoints" / "step_000002").mkdir(parents=True)
    (run_dir / "checkpoints" / "step_000002" / "state.pt").write_bytes(b"weights")
    (run_dir / "metrics.jsonl").write_text('{"step": 0}\n{"step": 1}\n', encoding="utf-8")
    return _snapshot(run_dir)


@pytest.mark.parametrize(
    ("where", "expected"),
    [
        ("override", "trainer.stpes: unknown key 'stpes'. Did you mean 'steps'?"),
        ("file", "rollout.max_turn: unknown key 'max_turn'. Did you mean 'max_turns'?"),
    ],
    ids=["override", "file"],
)
def test_train_with_a_misspelt_key_exits_2_naming_it(
    where: str, expected: str, site: Path, model_dir: Path, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    before = _previous_run(run_dir)
    data = toy_config(model_dir, run_dir)
    overrides = []
    if where == "file":
        data["rollout"]["max_turn"] = 2
    else:
        overrides = ["trainer.stpes=2"]
    config = write_config(tmp_path / "run.yaml", data)
    result = agent_r1(["train", str(config), *overrides], site)
    assert result.returncode == 2
    assert expected in " ".join(result.stderr.split()), result.stderr
    assert "Traceback" not in result.stderr
    assert _snapshot(run_dir) == before, "a refused run changed the existing run directory"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run", "run.yaml"]


def test_train_with_a_missing_model_exits_2_and_leaves_the_run_directory_alone(
    site: Path, tmp_path: Path
) -> None:
    missing = tmp_path / "no-such-model"
    run_dir = tmp_path / "run"
    (run_dir / "notes.txt").parent.mkdir()
    (run_dir / "notes.txt").write_text("mine", encoding="utf-8")
    before = _snapshot(run_dir)
    config = _config(tmp_path / "run.yaml", missing, run_dir)
    result = agent_r1(["train", str(config)], site)
    assert result.returncode == 2
    message = " ".join(result.stderr.split())
    assert f"model '{missing}' was not found" in message and "model.path=" in message, result.stderr
    assert "Traceback" not in result.stderr
    assert _snapshot(run_dir) == before
    assert not missing.exists()


def test_train_refuses_to_overwrite_a_run_with_checkpoints(
    site: Path, model_dir: Path, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    before = _previous_run(run_dir)
    result = agent_r1(["train", str(_config(tmp_path / "run.yaml", model_dir, run_dir))], site)
    assert result.returncode == 2
    message = " ".join(result.stderr.split())
    assert f"{run_dir} already holds a run" in message and "Continue it with --resume" in message
    assert _snapshot(run_dir) == before


def test_train_with_a_missing_model_creates_no_run_directory(site: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "runs" / "new"
    result = agent_r1(
        ["train", str(_config(tmp_path / "run.yaml", tmp_path / "no-such-model", run_dir))], site
    )
    assert result.returncode == 2 and "was not found" in result.stderr
    assert not (tmp_path / "runs").exists(), os.listdir(tmp_path / "runs")


# --------------------------------------------------------------------------------------------
# config show / models list
# --------------------------------------------------------------------------------------------


def test_config_show_demo(site: Path) -> None:
    result = agent_r1(["config", "show", "demo"], site)
    assert result.returncode == 0, result.stderr
    shown = yaml.safe_load(result.stdout)
    assert shown["model"]["path"] == "smollm2-135m-instruct"
    assert (shown["data"]["name"], shown["environment"]["name"], shown["algorithm"]["name"]) == (
        "arithmetic",
        "calculator",
        "grpo",
    )
    assert shown["environment"]["tools"] == ["calculator"]  # component defaults are filled in
    from agent_r1.config import bundled_config_path

    bundled = yaml.safe_load(bundled_config_path("demo").read_text())  # values the file sets win
    assert shown["trainer"]["steps"] == bundled["trainer"]["steps"]
    as_json = agent_r1(["config", "show", "demo", "--json", "trainer.steps=3"], site)
    assert as_json.returncode == 0 and json.loads(as_json.stdout)["trainer"]["steps"] == 3


def test_models_list(site: Path) -> None:
    result = agent_r1(["models", "list"], site)
    assert result.returncode == 0, result.stderr
    line = next(line for line in result.stdout.splitlines() if line.startswith("smollm2-135m-instruct"))
    assert "(prepared)" in line or "(not prepared yet)" in line
    assert "SmolLM2-135M-Instruct" in line


# --------------------------------------------------------------------------------------------
# a usable model out: run/final, `agent-r1 export`, model.path=RUN
# --------------------------------------------------------------------------------------------


def test_a_trained_run_exports_a_model_that_plain_transformers_loads(
    site: Path, model_dir: Path, tmp_path: Path
) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    run_dir = tmp_path / "run"
    config = _config(tmp_path / "run.yaml", model_dir, run_dir, trainer={"steps": 2, "checkpoint_every": 1})
    trained = agent_r1(["train", str(config)], site)
    assert trained.returncode == 0, trained.stderr

    out = tmp_path / "exported"
    exported = agent_r1(["export", str(run_dir), "--out", str(out)], site)
    assert exported.returncode == 0, exported.stderr
    assert f"exported {run_dir / 'checkpoints' / 'step_000002'} (step 2) to {out}" in exported.stdout
    assert "AutoModelForCausalLM.from_pretrained" in exported.stdout

    final = AutoModelForCausalLM.from_pretrained(str(run_dir / "final")).eval()
    model = AutoModelForCausalLM.from_pretrained(str(out)).eval()
    base = AutoModelForCausalLM.from_pretrained(str(model_dir)).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(out))
    assert tokenizer.chat_template, "the chat template travels with the export"
    changed = False
    for name, tensor in model.state_dict().items():  # the last checkpoint is the end-of-run model
        assert torch.equal(tensor, final.state_dict()[name]), name
        changed |= not torch.equal(tensor, base.state_dict()[name])
    assert changed, "training did not change the weights; the comparison is blind"
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Write only digits (3)."}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )["input_ids"]
    generate = {"do_sample": False, "max_new_tokens": 8, "pad_token_id": tokenizer.pad_token_id}
    assert torch.equal(model.generate(ids, **generate), final.generate(ids, **generate))

    # model.path=RUN evaluates the run's final model; a checkpoint is refused with advice
    evaluated = agent_r1(
        [
            "eval",
            str(_config(tmp_path / "again.yaml", run_dir, tmp_path / "again")),
            "--out",
            str(tmp_path / "ev"),
        ],
        site,
    )
    assert evaluated.returncode == 0, evaluated.stderr
    refused = agent_r1(
        [
            "eval",
            str(_config(tmp_path / "ckpt.yaml", run_dir / "checkpoints" / "step_000002", tmp_path / "x")),
        ],
        site,
    )
    assert refused.returncode == 2 and "is a training checkpoint" in refused.stderr


# --------------------------------------------------------------------------------------------
# check / config show run the preflight
# --------------------------------------------------------------------------------------------


def test_check_prints_the_report_and_exits_2_on_a_failure(
    site: Path, model_dir: Path, tmp_path: Path
) -> None:
    config = _config(tmp_path / "run.yaml", model_dir, tmp_path / "run")
    good = agent_r1(["check", str(config)], site)
    assert good.returncode == 0, good.stdout + good.stderr
    assert "agent-r1 preflight" in good.stdout and "0 failed" in good.stdout
    for name in ("model", "tokenizer", "context", "data", "output", "prompts"):
        assert name in good.stdout
    bad = agent_r1(["check", str(config), "rollout.max_context=16"], site)
    assert bad.returncode == 2
    assert "train on nothing" in " ".join(bad.stdout.split()) and "1 failed" in bad.stdout
    as_json = agent_r1(["check", str(config), "--json"], site)
    assert {c["status"] for c in json.loads(as_json.stdout)} == {"ok"}
    assert not (tmp_path / "run").exists(), "check created the run directory"


def test_config_show_prints_the_config_then_the_preflight_problems(
    site: Path, model_dir: Path, tmp_path: Path
) -> None:
    config = _config(tmp_path / "run.yaml", model_dir, tmp_path / "run")
    shown = agent_r1(["config", "show", str(config), "rollout.max_context=16"], site)
    assert shown.returncode == 2
    assert yaml.safe_load(shown.stdout)["rollout"]["max_context"] == 16, "the config is printed in full"
    stderr = " ".join(shown.stderr.split())
    assert "error: prompts: every one of the first" in stderr and "Traceback" not in stderr
    unchecked = agent_r1(["config", "show", str(config), "rollout.max_context=16", "--no-check"], site)
    assert unchecked.returncode == 0 and unchecked.stderr.strip() == ""
