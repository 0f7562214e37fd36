"""agent-r1's model cache: where prepared models live, and the verified, atomic way they get there.

The cache lives in ``$AGENT_R1_CACHE/models/<name>`` (default ``~/.cache/agent-r1/models/<name>``).
A prepared model is written into a temporary sibling directory and renamed into place only once it
is complete, and it carries a marker file listing every file with its size and SHA-256; a cache
whose files no longer match is rebuilt, so a half-written or damaged cache is never loaded.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent_r1.errors import ModelNotFound

if TYPE_CHECKING:
    pass

__all__ = [
    "CACHE_ENV",
    "MARKER_FILE",
    "cache_root",
    "verify_cache",
]


CACHE_ENV = "AGENT_R1_CACHE"
"""Environment variable naming agent-r1's cache root (models go in its ``models/`` folder)."""

MARKER_FILE = ".agent-r1-complete.json"
"""Written last into a prepared model directory: provenance plus every file's size and SHA-256."""

MARKER_FORMAT = 1
_HASH_CHUNK = 1 << 22  # 4 MiB

# --------------------------------------------------------------------------------------------
# Cache locations
# --------------------------------------------------------------------------------------------


def cache_root() -> Path:
    """agent-r1's cache root: ``$AGENT_R1_CACHE``, else ``$XDG_CACHE_HOME/agent-r1``, else
    ``~/.cache/agent-r1``. Prepared models live in its ``models/`` folder."""
    configured = os.environ.get(CACHE_ENV)
    if configured:
        return Path(configured).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "agent-r1"


def _models_root(cache_dir: str | Path | None) -> Path:
    return Path(cache_dir).expanduser() if cache_dir is not None else cache_root() / "models"


# --------------------------------------------------------------------------------------------
# The verified cache
# --------------------------------------------------------------------------------------------


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(_HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _file_manifest(directory: Path) -> dict[str, dict[str, Any]]:
    files: dict[str, dict[str, Any]] = {}
    for path in sorted(directory.rglob("*")):
        if path.is_file() and path.name != MARKER_FILE:
            stat = path.stat()
            files[path.relative_to(directory).as_posix()] = {
                "size": stat.st_size,
                "sha256": _sha256(path),
                "mtime_ns": stat.st_mtime_ns,
            }
    return files


def verify_cache(directory: str | Path, *, full: bool = False) -> str | None:
    """Check a prepared model directory against its marker; ``None`` when intact, else the reason.

    Every file must exist with its recorded size. Its SHA-256 is recomputed when its modification
    time differs from the recorded one (a file rewritten in place), or for every file when
    ``full`` is true (``agent-r1 models prepare`` does this).
    """
    directory = Path(directory)
    marker_path = directory / MARKER_FILE
    if not marker_path.is_file():
        return f"no {MARKER_FILE} (the cache was never completed)"
    try:
        marker = json.loads(marker_path.read_text(encoding="utf-8"))
        files = marker["files"]
        if marker.get("format") != MARKER_FORMAT or not isinstance(files, dict) or not files:
            return f"{MARKER_FILE} has an unknown format"
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return f"{MARKER_FILE} is unreadable ({exc})"
    for relative, expected in files.items():
        if not isinstance(expected, dict) or not {"size", "sha256"} <= expected.keys():
            return f"{MARKER_FILE} has an unknown format"
        path = directory / relative
        try:
            stat = path.stat()
        except OSError:
            return f"{relative} is missing"
        if stat.st_size != expected["size"]:
            return f"{relative} has {stat.st_size} bytes, expected {expected['size']}"
        if (full or stat.st_mtime_ns != expected.get("mtime_ns")) and _sha256(path) != expected["sha256"]:
            return f"{relative} does not match its recorded SHA-256"
    return None


class _DirectoryLock:
    """An exclusive lock between processes preparing the same model (a lock file beside it)."""

    def __init__(self, path: Path, *, timeout_s: float = 1800.0) -> None:
        from filelock import FileLock

        self._lock = FileLock(str(path), timeout=timeout_s)
        self._path = path

    def __enter__(self) -> None:
        from filelock import Timeout

        try:
            self._lock.acquire()
        except Timeout:
            raise ModelNotFound(
                f"timed out waiting for another process preparing a model (lock file {self._path}); "
                "if no such process runs, delete the lock file and retry"
            ) from None

    def __exit__(self, *exc: object) -> None:
        self._lock.release()


def _remove_tree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
