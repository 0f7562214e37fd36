"""Loading: the device, the tokenizer and the policy (with LoRA adapters when configured).

torch and transformers are imported lazily, inside the functions that need them, so listing or
resolving models (``agent-r1 models ...``) stays fast."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent_r1.errors import ConfigError, ModelNotFound
from agent_r1.models.paths import resolve_model_path, tokenizer_problems, weight_problems, weights_message

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from agent_r1.config import ModelConfig

__all__ = [
    "is_lora_model",
    "load_policy",
    "load_tokenizer",
    "pick_device",
]


# --------------------------------------------------------------------------------------------
# Devices and loading
# --------------------------------------------------------------------------------------------


def pick_device(spec: str | torch.device = "auto") -> torch.device:
    """``"auto"`` gives ``cuda`` when a CUDA device is available, else ``cpu``; ``"cpu"``,
    ``"cuda"``, ``"cuda:1"``... are checked. Raises :class:`ConfigError` (path ``model.device``)
    for an unknown spec or a CUDA device that is not there."""
    import torch

    if isinstance(spec, torch.device):
        spec = str(spec)
    text = spec.strip().lower()
    if text == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(text)
    except (RuntimeError, ValueError):
        raise ConfigError(
            f"model.device: unknown device {spec!r}; use 'auto', 'cpu', 'cuda' or 'cuda:N'",
            path="model.device",
        ) from None
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise ConfigError(
                f"model.device is {spec!r} but no CUDA device is available (torch {torch.__version__}, "
                f"CUDA build: {torch.version.cuda or 'no'}); use model.device=cpu or model.device=auto",
                path="model.device",
            )
        if device.index is not None and device.index >= count:
            raise ConfigError(
                f"model.device is {spec!r} but only {count} CUDA device(s) exist (cuda:0..cuda:{count - 1})",
                path="model.device",
            )
    return device


_DTYPES = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16"}


def load_tokenizer(path: str | Path, *, cache_dir: str | Path | None = None) -> PreTrainedTokenizerBase:
    """The tokenizer of a model path or bundled name (resolved like :func:`resolve_model_path`),
    with a pad token guaranteed: when the checkpoint has none, the eos token pads."""
    from transformers import AutoTokenizer

    directory = resolve_model_path(path, cache_dir=cache_dir)
    problems = tokenizer_problems(directory)
    if problems:
        raise ModelNotFound(f"cannot load the tokenizer of {directory}: {problems[0]}")
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(directory))
    except Exception as exc:  # transformers raises OSError, ValueError, TypeError... for bad files
        raise ModelNotFound(
            f"cannot load the tokenizer in {directory}: {type(exc).__name__}: {exc}. Its tokenizer "
            "files are damaged or incomplete; save them again from the original model "
            "(tokenizer.save_pretrained(DIR))."
        ) from None
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise ModelNotFound(
                f"the tokenizer in {directory} has neither a pad nor an eos token; set pad_token in "
                "its tokenizer_config.json"
            )
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_policy(
    model_cfg: ModelConfig,
    *,
    device: str | torch.device | None = None,
    cache_dir: str | Path | None = None,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load the policy model and its tokenizer as ``model_cfg`` says, on ``device``.

    ``device`` defaults to ``model_cfg.device`` (see :func:`pick_device`). The model is in eval
    mode (call ``.train()`` to train). ``freeze_embeddings`` stops gradients to the input
    embedding matrix (with tied embeddings, as in SmolLM2 or Qwen2.5-0.5B, that is also the output
    head). ``gradient_checkpointing`` turns it on (non-reentrant) and disables the KV cache during
    training. With ``model_cfg.lora`` the model comes back wrapped by peft (a ``PeftModel``) with
    only the adapter weights trainable. The returned model's config always carries a pad token id.
    """
    import torch

    target = pick_device(model_cfg.device if device is None else device)
    directory = resolve_model_path(model_cfg.path, cache_dir=cache_dir)
    problems = weight_problems(directory)
    if problems:
        raise ModelNotFound(weights_message(directory, model_cfg.path, problems))
    tokenizer = load_tokenizer(directory)
    dtype = getattr(torch, _DTYPES[model_cfg.dtype])
    if target.type == "cpu" and dtype != torch.float32:
        warnings.warn(
            f"model.dtype={model_cfg.dtype} on CPU is usually much slower than float32 (many CPUs lack "
            "fast half-precision kernels) and less precise; use model.dtype=float32 on CPU",
            RuntimeWarning,
            stacklevel=2,
        )
    model = _from_pretrained(directory, model_cfg, dtype)
    if model.config.pad_token_id is None:
        model.config.pad_token_id = tokenizer.pad_token_id
    if model.generation_config is not None and model.generation_config.pad_token_id is None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
    if model_cfg.freeze_embeddings:
        model.get_input_embeddings().weight.requires_grad_(False)
    if model_cfg.gradient_checkpointing:
        # transformers 5 renamed gradient checkpointing to activation checkpointing.
        enable = getattr(model, "activation_checkpointing_enable", None)
        if enable is not None:
            enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.config.use_cache = False
    torch.nn.Module.to(model, target)  # PreTrainedModel.to is typed oddly; same call
    if model_cfg.lora is not None:
        model = _wrap_lora(model, model_cfg)
    return model, tokenizer


def _from_pretrained(directory: Path, model_cfg: ModelConfig, dtype: Any) -> PreTrainedModel:
    """The model in ``directory``, refusing one whose weights do not cover its config (which
    transformers would fill with random values and only log)."""
    from transformers import AutoModelForCausalLM

    kwargs: dict[str, Any] = {"dtype": dtype}
    if model_cfg.attn_implementation:
        kwargs["attn_implementation"] = model_cfg.attn_implementation
    try:
        loaded: Any = AutoModelForCausalLM.from_pretrained(str(directory), output_loading_info=True, **kwargs)
        model, loading = loaded
    except (ImportError, ValueError) as exc:
        message = str(exc).lower()
        if model_cfg.attn_implementation and ("attn" in message or "attention" in message):
            raise ConfigError(
                f"model.attn_implementation={model_cfg.attn_implementation!r} cannot be used: {exc}",
                path="model.attn_implementation",
            ) from None
        raise ModelNotFound(f"cannot load the model in {directory}: {type(exc).__name__}: {exc}") from None
    except (OSError, RuntimeError) as exc:
        # A damaged file that passed weight_problems (bad bytes inside a complete-looking file),
        # or a config that does not match the weights: the user's files, not a bug here.
        raise ModelNotFound(
            f"cannot load the model in {directory} (model.path={model_cfg.path!r}): "
            f"{type(exc).__name__}: {_first_line(exc)}. Copy or save the model again, or point "
            "model.path at a complete model directory."
        ) from None
    missing = sorted(loading.get("missing_keys") or ())
    if missing:
        # transformers initialises missing weights randomly and only logs it: training would start
        # from a partly random model without anyone noticing.
        raise ModelNotFound(
            f"the weights in {directory} do not cover the model its config.json describes: "
            f"{len(missing)} weight(s) missing (e.g. {missing[0]}). The weight files are incomplete or "
            "belong to another configuration; save the model again with save_pretrained."
        )
    return model  # type: ignore[no-any-return]


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else ""


def _wrap_lora(model: PreTrainedModel, model_cfg: ModelConfig) -> Any:
    lora = model_cfg.lora
    assert lora is not None
    if importlib.util.find_spec("peft") is None:
        raise ConfigError(
            "model.lora is set but the package peft is not installed: `pip install 'agent-r1[peft]'`",
            path="model.lora",
        )
    from peft import LoraConfig as PeftLoraConfig
    from peft import get_peft_model

    peft_config = PeftLoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=lora.target_modules,
        task_type="CAUSAL_LM",
    )
    try:
        return get_peft_model(model, peft_config)
    except ValueError as exc:
        raise ConfigError(f"model.lora.target_modules: {exc}", path="model.lora.target_modules") from None


def is_lora_model(model: Any) -> bool:
    """Whether ``model`` is a peft model carrying adapters (it has a ``peft_config``)."""
    return bool(getattr(model, "peft_config", None)) and hasattr(model, "merge_and_unload")
