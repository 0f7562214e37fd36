"""Atomic, verifiable checkpoints.

A checkpoint is a directory ``checkpoints/step_000010/`` holding ``state.pt`` (model, optimizer,
scheduler, critic, KL controller, RNG states, data position, step), ``config.json`` (the resolved
run config, whose ``model`` section says how to rebuild the policy) and, written last,
``manifest.json`` with the size and SHA-256 of every file. It is first written as
``step_000010.tmp-<pid>``; each file is fsynced, then the directory is renamed into place and its
parent fsynced. A directory without a valid manifest, or whose files do not match it, is corrupt:
:func:`latest_checkpoint` reports it and falls back to the previous good one.

A write that fails (disk full, no permission) removes its temporary directory and raises an
:class:`~agent_r1.errors.AgentR1Error` saying so (:func:`storage_error`); :func:`resolve_checkpoint`
turns whatever a user passes (a run directory, its ``checkpoints`` folder, one checkpoint) into a
verified checkpoint or an error saying what to pass; :func:`load_model_state` loads a checkpoint's
weights into a model and names the mismatch when they do not fit.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from agent_r1.errors import AgentR1Error

MANIFEST = "manifest.json"
PREFIX = "step_"
STATE_FILE = "state.pt"

_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})
"""Write failures that mean "no room": the disk (or quota) is full, or a file size limit was hit."""


class CheckpointWarning(UserWarning):
    """A checkpoint was corrupt or partial and was skipped."""


class StorageError(AgentR1Error):
    """Writing a checkpoint or an exported model failed: disk full, no permission, read-only."""


def storage_error(exc: OSError, path: Path, what: str) -> StorageError:
    """The user-facing error for an ``OSError`` raised while writing ``what`` under ``path``.

    A full disk, an exhausted quota or a file size limit (``ENOSPC``, ``EDQUOT``, ``EFBIG``) says
    "disk full" with the free space left; anything else names the OS error. Both say what to do.
    """
    where = path if path.exists() else next((p for p in path.parents if p.exists()), path)
    if exc.errno in _FULL_ERRNOS:
        try:
            free = f"{shutil.disk_usage(where).free / 2**20:.1f} MiB free"
        except OSError:
            free = "free space unknown"
        return StorageError(
            f"disk full while writing {what} to {path} ({os.strerror(exc.errno or errno.ENOSPC)}; "
            f"{free} on that file system). Nothing partial was kept. Free some space or write to "
            "another disk (output_dir=... for a run, --out for an export), then run the command again."
        )
    return StorageError(
        f"cannot write {what} to {path}: {exc.strerror or exc} ({type(exc).__name__}). Check that the "
        "directory is writable (permissions, read-only mount) or choose another one."
    )


_FULL_MESSAGES = ("no space left on device", "os error 28", "disk quota exceeded", "file too large")


def write_failure(exc: BaseException) -> OSError | None:
    """The operating-system error behind a failed write, or ``None`` when it was something else.

    Libraries wrap them: torch's zip writer raises a ``RuntimeError`` while an ``OSError`` is being
    handled, and the safetensors writer raises its own error whose message carries the OS error
    text. The exception chain and the message are both searched.
    """
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError):
            return current
        text = str(current).lower()
        for number, marker in zip(
            (errno.ENOSPC, errno.ENOSPC, errno.EDQUOT, errno.EFBIG), _FULL_MESSAGES, strict=True
        ):
            if marker in text:
                return OSError(number, os.strerror(number))
        current = current.__cause__ or current.__context__
    return None


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _fsync_file(path: Path) -> None:
    with path.open("rb") as handle:
        os.fsync(handle.fileno())


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def checkpoint_dir(root: Path, step: int) -> Path:
    """Where the checkpoint of ``step`` lives under ``root`` (``root/step_000010``)."""
    return root / f"{PREFIX}{step:06d}"


def save_checkpoint(
    root: Path, step: int, state: dict[str, Any], config: dict[str, Any], *, keep: int = 2
) -> Path:
    """Write ``state`` atomically as the checkpoint of ``step`` and prune all but ``keep`` newest.

    A failed write (disk full, no permission) leaves no temporary directory behind and raises
    :class:`StorageError`; the older checkpoints stay as they were.
    """
    final = checkpoint_dir(root, step)
    tmp = root / f"{final.name}.tmp-{os.getpid()}"
    try:
        root.mkdir(parents=True, exist_ok=True)
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
        # Through a Python file object, a failed write raises OSError (ENOSPC...) instead of
        # torch's opaque "unexpected pos" RuntimeError from its own C++ writer.
        with (tmp / STATE_FILE).open("wb") as handle:
            torch.save(state, handle)
        (tmp / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True), encoding="utf-8")
        files = {}
        for path in sorted(tmp.iterdir()):
            _fsync_file(path)
            files[path.name] = {"size": path.stat().st_size, "sha256": _sha256(path)}
        manifest = tmp / MANIFEST
        manifest.write_text(json.dumps({"step": step, "files": files}, indent=2), encoding="utf-8")
        _fsync_file(manifest)
        _fsync_dir(tmp)
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        failure = write_failure(exc) if isinstance(exc, Exception) else None
        if failure is not None:
            raise storage_error(failure, final, f"the checkpoint of step {step}") from exc
        raise
    if final.exists():  # a re-run of the same step replaces the older copy
        shutil.rmtree(final)
    os.replace(tmp, final)
    _fsync_dir(root)
    _prune(root, keep)
    return final


def _prune(root: Path, keep: int) -> None:
    good = sorted(
        p for p in root.iterdir() if p.is_dir() and p.name.startswith(PREFIX) and ".tmp" not in p.name
    )
    for old in good[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    for stale in root.glob(f"{PREFIX}*.tmp-*"):
        shutil.rmtree(stale, ignore_errors=True)


def verify_checkpoint(path: Path) -> str | None:
    """``None`` if ``path`` is a complete checkpoint matching its manifest, else the problem."""
    if not path.exists():
        return "it does not exist"
    if not path.is_dir():
        return "it is a file, not a checkpoint directory"
    manifest = path / MANIFEST
    if not manifest.is_file():
        return "no manifest.json (the write did not finish)"
    try:
        recorded = json.loads(manifest.read_text(encoding="utf-8"))["files"]
    except (ValueError, KeyError, TypeError) as exc:
        return f"unreadable manifest.json: {exc}"
    for name, meta in recorded.items():
        file = path / name
        if not file.is_file():
            return f"{name} is missing"
        if file.stat().st_size != meta["size"]:
            return f"{name} has {file.stat().st_size} bytes, the manifest says {meta['size']}"
        if _sha256(file) != meta["sha256"]:
            return f"{name} does not match its checksum"
    return None


def _candidates(root: Path) -> list[Path]:
    return sorted(
        (p for p in root.iterdir() if p.is_dir() and p.name.startswith(PREFIX) and ".tmp" not in p.name),
        reverse=True,
    )


def latest_checkpoint(root: Path) -> Path | None:
    """The newest valid checkpoint under ``root``; corrupt ones are reported and skipped."""
    if not root.is_dir():
        return None
    for candidate in _candidates(root):
        problem = verify_checkpoint(candidate)
        if problem is None:
            return candidate
        warnings.warn(
            f"checkpoint {candidate} is corrupt or partial ({problem}); falling back to an older one",
            CheckpointWarning,
            stacklevel=2,
        )
    return None


def load_checkpoint(path: Path) -> dict[str, Any]:
    """Load ``state.pt`` of a verified checkpoint (on CPU; the trainer moves tensors)."""
    path = Path(path)
    if not path.exists():
        raise AgentR1Error(
            f"checkpoint {path} does not exist. Pass a run directory (its newest good checkpoint is "
            "used) or one of its checkpoints, e.g. RUN/checkpoints/step_000010."
        )
    problem = verify_checkpoint(path)
    if problem is not None:
        raise AgentR1Error(f"checkpoint {path} is not usable: {problem}")
    state: dict[str, Any] = torch.load(path / STATE_FILE, map_location="cpu", weights_only=False)
    return state


def resolve_checkpoint(path: str | Path) -> Path:
    """The verified checkpoint directory that ``path`` names.

    ``path`` may be a run directory (its newest good checkpoint under ``checkpoints/``), a
    ``checkpoints`` folder (its newest good one) or one checkpoint directory. Raises
    :class:`~agent_r1.errors.AgentR1Error` saying what ``path`` is and what to pass instead:
    a path that does not exist, a file, a run without a usable checkpoint, a corrupt checkpoint.
    """
    path = Path(path).expanduser()
    if not path.exists():
        parent = next((p for p in path.parents if p.is_dir()), None)
        near = ""
        if parent is not None:
            runs = sorted(p.name for p in parent.iterdir() if (p / "checkpoints").is_dir())[-5:]
            if runs:
                near = f" Run directories in {parent}: {', '.join(runs)}."
        raise AgentR1Error(
            f"checkpoint path {path} does not exist.{near} Pass a run directory (its newest good "
            "checkpoint is used) or a checkpoint directory such as RUN/checkpoints/step_000010."
        )
    if not path.is_dir():
        raise AgentR1Error(
            f"checkpoint path {path} is a file; pass a run directory or a checkpoint directory "
            "(RUN/checkpoints/step_000010), not a file inside it."
        )
    if (path / MANIFEST).exists() or (path / STATE_FILE).exists():
        problem = verify_checkpoint(path)
        if problem is not None:
            older = latest_checkpoint(path.parent) if path.parent.name == "checkpoints" else None
            hint = f" The newest good one beside it is {older}." if older is not None else ""
            raise AgentR1Error(f"checkpoint {path} is not usable: {problem}.{hint}")
        return path
    root = path / "checkpoints" if (path / "checkpoints").is_dir() else path
    if any(p.name.startswith(PREFIX) for p in root.iterdir()):
        with warnings.catch_warnings(record=True) as skipped:
            warnings.simplefilter("always", CheckpointWarning)
            latest = latest_checkpoint(root)
        for warning in skipped:  # re-issue: the caller's filters decide how they show
            warnings.warn(warning.message, CheckpointWarning, stacklevel=2)
        if latest is None:
            raise AgentR1Error(
                f"{root} holds no usable checkpoint: every one is corrupt or partial "
                f"({', '.join(p.name for p in _candidates(root))})."
            )
        return latest
    if root is not path:
        raise AgentR1Error(f"run directory {path} has no checkpoint yet ({root} is empty).")
    final = path / "final"
    hint = ""
    if final.is_dir():
        hint = f" Its finished model is in {final} (load it as a model, not a checkpoint)."
    raise AgentR1Error(
        f"{path} is neither a run directory (no checkpoints/ folder) nor a checkpoint (no "
        f"{MANIFEST}).{hint} Pass a run directory or RUN/checkpoints/step_NNNNNN."
    )


def recorded_config(checkpoint: Path) -> dict[str, Any]:
    """The resolved run config a checkpoint was written with (its ``config.json``)."""
    try:
        data = json.loads((checkpoint / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise AgentR1Error(f"checkpoint {checkpoint}: cannot read config.json ({exc})") from None
    if not isinstance(data, dict):
        raise AgentR1Error(f"checkpoint {checkpoint}: config.json does not hold a run config")
    return data


def _shapes(state: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    return {name: tuple(value.shape) for name, value in state.items() if hasattr(value, "shape")}


def load_model_state(model: torch.nn.Module, state: Mapping[str, Any], *, source: str) -> None:
    """Load a checkpoint's model weights into ``model`` exactly (every name and shape must match).

    On a mismatch raises :class:`~agent_r1.errors.AgentR1Error` naming ``source`` (the checkpoint),
    how many weights are missing, unexpected or of another shape (with examples), and what to do:
    use the model (and LoRA setting) the checkpoint was trained with.
    """
    check_model_state(model.state_dict(), state, source=source)
    model.load_state_dict(dict(state))


def check_model_state(model_state: Mapping[str, Any], state: Mapping[str, Any], *, source: str) -> None:
    """:func:`load_model_state`'s check of ``state`` against the model's own ``model_state`` (a
    sharded model's state dict: its tensors' global shapes count)."""
    expected = _shapes(model_state)
    given = _shapes(state)
    missing = sorted(expected.keys() - given.keys())
    unexpected = sorted(given.keys() - expected.keys())
    reshaped = sorted(k for k in expected.keys() & given.keys() if expected[k] != given[k])
    if missing or unexpected or reshaped:
        parts = []
        if reshaped:
            first = reshaped[0]
            parts.append(
                f"{len(reshaped)} weight(s) of another shape (e.g. {first}: checkpoint "
                f"{list(given[first])}, model {list(expected[first])})"
            )
        if missing:
            parts.append(f"{len(missing)} weight(s) missing from the checkpoint (e.g. {missing[0]})")
        if unexpected:
            parts.append(f"{len(unexpected)} weight(s) the model does not have (e.g. {unexpected[0]})")
        lora_hint = ""
        if any("lora_" in k for k in unexpected) or any("lora_" in k for k in missing):
            lora_hint = " One side uses LoRA and the other does not: set model.lora as the run did."
        raise AgentR1Error(
            f"model/checkpoint architecture mismatch: {source} does not fit the model: "
            f"{'; '.join(parts)}.{lora_hint} Use the model.path and model.lora the checkpoint was "
            "trained with (its config.json records them)."
        )


def capture_rng() -> dict[str, Any]:
    import random

    import numpy as np

    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    import random

    import numpy as np

    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
