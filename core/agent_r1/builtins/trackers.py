"""Built-in metric trackers: ``jsonl`` (the default), ``tensorboard``, ``wandb`` and ``console``.

The trainer calls :meth:`~agent_r1.Tracker.start` once with the run directory, then
:meth:`~agent_r1.Tracker.log` once per training step with that step's metrics (never per token),
then :meth:`~agent_r1.Tracker.close`. A run lists its trackers in the config::

    trackers:
      - name: jsonl
      - name: tensorboard
      - {name: wandb, project: my-agent, mode: offline}

``tensorboard`` and ``wandb`` import their libraries only in ``start``, and say which extra to
install when the library is missing.
"""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any, Literal

from pydantic import Field

from agent_r1.contracts import ComponentConfig, Tracker
from agent_r1.errors import AgentR1Error


class TrackerError(AgentR1Error):
    """A tracker cannot work: its library is missing, or it was used before ``start``."""


_NOT_A_NUMBER = object()


def _number(value: Any) -> Any:
    """``value`` as a plain int or float (torch and numpy scalars included); None for NaN and
    infinities; ``_NOT_A_NUMBER`` for anything that is not one number."""
    if hasattr(value, "item") and callable(value.item):  # torch / numpy scalars
        try:
            value = value.item()
        except (TypeError, ValueError, RuntimeError):
            return _NOT_A_NUMBER
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    return _NOT_A_NUMBER


def _scalar(value: Any) -> float | int | None:
    """A finite number for ``value``, or None (not a number, NaN or infinite)."""
    number = _number(value)
    return None if number is _NOT_A_NUMBER else number


def _require(module: str, tracker: str, extra: str) -> None:
    if importlib.util.find_spec(module) is None:
        raise TrackerError(
            f"the {tracker!r} tracker needs the {module!r} package, which is not installed. "
            f"Install it with `pip install agent-r1[{extra}]`, or remove {tracker!r} from `trackers`."
        )


class JsonlTracker(Tracker):
    """Appends one JSON object per step to ``metrics.jsonl`` in the run directory.

    Each line is ``{"step": <step>, <metric>: <value>, ...}`` and is flushed as soon as it is
    written, so a crash loses nothing that was logged. Non-finite values (NaN, inf) are written as
    ``null``; values that are not numbers are left out. The file is appended to, so a resumed run
    continues it (the runner first drops the lines of steps it will redo).
    """

    name = "jsonl"

    class Config(ComponentConfig):
        filename: str = Field("metrics.jsonl", description="file name inside the run directory")

    config: Config

    def __init__(self, config: ComponentConfig | Mapping[str, Any] | None = None) -> None:
        super().__init__(config)
        self.path: Path | None = None
        self._handle: IO[str] | None = None

    def start(self, run_dir: Path, config: Mapping[str, Any]) -> None:
        self.path = Path(run_dir) / self.config.filename
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._handle = self.path.open("a", encoding="utf-8")

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        if self._handle is None:
            raise TrackerError("the 'jsonl' tracker was asked to log before start(run_dir, config)")
        record: dict[str, Any] = {"step": int(step)}
        for key, value in metrics.items():
            if key == "step":
                continue
            number = _number(value)
            if number is not _NOT_A_NUMBER:
                record[str(key)] = number
        self._handle.write(json.dumps(record, allow_nan=False) + "\n")
        self._handle.flush()

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None


class TensorBoardTracker(Tracker):
    """Writes each numeric metric as a TensorBoard scalar (``tensorboard --logdir <run>/tensorboard``).

    Needs the ``tensorboard`` package (``pip install agent-r1[tensorboard]``).
    """

    name = "tensorboard"

    class Config(ComponentConfig):
        log_dir: str | None = Field(None, description="event file directory; default <run dir>/tensorboard")
        flush_secs: int = Field(30, ge=1, description="seconds between flushes to disk")

    config: Config

    def __init__(self, config: ComponentConfig | Mapping[str, Any] | None = None) -> None:
        super().__init__(config)
        _require("tensorboard", self.name, "tensorboard")
        self.writer: Any = None
        self.log_dir: Path | None = None

    def start(self, run_dir: Path, config: Mapping[str, Any]) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.log_dir = Path(self.config.log_dir) if self.config.log_dir else Path(run_dir) / "tensorboard"
        self.writer = SummaryWriter(log_dir=str(self.log_dir), flush_secs=self.config.flush_secs)
        self.writer.add_text(
            "config", "```json\n" + json.dumps(dict(config), indent=2, default=str) + "\n```"
        )

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        if self.writer is None:
            raise TrackerError("the 'tensorboard' tracker was asked to log before start(run_dir, config)")
        for key, value in metrics.items():
            number = _scalar(value)
            if key != "step" and number is not None:
                self.writer.add_scalar(str(key), number, global_step=int(step))

    def close(self) -> None:
        if self.writer is not None:
            self.writer.flush()
            self.writer.close()
            self.writer = None


class WandbTracker(Tracker):
    """Logs metrics to Weights & Biases. ``mode: offline`` writes the run under the run directory
    for a later ``wandb sync``; ``mode: null`` follows ``WANDB_MODE`` (online by default).

    Needs the ``wandb`` package (``pip install agent-r1[wandb]``).
    """

    name = "wandb"

    class Config(ComponentConfig):
        project: str = Field("agent-r1", description="W&B project")
        entity: str | None = Field(None, description="W&B team or user; default: your default entity")
        run_name: str | None = Field(None, description="run name; default: W&B picks one")
        group: str | None = Field(None, description="group runs together (e.g. one sweep)")
        tags: list[str] = Field(default_factory=list)
        mode: Literal["online", "offline", "disabled"] | None = Field(
            None, description="online, offline (sync later with `wandb sync`), disabled; null: WANDB_MODE"
        )

    config: Config

    def __init__(self, config: ComponentConfig | Mapping[str, Any] | None = None) -> None:
        super().__init__(config)
        _require("wandb", self.name, "wandb")
        self.run: Any = None

    def start(self, run_dir: Path, config: Mapping[str, Any]) -> None:
        try:
            import wandb
        except ImportError as exc:  # find_spec passed but the import itself failed
            raise TrackerError(
                f"the 'wandb' tracker could not import wandb ({exc}); reinstall it with "
                "`pip install agent-r1[wandb]`"
            ) from exc
        options = self.config
        self.run = wandb.init(
            project=options.project,
            entity=options.entity,
            name=options.run_name,
            group=options.group,
            tags=list(options.tags) or None,
            mode=options.mode,
            dir=str(run_dir),
            config=dict(config),
        )

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        if self.run is None:
            raise TrackerError("the 'wandb' tracker was asked to log before start(run_dir, config)")
        numbers = {str(k): n for k, v in metrics.items() if k != "step" and (n := _scalar(v)) is not None}
        self.run.log(numbers, step=int(step))

    def close(self) -> None:
        if self.run is not None:
            self.run.finish()
            self.run = None


class ConsoleTracker(Tracker):
    """Prints a one-line summary of chosen metrics every ``every`` steps (to stderr by default)."""

    name = "console"

    class Config(ComponentConfig):
        every: int = Field(1, ge=1, description="print every this many steps")
        keys: list[str] = Field(
            default_factory=lambda: ["reward/score_mean", "actor/loss", "actor/kl", "response/length_mean"],
            description="metrics to print (those a step lacks are skipped)",
        )
        stream: Literal["stdout", "stderr"] = "stderr"

    config: Config

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        if step % self.config.every:
            return
        parts = [
            f"{key}={number:.4g}"
            for key in self.config.keys
            if key in metrics and (number := _scalar(metrics[key])) is not None
        ]
        stream = sys.stdout if self.config.stream == "stdout" else sys.stderr
        print(f"step {step}: " + (" ".join(parts) or "(no tracked metric)"), file=stream, flush=True)


TRACKERS: list[type[Tracker]] = [JsonlTracker, TensorBoardTracker, WandbTracker, ConsoleTracker]
"""The trackers the bundled plugin registers."""
