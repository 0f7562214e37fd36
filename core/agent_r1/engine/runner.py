"""A run's lifecycle: what the ``train``, ``demo``, ``eval`` and ``rollout`` commands run.

Every entry point validates the whole run config and resolves every component *before* loading a
model, so a typo or a broken plugin costs seconds, not a model load. The runner owns everything
around the training steps: the run directory (one run per directory; ``--resume`` continues it),
``run.log``, evaluation before and after, checkpoints, interrupts (SIGINT/SIGTERM save a checkpoint
at the next safe point), trackers and every observer hook, and the final Hugging Face export
(``<run>/final``). The steps themselves (:func:`agent_r1.engine.trainer.train_step`) know nothing
of hooks or files.

Step numbering: step ``N`` is the ``N``-th completed update (1-based) in the console, in
``metrics.jsonl`` (``step``), in checkpoint names (``step_00000N``), in observer hooks and in
mid-run evaluation labels (``stepN``). Trajectories record the policy version that sampled them
(``N - 1`` for step ``N``).
"""

from __future__ import annotations

import contextlib
import json
import signal
import sys
import time
import warnings
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any, TextIO

from agent_r1.config import ResolvedComponent, RunConfig, load_config, resolved_dict, validate_components
from agent_r1.errors import AgentR1Error, RunInterrupted
from agent_r1.mdp import Task, save_trajectories

RUN_FILES = (
    "config.json",
    "metrics.jsonl",
    "samples.jsonl",
    "eval_before.json",
    "summary.json",
    "checkpoints",
)
"""What marks a directory as holding a run: a fresh run refuses to start in it."""


# --------------------------------------------------------------------------------------------
# Before anything is created
# --------------------------------------------------------------------------------------------


def prepare(
    config_path: str | Path | None, overrides: Sequence[str], *, skip: Sequence[str] = ()
) -> tuple[RunConfig, list[ResolvedComponent]]:
    """Load, merge and validate the config and all its components, then run the preflight checks
    (model and tokenizer files, data, trackers, LoRA targets, context, prompts, output directory:
    :mod:`agent_r1.engine.preflight`), before anything is created or loaded. Failures stop here
    with every problem listed; warnings are printed."""
    from agent_r1.engine.preflight import preflight

    config = load_config(config_path, overrides)
    components = validate_components(config)
    report = preflight(config, components, skip=skip)
    for check in report.warnings:
        print(f"warning: {check.name}: {check.message}", file=sys.stderr)
    report.raise_on_failure()
    return config, components


def _expand_output_dir(output_dir: str, *, resume: bool) -> Path:
    """``{now}`` in ``output_dir`` becomes the start time (``20261121-101500``), so each run gets a
    fresh directory; with ``--resume`` it picks the newest existing directory of that pattern."""
    if "{now}" not in output_dir:
        return Path(output_dir)
    if resume:
        pattern = Path(output_dir.replace("{now}", "*"))
        existing = sorted(pattern.parent.glob(pattern.name))
        if existing:
            return existing[-1]
    return Path(output_dir.replace("{now}", time.strftime("%Y%m%d-%H%M%S")))


def _check_run_dir(run_dir: Path, plain: dict[str, Any], *, resume: bool, allow_config_change: bool) -> None:
    """One run per directory: a fresh run needs a directory without run files; a resumed run needs
    the same config (or ``--allow-config-change``)."""
    held = [name for name in RUN_FILES if (run_dir / name).exists()]
    if not resume:
        if held:
            raise AgentR1Error(
                f"{run_dir} already holds a run ({', '.join(held)}). Continue it with --resume, or start a "
                "new run with output_dir=<another directory>."
            )
        return
    previous = run_dir / "config.json"
    if not previous.exists():
        return
    earlier = json.loads(previous.read_text(encoding="utf-8"))
    changes = _config_changes(earlier, plain)
    if changes and not allow_config_change:
        shown = "\n  ".join(changes[:20])
        raise AgentR1Error(
            f"--resume: the config differs from the one {run_dir} was started with:\n  {shown}\nResume "
            "with the original config, or pass --allow-config-change to continue with the new one (the "
            "change is recorded in config_changes.jsonl)."
        )


def _config_changes(before: Any, after: Any, path: str = "") -> list[str]:
    """``path: old -> new`` for every leaf that differs between two plain configs."""
    if isinstance(before, dict) and isinstance(after, dict):
        out: list[str] = []
        for key in sorted(set(before) | set(after), key=str):
            sub = f"{path}.{key}" if path else str(key)
            out += _config_changes(before.get(key, "<unset>"), after.get(key, "<unset>"), sub)
        return out
    if before != after and not path.startswith("output_dir"):
        return [f"{path}: {json.dumps(before)} -> {json.dumps(after)}"]
    return []


def _truncate_jsonl(path: Path, key: str, keep_up_to: int) -> None:
    """Drop lines of steps that the resumed run will redo (they came after the checkpoint)."""
    if not path.exists():
        return
    kept = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            if json.loads(line).get(key, -1) <= keep_up_to:
                kept.append(line)
        except ValueError:
            continue  # a line cut by a kill: the resumed run writes that step again
    path.write_text("".join(f"{line}\n" for line in kept), encoding="utf-8")


# --------------------------------------------------------------------------------------------
# run.log and signals
# --------------------------------------------------------------------------------------------


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
def _run_log(path: Path) -> Iterator[None]:
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


class _StopRequest:
    """SIGINT/SIGTERM handling during training: the first signal asks the loop to stop at the next
    safe point (after the current step, with a checkpoint); a second one stops at once."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> _StopRequest:
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


# --------------------------------------------------------------------------------------------
# Training
# --------------------------------------------------------------------------------------------


def train(
    config_path: str | Path | None,
    overrides: Sequence[str],
    *,
    resume: bool = False,
    allow_config_change: bool = False,
) -> dict[str, Any]:
    """Train as configured; returns the final summary (metrics, before/after eval)."""
    from agent_r1.engine.session import build_session

    config, components = prepare(config_path, overrides)
    run_dir = _expand_output_dir(config.output_dir, resume=resume)
    config.output_dir = str(run_dir)
    plain = resolved_dict(config, components)
    _check_run_dir(run_dir, plain, resume=resume, allow_config_change=allow_config_change)
    started = time.perf_counter()
    session = build_session(config, components, run_dir)
    created = not run_dir.exists()
    run_dir.mkdir(parents=True, exist_ok=True)
    try:
        with ExitStack() as stack:
            stack.callback(session.close)  # the policy gateway of rollout.source: gateway, if started
            if session.is_main:
                stack.enter_context(_run_log(run_dir / "run.log"))
            return _train_in(session, components, plain, resume=resume, started=started)
    except BaseException:
        if created and not any((run_dir / name).exists() for name in ("metrics.jsonl", "checkpoints")):
            _remove_empty_run(run_dir)
        raise


def _remove_empty_run(run_dir: Path) -> None:
    """A run that failed before its first step leaves nothing behind but its log's lesson."""
    import shutil

    shutil.rmtree(run_dir, ignore_errors=True)


def _train_in(
    session: Any,
    components: Sequence[ResolvedComponent],
    plain: dict[str, Any],
    *,
    resume: bool,
    started: float,
) -> dict[str, Any]:
    from agent_r1.engine.evaluation import compare_markdown, write_eval_report

    config, run_dir = session.config, session.run_dir
    if resume:
        _resume(session, plain)
    elif session.is_main:
        (run_dir / "config.json").write_text(json.dumps(plain, indent=2), encoding="utf-8")
        (run_dir / "provenance.json").write_text(
            json.dumps(_provenance(components), indent=2), encoding="utf-8"
        )

    eval_tasks = session.dataset.load(config.eval.split)[: config.eval.num_tasks]
    before_path = run_dir / "eval_before.json"
    before: dict[str, Any] | None = None
    if config.eval.before_training and eval_tasks:
        if resume and before_path.exists():  # this run's own earlier evaluation
            before = json.loads(before_path.read_text(encoding="utf-8"))
        else:
            before = run_eval(session, eval_tasks, label="before")
            if session.is_main:
                write_eval_report(before, run_dir / "eval_before")
                before_path.write_text(json.dumps(before, indent=2), encoding="utf-8")

    last = _training_loop(session, plain, eval_tasks)

    summary: dict[str, Any] = {"run_dir": str(run_dir), "steps": session.step, "last_metrics": last}
    if session.is_main:
        from agent_r1.engine.export import export_final

        final = export_final(
            run_dir,
            session.unwrapped,
            session.tokenizer,
            config.model,
            step=session.step,
            critic=_trained_critic(session),
        )
        summary["final"] = str(final)
    if eval_tasks:
        after = run_eval(session, eval_tasks, label="after")
        summary["after"] = after
        if session.is_main:
            write_eval_report(after, run_dir / "eval_after")
            (run_dir / "eval_after.json").write_text(json.dumps(after, indent=2), encoding="utf-8")
        if before is not None:
            summary["before"] = before
            summary["comparison_markdown"] = compare_markdown(before, after)
            if session.is_main:
                (run_dir / "comparison.md").write_text(summary["comparison_markdown"], encoding="utf-8")
    summary["wall_s"] = time.perf_counter() - started
    if session.is_main:
        _write_report(run_dir, plain, summary)
        (run_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=str), encoding="utf-8")
        _print_summary(summary)
    return summary


def _trained_critic(session: Any) -> tuple[dict[str, Any], Any] | None:
    """The value head's weights and the separate critic model of a run that trained a critic."""
    if session.value_head is None:
        return None
    unwrap = session.accelerator.unwrap_model
    critic_model = unwrap(session.critic_model) if session.critic_model is not None else None
    return unwrap(session.value_head).state_dict(), critic_model


def _resume(session: Any, plain: dict[str, Any]) -> None:
    """Load the newest good checkpoint (saying which), record a config change, trim the logs."""
    from agent_r1.engine import checkpoint as ckpt

    run_dir = session.run_dir
    previous = run_dir / "config.json"
    if previous.exists() and session.is_main:
        changes = _config_changes(json.loads(previous.read_text(encoding="utf-8")), plain)
        if changes:  # allowed by --allow-config-change (checked before the model loaded)
            stamp = time.strftime("%Y%m%d-%H%M%S")
            (run_dir / f"config.resume-{stamp}.json").write_text(
                json.dumps(plain, indent=2), encoding="utf-8"
            )
            with (run_dir / "config_changes.jsonl").open("a", encoding="utf-8") as log:
                log.write(json.dumps({"time": stamp, "changes": changes}) + "\n")
    elif session.is_main:
        previous.write_text(json.dumps(plain, indent=2), encoding="utf-8")
    latest = ckpt.latest_checkpoint(run_dir / "checkpoints")
    if latest is None:
        print(
            f"--resume: no usable checkpoint in {run_dir / 'checkpoints'}; starting from step 0",
            file=sys.stderr,
        )
    else:
        session.load_state_dict(ckpt.load_checkpoint(latest), source=str(latest))
        print(f"--resume: continuing from {latest} (step {session.step})", file=sys.stderr)
    _truncate_jsonl(run_dir / "metrics.jsonl", "step", session.step)
    _truncate_jsonl(run_dir / "samples.jsonl", "policy_version", session.step - 1)


def _training_loop(session: Any, plain: dict[str, Any], eval_tasks: list[Task]) -> dict[str, float]:
    """Steps until ``trainer.steps``, with trackers, hooks, mid-run evaluation, checkpoints and
    interrupts; returns the last step's metrics."""
    from agent_r1.engine.decoding import decoding_step_metrics
    from agent_r1.engine.progress import TrainingProgress
    from agent_r1.engine.trainer import train_step

    config, run_dir, notify = session.config, session.run_dir, session.registry.notify
    for tracker in session.trackers:
        tracker.start(run_dir, plain)
    notify("on_train_start", run_dir=run_dir, config=plain)
    last: dict[str, float] = {}
    with ExitStack() as stack:
        stack.callback(lambda: notify("on_train_end", run_dir=run_dir, metrics=last))
        for tracker in session.trackers:
            stack.callback(tracker.close)
        stop = stack.enter_context(_StopRequest())
        progress = stack.enter_context(
            TrainingProgress(config.trainer.steps, start=session.step, enabled=session.is_main)
        )
        while session.step < config.trainer.steps:
            result = train_step(session)
            step = session.step
            metrics = result.metrics
            metrics.update(decoding_step_metrics(result.trajectories))  # empty under plain sampling
            notify("on_rollout_end", step=step, trajectories=result.trajectories)
            if config.trainer.eval_every and step % config.trainer.eval_every == 0 and eval_tasks:
                metrics["eval/success"] = float(run_eval(session, eval_tasks, label=f"step{step}")["success"])
            for tracker in session.trackers:
                tracker.log(metrics, step)
            if session.is_main and result.trajectories:
                save_trajectories(run_dir / "samples.jsonl", result.trajectories[:2], append=True)
            notify("on_update_end", step=step, metrics=metrics)
            last = metrics
            progress.update(step, metrics)
            interrupted = _agreed_stop(session, stop)
            every = config.trainer.checkpoint_every
            if interrupted or step == config.trainer.steps or (every and step % every == 0):
                _checkpoint(session, plain)
            if interrupted:
                name = signal.Signals(interrupted).name
                raise RunInterrupted(
                    f"interrupted ({name}) at step {step}; checkpoint written; continue with --resume",
                    exit_code=128 + interrupted,
                )
    return last


def _agreed_stop(session: Any, stop: _StopRequest) -> int:
    """The signal that asked to stop on any process (0: none), so that every process stops at the
    same step."""
    from agent_r1.engine.collect import all_gather

    return max(all_gather(session, [stop.signum or 0]))


def _checkpoint(session: Any, plain: dict[str, Any]) -> None:
    from agent_r1.engine import checkpoint as ckpt

    if not session.is_main:
        return
    path = ckpt.save_checkpoint(
        session.run_dir / "checkpoints",
        session.step,
        session.state_dict(),
        plain,
        keep=session.config.trainer.keep_checkpoints,
    )
    session.registry.notify("on_checkpoint", step=session.step, path=path)


# --------------------------------------------------------------------------------------------
# Evaluation and rollouts
# --------------------------------------------------------------------------------------------


def run_eval(session: Any, tasks: list[Task], *, label: str) -> dict[str, Any]:
    """Roll out ``tasks`` with the session's current policy and summarise the result."""
    from agent_r1.engine.collect import rollout_all
    from agent_r1.engine.evaluation import decoding_summary, summarize_eval
    from agent_r1.rewards import answer_normalizations

    config = session.config
    ev = config.eval
    started = time.perf_counter()
    with session.decoding_as(ev.decoding):
        trajectories = rollout_all(
            session,
            tasks,
            ev.samples,
            seed=config.seed + 424_242,
            temperature=ev.temperature,
            salt=f"eval-{label}",
            progress=f"eval {label}",
        )
    wall_s = time.perf_counter() - started
    ks = tuple(sorted({k for k in ev.pass_k if k <= ev.samples}))
    summary: dict[str, Any] = summarize_eval(
        trajectories, {t.id: t for t in tasks}, success_signal=ev.success_signal, ks=ks
    )
    summary["decoding"] = decoding_summary(
        trajectories, ev.decoding.model_dump(), temperature=ev.temperature, wall_s=wall_s
    )
    summary["step"] = session.step
    summary["label"] = label
    summary["answer_normalization"] = answer_normalizations(shaper for shaper, _ in session.shapers)
    if session.is_main:
        save_trajectories(session.run_dir / f"eval_{label}.jsonl", trajectories)
    session.registry.notify("on_eval_end", step=session.step, report=summary)
    return summary


def evaluate(
    config_path: str | Path | None,
    overrides: Sequence[str],
    *,
    checkpoint: Path | None = None,
    out: Path | None = None,
) -> dict[str, Any]:
    """Evaluate the configured (or a checkpoint's) policy on the eval split."""
    from agent_r1.engine import checkpoint as ckpt
    from agent_r1.engine.critic_files import attach_critic, find_critic
    from agent_r1.engine.evaluation import eval_markdown, write_eval_report
    from agent_r1.engine.session import build_session

    config, components = prepare(config_path, overrides, skip=("output",) if out is not None else ())
    state, path = None, None
    if checkpoint is not None:
        path = ckpt.resolve_checkpoint(checkpoint)  # a clear error for a wrong or corrupt path
        state = ckpt.load_checkpoint(path)
    critic = None
    if config.eval.decoding.kind == "value_guided":  # found (or refused) before any model loads
        critic = find_critic(config.eval.decoding, config, checkpoint=path, state=state)
    out = Path(out or _expand_output_dir(config.output_dir, resume=True) / "eval")
    session = build_session(config, components, out, training=False)
    if state is not None:
        session.load_state_dict(state, source=str(path))
    if critic is not None:
        attach_critic(session, critic)
    tasks = session.dataset.load(config.eval.split)[: config.eval.num_tasks]
    if not tasks:
        raise AgentR1Error(f"the dataset has no tasks in split {config.eval.split!r}")
    out.mkdir(parents=True, exist_ok=True)
    try:
        summary = run_eval(session, tasks, label="eval")
    finally:
        session.close()
    write_eval_report(summary, out)
    return {"summary": summary, "markdown": eval_markdown(summary)}


def collect(
    config_path: str | Path | None,
    overrides: Sequence[str],
    *,
    out: Path,
    split: str = "train",
    num_tasks: int = 8,
) -> int:
    """Roll out ``num_tasks`` tasks of ``split`` with the configured model; write JSONL."""
    from agent_r1.engine.collect import rollout
    from agent_r1.engine.critic_files import attach_critic, find_critic
    from agent_r1.engine.session import build_session

    config, components = prepare(config_path, overrides)
    critic = None
    if config.rollout.decoding.kind == "value_guided":  # found (or refused) before any model loads
        critic = find_critic(config.rollout.decoding, config, setting="rollout.decoding")
    session = build_session(config, components, Path(out).parent, training=False)
    if critic is not None:
        attach_critic(session, critic)
    tasks = session.dataset.load(split)[:num_tasks]
    if not tasks:
        raise AgentR1Error(f"the dataset has no tasks in split {split!r}")
    try:
        trajectories = rollout(
            session,
            tasks,
            config.rollout.group_size,
            seed=config.seed,
            temperature=config.rollout.temperature,
            salt="collect",
            progress="rollout",
        )
    finally:
        session.close()
    return save_trajectories(out, trajectories)


# --------------------------------------------------------------------------------------------
# Reports
# --------------------------------------------------------------------------------------------


def _provenance(components: Sequence[ResolvedComponent]) -> list[dict[str, str]]:
    out = []
    for c in components:
        prov = getattr(c.cls, "provenance", None)
        out.append(
            {
                "path": c.path,
                "kind": c.kind,
                "name": c.name,
                "class": f"{c.cls.__module__}.{c.cls.__qualname__}",
                "plugin": prov.plugin if prov else "",
                "distribution": prov.distribution if prov else "",
                "version": prov.version if prov else "",
            }
        )
    return out


def _write_report(run_dir: Path, config: dict[str, Any], summary: dict[str, Any]) -> None:
    from agent_r1.engine.report import load_metrics, plot_curves, write_html_report

    metrics = load_metrics(run_dir / "metrics.jsonl")
    png: Path | None = run_dir / "reward_curve.png"
    try:
        plot_curves(metrics, png)
    except Exception as exc:  # a plotting problem must not lose the run's results: warned, logged
        warnings.warn(f"could not draw {png}: {exc}", stacklevel=2)
        png = None
    write_html_report(run_dir, config, metrics, summary.get("before"), summary.get("after"), png)


def _print_summary(summary: dict[str, Any]) -> None:
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
