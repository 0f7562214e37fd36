"""The ``vllm`` rollout backend in an environment without vLLM (the main one): it is listed and
validated like any backend, preflight fails before any model loads, and building it says what to
install. Its behaviour with vLLM is tested by ``make test-vllm`` (tests/vllm_backend)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from agent_r1.config import RunConfig, load_config, validate_components
from agent_r1.errors import AgentR1Error
from agent_r1.registry import get_registry

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is not None,
    reason="vLLM is installed here: tests/vllm_backend covers it",
)


def test_vllm_backend_is_registered_without_importing_vllm() -> None:
    cls = get_registry().get("rollout_backends", "vllm")
    assert cls.name == "vllm"
    config = cls.Config.model_validate({"max_model_len": 1024, "lora_sync": "merged"})
    assert config.logprobs_mode == "processed_logprobs"
    assert importlib.util.find_spec("vllm") is None  # listing and validating imported no vLLM


def test_preflight_reports_the_missing_install(tmp_path: Path) -> None:
    from agent_r1.run.preflight import preflight

    config = load_config(None, ["rollout.backend.name=vllm", f"output_dir={tmp_path / 'run'}"])
    report = preflight(config, validate_components(config), prepare_models=False, skip=("prompts",))
    failures = " ".join(check.message for check in report.failures)
    assert "agent-r1[vllm]" in failures and "make test-vllm" in failures


def test_building_it_says_what_to_install(tiny_model, tiny_tokenizer) -> None:  # type: ignore[no-untyped-def]
    from agent_r1.builtins.vllm_backend import VLLMBackend

    with pytest.raises(AgentR1Error, match=r"pip install agent-r1\[vllm\]"):
        VLLMBackend({}, model=tiny_model, tokenizer=tiny_tokenizer)


def test_a_misspelt_option_is_a_config_error() -> None:
    from agent_r1.errors import ConfigError

    config = RunConfig.model_validate({"rollout": {"backend": {"name": "vllm", "kv_cache_gib": 2}}})
    with pytest.raises(ConfigError, match="kv_cache"):
        validate_components(config)
