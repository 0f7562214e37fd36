"""Training a run: what the ``train`` and ``demo`` commands run.

Every entry point validates the whole run config and resolves every component *before* loading a
model, so a typo or a broken plugin costs seconds, not a model load. The runner owns everything
around the training steps: the run directory (one run per directory; ``--resume`` continues it),
``run.log``, evaluation before and after, checkpoints, interrupts (SIGINT/SIGTERM save a checkpoint
at the next safe point), trackers and every observer hook, the reward-hacking alarms
(:mod:`agent_r1.engine.reports.health`), and the final Hugging Face export
(``<run>/final``). The steps themselves (:func:`agent_r1.engine.trainer.train_step`) know nothing
of hooks or files.

Step numbering: step ``N`` is the ``N``-th completed update (1-based) in the console, in
``metrics.jsonl`` (``step``), in checkpoint names (``step_00000N``), in observer hooks and in
mid-run evaluation labels (``stepN``). Trajectories record the policy version that sampled them
(``N - 1`` for step ``N``)."""

from __future__ import annotations

import json
import signal
import sys
import time
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent_r1.config import ResolvedComponent, resolved_dict
from agent_r1.errors import RunInterrupted, TrainingAborted
from agent_r1.mdp import Task, save_trajectories
from agent_r1.run.commands import prepare, rollout_source, run_eval
from agent_r1.run.console import StopRequest, print_health, print_summary, run_log
from agent_r1.run.rundir import (
    check_run_dir,
    config_changes,
    expand_output_dir,
    provenance,
    remove_empty_run,
    truncate_jsonl,
    write_report,
)

if TYPE_CHECKING:
    from agent_r1.engine.session import Session


def train(
    config_path: str | Path | None,
    overrides: Sequence[str],
    *,
    resume: bool = False,
    allow_config_change: bool = False,
) -> dict[str, Any]:
    """Train as configured; returns the final summary (metrics, before/after eval)."""
    from agent_r1.engine.asynchrony.ranks import launch_role, rollout_rank_main
    from agent_r1.engine.session import build_session

    config, components = prepare(config_path, overrides)
    role = launch_role(config)  # rollout.async_worker ranks: rank 0 trains, the others roll out
    if role is not None and not role.trains:
        rollout_rank_main(config, components, role)
        return {"role": "rollout", "rank": role.rank}
    run_dir = expand_output_dir(config.output_dir, resume=resume)
    config.output_dir = str(run_dir)
    plain = resolved_dict(config, components)
    check_run_dir(run_dir, plain, resume=resume, allow_config_change=allow_config_change)
    started = time.perf_counter()
    session = build_session(config, components, run_dir, source=rollout_source(config))
    session.launch_role = role
    created = not run_dir.exists()
    run_dir.mkdir(parents=True, exist_ok=True)
    try:
        with ExitStack() as stack:
            stack.push(_close_process_group)  # last: after every collective of the run
            stack.callback(session.close)  # the policy gateway of rollout.source: gateway, if started
            if session.is_main:
                stack.enter_context(run_log(run_dir / "run.log"))
            return _train_in(session, components, plain, resume=resume, started=started)
    except BaseException:
        if created and not any((run_dir / name).exists() for name in ("metrics.jsonl", "checkpoints")):
            remove_empty_run(run_dir)
        raise


def _train_in(
    session: Session,
    components: Sequence[ResolvedComponent],
    plain: dict[str, Any],
    *,
    resume: bool,
    started: float,
) -> dict[str, Any]:
    from agent_r1.engine.reports.evaluation import compare_markdown, write_eval_report

    config, run_dir = session.config, session.run_dir
    if resume:
        _resume(session, plain)
    elif session.is_main:
        (run_dir / "config.json").write_text(json.dumps(plain, indent=2), encoding="utf-8")
        (run_dir / "provenance.json").write_text(
            json.dumps(provenance(components), indent=2), encoding="utf-8"
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
    if before is not None and session.health is not None:  # the audit_gap alarm's step 0
        session.health.note_eval(0, float(before["success"]))

    last = _training_loop(session, plain, eval_tasks)

    summary: dict[str, Any] = {"run_dir": str(run_dir), "steps": session.step, "last_metrics": last}
    policy, critic = session.exportable()  # sharded: gathered from every process onto rank 0
    if session.is_main:
        from agent_r1.engine.artifacts.export import export_final

        final = export_final(
            run_dir, policy, session.tokenizer, config.model, step=session.step, critic=critic
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
        write_report(run_dir, plain, summary)
        (run_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=str), encoding="utf-8")
        print_summary(summary)
    return summary


def _resume(session: Session, plain: dict[str, Any]) -> None:
    """Load the newest good checkpoint (saying which), record a config change, trim the logs."""
    from agent_r1.engine.artifacts import checkpoint as ckpt

    run_dir = session.run_dir
    previous = run_dir / "config.json"
    if previous.exists() and session.is_main:
        changes = config_changes(json.loads(previous.read_text(encoding="utf-8")), plain)
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
    truncate_jsonl(run_dir / "metrics.jsonl", "step", session.step)
    truncate_jsonl(run_dir / "samples.jsonl", "policy_version", session.step - 1)


def _training_loop(session: Session, plain: dict[str, Any], eval_tasks: list[Task]) -> dict[str, float]:
    """Steps until ``trainer.steps``, with trackers, hooks, mid-run evaluation, checkpoints and
    interrupts; returns the last step's metrics."""
    from agent_r1.engine.reports.progress import TrainingProgress
    from agent_r1.engine.trainer import train_step
    from agent_r1.rollout.decoder import decoding_step_metrics

    config, run_dir, notify = session.config, session.run_dir, session.registry.notify
    for tracker in session.trackers:
        tracker.start(run_dir, plain)
    notify("on_train_start", run_dir=run_dir, config=plain)
    health = session.health
    if health is not None and session.is_main and session.step < config.trainer.steps:
        print(health.describe(), file=sys.stderr, flush=True)
    last: dict[str, float] = {}
    with ExitStack() as stack:
        stack.callback(lambda: notify("on_train_end", run_dir=run_dir, metrics=last))
        for tracker in session.trackers:
            stack.callback(tracker.close)
        stop = stack.enter_context(StopRequest())
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
            alarms = health.observe(step, metrics) if health is not None else []  # adds health/...
            if session.is_main:
                print_health(alarms)
            for tracker in session.trackers:
                tracker.log(metrics, step)
            if session.is_main and result.trajectories:
                save_trajectories(run_dir / "samples.jsonl", result.trajectories[:2], append=True)
            notify("on_update_end", step=step, metrics=metrics)
            last = metrics
            progress.update(step, metrics)
            _stop_on_alarm(session, alarms)
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


def _stop_on_alarm(session: Session, events: Sequence[Any]) -> None:
    """Under ``health.action: stop``, end the run when an alarm tripped this step (every process
    sees the same alarms: they are judged on figures gathered over all processes)."""
    tripped = [event for event in events if event.kind == "tripped"]
    if not tripped or session.config.health.action != "stop":
        return
    first = tripped[0]
    detail = first.message.split(": ", 2)[-1]
    raise TrainingAborted(
        f"step {first.step}: reward-hacking alarm {first.alarm!r} tripped: {detail}. What to do: "
        f"{first.advice}. The run stopped because health.action=stop (the step's metrics are logged; "
        "the latest checkpoint is the one before); set health.action=warn to keep training with a "
        f"warning, or health.{first.alarm}.enabled=false to switch this alarm off "
        f"(docs/reward_hacking.md#{first.alarm})."
    )


def _agreed_stop(session: Session, stop: StopRequest) -> int:
    """The signal that asked to stop on any process (0: none), so that every process stops at the
    same step."""
    from agent_r1.engine.collect import all_gather

    return max(all_gather(session, [stop.signum or 0]))


def _checkpoint(session: Session, plain: dict[str, Any]) -> None:
    from agent_r1.engine.artifacts import checkpoint as ckpt

    if not session.is_main and not session.sharded:
        return
    state = session.state_dict()  # sharded: every process gathers its shards with the others
    if not session.is_main:
        return
    path = ckpt.save_checkpoint(
        session.run_dir / "checkpoints",
        session.step,
        state,
        plain,
        keep=session.config.trainer.keep_checkpoints,
    )
    session.registry.notify("on_checkpoint", step=session.step, path=path)


def _close_process_group(exc_type: Any, exc: Any, traceback: Any) -> None:
    """Destroy the process group of a multi-process (or sharded) run before the interpreter exits,
    after every process has got there (a barrier, unless this one is leaving on an error): a gloo
    group left to the interpreter's teardown, or torn down while another process still talks to
    it, can abort a process ("terminate called without an active exception") after its run has
    finished."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return
    if exc_type is None and dist.get_world_size() > 1:
        dist.barrier()
    dist.destroy_process_group()
