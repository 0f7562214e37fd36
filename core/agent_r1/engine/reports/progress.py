"""Rich progress bars: training steps (ETA, latest reward) and finished episodes of an evaluation or
rollout."""

from __future__ import annotations

import sys
from types import TracebackType
from typing import Any

from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)


class TrainingProgress:
    """Context manager showing ``step k/N``, elapsed time, ETA and the latest reward figures.

    Disabled on non-main processes; on a non-interactive stream it prints one line per step instead.
    """

    def __init__(self, total: int, *, start: int = 0, enabled: bool = True) -> None:
        self.total = total
        self.enabled = enabled and total > 0
        self.interactive = sys.stderr.isatty()
        self._progress: Progress | None = None
        self._task: Any = None
        self._start = start

    def __enter__(self) -> TrainingProgress:
        if self.enabled and self.interactive:
            self._progress = Progress(
                TextColumn("[bold]train"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TextColumn("eta"),
                TimeRemainingColumn(),
                TextColumn("{task.fields[info]}"),
            )
            self._progress.__enter__()
            self._task = self._progress.add_task("train", total=self.total, completed=self._start, info="")
        return self

    def update(self, step: int, metrics: dict[str, float]) -> None:
        if not self.enabled:
            return
        reward = metrics.get("reward/score_mean", float("nan"))
        info = f"reward {reward:.3f}"
        if "reward/answer_match" in metrics:
            info += f" | answer {metrics['reward/answer_match']:.2f}"
        info += f" | {metrics.get('time/step_s', 0.0):.1f}s/step"
        failed = int(metrics.get("errors/failed_episodes", 0))
        if failed:  # episodes set aside because their environment or reward shaper failed
            info += f" | {failed} failed episode(s), not trained on"
        unclosed = int(metrics.get("errors/env_close_errors", 0))
        if unclosed:  # environments whose aclose() raised (the episodes are trained on)
            info += f" | {unclosed} environment(s) failed to close"
        on = [  # health/<alarm> flags; health/alarms counts them
            key[len("health/") :]
            for key, value in metrics.items()
            if key.startswith("health/") and key.count("/") == 1 and key != "health/alarms" and value
        ]
        if on:  # reward-hacking alarms that are on (docs/reward_hacking.md)
            info += f" | ALARM {', '.join(on)}"
        if self._progress is not None:
            self._progress.update(self._task, completed=step, info=info)
        else:
            print(f"step {step}/{self.total}  {info}", file=sys.stderr, flush=True)

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._progress is not None:
            self._progress.__exit__(exc_type, exc, tb)


class EpisodeProgress:
    """Context manager counting finished episodes of a rollout (``eval before``: 37/64 episodes).

    Pass :meth:`update` as the rollout engine's ``on_progress`` callback. On an interactive terminal
    it draws a bar; otherwise it prints one line when the rollout is done; disabled, it does
    nothing.
    """

    def __init__(self, label: str, *, enabled: bool = True) -> None:
        self.label = label
        self.enabled = enabled
        self._progress: Progress | None = None
        self._task: Any = None
        self._done = 0
        self._total = 0
        self._started = 0.0

    def __enter__(self) -> EpisodeProgress:
        import time

        self._started = time.perf_counter()
        if self.enabled and sys.stderr.isatty():
            self._progress = Progress(
                TextColumn(f"[bold]{self.label}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("episodes"),
                TimeElapsedColumn(),
                transient=True,
            )
            self._progress.__enter__()
            self._task = self._progress.add_task(self.label, total=None)
        return self

    def update(self, done: int, total: int) -> None:
        """``done`` of ``total`` episodes have finished."""
        self._done, self._total = done, total
        if self._progress is not None:
            self._progress.update(self._task, completed=done, total=total)

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        import time

        if self._progress is not None:
            self._progress.__exit__(exc_type, exc, tb)
        if self.enabled and exc_type is None and self._total:
            elapsed = time.perf_counter() - self._started
            print(
                f"{self.label}: {self._done}/{self._total} episodes in {elapsed:.1f} s",
                file=sys.stderr,
                flush=True,
            )
