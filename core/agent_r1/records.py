"""Records from JSONL and JSON files, and the splits of a file-backed dataset, for datasets and
corpora (the core's and plugins').

:func:`read_records` yields every record of a file with the place it stands in, so that an error
about a record can name its file and line. It reads

* ``.jsonl`` (any other name too): one JSON object per line, blank lines skipped;
* ``.json``: a list of objects, or an object whose ``"data"`` is that list;
* either of them compressed, with a ``.gz`` suffix on top.

Every problem (a missing or unreadable file, invalid JSON, a record that is not an object) raises
the caller's error type with a message that names the file and, where there is one, the line or
index: a plugin raises its own error class, the core a :class:`~agent_r1.errors.ConfigError` that
points at the config option.

:func:`split_key` names the split a dataset is asked for (``train``, ``eval`` or ``all``; the
usual names of an eval split are synonyms of ``eval``) and :func:`tail_split` holds out the last
rows of one file as the eval split.
"""

from __future__ import annotations

import gzip
import json
import math
import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import IO, Any, NamedTuple, TypeVar

from agent_r1.errors import AgentR1Error

__all__ = ["EVAL_SPLIT_NAMES", "Record", "read_records", "split_key", "tail_split"]

EVAL_SPLIT_NAMES = frozenset({"eval", "validation", "dev", "test"})

T = TypeVar("T")


class Record(NamedTuple):
    """One record of a file: ``where`` is ``file:line`` (JSONL) or ``file[index]`` (JSON list),
    ``position`` that line (from 1) or index (from 0)."""

    where: str
    position: int
    row: dict[str, Any]


def read_records(
    path: str | os.PathLike[str],
    *,
    error: Callable[[str], Exception] = AgentR1Error,
    missing: str = "",
    json_advice: str = "",
) -> Iterator[Record]:
    """Every record of the JSONL or JSON file ``path`` (see the module docstring), in order.

    ``error`` builds the exception raised on a problem from its message; ``missing`` is appended to
    the message about a missing file (what to check), ``json_advice`` to the one about a ``.json``
    file that holds no list."""
    path = Path(path)
    if not path.is_file():
        raise error(f"data file {str(path)!r} does not exist" + (f"; {missing}" if missing else ""))
    try:
        with _open_text(path) as handle:
            if path.name.removesuffix(".gz").endswith(".json"):
                yield from _json_list(path, handle, error, json_advice)
            else:
                yield from _json_lines(path, handle, error)
    except (OSError, UnicodeDecodeError, EOFError) as exc:
        raise error(f"cannot read {path}: {exc}") from None


def _open_text(path: Path) -> IO[str]:
    if path.suffix == ".gz":
        return gzip.open(path, "rt", encoding="utf-8")
    return path.open(encoding="utf-8")


def _json_list(
    path: Path, handle: IO[str], error: Callable[[str], Exception], advice: str
) -> Iterator[Record]:
    try:
        data = json.load(handle)
    except json.JSONDecodeError as exc:
        raise error(f"{path}:{exc.lineno}: not valid JSON: {exc.msg}") from None
    if isinstance(data, dict) and isinstance(data.get("data"), list):
        data = data["data"]
    if not isinstance(data, list):
        raise error(
            f"{path}: a .json data file must hold a list of objects (or {{'data': [...]}}), got "
            f"{type(data).__name__}" + (f" ({advice})" if advice else "")
        )
    for index, row in enumerate(data):
        where = f"{path}[{index}]"
        yield Record(where, index, _object(row, where, error))


def _json_lines(path: Path, handle: IO[str], error: Callable[[str], Exception]) -> Iterator[Record]:
    for number, line in enumerate(handle, start=1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise error(f"{where}: not valid JSON: {exc.msg} (column {exc.colno})") from None
        yield Record(where, number, _object(row, where, error))


def _object(row: Any, where: str, error: Callable[[str], Exception]) -> dict[str, Any]:
    if not isinstance(row, dict):
        raise error(f"{where}: expected a JSON object, got {type(row).__name__}")
    return row


def split_key(dataset: str, split: str, *, error: Callable[[str], Exception] = AgentR1Error) -> str:
    """``train``, ``eval`` or ``all`` for the ``split`` dataset ``dataset`` is asked for (the names
    in :data:`EVAL_SPLIT_NAMES` mean ``eval``); any other name raises ``error``."""
    key = "eval" if split in EVAL_SPLIT_NAMES else split
    if key not in {"train", "eval", "all"}:
        raise error(f"dataset {dataset!r} has no split {split!r}; use train, eval or all")
    return key


def tail_split(items: Sequence[T], key: str, *, eval_size: int | None, eval_fraction: float) -> list[T]:
    """Split ``key`` of ``items`` when their last rows are the eval split: ``eval_size`` rows, else
    ``ceil(len · eval_fraction)``, at most all but one (a single row is train only); ``all`` is
    every row."""
    if key == "all":
        return list(items)
    held = eval_size if eval_size is not None else math.ceil(len(items) * eval_fraction)
    held = min(held, len(items) - 1) if len(items) > 1 else 0
    cut = len(items) - held
    return list(items[cut:] if key == "eval" else items[:cut])
