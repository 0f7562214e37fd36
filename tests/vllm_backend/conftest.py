"""Fixtures of the vLLM backend tests (``make test-vllm``, in the ``.venv-vllm`` environment).

These tests need vLLM, which the main environment does not have: without it they are not even
collected (the main suite stays free of them), unless ``AGENT_R1_REQUIRE_VLLM=1`` (set by
``make test-vllm``) turns its absence into an error. One SmolLM2 engine serves the whole session:
booting one costs 10-30 s on CPU; a test that changes the weights syncs the original ones back.
"""

from __future__ import annotations

import copy
import importlib.util
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

if importlib.util.find_spec("vllm") is None:
    if os.environ.get("AGENT_R1_REQUIRE_VLLM") == "1":
        raise RuntimeError("AGENT_R1_REQUIRE_VLLM=1 but vLLM is not importable: run `make venv-vllm`")
    collect_ignore_glob = ["test_*.py"]


@pytest.fixture(scope="session")
def smollm2(smollm2_path: Path) -> tuple[Any, Any]:
    """SmolLM2-135M-Instruct in float32 and its tokenizer (shared: restore what you change)."""
    import torch
    from transformers import AutoModelForCausalLM

    from agent_r1.models.loading import load_tokenizer

    model = AutoModelForCausalLM.from_pretrained(smollm2_path, dtype=torch.float32).eval()
    return model, load_tokenizer(smollm2_path)


@pytest.fixture(scope="session")
def vllm_backend(smollm2: tuple[Any, Any]) -> Iterator[Any]:
    """One in-process vLLM engine on SmolLM2's weights (prefix caching on, 1 GiB KV cache)."""
    from agent_r1.builtins.vllm_backend import VLLMBackend

    model, tokenizer = smollm2
    backend = VLLMBackend({"max_model_len": 2048}, model=model, tokenizer=tokenizer)
    yield backend
    backend.close()


@pytest.fixture
def fresh_smollm2(smollm2: tuple[Any, Any]) -> Any:
    """A copy of SmolLM2 a test may change."""
    return copy.deepcopy(smollm2[0])


@pytest.fixture(scope="session")
def tiny_vllm_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Llama checkpoint vLLM's CPU attention serves (head size 32), with the tiny
    ChatML tokenizer: an engine boots in a few seconds and generates fast."""
    from agent_r1.testing.models import save_tiny_model, tiny_model, tiny_tokenizer

    tokenizer = tiny_tokenizer()
    model = tiny_model(tokenizer, hidden=64, heads=2, seed=0)
    return save_tiny_model(tmp_path_factory.mktemp("tiny-vllm-async"), model, tokenizer)
