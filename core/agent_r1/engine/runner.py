"""What the ``train``, ``demo``, ``eval`` and ``rollout`` commands run.

Every entry point validates the whole run config and resolves every component *before* loading a
model, so a typo or a broken plugin costs seconds, not a model load.
"""

from __future__ import annotations

import json
import time
import warnings
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from agent_r1.config import ResolvedComponent, RunConfig, load_config, resolved_dict, validate_components
from agent_r1.errors import AgentR1Error
from agent_r1.mdp import Task, save_trajectories


def prepare(
    config_path: str | Path | None, overrides: Sequence[str]
) -> tuple[RunConfig, list[ResolvedComponent]]:
    """Load, merge and validate the config and all its components, and check that the model can
    be found, before anything is created or loaded."""
    from agent_r1.engine.models import resolve_model_path

    config = load_config(config_path, overrides)
    components = validate_components(config)
    resolve_model_path(config.model.path)
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


def _run_dir(config: RunConfig, *, resume: bool) -> Path:
    run_dir = _expand_output_dir(config.output_dir, resume=resume)
    config.output_dir = str(run_dir)
    checkpoints = run_dir / "checkpoints"
    if not resume and checkpoints.is_dir() and any(checkpoints.iterdir()):
        raise AgentR1Error(
            f"{run_dir} already holds a run with checkpoints. Continue it with --resume, or start a new "
            f"run with output_dir=<another directory>."
        )
    run_dir.mkdir(parents=True, exist_ok=True)
    return run_dir


def _truncate_jsonl(path: Path, key: str, before_step: int) -> None:
    """Drop lines of steps that the resumed run will redo (they came after the checkpoint)."""
    if not path.exists():
        return
    kept = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            if json.loads(line).get(key, -1) < before_step:
                kept.append(line)
        except ValueError:
            continue  # a line cut by a kill
    path.write_text("".join(f"{line}\n" for line in kept), encoding="utf-8")


def run_eval(trainer: Any, config: RunConfig, tasks: list[Task], *, step: int, label: str) -> dict[str, Any]:
    """Roll out ``tasks`` with the trainer's current policy and summarise the result."""
    from agent_r1.engine.evaluation import summarize_eval

    ev = config.eval
    trajectories = trainer.collect_all(
        tasks, ev.samples, seed=config.seed + 424_242, temperature=ev.temperature, salt=f"eval-{label}"
    )
    ks = tuple(k for k in (1, 2, 4, 8, 16) if k <= ev.samples)
    summary: dict[str, Any] = summarize_eval(
        trajectories, {t.id: t for t in tasks}, success_signal=ev.success_signal, ks=ks
    )
    summary["step"] = step
    summary["label"] = label
    if trainer.is_main:
        save_trajectories(trainer.run_dir / f"eval_{label}.jsonl", trajectories)
    trainer.registry.notify("on_eval_end", step=step, report=summary)
    return summary


def train(
    config_path: str | Path | None, overrides: Sequence[str], *, resume: bool = False
) -> dict[str, Any]:
    """Train as configured; returns the final summary (metrics, before/after eval)."""
    from agent_r1.engine import checkpoint as ckpt
    from agent_r1.engine.evaluation import compare_markdown, write_eval_report
    from agent_r1.engine.progress import TrainingProgress
    from agent_r1.engine.trainer import Trainer

    config, components = prepare(config_path, overrides)
    run_dir = _run_dir(config, resume=resume)
    started = time.perf_counter()
    trainer = Trainer(config, components, run_dir)
    plain = resolved_dict(config, components)
    if trainer.is_main:
        (run_dir / "config.json").write_text(json.dumps(plain, indent=2), encoding="utf-8")
        (run_dir / "provenance.json").write_text(
            json.dumps(_provenance(components), indent=2), encoding="utf-8"
        )
    checkpoints = run_dir / "checkpoints"
    if resume:
        latest = ckpt.latest_checkpoint(checkpoints)
        if latest is None:
            warnings.warn(
                f"--resume: no usable checkpoint in {checkpoints}; starting from step 0", stacklevel=2
            )
        else:
            trainer.load_state_dict(ckpt.load_checkpoint(latest))
        _truncate_jsonl(run_dir / "metrics.jsonl", "step", trainer.step)
        _truncate_jsonl(run_dir / "samples.jsonl", "policy_version", trainer.step)

    eval_tasks = trainer.dataset.load(config.eval.split)[: config.eval.num_tasks]
    before_path = run_dir / "eval_before.json"
    before: dict[str, Any] | None = None
    if config.eval.before_training and eval_tasks:
        if before_path.exists():
            before = json.loads(before_path.read_text(encoding="utf-8"))
        else:
            before = run_eval(trainer, config, eval_tasks, step=trainer.step, label="before")
            if trainer.is_main:
                write_eval_report(before, run_dir / "eval_before")
                before_path.write_text(json.dumps(before, indent=2), encoding="utf-8")

    for tracker in trainer.trackers:
        tracker.start(run_dir, plain)
    trainer.registry.notify("on_train_start", run_dir=run_dir, config=plain)
    last: dict[str, float] = {}
    with ExitStack() as stack:
        progress = stack.enter_context(
            TrainingProgress(config.trainer.steps, start=trainer.step, enabled=trainer.is_main)
        )
        try:
            while trainer.step < config.trainer.steps:
                metrics = trainer.train_step()
                step = int(metrics["step"])
                if config.trainer.eval_every and (step + 1) % config.trainer.eval_every == 0 and eval_tasks:
                    mid = run_eval(trainer, config, eval_tasks, step=step, label=f"step{step + 1}")
                    metrics["eval/success"] = float(mid["success"])
                for tracker in trainer.trackers:
                    tracker.log(metrics, step)
                if trainer.is_main and trainer.last_trajectories:
                    save_trajectories(run_dir / "samples.jsonl", trainer.last_trajectories[:2], append=True)
                trainer.registry.notify("on_update_end", step=step, metrics=metrics)
                last = metrics
                progress.update(trainer.step, metrics)
                every = config.trainer.checkpoint_every
                if trainer.is_main and (
                    trainer.step == config.trainer.steps or (every and trainer.step % every == 0)
                ):
                    path = ckpt.save_checkpoint(
                        checkpoints,
                        trainer.step,
                        trainer.state_dict(),
                        plain,
                        keep=config.trainer.keep_checkpoints,
                    )
                    trainer.registry.notify("on_checkpoint", step=trainer.step, path=path)
        finally:
            for tracker in trainer.trackers:
                tracker.close()
            trainer.registry.notify("on_train_end", run_dir=run_dir, metrics=last)

    summary: dict[str, Any] = {"run_dir": str(run_dir), "steps": trainer.step, "last_metrics": last}
    if eval_tasks:
        after = run_eval(trainer, config, eval_tasks, step=trainer.step, label="after")
        summary["after"] = after
        if trainer.is_main:
            write_eval_report(after, run_dir / "eval_after")
            (run_dir / "eval_after.json").write_text(json.dumps(after, indent=2), encoding="utf-8")
        if before is not None:
            summary["before"] = before
            comparison = compare_markdown(before, after)
            summary["comparison_markdown"] = comparison
            if trainer.is_main:
                (run_dir / "comparison.md").write_text(comparison, encoding="utf-8")
    summary["wall_s"] = time.perf_counter() - started
    if trainer.is_main:
        _write_report(run_dir, plain, summary)
        (run_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=str), encoding="utf-8")
        _print_summary(summary)
    return summary


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
    png = run_dir / "reward_curve.png"
    try:
        plot_curves(metrics, png)
    except Exception as exc:  # a plotting problem must not lose the run's results
        warnings.warn(f"could not draw {png}: {exc}", stacklevel=2)
        png = None  # type: ignore[assignment]
    write_html_report(run_dir, config, metrics, summary.get("before"), summary.get("after"), png)


def _print_summary(summary: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.markdown import Markdown

    console = Console()
    if "comparison_markdown" in summary:
        console.print(Markdown(summary["comparison_markdown"]))
    console.print(f"run directory: {summary['run_dir']}  (report.html, reward_curve.png, metrics.jsonl)")
    console.print(f"wall time: {summary['wall_s']:.0f} s")


def evaluate(
    config_path: str | Path | None,
    overrides: Sequence[str],
    *,
    checkpoint: Path | None = None,
    out: Path | None = None,
) -> dict[str, Any]:
    """Evaluate the configured (or a checkpoint's) policy on the eval split."""
    from agent_r1.engine import checkpoint as ckpt
    from agent_r1.engine.evaluation import eval_markdown, write_eval_report
    from agent_r1.engine.trainer import Trainer

    config, components = prepare(config_path, overrides)
    out = Path(out or _expand_output_dir(config.output_dir, resume=True) / "eval")
    out.mkdir(parents=True, exist_ok=True)
    trainer = Trainer(config, components, out)
    if checkpoint is not None:
        path = Path(checkpoint)
        if (path / "checkpoints").is_dir():
            path = ckpt.latest_checkpoint(path / "checkpoints") or path
        state = ckpt.load_checkpoint(path)
        trainer.unwrapped.load_state_dict(state["model"])
        trainer.backend.sync_weights(trainer.unwrapped, state["step"])
    tasks = trainer.dataset.load(config.eval.split)[: config.eval.num_tasks]
    if not tasks:
        raise AgentR1Error(f"the dataset has no tasks in split {config.eval.split!r}")
    summary = run_eval(trainer, config, tasks, step=trainer.step, label="eval")
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
    from agent_r1.engine.trainer import Trainer

    config, components = prepare(config_path, overrides)
    run_dir = Path(out).parent
    trainer = Trainer(config, components, run_dir)
    tasks = trainer.dataset.load(split)[:num_tasks]
    if not tasks:
        raise AgentR1Error(f"the dataset has no tasks in split {split!r}")
    trajectories = trainer.collect(
        tasks,
        config.rollout.group_size,
        seed=config.seed,
        temperature=config.rollout.temperature,
        salt="collect",
    )
    return save_trajectories(out, trajectories)
