"""Exporting a trained policy as a Hugging Face model directory (agent_r1.engine.artifacts.export).

Every export is reloaded with plain transformers (or peft, for an adapter) and must generate
exactly what the in-memory model generates, greedily, on the same prompts.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from agent_r1.config import LoraConfig, ModelConfig, RunConfig, resolved_dict
from agent_r1.engine.artifacts import checkpoint as ckpt
from agent_r1.engine.artifacts.export import (
    EXPORT_RECORD,
    export_checkpoint,
    export_final,
    export_model,
    is_lora_model,
)
from agent_r1.errors import AgentR1Error
from agent_r1.models.loading import load_policy
from agent_r1.testing.models import save_tiny_model, tiny_model, tiny_tokenizer

PROMPTS = ["What is 3 plus 4?", "the answer is", "Compute 12 times 7 with the calculator tool."]


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_model(tmp_path_factory.mktemp("base"))


def _train(model: Any, tokenizer: Any, steps: int = 3) -> None:
    """A few real AdamW steps of language-model loss, so the weights move away from the base."""
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=3e-2)
    text = "the answer is 42. the sum of 3 and 4 is 7. call the calculator tool."
    ids = tokenizer(text, return_tensors="pt").input_ids
    model.train()
    for _ in range(steps):
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    model.eval()


def _greedy(model: Any, tokenizer: Any) -> list[list[int]]:
    """Greedy continuations of the chat-rendered prompts (16 new tokens each, no early stop)."""
    outputs = []
    for prompt in PROMPTS:
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}],
            add_generation_prompt=True,
            return_tensors="pt",
            return_dict=True,
        )["input_ids"]
        with torch.no_grad():
            out = model.generate(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                do_sample=False,
                max_new_tokens=16,
                min_new_tokens=16,
                pad_token_id=tokenizer.pad_token_id,
            )
        outputs.append(out[0, ids.shape[1] :].tolist())
    return outputs


def _logits(model: Any, tokenizer: Any) -> torch.Tensor:
    ids = tokenizer(" ".join(PROMPTS), return_tensors="pt").input_ids
    with torch.no_grad():
        return model(input_ids=ids).logits  # [1, T, V]


def _lora_policy(base_dir: Path) -> tuple[Any, Any]:
    model_cfg = ModelConfig(path=str(base_dir), device="cpu", lora=LoraConfig(r=4, alpha=8))
    model, tokenizer = load_policy(model_cfg)
    return model, tokenizer


# --------------------------------------------------------------------------------------------
# export_model
# --------------------------------------------------------------------------------------------


def test_trained_model_reloads_with_plain_transformers_and_generates_the_same(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = tiny_tokenizer()
    model = tiny_model(tokenizer, seed=3)
    initial = {k: v.clone() for k, v in model.state_dict().items()}
    _train(model, tokenizer)
    assert not torch.equal(
        initial["model.embed_tokens.weight"], model.state_dict()["model.embed_tokens.weight"]
    )

    out = export_model(model, tokenizer, tmp_path / "exported")
    names = {p.name for p in out.iterdir()}
    assert {"config.json", "model.safetensors", "generation_config.json", "tokenizer.json"} <= names
    assert {"chat_template.jinja", "tokenizer_config.json", EXPORT_RECORD} <= names
    assert json.loads((out / "tokenizer_config.json").read_text())["chat_template"] == tokenizer.chat_template
    assert json.loads((out / EXPORT_RECORD).read_text())["kind"] == "full"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")], "a staging directory was left"

    reloaded = AutoModelForCausalLM.from_pretrained(str(out)).eval()
    reloaded_tokenizer = AutoTokenizer.from_pretrained(str(out))
    assert reloaded_tokenizer.chat_template == tokenizer.chat_template
    for name, tensor in model.state_dict().items():
        assert torch.equal(reloaded.state_dict()[name], tensor), name
    assert _greedy(reloaded, reloaded_tokenizer) == _greedy(model, tokenizer)
    end_of_turn = tokenizer.convert_tokens_to_ids("<|im_end|>")
    eos = reloaded.generation_config.eos_token_id
    assert end_of_turn in (eos if isinstance(eos, list) else [eos])


def test_export_keeps_the_live_model_as_it_was(tmp_path: Path) -> None:
    tokenizer = tiny_tokenizer()
    model = tiny_model(tokenizer)
    model.config.use_cache = False  # as gradient checkpointing leaves it
    out = export_model(model, tokenizer, tmp_path / "out")
    assert json.loads((out / "config.json").read_text())["use_cache"] is True
    assert model.config.use_cache is False


def test_lora_adapter_reloads_through_peft_and_the_merged_model_matches(
    base_dir: Path, tmp_path: Path
) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model, tokenizer = _lora_policy(base_dir)
    _train(model, tokenizer)
    live_state = {k: v.clone() for k, v in model.state_dict().items()}
    expected = _greedy(model, tokenizer)
    expected_logits = _logits(model, tokenizer)
    plain_base = AutoModelForCausalLM.from_pretrained(str(base_dir)).eval()
    assert _greedy(plain_base, tokenizer) != expected, (
        "training did not change the outputs; the test is blind"
    )

    adapter = export_model(model, tokenizer, tmp_path / "adapter")
    names = {p.name for p in adapter.iterdir()}
    assert {"adapter_config.json", "adapter_model.safetensors", "tokenizer.json"} <= names
    assert "model.safetensors" not in names
    assert json.loads((adapter / "adapter_config.json").read_text())["base_model_name_or_path"] == str(
        base_dir
    )
    with_adapter = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(str(base_dir)), str(adapter)
    )
    with_adapter.eval()
    assert _greedy(with_adapter, tokenizer) == expected
    assert torch.allclose(_logits(with_adapter, tokenizer), expected_logits, atol=1e-6)

    merged = export_model(model, tokenizer, tmp_path / "merged", merge_lora=True)
    assert "adapter_config.json" not in {p.name for p in merged.iterdir()}
    plain = AutoModelForCausalLM.from_pretrained(str(merged)).eval()
    assert _greedy(plain, tokenizer) == expected
    assert torch.allclose(_logits(plain, tokenizer), expected_logits, atol=1e-5)
    assert json.loads((merged / EXPORT_RECORD).read_text())["kind"] == "merged-lora"

    assert is_lora_model(model), "merging must work on a copy"
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, live_state[name]), name


def test_export_refuses_a_directory_with_files_and_leaves_nothing_after_a_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tokenizer = tiny_tokenizer()
    model = tiny_model(tokenizer)
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "notes.txt").write_text("mine")
    with pytest.raises(AgentR1Error, match="already holds files; choose a new directory"):
        export_model(model, tokenizer, taken)
    assert [p.name for p in taken.iterdir()] == ["notes.txt"]

    def crash(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("crashed while writing the tokenizer")

    monkeypatch.setattr(tokenizer, "save_pretrained", crash)
    with pytest.raises(RuntimeError, match="crashed while writing"):
        export_model(model, tokenizer, tmp_path / "new")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["taken"], "a failed export left files behind"


# --------------------------------------------------------------------------------------------
# export_final
# --------------------------------------------------------------------------------------------


def test_export_final_of_a_lora_run_is_a_plain_model_with_the_adapter_beside(
    base_dir: Path, tmp_path: Path
) -> None:
    from transformers import AutoModelForCausalLM

    model, tokenizer = _lora_policy(base_dir)
    _train(model, tokenizer)
    model_cfg = ModelConfig(path=str(base_dir), lora=LoraConfig(r=4, alpha=8))
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    final = export_final(run_dir, model, tokenizer, model_cfg, step=2)
    assert final == run_dir / "final"
    record = json.loads((final / EXPORT_RECORD).read_text())
    assert (record["kind"], record["step"], record["base_model"]) == ("merged-lora", 2, str(base_dir))
    assert (final / "adapter" / "adapter_config.json").is_file()
    plain = AutoModelForCausalLM.from_pretrained(str(final)).eval()
    assert _greedy(plain, tokenizer) == _greedy(model, tokenizer)

    _train(model, tokenizer, steps=2)  # a resumed run that finishes again replaces final whole
    again = export_final(run_dir, model, tokenizer, model_cfg, step=4)
    assert json.loads((again / EXPORT_RECORD).read_text())["step"] == 4
    assert _greedy(AutoModelForCausalLM.from_pretrained(str(again)).eval(), tokenizer) == _greedy(
        model, tokenizer
    )
    assert sorted(p.name for p in run_dir.iterdir()) == ["final"]


# --------------------------------------------------------------------------------------------
# export_checkpoint
# --------------------------------------------------------------------------------------------


def _write_run(run_dir: Path, model: Any, model_cfg: ModelConfig, step: int) -> Path:
    """A run directory with a checkpoint in the trainer's on-disk format."""
    config = resolved_dict(RunConfig(model=model_cfg, output_dir=str(run_dir)))
    state = {"step": step, "model": {k: v.detach().cpu() for k, v in model.state_dict().items()}}
    return ckpt.save_checkpoint(run_dir / "checkpoints", step, state, config)


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_export_checkpoint_rebuilds_the_trained_policy(lora: bool, base_dir: Path, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    model_cfg = ModelConfig(path=str(base_dir), lora=LoraConfig(r=4, alpha=8) if lora else None)
    model, tokenizer = load_policy(model_cfg.model_copy(update={"device": "cpu"}))
    _write_run(tmp_path / "run", model, model_cfg, step=1)
    _train(model, tokenizer)
    _write_run(tmp_path / "run", model, model_cfg, step=2)
    expected = _greedy(model, tokenizer)

    out = export_checkpoint(tmp_path / "run", tmp_path / "out", merge_lora=lora)
    record = json.loads((out / EXPORT_RECORD).read_text())
    assert record["step"] == 2 and record["checkpoint"].endswith("step_000002")
    reloaded = AutoModelForCausalLM.from_pretrained(str(out)).eval()
    assert _greedy(reloaded, tokenizer) == expected
    one = export_checkpoint(
        tmp_path / "run" / "checkpoints" / "step_000001", tmp_path / "one", merge_lora=lora
    )
    assert _greedy(AutoModelForCausalLM.from_pretrained(str(one)).eval(), tokenizer) != expected


def test_export_checkpoint_carries_the_runs_chat_template(base_dir: Path, tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    template = (
        "{#- the run's own template -#}{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
        "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    model_cfg = ModelConfig(path=str(base_dir), chat_template=template)
    model, _ = load_policy(model_cfg.model_copy(update={"device": "cpu"}))
    _write_run(tmp_path / "run", model, model_cfg, step=1)
    out = export_checkpoint(tmp_path / "run", tmp_path / "out")
    assert AutoTokenizer.from_pretrained(str(out)).chat_template == template
    assert AutoTokenizer.from_pretrained(str(base_dir)).chat_template != template
