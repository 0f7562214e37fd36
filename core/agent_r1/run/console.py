"""The console of a run: ``run.log`` (everything printed, warnings included), SIGINT/SIGTERM as a
request to stop at the next safe point, the alarms' lines and the closing summary."""

from __future__ import annotations

import contextlib
import signal
import sys
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TextIO

from agent_r1.errors import AgentR1Error, RunInterrupted


class _Tee:
    """A text stream that writes to the console stream and to ``run.log``."""

    def __init__(self, stream: TextIO, log: TextIO) -> None:
        self.stream, self.log = stream, log

    def write(self, text: str) -> int:
        self.log.write(text)
        self.log.flush()
        return self.stream.write(text)

    def flush(self) -> None:
        self.stream.flush()

    def isatty(self) -> bool:
        return self.stream.isatty()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


@contextmanager
def run_log(path: Path) -> Iterator[None]:
    """Everything printed (stdout and stderr), every warning and the error that ends the run also
    go to ``path``."""
    with path.open("a", encoding="utf-8") as log:
        stdout, stderr, show = sys.stdout, sys.stderr, warnings.showwarning
        sys.stdout, sys.stderr = _Tee(stdout, log), _Tee(stderr, log)  # type: ignore[assignment]

        def showwarning(message: Any, category: Any, filename: str, lineno: int, *_: Any, **__: Any) -> None:
            print(
                f"warning: {category.__name__}: {message} ({Path(filename).name}:{lineno})", file=sys.stderr
            )

        warnings.showwarning = showwarning
        try:
            yield
        except RunInterrupted as exc:  # the command line prints it after the log is closed
            log.write(f"{exc}\n")
            raise
        except AgentR1Error as exc:
            log.write(f"error: {exc}\n")
            raise
        finally:
            sys.stdout, sys.stderr, warnings.showwarning = stdout, stderr, show


class StopRequest:
    """SIGINT/SIGTERM handling during training: the first signal asks the loop to stop at the next
    safe point (after the current step, with a checkpoint); a second one stops at once."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopRequest:
        for signum in (signal.SIGINT, signal.SIGTERM):
            # Outside the main thread (embedded use) signal.signal raises: signals stay the caller's.
            with contextlib.suppress(ValueError):
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def _handle(self, signum: int, _frame: Any) -> None:
        if self.signum is not None:
            raise RunInterrupted(
                f"interrupted again ({signal.Signals(signum).name}) during step; stopped at once without "
                "a checkpoint for this step. Continue from the last checkpoint with --resume.",
                exit_code=128 + signum,
            )
        self.signum = signum
        print(
            f"\n{signal.Signals(signum).name}: finishing the current step, then writing a checkpoint "
            "(send it again to stop at once)",
            file=sys.stderr,
            flush=True,
        )

    def __exit__(self, *_: Any) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)


def print_health(events: Sequence[Any]) -> None:
    """One line per alarm that tripped (a warning, with what to do) or cleared, and per notice; on
    the console and in ``run.log``."""
    for event in events:
        warning = "" if event.kind == "cleared" else "warning: "
        advice = (
            f". What to do: {event.advice} (docs/reward_hacking.md#{event.alarm})" if event.advice else ""
        )
        print(f"{warning}{event.message}{advice}", file=sys.stderr, flush=True)


def print_summary(summary: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.markdown import Markdown

    console = Console()
    if "comparison_markdown" in summary:
        console.print(Markdown(summary["comparison_markdown"]))
    console.print(f"run directory: {summary['run_dir']}  (report.html, reward_curve.png, metrics.jsonl)")
    if "final" in summary:
        console.print(
            f"trained model: {summary['final']}  (load it with AutoModelForCausalLM.from_pretrained)"
        )
    console.print(f"wall time: {summary['wall_s']:.0f} s")
