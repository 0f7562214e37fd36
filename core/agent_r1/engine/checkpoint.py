"""Atomic, verifiable checkpoints.

A checkpoint is a directory ``checkpoints/step_000010/`` holding ``state.pt`` (model, optimizer,
scheduler, critic, KL controller, RNG states, data position, step), ``config.json`` and, written
last, ``manifest.json`` with the size and SHA-256 of every file. It is first written as
``step_000010.tmp-<pid>``; each file is fsynced, then the directory is renamed into place and its
parent fsynced. A directory without a valid manifest, or whose files do not match it, is corrupt:
:func:`latest_checkpoint` reports it and falls back to the previous good one.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import warnings
from pathlib import Path
from typing import Any

import torch

MANIFEST = "manifest.json"
PREFIX = "step_"


class CheckpointWarning(UserWarning):
    """A checkpoint was corrupt or partial and was skipped."""


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
    return root / f"{PREFIX}{step:06d}"


def save_checkpoint(
    root: Path, step: int, state: dict[str, Any], config: dict[str, Any], *, keep: int = 2
) -> Path:
    """Write ``state`` atomically as the checkpoint of ``step`` and prune all but ``keep`` newest."""
    root.mkdir(parents=True, exist_ok=True)
    final = checkpoint_dir(root, step)
    tmp = root / f"{final.name}.tmp-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    torch.save(state, tmp / "state.pt")
    (tmp / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True), encoding="utf-8")
    files = {}
    for path in sorted(tmp.iterdir()):
        _fsync_file(path)
        files[path.name] = {"size": path.stat().st_size, "sha256": _sha256(path)}
    manifest = tmp / MANIFEST
    manifest.write_text(json.dumps({"step": step, "files": files}, indent=2), encoding="utf-8")
    _fsync_file(manifest)
    _fsync_dir(tmp)
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
    manifest = path / MANIFEST
    if not manifest.is_file():
        return "no manifest.json (the write did not finish)"
    try:
        recorded = json.loads(manifest.read_text(encoding="utf-8"))["files"]
    except (ValueError, KeyError) as exc:
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


def latest_checkpoint(root: Path) -> Path | None:
    """The newest valid checkpoint under ``root``; corrupt ones are reported and skipped."""
    if not root.is_dir():
        return None
    candidates = sorted(
        (p for p in root.iterdir() if p.is_dir() and p.name.startswith(PREFIX) and ".tmp" not in p.name),
        reverse=True,
    )
    for candidate in candidates:
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
    problem = verify_checkpoint(path)
    if problem is not None:
        from agent_r1.errors import AgentR1Error

        raise AgentR1Error(f"checkpoint {path} is not usable: {problem}")
    state: dict[str, Any] = torch.load(path / "state.pt", map_location="cpu", weights_only=False)
    return state


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
