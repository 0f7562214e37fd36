"""The ``vllm`` backend inside training, on a tiny random Llama (head size 32, which vLLM's CPU
attention supports): LoRA adapters synced as adapters and as merged weights, and a run of a few
GRPO steps on the toy task whose reward rises, every trajectory tagged with the weights that
produced it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from trainer_helpers import toy_config, toy_registry

from agent_r1.builtins.hf_backend import HFBackend
from agent_r1.config import RunConfig, validate_components
from agent_r1.contracts import SamplingParams
from agent_r1.registry import reset_registry


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from agent_r1.testing.models import save_tiny_model, tiny_model, tiny_tokenizer

    tokenizer = tiny_tokenizer()
    model = tiny_model(tokenizer, hidden=64, heads=2, seed=0)  # head size 32
    return save_tiny_model(tmp_path_factory.mktemp("tiny-vllm"), model, tokenizer)


def _greedy(backend: Any, prompts: list[list[int]]) -> list[list[int]]:
    out = backend.generate(prompts, SamplingParams(temperature=0, max_new_tokens=12))
    return [g.token_ids for g in out]


@pytest.mark.parametrize("lora_sync", ["adapter", "merged"])
def test_lora_sync_serves_the_trained_adapter(lora_sync: str, tiny_dir: Path) -> None:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from agent_r1.builtins.vllm_backend import VLLMBackend
    from agent_r1.models.loading import load_tokenizer

    tokenizer = load_tokenizer(tiny_dir)
    base = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32).eval()
    model = get_peft_model(base, LoraConfig(r=8, lora_alpha=16, target_modules="all-linear"))
    prompts = [tokenizer.encode(text) for text in ("hello there", "write digits", "a b c")]
    backend = VLLMBackend(
        {"lora_sync": lora_sync, "max_model_len": 256, "kv_cache_gb": 0.25, "max_lora_rank": 8},
        model=model,
        tokenizer=tokenizer,
    )
    try:
        hf = HFBackend({}, model=model, tokenizer=tokenizer)
        untrained = _greedy(backend, prompts)
        assert untrained == _greedy(hf, prompts)  # lora_B starts at zero: the base model
        generator = torch.Generator().manual_seed(1)
        with torch.no_grad():  # a deliberate "update" of the adapter only
            for name, param in model.named_parameters():
                if "lora_B" in name:
                    param.copy_(torch.randn(param.shape, generator=generator) * 0.5)
        backend.sync_weights(model, 1)
        trained = _greedy(backend, prompts)
        assert trained == _greedy(hf, prompts)
        assert trained != untrained
        assert backend.policy_version == 1
        if lora_sync == "adapter":
            assert backend._lora_request is not None and backend._lora_request.lora_int_id == 2
            assert backend.step_metrics()["backend/sync_tensors"] == sum(
                "lora_" in n for n, _ in model.named_parameters()
            )
    finally:
        backend.close()


def test_training_with_the_vllm_backend_raises_the_reward(tiny_dir: Path, tmp_path: Path) -> None:
    from agent_r1.engine import build_session, train_step

    registry = toy_registry()
    try:
        config = toy_config(
            tiny_dir,
            tmp_path / "run",
            rollout={"backend": {"name": "vllm", "max_model_len": 256, "kv_cache_gb": 0.25}},
            trainer={"steps": 8, "checkpoint_every": 0},
        )
        run = RunConfig.model_validate(config)
        session = build_session(run, validate_components(run, registry), tmp_path / "run", registry=registry)
        assert session.backend.name == "vllm"
        curve, kl = [], []
        for step in range(8):
            result = train_step(session)
            assert {t.policy_version for t in result.trajectories} == {step}
            assert session.backend.policy_version == step + 1
            curve.append(result.metrics["reward/answer_match"])
            if "rollout/mismatch/kl_k3" in result.metrics:  # absent when no row had an advantage
                kl.append(result.metrics["rollout/mismatch/kl_k3"])
        print("reward", [round(r, 3) for r in curve], "mismatch kl_k3", max(kl))
        early, late = sum(curve[:2]) / 2, sum(curve[-2:]) / 2
        assert late > early + 0.3, f"reward did not rise with the vllm backend: {curve}"
        assert kl and max(kl) < 1e-4, f"vLLM and the trainer disagree: mismatch KL {kl}"
        session.backend.close()
    finally:
        reset_registry()


@pytest.mark.parametrize("lora_sync", [None, "adapter"], ids=["full", "lora-adapter"])
def test_a_sharded_policy_streams_its_gathered_weights_to_vllm(
    lora_sync: str | None, tiny_dir: Path, tmp_path: Path
) -> None:
    """``trainer.sharding: fsdp2`` (one process: the policy's parameters are DTensors): every
    sync gathers the weights one tensor at a time (or the adapter's only) into vLLM, which then
    samples what the trainer's gathered policy computes."""
    from agent_r1.engine import build_session, train_step
    from agent_r1.engine.learner.sharding import is_sharded
    from agent_r1.models.loading import load_tokenizer

    registry = toy_registry()
    backend_options: dict[str, Any] = {"name": "vllm", "max_model_len": 256, "kv_cache_gb": 0.25}
    extra: dict[str, Any] = {}
    if lora_sync is not None:
        backend_options.update(lora_sync=lora_sync, max_lora_rank=8)
        extra["model"] = {"path": str(tiny_dir), "lora": {"r": 8, "alpha": 16}}
    try:
        config = toy_config(
            tiny_dir,
            tmp_path / "run",
            rollout={"backend": backend_options},
            trainer={"steps": 3, "checkpoint_every": 0, "sharding": "fsdp2"},
            **extra,
        )
        run = RunConfig.model_validate(config)
        session = build_session(run, validate_components(run, registry), tmp_path / "run", registry=registry)
        assert is_sharded(session.model)
        kl = []
        for _ in range(3):
            result = train_step(session)
            kl.append(result.metrics.get("rollout/mismatch/kl_k3", 0.0))
        assert session.backend.policy_version == 3
        assert max(kl) < 1e-4, f"vLLM does not sample the trained policy: mismatch KL {kl}"
        tokenizer = load_tokenizer(tiny_dir)
        prompts = [tokenizer.encode(text) for text in ("hello there", "write digits")]
        with session.rollout_weights():
            expected = _greedy(HFBackend({}, model=session.unwrapped, tokenizer=tokenizer), prompts)
        assert _greedy(session.backend, prompts) == expected
        synced = session.backend.step_metrics()["backend/sync_tensors"]
        names = [n for n in session.unwrapped.state_dict() if lora_sync is None or "lora_" in n]
        assert synced == len(names) > 0
        session.backend.close()
    finally:
        reset_registry()
