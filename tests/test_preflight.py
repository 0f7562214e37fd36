"""Preflight (agent_r1.run.preflight): every check passes on a good run config, and each problem
a run would hit later is found before any weights load, with a message saying what to do."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import pytest
from storage_helpers import small_tmpfs
from trainer_helpers import toy_config, write_config, write_tiny_checkpoint
from typer.testing import CliRunner

from agent_r1.config import RunConfig, validate_components
from agent_r1.run.preflight import PreflightError, PreflightReport, preflight


def _report(
    registry: Any, model_dir: Path, run_dir: Path, *, data: dict[str, Any] | None = None, **sections: Any
) -> PreflightReport:
    """Preflight of the toy run config with ``sections`` merged in and ``data`` replaced whole."""
    raw = toy_config(model_dir, run_dir, **sections)
    if data is not None:
        raw["data"] = data
    config = RunConfig.model_validate(raw)
    return preflight(config, validate_components(config, registry))


def _messages(report: PreflightReport, name: str, status: str) -> str:
    return " | ".join(c.message for c in report.checks if c.name == name and c.status == status)


def test_a_good_config_passes_every_check_and_creates_nothing(
    registry: Any, model_dir: Path, tmp_path: Path
) -> None:
    run_dir = tmp_path / "runs" / "new"
    report = _report(registry, model_dir, run_dir)
    assert report.ok, report.as_dicts()
    assert not report.warnings, report.as_dicts()
    names = [c.name for c in report.checks]
    for name in ("device", "model", "context", "tokenizer", "data", "trackers", "output", "prompts"):
        assert name in names, names
    assert "16 train tasks, 4 in split 'eval'" in _messages(report, "data", "ok")
    assert "GiB free" in _messages(report, "output", "ok")
    assert "files complete" in _messages(report, "model", "ok")
    assert "rollout.max_context=256 within the model's 2048 positions" in _messages(report, "context", "ok")
    report.raise_on_failure()  # nothing to raise
    assert sorted(p.name for p in tmp_path.iterdir()) == [], "preflight created files"


def test_the_launch_and_the_sharding_setting_must_agree(
    registry: Any, model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    failure = _messages(_report(registry, model_dir, tmp_path / "run"), "distributed", "fail")
    assert "DeepSpeed (ACCELERATE_USE_DEEPSPEED=true), which agent-r1 does not support" in failure
    monkeypatch.delenv("ACCELERATE_USE_DEEPSPEED")
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    failure = _messages(_report(registry, model_dir, tmp_path / "run"), "distributed", "fail")
    assert "FSDP (ACCELERATE_USE_FSDP=true), but trainer.sharding is 'none'" in failure
    sharded = {"trainer": {"sharding": "fsdp2"}}
    ok = _messages(_report(registry, model_dir, tmp_path / "run", **sharded), "distributed", "ok")
    assert "FSDP2 sharding over 1 process(es) (nothing to split on one process)" in ok
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "false")
    assert "data parallel (DDP) over" in _messages(
        _report(registry, model_dir, tmp_path / "run"), "distributed", "ok"
    )


def test_lora_target_that_is_not_a_module_fails_with_a_suggestion(
    registry: Any, model_dir: Path, tmp_path: Path
) -> None:
    report = _report(
        registry,
        model_dir,
        tmp_path / "run",
        model={"path": str(model_dir), "lora": {"target_modules": ["q_prj", "v_proj"]}},
    )
    message = _messages(report, "lora", "fail")
    assert "'q_prj' is not a module of the model (llama)" in message
    assert "Did you mean 'q_proj'?" in message and "v_proj" in message
    good = _report(
        registry,
        model_dir,
        tmp_path / "run",
        model={"path": str(model_dir), "lora": {"target_modules": ["q_proj"]}},
    )
    assert "q_proj: 2 modules" in _messages(good, "lora", "ok")  # one per layer


def test_context_beyond_the_trained_positions_warns_for_rope(registry: Any, tmp_path: Path) -> None:
    from agent_r1.testing.models import save_tiny_model

    short = save_tiny_model(tmp_path / "short", max_positions=128)
    report = _report(registry, short, tmp_path / "run", rollout={"max_context": 256})
    assert report.ok
    assert "rollout.max_context=256 exceeds the 128 positions the model was trained with" in _messages(
        report, "context", "warn"
    )


def test_context_beyond_learned_positions_fails(registry: Any, tmp_path: Path) -> None:
    from transformers import GPT2Config, GPT2LMHeadModel

    from agent_r1.testing.models import tiny_tokenizer

    tokenizer = tiny_tokenizer()
    config = GPT2Config(vocab_size=len(tokenizer), n_positions=64, n_embd=32, n_layer=1, n_head=2)
    GPT2LMHeadModel(config).save_pretrained(str(tmp_path / "gpt2"))
    tokenizer.save_pretrained(str(tmp_path / "gpt2"))
    report = _report(registry, tmp_path / "gpt2", tmp_path / "run", rollout={"max_context": 256})
    assert "rollout.max_context=256 exceeds the model's 64 learned positions" in _messages(
        report, "context", "fail"
    )
    with pytest.raises(PreflightError, match=r"Set rollout\.max_context=64 or less"):
        report.raise_on_failure()


def test_every_prompt_over_the_context_budget_fails_instead_of_training_on_nothing(
    registry: Any, model_dir: Path, tmp_path: Path
) -> None:
    report = _report(registry, model_dir, tmp_path / "run", rollout={"max_context": 16})
    message = _messages(report, "prompts", "fail")
    assert "every one of the first 16 train prompts" in message and "train on nothing" in message
    assert "Raise rollout.max_context above" in message


def test_dataset_problems_name_the_file_and_line(registry: Any, model_dir: Path, tmp_path: Path) -> None:
    missing = tmp_path / "no-such.jsonl"
    report = _report(
        registry, model_dir, tmp_path / "run", data={"name": "jsonl_tasks", "path": str(missing)}
    )
    assert f"task file {str(missing)!r} does not exist" in _messages(report, "data", "fail")
    broken = tmp_path / "tasks.jsonl"
    broken.write_text('{"question": "1+1", "answer": "2"}\n{"question": oops}\n', encoding="utf-8")
    report = _report(registry, model_dir, tmp_path / "run", data={"name": "jsonl_tasks", "path": str(broken)})
    assert f"{broken}:2: not valid JSON" in _messages(report, "data", "fail")


def test_a_tracker_whose_package_is_missing_fails(registry: Any, model_dir: Path, tmp_path: Path) -> None:
    import importlib.util

    if importlib.util.find_spec("wandb") is not None:
        pytest.skip("wandb is installed here; the check needs a tracker package that is absent")
    report = _report(registry, model_dir, tmp_path / "run", trackers=[{"name": "wandb"}])
    assert "needs the 'wandb' package" in _messages(report, "trackers", "fail")
    assert "pip install agent-r1[wandb]" in _messages(report, "trackers", "fail")


def test_component_check_hook_reports_failures_and_warnings(
    registry: Any, model_dir: Path, tmp_path: Path
) -> None:
    config = RunConfig.model_validate(toy_config(model_dir, tmp_path / "run"))
    components = validate_components(config, registry)
    env = next(c for c in components if c.path == "environment")

    built = []

    class CheckedEnv(env.cls):  # type: ignore[misc,name-defined]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            built.append(self)
            super().__init__(*args, **kwargs)

        @classmethod
        def check(cls, config: Any) -> list[str]:
            warnings.warn("the corpus index is stale; it will be rebuilt", stacklevel=1)
            return [
                "corpus 'wiki' is empty (0 passages in /data/wiki.jsonl)",
                "server 'search' does not answer",
            ]

    env.cls = CheckedEnv
    report = preflight(config, components)
    failures = [c.message for c in report.failures if c.name == "component"]
    assert failures == [  # one failure per problem
        "environment (toy_single_turn): corpus 'wiki' is empty (0 passages in /data/wiki.jsonl)",
        "environment (toy_single_turn): server 'search' does not answer",
    ]
    assert "the corpus index is stale" in _messages(report, "component", "warn")
    # the environment is not built again to meet the same problems in the prompt check
    assert built == []
    assert "not checked: the environment (toy_single_turn) failed its own check" in _messages(
        report, "prompts", "warn"
    )


def test_missing_tokenizer_and_truncated_weights_fail_without_loading(registry: Any, tmp_path: Path) -> None:
    broken = write_tiny_checkpoint(tmp_path / "broken")
    (broken / "tokenizer.json").unlink()
    weights = broken / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    report = _report(registry, broken, tmp_path / "run")
    assert "model.safetensors is truncated" in _messages(report, "model", "fail")
    fixed = write_tiny_checkpoint(tmp_path / "notok")
    (fixed / "tokenizer.json").unlink()
    report = _report(registry, fixed, tmp_path / "run")
    assert "no tokenizer files" in _messages(report, "tokenizer", "fail")


def test_output_directory_on_a_full_or_read_only_disk_fails(
    registry: Any, model_dir: Path, tmp_path: Path
) -> None:
    with small_tmpfs(tmp_path, size="1m") as full:
        if full is None:
            pytest.skip("cannot mount a small tmpfs here (needs root on Linux)")
        report = _report(registry, model_dir, full / "run")
        message = _messages(report, "output", "fail")
        assert "the disk is nearly full" in message and "GiB free" in message
    with small_tmpfs(tmp_path, read_only=True) as read_only:
        assert read_only is not None
        report = _report(registry, model_dir, read_only / "runs" / "{now}")
        message = _messages(report, "output", "fail")
        assert f"{read_only} is not writable" in message and "choose another output_dir" in message


def test_raise_on_failure_lists_every_failure(registry: Any, tmp_path: Path) -> None:
    report = _report(
        registry,
        tmp_path / "no-such-model",
        tmp_path / "run",
        data={"name": "jsonl_tasks", "path": str(tmp_path / "none.jsonl")},
    )
    assert {c.name for c in report.failures} >= {"model", "data"}
    with pytest.raises(PreflightError) as info:
        report.raise_on_failure()
    text = str(info.value)
    assert "preflight found" in text and "- model:" in text and "- data:" in text
    assert json.dumps(report.as_dicts())  # serialisable for `agent-r1 check --json`


def test_skipped_checks_do_not_run(registry: Any, model_dir: Path, tmp_path: Path) -> None:
    report = _report(registry, model_dir, tmp_path / "run", rollout={"max_context": 16})
    config = RunConfig.model_validate(toy_config(model_dir, tmp_path / "run", rollout={"max_context": 16}))
    skipped = preflight(config, validate_components(config, registry), skip=("prompts", "output"))
    assert {c.name for c in report.checks} - {c.name for c in skipped.checks} == {"prompts", "output"}
    assert skipped.ok and not report.ok


# --------------------------------------------------------------------------------------------
# tools: what the environment offers is in the rendered prompt
# --------------------------------------------------------------------------------------------

PLAIN_CHATML = (  # SmolLM2's kind of template: no tools section, so the tools argument is dropped
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def _calculator_config(model_dir: Path, run_dir: Path, **environment: Any) -> dict[str, Any]:
    return toy_config(
        model_dir,
        run_dir,
        data={"name": "arithmetic", "num_train": 4, "num_eval": 2},
        environment={"name": "tool_env", "tools": ["calculator"], "format": "hermes", **environment},
        rewards=[{"name": "answer_match", "weight": 1.0}],
        rollout={"max_turns": 2, "max_context": 1024},
    )


def _check(config: Path, *overrides: str) -> tuple[int, list[dict[str, str]]]:
    """``agent-r1 check CONFIG OVERRIDES --json``, in-process: the exit code and the checks."""
    from agent_r1.cli import app

    result = CliRunner().invoke(app, ["check", str(config), *overrides, "--json"])
    assert result.exit_code in (0, 2), result.output
    return result.exit_code, json.loads(result.stdout)


def test_check_refuses_tools_that_the_chat_template_leaves_out(
    registry: Any, model_dir: Path, tmp_path: Path
) -> None:
    raw = _calculator_config(model_dir, tmp_path / "run")
    raw["model"]["chat_template"] = PLAIN_CHATML
    config = write_config(tmp_path / "run.yaml", raw)

    code, checks = _check(config)
    assert code == 2
    [failure] = [c for c in checks if c["status"] == "fail"]
    assert failure["name"] == "tools"
    message = failure["message"]
    assert message.startswith(
        "environment (tool_env): the first train prompt, rendered with model.chat_template (the template "
        f"text) (model.path={str(model_dir)!r}), does not show the tool(s) 'calculator': format 'hermes' "
        "hands their schemas to the chat template, which ignores its tools argument, so the model would "
        "never call them."
    )
    for fix in ("environment.tool_schemas: system", "environment.format: tags", "model.chat_template: a"):
        assert fix in message
    assert not (tmp_path / "run").exists()

    # the first fix: the environment writes the schemas into the system message
    code, checks = _check(config, "environment.tool_schemas=system")
    assert code == 0, [c for c in checks if c["status"] != "ok"]
    assert {
        "name": "tools",
        "status": "ok",
        "message": (
            "environment (tool_env): the first prompt shows its 1 tool (the system message names them)"
        ),
    } in checks
    # the third: a template that renders tools (the tiny model's own, Qwen2.5-style)
    del raw["model"]["chat_template"]
    code, checks = _check(write_config(tmp_path / "own.yaml", raw))
    assert code == 0
    assert "(the chat template renders their schemas)" in " ".join(
        c["message"] for c in checks if c["name"] == "tools"
    )


def test_tools_a_system_message_leaves_unnamed_fail(registry: Any, model_dir: Path, tmp_path: Path) -> None:
    raw = _calculator_config(model_dir, tmp_path / "run", format="tags", include_format_instructions=False)
    config = RunConfig.model_validate(raw)
    report = preflight(config, validate_components(config, registry))
    assert "format 'tags' describes tools in the system message, but it does not name them" in _messages(
        report, "tools", "fail"
    )
    assert "include_format_instructions: true" in _messages(report, "tools", "fail")
    # a tool called by a tag alias is shown by its tag (the calculator environment's <calc>)
    raw = _calculator_config(
        model_dir, tmp_path / "run", format={"name": "tags", "tool_tags": {"calculator": "calc"}}
    )
    config = RunConfig.model_validate(raw)
    report = preflight(config, validate_components(config, registry))
    assert report.ok, report.as_dicts()
    assert "shows its 1 tool (" in _messages(report, "tools", "ok")
