"""A trained policy out as a Hugging Face model directory.

:func:`export_model` writes a model and its tokenizer to a directory that
``transformers.AutoModelForCausalLM.from_pretrained`` (and vLLM) load as it is: ``config.json``,
``model.safetensors``, the tokenizer files with the chat template, and a ``generation_config.json``
whose end-of-sequence ids include the chat template's end-of-turn token, so that plain generation
stops where the rollout's did. A peft LoRA model is written as its adapter (peft format:
``adapter_config.json``, ``adapter_model.safetensors``) or, with ``merge_lora``, as a merged plain
model. ``agent-r1-export.json`` records where the weights came from.

:func:`export_checkpoint` rebuilds the policy of a training checkpoint from the run config the
checkpoint recorded (its base model, dtype, LoRA setting), loads the checkpoint's weights exactly,
and exports it (``agent-r1 export RUN --out DIR``). :func:`export_final` is what the runner calls at
the end of every training run: ``<run>/final`` is always a plain model (LoRA merged), with the
adapter itself in ``<run>/final/adapter``. A run that trained a critic (PPO's value head, or a
separate critic model) exports it beside the policy in ``critic/``
(:mod:`agent_r1.engine.artifacts.critic_files`), where ``agent-r1 eval`` finds it for value-guided decoding.

Every export is written into a temporary sibling directory and renamed into place once complete,
so an interrupted or failed export (disk full included) leaves nothing half-written.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent_r1.errors import AgentR1Error, ModelNotFound
from agent_r1.models.loading import is_lora_model

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from agent_r1.config import ModelConfig

__all__ = [
    "EXPORT_RECORD",
    "export_checkpoint",
    "export_final",
    "export_model",
    "is_lora_model",
]

EXPORT_RECORD = "agent-r1-export.json"
"""Written into every export: agent-r1 version, source, LoRA handling, time."""

ADAPTER_DIR = "adapter"
"""Sub-directory of ``<run>/final`` holding the LoRA adapter of a LoRA run."""


def _check_target(out_dir: Path, *, replace: bool) -> None:
    if out_dir.exists() and not out_dir.is_dir():
        raise AgentR1Error(f"export target {out_dir} is a file; pass a directory to write the model into")
    if not replace and out_dir.is_dir() and any(out_dir.iterdir()):
        raise AgentR1Error(
            f"export target {out_dir} already holds files; choose a new directory (--out) or delete it first"
        )


def _staging_dir(out_dir: Path) -> Path:
    from agent_r1.engine.artifacts.checkpoint import storage_error

    try:
        out_dir.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    except OSError as exc:
        raise storage_error(exc, out_dir, "the exported model") from exc
    staging.chmod(0o755)  # mkdtemp makes it private; an exported model is meant to be shared
    return staging


def _commit(staging: Path, out_dir: Path) -> None:
    """Move the finished ``staging`` directory to ``out_dir`` (replacing an older one whole)."""
    if out_dir.exists():
        stale = out_dir.parent / f".{out_dir.name}.old-{os.getpid()}"
        os.replace(out_dir, stale)
        os.replace(staging, out_dir)
        shutil.rmtree(stale, ignore_errors=True)
    else:
        os.replace(staging, out_dir)


def _generation_config(model: Any, tokenizer: Any, overrides: Mapping[str, Any] | None) -> Any:
    """The model's generation config with pad/eos ids that match how the policy was trained: eos
    includes the chat template's end-of-turn token (``<|im_end|>``...) so generation stops there."""
    from transformers import GenerationConfig

    from agent_r1.rollout.chat import end_of_turn_token_ids

    base = getattr(model, "generation_config", None)
    config = copy.deepcopy(base) if base is not None else GenerationConfig()
    eos = config.eos_token_id if config.eos_token_id is not None else tokenizer.eos_token_id
    eos_ids = list(eos) if isinstance(eos, list | tuple) else ([eos] if eos is not None else [])
    for token_id in end_of_turn_token_ids(tokenizer):
        if token_id not in eos_ids:
            eos_ids.append(token_id)
    if eos_ids:
        config.eos_token_id = eos_ids[0] if len(eos_ids) == 1 else eos_ids
    if config.pad_token_id is None:
        config.pad_token_id = tokenizer.pad_token_id
    for key, value in (overrides or {}).items():
        setattr(config, key, value)
    return config


def _save_tokenizer(tokenizer: Any, directory: Path) -> None:
    """Tokenizer files plus the chat template, also inside ``tokenizer_config.json``: transformers 5
    reads ``chat_template.jinja``, older transformers (and tools built on them) read the config."""
    tokenizer.save_pretrained(str(directory))
    template = getattr(tokenizer, "chat_template", None)
    config_path = directory / "tokenizer_config.json"
    if isinstance(template, str) and config_path.is_file():
        data = json.loads(config_path.read_text(encoding="utf-8"))
        if "chat_template" not in data:
            data["chat_template"] = template
            config_path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _save_plain(model: Any, tokenizer: Any, directory: Path, generation: Any) -> None:
    config = model.config
    use_cache = getattr(config, "use_cache", None)
    # Training may have turned the KV cache off (gradient checkpointing); an exported model is
    # for generation, so it is saved with the cache on and the live model is left as it was.
    config.use_cache = True
    try:
        model.save_pretrained(str(directory))
    finally:
        config.use_cache = use_cache
    generation.save_pretrained(str(directory))
    _save_tokenizer(tokenizer, directory)


def _merged_copy(model: Any) -> Any:
    """A merged plain copy of a peft model; the live model keeps its adapters untouched."""
    return copy.deepcopy(model).merge_and_unload()


def _record(directory: Path, *, kind: str, source: Mapping[str, Any] | None) -> None:
    import agent_r1

    record = {
        "agent_r1_version": agent_r1.__version__,
        "kind": kind,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        **dict(source or {}),
    }
    (directory / EXPORT_RECORD).write_text(json.dumps(record, indent=2, default=str) + "\n", encoding="utf-8")


def _write(
    model: Any,
    tokenizer: Any,
    out_dir: Path,
    *,
    merge_lora: bool,
    generation_config: Mapping[str, Any] | None,
    source: Mapping[str, Any] | None,
    replace: bool,
    adapter_too: bool = False,
    critic: tuple[Mapping[str, Any], Any] | None = None,
) -> Path:
    from agent_r1.engine.artifacts.checkpoint import storage_error, write_failure

    out_dir = Path(out_dir)
    _check_target(out_dir, replace=replace)
    generation = _generation_config(model, tokenizer, generation_config)
    lora = is_lora_model(model)
    staging = _staging_dir(out_dir)
    try:
        if lora and not merge_lora:
            model.save_pretrained(str(staging))
            generation.save_pretrained(str(staging))
            _save_tokenizer(tokenizer, staging)
            kind = "lora-adapter"
        else:
            plain = _merged_copy(model) if lora else model
            _save_plain(plain, tokenizer, staging, generation)
            kind = "merged-lora" if lora else "full"
            if lora and adapter_too:
                model.save_pretrained(str(staging / ADAPTER_DIR))
                _save_tokenizer(tokenizer, staging / ADAPTER_DIR)
        if critic is not None:
            from agent_r1.engine.artifacts.critic_files import write_critic

            step = (source or {}).get("step")
            write_critic(staging, critic[0], critic[1], step=step if isinstance(step, int) else None)
        _record(staging, kind=kind, source=source)
        _commit(staging, out_dir)
    except BaseException as exc:
        shutil.rmtree(staging, ignore_errors=True)
        failure = write_failure(exc) if isinstance(exc, Exception) else None
        if failure is not None:
            raise storage_error(failure, out_dir, "the exported model") from exc
        raise
    return out_dir


def export_model(
    model: PreTrainedModel | Any,
    tokenizer: PreTrainedTokenizerBase,
    out_dir: str | Path,
    *,
    merge_lora: bool = False,
    generation_config: Mapping[str, Any] | None = None,
    source: Mapping[str, Any] | None = None,
) -> Path:
    """Write ``model`` and ``tokenizer`` to ``out_dir`` as a Hugging Face model directory.

    A plain model gives ``config.json``, ``model.safetensors``, ``generation_config.json`` and the
    tokenizer files with the chat template; ``AutoModelForCausalLM.from_pretrained(out_dir)``
    loads it. A peft LoRA model gives its adapter in peft format (load it with
    ``PeftModel.from_pretrained(base, out_dir)``), or with ``merge_lora`` a merged plain model
    (the live model is not changed; the merge works on a copy). ``generation_config`` overrides
    fields of the saved generation config; ``source`` goes into ``agent-r1-export.json``.
    ``out_dir`` must not hold files yet. Raises :class:`~agent_r1.errors.AgentR1Error` for a
    non-empty target and :class:`~agent_r1.engine.artifacts.checkpoint.StorageError` when writing fails
    (disk full...), leaving nothing behind.
    """
    return _write(
        model,
        tokenizer,
        Path(out_dir),
        merge_lora=merge_lora,
        generation_config=generation_config,
        source=source,
        replace=False,
    )


def export_final(
    run_dir: str | Path,
    model: PreTrainedModel | Any,
    tokenizer: PreTrainedTokenizerBase,
    model_config: ModelConfig,
    *,
    step: int | None = None,
    critic: tuple[Mapping[str, Any], Any] | None = None,
) -> Path:
    """Write the run's final policy to ``<run_dir>/final`` and return that path.

    ``final`` is always a plain model that transformers and vLLM load as it is; for a LoRA run the
    adapters are merged (on a copy) and the adapter itself is also written to ``final/adapter``.
    An existing ``final`` (a resumed run that finished again) is replaced whole, only once the new
    one is complete. ``model_config`` is the run's ``model`` section, recorded with ``step``.
    ``critic`` is ``(value head state dict, separate critic model or None)`` of a run that trained
    one; it goes to ``final/critic``.
    """
    source = {
        "source": "end of training",
        "run_dir": str(Path(run_dir).absolute()),
        "step": step,
        "base_model": model_config.path,
        "lora": model_config.lora.model_dump() if model_config.lora is not None else None,
    }
    return _write(
        model,
        tokenizer,
        Path(run_dir) / "final",
        merge_lora=True,
        generation_config=None,
        source=source,
        replace=True,
        adapter_too=True,
        critic=critic,
    )


def _recorded_model_config(checkpoint: Path, recorded: dict[str, Any]) -> ModelConfig:
    """The ``model`` section a checkpoint's run recorded, to rebuild its policy on CPU."""
    from agent_r1.config import ModelConfig

    section = recorded.get("model")
    if not isinstance(section, dict):
        raise AgentR1Error(
            f"checkpoint {checkpoint}: config.json has no model section to rebuild the policy from"
        )
    try:
        return ModelConfig.model_validate(
            {**section, "device": "cpu", "gradient_checkpointing": False, "attn_implementation": None}
        )
    except ValueError as exc:
        raise AgentR1Error(f"checkpoint {checkpoint}: the recorded model section is invalid: {exc}") from None


def export_checkpoint(path: str | Path, out_dir: str | Path, *, merge_lora: bool = False) -> Path:
    """Export the policy of a training checkpoint to ``out_dir`` (see :func:`export_model`).

    ``path`` is a run directory (its newest good checkpoint), its ``checkpoints`` folder or one
    checkpoint directory. The policy is rebuilt on CPU from the ``model`` section of the run config
    the checkpoint recorded (base model, dtype, LoRA), so that base model must still be where the
    run found it; the checkpoint's weights must then fit it exactly. Errors say which of these
    failed and what to do. A checkpoint with a trained critic exports it too, in ``critic/``.
    """
    from agent_r1.engine.artifacts.checkpoint import (
        load_checkpoint,
        load_model_state,
        recorded_config,
        resolve_checkpoint,
    )
    from agent_r1.models.loading import load_policy

    out_dir = Path(out_dir)
    _check_target(out_dir, replace=False)
    checkpoint = resolve_checkpoint(path)
    recorded = recorded_config(checkpoint)
    model_cfg = _recorded_model_config(checkpoint, recorded)
    if merge_lora and model_cfg.lora is None:
        raise AgentR1Error(
            f"--merge-lora: checkpoint {checkpoint} was trained without LoRA (model.lora is null), so there "
            "is nothing to merge; export it without --merge-lora"
        )
    try:
        model, tokenizer = load_policy(model_cfg, device="cpu")
    except ModelNotFound as exc:
        raise ModelNotFound(
            f"cannot rebuild the policy of checkpoint {checkpoint}: its base model (model.path="
            f"{model_cfg.path!r}, recorded in {checkpoint / 'config.json'}) is not available: {exc}"
        ) from None
    if model_cfg.chat_template is not None:
        # The run rendered its prompts with this template; the exported tokenizer must carry it.
        from agent_r1.rollout.templates import apply_chat_template_config

        try:
            tokenizer = apply_chat_template_config(tokenizer, model_cfg)
        except AgentR1Error as exc:
            raise AgentR1Error(
                f"checkpoint {checkpoint}: the run's chat template (model.chat_template, recorded in "
                f"{checkpoint / 'config.json'}) cannot be used: {exc}"
            ) from None
    state = load_checkpoint(checkpoint)
    if "model" not in state:
        raise AgentR1Error(f"checkpoint {checkpoint}: state.pt holds no model weights (no 'model' entry)")
    load_model_state(model, state["model"], source=f"checkpoint {checkpoint}")
    model.eval()
    source = {
        "source": "checkpoint",
        "checkpoint": str(checkpoint.absolute()),
        "step": state.get("step"),
        "base_model": model_cfg.path,
        "lora": model_cfg.lora.model_dump() if model_cfg.lora is not None else None,
    }
    critic = None
    if "value_head" in state:
        critic_model = None
        if "critic_model" in state:  # a separate critic: rebuilt as its run built it
            section_critic = (recorded.get("algorithm") or {}).get("critic") or {}
            critic_cfg = model_cfg.model_copy(update={"path": section_critic.get("path") or model_cfg.path})
            critic_model, _ = load_policy(critic_cfg, device="cpu")
            load_model_state(critic_model, state["critic_model"], source=f"checkpoint {checkpoint} (critic)")
        critic = (state["value_head"], critic_model)
    return _write(
        model,
        tokenizer,
        out_dir,
        merge_lora=merge_lora,
        generation_config=None,
        source=source,
        replace=False,
        critic=critic,
    )
