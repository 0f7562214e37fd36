"""The on-disk index cache: where it lives, how an index is keyed, and how a finished index is put
in place atomically."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

from agent_r1_plugin_search.corpus import (
    CorpusFormat,
    Passage,
    file_sha256,
    read_passages,
    resolve_corpus_path,
)

__all__ = ["INDEX_FORMAT_VERSION", "default_cache_dir"]

INDEX_FORMAT_VERSION = 1
"""Bumped whenever the cached index layout or tokenisation changes, so old caches are rebuilt."""


def default_cache_dir() -> Path:
    """The index cache: ``$AGENT_R1_SEARCH_CACHE``, else ``$XDG_CACHE_HOME/agent-r1/search``, else
    ``~/.cache/agent-r1/search``."""
    explicit = os.environ.get("AGENT_R1_SEARCH_CACHE")
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "agent-r1" / "search"


def cache_key(kind: str, corpus_sha256: str, settings: dict[str, Any]) -> str:
    """The cache name of an index of ``kind`` over a corpus (by its SHA-256) built with
    ``settings``."""
    blob = json.dumps(
        {"kind": kind, "corpus": corpus_sha256, "settings": settings, "version": INDEX_FORMAT_VERSION},
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


def publish_dir(temporary: Path, final: Path) -> None:
    """Move a fully written directory into place atomically; a concurrent winner is kept."""
    try:
        os.replace(temporary, final)
    except OSError:
        if (final / "DONE").is_file():  # another process finished the same index first
            shutil.rmtree(temporary, ignore_errors=True)
            return
        shutil.rmtree(final, ignore_errors=True)
        os.replace(temporary, final)


def cached_corpus(
    corpus: str | os.PathLike[str],
    corpus_format: CorpusFormat,
    *,
    cache_dir: str | os.PathLike[str] | None,
    use_cache: bool,
    kind: str,
    settings: dict[str, Any],
    suffix: str = "",
) -> tuple[list[Passage], Path | None]:
    """Read a corpus file (or bundled corpus name); its passages, and where the ``kind`` index
    built over it with ``settings`` is cached (``<cache>/<kind>-<key><suffix>``; ``None`` when
    ``use_cache`` is off)."""
    path = resolve_corpus_path(corpus)
    passages = read_passages(path, corpus_format)
    if not use_cache:
        return passages, None
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    digest = file_sha256(path, memo_dir=root)
    return passages, root / f"{kind}-{cache_key(kind, digest, settings)}{suffix}"
