"""The ``eval`` and ``rollout`` commands, and what every command runs first (:func:`prepare`: the
whole config and every component validated and the preflight checks run before a model loads)."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent_r1.config import ResolvedComponent, RunConfig, load_config, validate_components
from agent_r1.errors import AgentR1Error
from agent_r1.mdp import Task, save_trajectories
from agent_r1.run.rundir import expand_output_dir

if TYPE_CHECKING:
    from agent_r1.engine.session import Session
    from agent_r1.engine.source import RolloutSource


def prepare(
    config_path: str | Path | None, overrides: Sequence[str], *, skip: Sequence[str] = ()
) -> tuple[RunConfig, list[ResolvedComponent]]:
    """Load, merge and validate the config and all its components, then run the preflight checks
    (model and tokenizer files, data, trackers, LoRA targets, context, prompts, output directory:
    :mod:`agent_r1.run.preflight`), before anything is created or loaded. Failures stop here
    with every problem listed; warnings are printed."""
    from agent_r1.run.preflight import preflight

    config = load_config(config_path, overrides)
    components = validate_components(config)
    report = preflight(config, components, skip=skip)
    for check in report.warnings:
        print(f"warning: {check.name}: {check.message}", file=sys.stderr)
    report.raise_on_failure()
    return config, components


def run_eval(session: Session, tasks: list[Task], *, label: str) -> dict[str, Any]:
    """Roll out ``tasks`` with the session's current policy and summarise the result."""
    from agent_r1.engine.collect import rollout
    from agent_r1.engine.reports.evaluation import decoding_summary, summarize_eval
    from agent_r1.rewards import answer_normalizations

    config = session.config
    ev = config.eval
    started = time.perf_counter()
    with session.decoding_as(ev.decoding):
        trajectories = rollout(
            session,
            tasks,
            ev.samples,
            seed=config.seed + 424_242,
            temperature=ev.temperature,
            salt=f"eval-{label}",
            progress=f"eval {label}",
            spread=True,
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
    from agent_r1.engine.artifacts import checkpoint as ckpt
    from agent_r1.engine.artifacts.critic_files import attach_critic, find_critic
    from agent_r1.engine.reports.evaluation import eval_markdown, write_eval_report
    from agent_r1.engine.session import build_session

    config, components = prepare(config_path, overrides, skip=("output",) if out is not None else ())
    state, path = None, None
    if checkpoint is not None:
        path = ckpt.resolve_checkpoint(checkpoint)  # a clear error for a wrong or corrupt path
        state = ckpt.load_checkpoint(path)
    critic = None
    if config.eval.decoding.kind == "value_guided":  # found (or refused) before any model loads
        critic = find_critic(config.eval.decoding, config, checkpoint=path, state=state)
    out = Path(out or expand_output_dir(config.output_dir, resume=True) / "eval")
    session = build_session(config, components, out, training=False, source=rollout_source(config))
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
    from agent_r1.engine.artifacts.critic_files import attach_critic, find_critic
    from agent_r1.engine.collect import rollout
    from agent_r1.engine.session import build_session

    config, components = prepare(config_path, overrides)
    critic = None
    if config.rollout.decoding.kind == "value_guided":  # found (or refused) before any model loads
        critic = find_critic(config.rollout.decoding, config, setting="rollout.decoding")
    session = build_session(
        config, components, Path(out).parent, training=False, source=rollout_source(config)
    )
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


def rollout_source(config: RunConfig) -> Callable[[Session], RolloutSource] | None:
    """The rollout source ``rollout.source`` names, for :func:`~agent_r1.engine.session.build_session`
    (``None``: the engine's own agent loop)."""
    if config.rollout.source == "gateway":
        from agent_r1.gateway.training import GatewaySource

        return GatewaySource
    return None
