"""The trained critic on disk, and back into a session for value-guided decoding.

A training checkpoint holds the critic in ``state.pt`` (``value_head``, and ``critic_model`` for a
separate critic). An exported model (``<run>/final``, ``agent-r1 export``) of a run that trained a
critic carries it beside the policy, in ``critic/``:

* ``critic/critic.json``: ``{"kind": "value_head" | "separate", "hidden_size": H, "step": N}``;
* ``critic/value_head.safetensors``: the value head's weights (``proj.weight``, ``proj.bias``);
* ``critic/model/``: for a separate critic, its backbone as a Hugging Face model directory.

:func:`find_critic` locates the critic an evaluation with ``eval.decoding.kind=value_guided``
needs (reading files, loading no model) and raises an error saying what was searched and what to
pass when there is none; :func:`attach_critic` then loads it into a built session.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent_r1.errors import AgentR1Error

if TYPE_CHECKING:
    from agent_r1.config import DecodingConfig, RunConfig

__all__ = ["CRITIC_DIR", "CriticSource", "attach_critic", "find_critic", "write_critic"]

CRITIC_DIR = "critic"
"""Sub-directory of an exported model holding the critic."""
CRITIC_RECORD = "critic.json"
VALUE_HEAD_FILE = "value_head.safetensors"
CRITIC_MODEL_DIR = "model"


def write_critic(
    directory: Path, value_head_state: Mapping[str, Any], critic_model: Any = None, *, step: int | None
) -> Path:
    """Write a critic into ``directory/critic`` (the layout of the module docstring): the value
    head's state dict, and ``critic_model`` (a separate critic's backbone) when given."""
    from safetensors.torch import save_file

    out = Path(directory) / CRITIC_DIR
    out.mkdir(parents=True, exist_ok=True)
    tensors = {name: value.detach().cpu().contiguous() for name, value in value_head_state.items()}
    save_file(tensors, str(out / VALUE_HEAD_FILE))
    hidden_size = int(tensors["proj.weight"].shape[-1])
    kind = "value_head"
    if critic_model is not None:
        from agent_r1.models.loading import is_lora_model

        kind = "separate"
        plain = critic_model
        if is_lora_model(critic_model):  # a LoRA critic is written merged, on a copy
            import copy

            plain = copy.deepcopy(critic_model).merge_and_unload()
        plain.save_pretrained(str(out / CRITIC_MODEL_DIR))
    record = {"kind": kind, "hidden_size": hidden_size, "step": step}
    (out / CRITIC_RECORD).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    return out


@dataclass
class CriticSource:
    """Where a trained critic was found, and what is needed to load it."""

    where: str
    """Human-readable origin, for messages (a checkpoint, an exported model's critic/ folder)."""
    value_head_state: dict[str, Any]
    critic_model_dir: Path | None = None
    """A separate critic exported as a Hugging Face model directory."""
    critic_model_state: dict[str, Any] | None = None
    """A separate critic's weights from a checkpoint, rebuilt from ``critic_model_path``."""
    critic_model_path: str | None = None


def find_critic(
    decoding: DecodingConfig,
    config: RunConfig,
    *,
    checkpoint: Path | None = None,
    state: Mapping[str, Any] | None = None,
    setting: str = "eval.decoding",
) -> CriticSource:
    """The trained critic for value-guided decoding, looked for (loading no model) in
    ``decoding.critic`` when set (a run directory, a checkpoint or an exported model), else in the
    evaluated ``checkpoint`` (whose loaded ``state`` is passed), else beside ``model.path`` (its
    ``critic/`` folder, or its run's ``final/critic``). Raises
    :class:`~agent_r1.errors.AgentR1Error` naming what was searched and what to pass instead."""
    if decoding.critic is not None:
        return _from_path(Path(decoding.critic).expanduser(), config, f"{setting}.critic")
    if checkpoint is not None and state is not None:
        return _from_state(state, checkpoint, config)
    model_dir = Path(config.model.path).expanduser()
    for candidate in (model_dir / CRITIC_DIR, model_dir / "final" / CRITIC_DIR):
        if (candidate / CRITIC_RECORD).is_file():
            return _from_export(candidate)
    raise AgentR1Error(
        f"{setting}.kind=value_guided needs the trained critic, but none was found: no --checkpoint was "
        f"given and model.path={config.model.path!r} has no {CRITIC_DIR}/{CRITIC_RECORD} (nor final/"
        f"{CRITIC_DIR}/ in it). Evaluate a checkpoint of a run trained with a critic "
        "(algorithm.name=ppo): --checkpoint RUN; or point model.path at such a run (its final model "
        f"carries {CRITIC_DIR}/); or set {setting}.critic=<run, checkpoint or exported model>."
    )


def _from_path(path: Path, config: RunConfig, setting: str) -> CriticSource:
    from agent_r1.engine.artifacts import checkpoint as ckpt

    if not path.exists():
        raise AgentR1Error(
            f"{setting}={str(path)!r} does not exist; give a run directory, a checkpoint "
            "(RUN/checkpoints/step_NNNNNN) or an exported model holding the trained critic"
        )
    for candidate in (path / CRITIC_DIR, path / "final" / CRITIC_DIR, path):
        if (candidate / CRITIC_RECORD).is_file():
            return _from_export(candidate)
    try:
        checkpoint = ckpt.resolve_checkpoint(path)
    except AgentR1Error as exc:
        raise AgentR1Error(
            f"{setting}={str(path)!r} holds no critic: it has no {CRITIC_DIR}/{CRITIC_RECORD} and is not a "
            f"usable checkpoint ({exc})"
        ) from None
    return _from_state(ckpt.load_checkpoint(checkpoint), checkpoint, config)


def _from_state(state: Mapping[str, Any], checkpoint: Path, config: RunConfig) -> CriticSource:
    from agent_r1.engine.artifacts import checkpoint as ckpt

    if "value_head" not in state:
        raise AgentR1Error(
            f"checkpoint {checkpoint} holds no trained critic (no value head in state.pt: its run's "
            "algorithm trained none), so value-guided decoding cannot score candidates. Evaluate a "
            "run trained with a critic (algorithm.name=ppo), or set eval.decoding.critic to one."
        )
    source = CriticSource(where=f"checkpoint {checkpoint}", value_head_state=dict(state["value_head"]))
    if "critic_model" in state:
        recorded = ckpt.recorded_config(checkpoint)
        critic = (recorded.get("algorithm") or {}).get("critic") or {}
        model = recorded.get("model") or {}
        source.critic_model_state = dict(state["critic_model"])
        source.critic_model_path = critic.get("path") or model.get("path") or config.model.path
    return source


def _from_export(directory: Path) -> CriticSource:
    from safetensors.torch import load_file

    try:
        record = json.loads((directory / CRITIC_RECORD).read_text(encoding="utf-8"))
        weights = load_file(str(directory / VALUE_HEAD_FILE))
    except (OSError, ValueError) as exc:
        raise AgentR1Error(
            f"the critic in {directory} cannot be read ({type(exc).__name__}: {exc}); export the run "
            "again (`agent-r1 export RUN --out DIR`)"
        ) from None
    source = CriticSource(where=f"{directory}", value_head_state=dict(weights))
    if record.get("kind") == "separate":
        source.critic_model_dir = directory / CRITIC_MODEL_DIR
    return source


def _load_exported_model(directory: Path, session: Any) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    try:
        model = AutoModelForCausalLM.from_pretrained(
            str(directory), dtype=getattr(torch, session.config.model.dtype)
        )
    except (OSError, ValueError, RuntimeError) as exc:
        raise AgentR1Error(
            f"the separate critic model in {directory} cannot be loaded ({type(exc).__name__}: {exc}); "
            "export the run again (`agent-r1 export RUN --out DIR`)"
        ) from None
    return model.to(session.device)


def attach_critic(session: Any, source: CriticSource) -> None:
    """Load ``source`` into ``session`` (its ``value_head``, and ``critic_model`` for a separate
    critic), on the session's device, in eval mode. A value head whose size does not fit the model
    it reads is an error naming both."""
    from agent_r1.config import ModelConfig
    from agent_r1.engine.artifacts.checkpoint import load_model_state
    from agent_r1.engine.learner.critic import ValueHead
    from agent_r1.models.loading import load_policy

    backbone = session.unwrapped
    critic_model = None
    model_section = {**session.config.model.model_dump(), "gradient_checkpointing": False}
    if source.critic_model_dir is not None:  # exported whole (a LoRA critic merged), no tokenizer
        critic_model = _load_exported_model(source.critic_model_dir, session)
    elif source.critic_model_state is not None:  # rebuilt as training built it, then its weights
        assert source.critic_model_path is not None
        cfg = ModelConfig(**{**model_section, "path": source.critic_model_path})
        critic_model, _ = load_policy(cfg, device=session.device)
        load_model_state(critic_model, source.critic_model_state, source=source.where)
    if critic_model is not None:
        backbone = critic_model.eval()
    hidden = int(backbone.config.hidden_size)
    weight = source.value_head_state.get("proj.weight")
    if weight is None or tuple(weight.shape) != (1, hidden):
        shape = None if weight is None else list(weight.shape)
        raise AgentR1Error(
            f"the critic from {source.where} does not fit the model it reads: its value head has shape "
            f"{shape}, the {'critic' if critic_model is not None else 'policy'} model's hidden size is "
            f"{hidden}. Use the critic trained with this policy (the same run)."
        )
    head = ValueHead(hidden)
    head.load_state_dict(source.value_head_state)
    session.value_head = head.to(session.device).eval()
    session.critic_model = critic_model
