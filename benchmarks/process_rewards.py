"""Process rewards, measured: train the main task with and without process rewards, side by side.

For every seed the script trains two arms (or more, with ``--arm``) from the same starting point,
in one process, with the training step driven step by step:

* ``outcome``: the config's rewards as they are (the bundled ``demo`` config: ``answer_match``
  only, an outcome reward per trajectory);
* ``process``: the same, plus the process rewards given with ``--process`` (default: the
  ``tool_call`` shaper with its safe defaults, +0.1 for a successful calculator call in an episode
  that ended with an answer, at most one per episode, and -0.1 per failed or malformed call).

* any arm given with ``--arm "NAME: KEY=VALUE ..."``: the outcome arm plus those overrides, e.g.
  ``--arm "gigpo: algorithm.name=gigpo"`` (turn-level credit from the outcome reward alone).

It reports, per arm (mean ± sd and a 95% t-interval over seeds), as the ratio arm / outcome, and
as the paired per-seed difference arm − outcome with its 95% t-interval:

* the variance and std of the trajectory scores (returns) over each step's batch, of their
  outcome part alone, and within each group (what GRPO normalises), averaged over steps;
* the variance and std of the advantages over each step's batch (per policy token, and per
  trajectory), and of the estimator's returns, averaged over steps;
* the mean of the gradient norm (``actor/grad_norm``, before clipping) and its variance across
  steps;
* learning curves (``reward/answer_match`` and ``success/train`` per step) as a PNG, a JSON file
  and a Markdown table, and with ``--eval`` the held-out greedy success before training (once: the
  arms share the starting model, and greedy decoding does not depend on the seed) and after.

A study is resumable: run the same command with the same ``--out`` and the runs already finished
there are kept, not run again. ``--merge DIR ...`` writes one report from the runs of several
output directories (seeds run in separate processes side by side).

Examples (from the repository root)::

    .venv/bin/python benchmarks/process_rewards.py --tiny --steps 3 --seeds 0 1 --threads 1
    .venv/bin/python benchmarks/process_rewards.py --seeds 0 1 2 --eval --arm "gigpo: algorithm.name=gigpo"
    .venv/bin/python benchmarks/process_rewards.py --merge runs/pr-s0 runs/pr-s1 --out runs/pr
    .venv/bin/python benchmarks/process_rewards.py --process "tool_call:1.0:success=0.2" \\
        --process "env:format_error=-0.1" trainer.steps=20

``--process`` takes ``NAME[:WEIGHT][:OPTION=VALUE,...]`` (a reward shaper appended to the rewards),
``{name: ..., weight: ..., <options>}`` (the same as a YAML mapping), or ``env:KEY=VALUE,...``
(the environment's own process signals: ``tool_success``, ``tool_failure`` and ``format_error``
set ``environment.<key>_reward``; other keys set ``environment.<key>``). Repeat it to combine.
Trailing ``KEY=VALUE`` arguments are config overrides for both arms; ``--with-override`` applies
to the process arm only. One run's failure is recorded in the report and the others go on.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import shlex
import time
import traceback
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml

ENV_PROCESS_KEYS = {
    "tool_success": "tool_success_reward",
    "tool_failure": "tool_failure_reward",
    "format_error": "format_error_reward",
}
"""Short names accepted by ``--process env:...`` for the ToolEnv's process-reward options."""

TINY_OVERRIDES = [
    "model.freeze_embeddings=false",
    "data.num_train=64",
    "data.num_eval=16",
    "rollout.max_turns=2",
    "rollout.max_new_tokens=12",
    "rollout.max_context=2048",
    "trainer.tasks_per_step=2",
    "trainer.micro_batch_size=8",
    "trainer.lr=1.0e-3",
    "eval.num_tasks=4",
]
"""What ``--tiny`` changes besides the model: a quick smoke run of the calculator task."""

CURVE_KEYS = ("reward/answer_match", "success/train", "actor/grad_norm", "batch/zero_variance_groups")
"""Per-step metrics drawn in the PNG and kept as mean curves (the first two are the learning curves)."""

STEP_KEYS = (
    "reward/answer_match",
    "success/train",
    "reward/score_mean",
    "actor/grad_norm",
    "batch/zero_variance_groups",
    "tools/calls_mean",
    "termination/max_turns",
    "rollout/format_error_rate",
    "time/step_s",
)
"""Trainer metrics kept per step in ``results.json`` (besides the statistics computed here)."""

SUMMARY_ROWS = [
    # (key in a run's summary, label in the report); the report averages each over seeds
    ("score_var", "score (return) variance over the batch"),
    ("score_std", "score (return) std over the batch"),
    ("outcome_var", "outcome-part variance over the batch"),
    ("group_score_var", "within-group score variance"),
    ("zero_variance_groups", "share of zero-variance groups"),
    ("adv_token_var", "advantage variance (policy tokens)"),
    ("adv_token_std", "advantage std (policy tokens)"),
    ("adv_traj_var", "advantage variance (per trajectory)"),
    ("returns_token_var", "estimator-return variance (policy tokens)"),
    ("grad_norm_mean", "gradient norm, mean over steps"),
    ("grad_norm_var", "gradient norm, variance across steps"),
    ("grad_norm_std", "gradient norm, std across steps"),
    ("answer_match_mean", "reward/answer_match, mean over steps"),
    ("success_train_last", "success/train, mean of the last quarter"),
    ("tool_calls_mean", "tool calls per trajectory"),
    ("max_turns_share", "share ending at max_turns"),
    ("eval_success", "held-out greedy success after training"),
    ("wall_s", "wall time per run (s)"),
]


# --------------------------------------------------------------------------------------------
# Arms: the config overrides of "outcome only" and "with process rewards"
# --------------------------------------------------------------------------------------------


@dataclass
class Arm:
    """One side of the comparison: a name, a readable label and its config overrides."""

    name: str
    label: str
    overrides: list[str]
    short: str = ""


def _value(text: str) -> Any:
    return yaml.safe_load(text) if text.strip() else ""


def parse_process_spec(spec: str) -> tuple[list[dict[str, Any]], list[str]]:
    """``--process`` text -> (reward specs to append, environment overrides)."""
    spec = spec.strip()
    if spec.startswith("{"):
        mapping = yaml.safe_load(spec)
        if not isinstance(mapping, dict) or "name" not in mapping:
            raise ValueError(f"--process {spec!r}: a mapping needs at least a 'name'")
        return [mapping], []
    head, _, rest = spec.partition(":")
    if head == "env":
        overrides = []
        for item in filter(None, (part.strip() for part in rest.split(","))):
            key, sep, raw = item.partition("=")
            if not sep:
                raise ValueError(f"--process {spec!r}: expected env:KEY=VALUE,... (got {item!r})")
            option = ENV_PROCESS_KEYS.get(key.strip(), key.strip())
            overrides.append(f"environment.{option}={raw.strip()}")
        if not overrides:
            raise ValueError(f"--process {spec!r}: env: needs at least one KEY=VALUE")
        return [], overrides
    if not head:
        raise ValueError(f"--process {spec!r}: expected NAME[:WEIGHT][:OPTION=VALUE,...]")
    reward: dict[str, Any] = {"name": head}
    parts = rest.split(":", 1) if rest else []
    if parts and "=" not in parts[0]:
        try:
            reward["weight"] = float(parts.pop(0))
        except ValueError:
            raise ValueError(f"--process {spec!r}: the weight must be a number") from None
    for chunk in parts:
        for item in filter(None, (part.strip() for part in chunk.split(","))):
            key, sep, raw = item.partition("=")
            if not sep:
                raise ValueError(f"--process {spec!r}: expected OPTION=VALUE (got {item!r})")
            reward[key.strip()] = _value(raw)
    return [reward], []


def describe_reward(spec: dict[str, Any], *, options: bool = True) -> str:
    """``name×weight(option=value, ...)`` for a reward spec."""
    extra = {k: v for k, v in spec.items() if k not in ("name", "weight")} if options else {}
    text = f"{spec['name']}×{spec.get('weight', 1.0):g}"
    return f"{text}({', '.join(f'{k}={v}' for k, v in extra.items())})" if extra else text


def _resolved(config: str, overrides: list[str]) -> dict[str, Any]:
    """The fully validated config (component defaults filled in); fails fast on a bad override."""
    from agent_r1.config import load_config, resolved_dict, validate_components

    loaded = load_config(config, overrides)
    return resolved_dict(loaded, validate_components(loaded))


def parse_arm_spec(spec: str) -> tuple[str, list[str]]:
    """``--arm "NAME: KEY=VALUE KEY=VALUE"`` -> (name, overrides)."""
    name, sep, rest = spec.partition(":")
    name = name.strip()
    if not sep or not name.isidentifier() or name in ("outcome", "process"):
        raise ValueError(
            f"--arm {spec!r}: expected 'NAME: KEY=VALUE ...' with a new arm name (not outcome or process)"
        )
    overrides = shlex.split(rest)
    bad = [item for item in overrides if "=" not in item]
    if not overrides or bad:
        raise ValueError(f"--arm {spec!r}: expected KEY=VALUE overrides after the name (got {bad or 'none'})")
    return name, overrides


def build_arms(
    config: str,
    base: list[str],
    process: Sequence[str],
    with_overrides: list[str],
    extra: Sequence[str] = (),
) -> list[Arm]:
    """The arms; all start from ``config`` + ``base``: the process arm adds the signals, each
    ``--arm`` its own overrides (validated here, before any model loads)."""
    from agent_r1.config import load_config

    rewards = [r.model_dump(exclude_none=True) for r in load_config(config, base).rewards]
    extra_rewards: list[dict[str, Any]] = []
    env_overrides: list[str] = []
    for spec in process:
        more, env = parse_process_spec(spec)
        extra_rewards += more
        env_overrides += env
    process_overrides = [*base, f"rewards={json.dumps(rewards + extra_rewards)}", *env_overrides]
    process_overrides += with_overrides
    outcome_full = _resolved(config, base)
    process_full = _resolved(config, process_overrides)
    # the shapers added by --process with every option spelled out (defaults included)
    added = process_full["rewards"][len(rewards) :]
    env_keys = sorted({o.split("=", 1)[0].removeprefix("environment.") for o in env_overrides})
    env_text = [f"environment {k}={process_full['environment'].get(k)}" for k in env_keys]
    process_label = " + ".join(
        [describe_reward(r) for r in rewards] + [describe_reward(r) for r in added] + env_text
    )
    if with_overrides:
        process_label += f"; process arm only: {' '.join(with_overrides)}"
    env_process = {k: v for k, v in outcome_full["environment"].items() if k.endswith("_reward") and v}
    if env_process:
        print(f"note: the outcome arm's environment already emits process rewards: {env_process}")
    arms = [
        Arm(
            "outcome",
            " + ".join(describe_reward(r) for r in rewards) or "none",
            list(base),
            " + ".join(describe_reward(r, options=False) for r in rewards) or "none",
        ),
        Arm(
            "process",
            process_label,
            process_overrides,
            " + ".join([describe_reward(r, options=False) for r in rewards + added] + env_text),
        ),
    ]
    for spec in extra:
        name, overrides = parse_arm_spec(spec)
        if any(a.name == name for a in arms):
            raise ValueError(f"--arm {spec!r}: the arm {name!r} is given twice")
        _resolved(config, [*base, *overrides])
        text = " ".join(overrides)
        arms.append(Arm(name, f"{arms[0].label}; {text}", [*base, *overrides], f"{arms[0].short}; {text}"))
    return arms


# --------------------------------------------------------------------------------------------
# Per-step statistics
# --------------------------------------------------------------------------------------------


class AdvantageRecorder:
    """Wraps an estimator's ``compute`` to keep the last ``(advantages, returns, loss_mask)``."""

    def __init__(self, estimator: Any) -> None:
        self.last: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
        original = estimator.compute

        def compute(batch: Any) -> tuple[torch.Tensor, torch.Tensor]:
            advantages, returns = original(batch)
            self.last = (advantages.detach().cpu(), returns.detach().cpu(), batch.loss_mask.detach().cpu())
            return advantages, returns

        estimator.compute = compute

    def take(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        last, self.last = self.last, None
        return last


def _token_var(values: torch.Tensor, mask: torch.Tensor) -> float:
    """Unbiased variance over the masked tokens (as ``advantages/std`` is logged)."""
    selected = values[mask].double()
    return float(selected.var()) if selected.numel() > 1 else 0.0


def step_statistics(trajectories: Sequence[Any], recorded: Any) -> dict[str, float]:
    """Variances of one step's batch: scores, their outcome part, within groups, advantages."""
    scores = np.array([t.score for t in trajectories], dtype=float)
    outcome = np.array(
        [sum(r.weighted for r in t.rewards if r.kind == "outcome") for t in trajectories], dtype=float
    )
    process = scores - outcome
    groups: dict[str, list[float]] = defaultdict(list)
    for t, s in zip(trajectories, scores, strict=True):
        groups[t.group_id].append(float(s))
    within = [float(np.var(g, ddof=1)) for g in groups.values() if len(g) > 1]
    out = {
        "score_var": float(np.var(scores)) if len(scores) else math.nan,
        "outcome_var": float(np.var(outcome)) if len(outcome) else math.nan,
        "process_mean": float(np.mean(process)) if len(process) else math.nan,
        "group_score_var": float(np.mean(within)) if within else math.nan,
    }
    out["score_std"] = math.sqrt(out["score_var"]) if out["score_var"] >= 0 else math.nan
    if recorded is not None:
        advantages, returns, mask = recorded  # [B, T] each
        mask = mask.bool()
        out["adv_token_var"] = _token_var(advantages, mask)
        out["adv_token_std"] = math.sqrt(out["adv_token_var"])
        counts = mask.sum(dim=1).clamp(min=1)
        per_traj = (torch.where(mask, advantages, 0.0).sum(dim=1) / counts)[mask.any(dim=1)]  # [B']
        out["adv_traj_var"] = float(per_traj.double().var(unbiased=False)) if per_traj.numel() else math.nan
        out["returns_token_var"] = _token_var(returns, mask)
    return out


def _finite(values: Sequence[float]) -> list[float]:
    return [float(v) for v in values if v is not None and math.isfinite(float(v))]


def _mean(values: Sequence[float]) -> float:
    kept = _finite(values)
    return float(np.mean(kept)) if kept else math.nan


def run_summary(steps: list[dict[str, float]]) -> dict[str, float]:
    """One run's figures from its per-step records."""
    summary = {
        key: _mean([s.get(key, math.nan) for s in steps])
        for key in (
            "score_var",
            "score_std",
            "outcome_var",
            "group_score_var",
            "adv_token_var",
            "adv_token_std",
            "adv_traj_var",
            "returns_token_var",
        )
    }
    summary["zero_variance_groups"] = _mean([s.get("batch/zero_variance_groups", math.nan) for s in steps])
    norms = _finite([s.get("actor/grad_norm", math.nan) for s in steps])
    summary["grad_norm_mean"] = float(np.mean(norms)) if norms else math.nan
    summary["grad_norm_var"] = float(np.var(norms, ddof=1)) if len(norms) > 1 else math.nan
    summary["grad_norm_std"] = math.sqrt(summary["grad_norm_var"]) if len(norms) > 1 else math.nan
    summary["answer_match_mean"] = _mean([s.get("reward/answer_match", math.nan) for s in steps])
    last = steps[-max(1, len(steps) // 4) :] if steps else []
    summary["success_train_last"] = _mean([s.get("success/train", math.nan) for s in last])
    summary["tool_calls_mean"] = _mean([s.get("tools/calls_mean", math.nan) for s in steps])
    summary["max_turns_share"] = _mean([s.get("termination/max_turns", 0.0) for s in steps])
    return summary


# --------------------------------------------------------------------------------------------
# One training run
# --------------------------------------------------------------------------------------------


def run_one(
    arm: Arm,
    seed: int,
    args: argparse.Namespace,
    out_dir: Path,
    record: dict[str, Any],
    before: dict[str, Any] | None = None,
) -> None:
    """Train one arm with one seed; fill ``record`` with its per-step records and summary as it goes
    (a run that fails keeps the steps it finished). With ``--eval`` and an empty ``before``, the
    starting model is evaluated first and ``before`` filled in."""
    from agent_r1.config import load_config, resolved_dict, validate_components
    from agent_r1.engine.session import build_session
    from agent_r1.engine.trainer import train_step
    from agent_r1.mdp import save_trajectories

    started = time.perf_counter()
    run_dir = out_dir / "runs" / f"{arm.name}-seed{seed}"
    config = load_config(args.config, [*arm.overrides, f"seed={seed}"])
    config.output_dir = str(run_dir)
    components = validate_components(config)
    run_dir.mkdir(parents=True, exist_ok=True)
    plain = resolved_dict(config, components)
    (run_dir / "config.json").write_text(json.dumps(plain, indent=2), encoding="utf-8")

    session = build_session(config, components, run_dir)
    if args.eval and before is not None and not before:
        from agent_r1.run.training import run_eval

        tasks = session.dataset.load(config.eval.split)[: config.eval.num_tasks]
        result = run_eval(session, tasks, label="before")
        before.update({k: result[k] for k in ("success", "successes", "num_tasks") if k in result})
        print(f"  held-out greedy success before training: {before.get('success', math.nan):.3f}", flush=True)
    recorder = AdvantageRecorder(session.estimator)
    for tracker in session.trackers:
        tracker.start(run_dir, plain)
    steps: list[dict[str, float]] = []
    record.update(run_dir=str(run_dir), steps=steps)
    try:
        total = config.trainer.steps
        while session.step < total:
            result = train_step(session)
            metrics = result.metrics
            stats = step_statistics(result.trajectories, recorder.take())
            for tracker in session.trackers:
                tracker.log({**metrics, **{f"bench/{k}": v for k, v in stats.items()}}, int(metrics["step"]))
            if result.trajectories:
                save_trajectories(run_dir / "samples.jsonl", result.trajectories[:2], append=True)
            row = {"step": int(metrics["step"]), **{k: float(metrics[k]) for k in STEP_KEYS if k in metrics}}
            row.update(stats)
            steps.append(row)
            print(
                f"  [{arm.name} seed {seed}] step {session.step}/{total}  "
                f"answer_match {row.get('reward/answer_match', math.nan):.3f}  "
                f"success {row.get('success/train', math.nan):.3f}  "
                f"score_var {row['score_var']:.4f}  "
                f"grad_norm {row.get('actor/grad_norm', math.nan):.3f}  "
                f"({row.get('time/step_s', math.nan):.1f} s)",
                flush=True,
            )
    finally:
        for tracker in session.trackers:
            tracker.close()
    summary = run_summary(steps)
    if args.eval:
        from agent_r1.run.training import run_eval

        tasks = session.dataset.load(config.eval.split)[: config.eval.num_tasks]
        result = run_eval(session, tasks, label="after")
        (run_dir / "eval_after.json").write_text(json.dumps(result, indent=2, default=str), encoding="utf-8")
        summary["eval_success"] = float(result["success"])
        record["eval"] = {k: result[k] for k in ("success", "successes", "num_tasks") if k in result}
    summary["wall_s"] = time.perf_counter() - started
    record["summary"] = summary


# --------------------------------------------------------------------------------------------
# Aggregation and reports
# --------------------------------------------------------------------------------------------


def _ratio(numerator: float, denominator: float) -> float:
    if not (math.isfinite(numerator) and math.isfinite(denominator)) or denominator == 0:
        return math.nan
    return numerator / denominator


T_975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228}
"""Two-sided 95% quantiles of Student's t by degrees of freedom (more than 10: 1.96 + 2.5 / df)."""


def ci95(values: Sequence[float]) -> float:
    """Half-width of the 95% t-interval of the mean of ``values`` (NaN with fewer than two)."""
    kept = _finite(values)
    if len(kept) < 2:
        return math.nan
    df = len(kept) - 1
    t = T_975.get(df, 1.96 + 2.5 / df)
    return float(t * np.std(kept, ddof=1) / math.sqrt(len(kept)))


def _stats(values: Sequence[float]) -> dict[str, float]:
    kept = _finite(values)
    return {
        "mean": float(np.mean(kept)) if kept else math.nan,
        "sd": float(np.std(kept, ddof=1)) if len(kept) > 1 else math.nan,
        "ci95": ci95(kept),
        "n": len(kept),
    }


def aggregate(runs: list[dict[str, Any]], arms: list[Arm]) -> dict[str, Any]:
    """Per arm: mean, sd and 95% t-interval over seeds; per other arm: the ratio of its mean to the
    outcome arm's, and the paired per-seed difference (arm − outcome) with its 95% t-interval."""
    ok = [r for r in runs if "error" not in r and "summary" in r]
    per_arm: dict[str, dict[str, dict[str, float]]] = {}
    for arm in arms:
        summaries = [r["summary"] for r in ok if r["arm"] == arm.name]
        per_arm[arm.name] = {
            key: _stats([s.get(key, math.nan) for s in summaries]) for key, _ in SUMMARY_ROWS
        }
    by_seed: dict[int, dict[str, dict[str, float]]] = defaultdict(dict)
    for r in ok:
        by_seed[r["seed"]][r["arm"]] = r["summary"]
    ratios: dict[str, dict[str, float]] = {}
    paired_ratios: dict[str, dict[str, dict[str, float]]] = {}
    differences: dict[str, dict[str, dict[str, float]]] = {}
    for arm in arms[1:]:
        ratios[arm.name] = {
            key: _ratio(per_arm[arm.name][key]["mean"], per_arm["outcome"][key]["mean"])
            for key, _ in SUMMARY_ROWS
        }
        pairs = [
            (seed, pair) for seed, pair in sorted(by_seed.items()) if arm.name in pair and "outcome" in pair
        ]
        paired_ratios[arm.name] = {
            key: {
                str(seed): _ratio(pair[arm.name].get(key, math.nan), pair["outcome"].get(key, math.nan))
                for seed, pair in pairs
            }
            for key, _ in SUMMARY_ROWS
        }
        differences[arm.name] = {
            key: _stats(
                [pair[arm.name].get(key, math.nan) - pair["outcome"].get(key, math.nan) for _, pair in pairs]
            )
            for key, _ in SUMMARY_ROWS
        }
    return {
        "per_arm": per_arm,
        "ratio_over_outcome": ratios,
        "paired_ratios_by_seed": paired_ratios,
        "paired_difference": differences,
        # the two-arm name kept for readers of earlier reports
        "ratio_process_over_outcome": ratios.get("process", {}),
    }


def curves(runs: list[dict[str, Any]], arm: str, key: str) -> tuple[list[int], np.ndarray]:
    """Steps and a ``[seeds, steps]`` array (NaN where a run has no value) of one metric."""
    series = [r["steps"] for r in runs if r["arm"] == arm and r.get("steps") and "error" not in r]
    if not series:
        return [], np.zeros((0, 0))
    length = max(len(s) for s in series)
    values = np.full((len(series), length), np.nan)
    for i, steps in enumerate(series):
        for j, row in enumerate(steps):
            values[i, j] = row.get(key, np.nan)
    return list(range(length)), values


def _nanmean(values: np.ndarray) -> np.ndarray:
    counts = np.sum(np.isfinite(values), axis=0)
    total = np.nansum(values, axis=0)
    return np.where(counts > 0, total / np.maximum(counts, 1), np.nan)


def rolling_mean(values: np.ndarray, window: int) -> np.ndarray:
    """Trailing mean over ``window`` points, ignoring NaN."""
    out = np.full(len(values), np.nan)
    for i in range(len(values)):
        chunk = values[max(0, i - window + 1) : i + 1]
        chunk = chunk[np.isfinite(chunk)]
        if chunk.size:
            out[i] = chunk.mean()
    return out


def plot(runs: list[dict[str, Any]], arms: list[Arm], path: Path) -> None:
    """One panel per :data:`CURVE_KEYS` entry and arm: the mean over seeds (thin), its rolling mean
    (thick), the seeds' min-max (band) and each seed (faint)."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(CURVE_KEYS), 1, figsize=(9, 2.8 * len(CURVE_KEYS)), sharex=True)
    palette = ["tab:gray", "tab:blue", "tab:green", "tab:orange", "tab:purple", "tab:red"]
    colors = {arm.name: palette[i % len(palette)] for i, arm in enumerate(arms)}
    window = 1
    try:
        for ax, key in zip(axes, CURVE_KEYS, strict=True):
            for arm in arms:
                steps, values = curves(runs, arm.name, key)
                if not steps:
                    continue
                window = max(1, min(10, len(steps) // 8))
                color = colors.get(arm.name)
                for row in values:
                    ax.plot(steps, row, color=color, alpha=0.15, linewidth=0.7)
                if np.isfinite(values).any():
                    lower = np.where(np.isfinite(values), values, np.inf).min(axis=0)
                    upper = np.where(np.isfinite(values), values, -np.inf).max(axis=0)
                    finite = np.isfinite(lower) & np.isfinite(upper)
                    ax.fill_between(
                        np.array(steps)[finite], lower[finite], upper[finite], color=color, alpha=0.1
                    )
                mean = _nanmean(values)
                ax.plot(steps, mean, color=color, linewidth=1, alpha=0.6)
                label = f"{arm.name}: {arm.short or arm.label}"
                ax.plot(steps, rolling_mean(mean, window), color=color, linewidth=2.2, label=label)
            ax.set_ylabel(key, fontsize=9)
            ax.grid(alpha=0.3)
        axes[0].legend(loc="best", fontsize=8)
        axes[-1].set_xlabel("step")
        smoothing = f"thick: rolling mean over {window} steps; " if window > 1 else ""
        fig.suptitle(
            f"{' vs '.join(a.name for a in arms if curves(runs, a.name, CURVE_KEYS[0])[0])}: "
            f"mean over seeds ({smoothing}band: min-max over seeds)",
            fontsize=10,
        )
        fig.tight_layout()
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=110)
    finally:
        plt.close(fig)


def _fmt(value: float, digits: int = 4) -> str:
    if value is None or not math.isfinite(value):
        return "n/a"
    return f"{value:.{digits}g}"


def _cell(stats: dict[str, float]) -> str:
    if stats["n"] == 0:
        return "n/a"
    if stats["n"] == 1:
        return _fmt(stats["mean"])
    return f"{_fmt(stats['mean'])} ± {_fmt(stats['ci95'], 2)}"


DIFFERENCE_ROWS = (
    "eval_success",
    "answer_match_mean",
    "success_train_last",
    "score_var",
    "outcome_var",
    "adv_token_var",
    "adv_traj_var",
    "grad_norm_mean",
    "grad_norm_var",
)
"""Summary rows also reported as paired per-seed differences (arm − outcome)."""


def markdown(results: dict[str, Any]) -> str:
    """The report: setup, the side-by-side table, paired differences, learning curves, failures."""
    ran = {r["arm"] for r in results["runs"] if "error" not in r and "summary" in r}
    idle = [a["name"] for a in results["arms"][1:] if a["name"] not in ran]
    arms = [a for a in results["arms"] if a["name"] == "outcome" or a["name"] in ran]  # arms with runs
    names = [a["name"] for a in arms]
    others = names[1:]
    agg = results["aggregate"]
    lines = [
        "# Process rewards, measured",
        "",
        f"- config: `{results['config']}`, seeds {results['seeds']}, {results['steps']} steps per run",
        *[f"- {a['name']} arm: {a['label']}" for a in arms],
        *([f"- defined but not run here: {', '.join(idle)}"] if idle else []),
        f"- runs: {results['runs_ok']} finished, {results['runs_failed']} failed",
    ]
    before = results.get("eval_before") or {}
    if "success" in before:
        lines.append(
            f"- held-out greedy success before training (the shared starting model): "
            f"{before['success'] * 100:.1f}% of {before.get('num_tasks', '?')} tasks"
        )
    lines += [
        "",
        "Mean ± 95% t-interval half-width over seeds; each per-step statistic is first averaged over",
        "the steps of a run. Ratio = arm / outcome (below 1: less than outcome only).",
        "",
        "| metric | " + " | ".join(names) + " | " + " | ".join(f"{o} / outcome" for o in others) + " |",
        "|---|" + "---|" * (len(names) + len(others)),
    ]
    for key, label in SUMMARY_ROWS:
        cells = [agg["per_arm"][n][key] for n in names]
        if all(c["n"] == 0 for c in cells):
            continue
        ratios = [agg["ratio_over_outcome"][o][key] for o in others]
        ratio_text = [f"{_fmt(r, 3)} ({(r - 1) * 100:+.0f}%)" if math.isfinite(r) else "n/a" for r in ratios]
        lines.append(
            f"| {label} | " + " | ".join(_cell(c) for c in cells) + " | " + " | ".join(ratio_text) + " |"
        )
    labels = dict(SUMMARY_ROWS)
    lines += [
        "",
        "## Paired differences (arm − outcome, same seed)",
        "",
        "Mean over seeds ± 95% t-interval half-width; an interval that contains 0 is no evidence of a",
        "difference at this number of seeds.",
        "",
        "| metric | " + " | ".join(f"{o} − outcome" for o in others) + " |",
        "|---|" + "---|" * len(others),
    ]
    for key in DIFFERENCE_ROWS:
        cells = [agg["paired_difference"][o][key] for o in others]
        if all(c["n"] == 0 for c in cells):
            continue
        lines.append(f"| {labels[key]} | " + " | ".join(_cell(c) for c in cells) + " |")
    keys = ("reward/answer_match", "success/train")
    lines += [
        "",
        "## Learning curves (mean over seeds)",
        "",
        "| step | " + " | ".join(f"{k.split('/')[-1]} {n}" for k in keys for n in names) + " |",
        "|---|" + "---|" * (len(keys) * len(names)),
    ]
    curve = results["curves"]
    for i, step in enumerate(curve["steps"]):
        cells = [_fmt(curve[n][k][i], 3) for k in keys for n in names]
        lines.append(f"| {step} | " + " | ".join(cells) + " |")
    failures = [r for r in results["runs"] if "error" in r]
    if failures:
        lines += ["", "## Failed runs", ""]
        lines += [f"- {r['arm']} seed {r['seed']}: {r['error']}" for r in failures]
    return "\n".join(lines) + "\n"


def _jsonable(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def write_reports(results: dict[str, Any], runs: list[dict[str, Any]], arms: list[Arm], out: Path) -> None:
    results["runs"] = runs
    results["runs_ok"] = sum("error" not in r for r in runs)
    results["runs_failed"] = len(runs) - results["runs_ok"]
    results["aggregate"] = aggregate(runs, arms)
    length = max((len(r.get("steps", [])) for r in runs if "error" not in r), default=0)
    results["curves"] = {"steps": list(range(length))}
    for arm in arms:
        results["curves"][arm.name] = {}
        for key in CURVE_KEYS:
            _, values = curves(runs, arm.name, key)
            mean = _nanmean(values) if values.size else np.array([])
            padded = [float(mean[i]) if i < len(mean) else math.nan for i in range(length)]
            results["curves"][arm.name][key] = padded
    (out / "results.json").write_text(json.dumps(_jsonable(results), indent=2), encoding="utf-8")
    (out / "summary.md").write_text(markdown(results), encoding="utf-8")
    try:
        plot(runs, arms, out / "curves.png")
    except Exception as exc:  # a plotting problem must not lose the figures
        print(f"could not draw curves.png: {type(exc).__name__}: {exc}", flush=True)


# --------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=(__doc__ or "").splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="See docs/process_rewards.md for what each figure means.",
    )
    parser.add_argument("overrides", nargs="*", help="KEY=VALUE config overrides for both arms")
    parser.add_argument("--config", default="demo", help="run config file or bundled name (default: demo)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="seeds (default: 0 1 2)")
    parser.add_argument("--steps", type=int, help="training steps per run (default: the config's)")
    parser.add_argument("--model", help="model.path: checkpoint directory or bundled name")
    parser.add_argument(
        "--tiny", action="store_true", help="tiny random model, small calculator settings: a smoke run"
    )
    parser.add_argument(
        "--process",
        action="append",
        metavar="SPEC",
        help="process signal(s) of the process arm (repeatable; default: tool_call)",
    )
    parser.add_argument(
        "--with-override",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="config override for the process arm only (repeatable)",
    )
    parser.add_argument(
        "--arm",
        action="append",
        default=[],
        metavar='"NAME: KEY=VALUE ..."',
        help="a further arm: the outcome arm plus these overrides (repeatable), "
        "e.g. 'gigpo: algorithm.name=gigpo'",
    )
    parser.add_argument(
        "--only-arms",
        nargs="+",
        metavar="NAME",
        help="train only these arms of each seed (the others can run in another process; see --merge)",
    )
    parser.add_argument(
        "--merge",
        nargs="+",
        metavar="DIR",
        help="write one report from the runs already in these output directories (trains nothing)",
    )
    parser.add_argument(
        "--eval",
        action="store_true",
        help="held-out greedy success before training and after each run (slow)",
    )
    parser.add_argument("--eval-tasks", type=int, help="eval.num_tasks (default: the config's)")
    parser.add_argument("--out", help="output directory (default: runs/process_rewards/<time>)")
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's own choice)")
    args = parser.parse_args(argv)
    args.process = args.process or ["tool_call"]
    for item in [*args.overrides, *args.with_override]:
        if "=" not in item:
            parser.error(f"override {item!r} is not KEY=VALUE")
    return args


def merge(dirs: Sequence[str], out: Path) -> int:
    """One report from the ``results.json`` of several output directories (same arms in each)."""
    loaded = []
    for name in dirs:
        path = Path(name) / "results.json"
        if not path.is_file():
            print(f"error: --merge {name}: no results.json there (is it an output directory of this script?)")
            return 2
        loaded.append(json.loads(path.read_text(encoding="utf-8")))

    def study(name: str, results: dict[str, Any]) -> list[Any]:
        # the arms, with this directory's own path (--tiny's model lives there) left out
        here = str(Path(name).resolve())
        return [(a["name"], [o.replace(here, "<out>") for o in a["overrides"]]) for a in results["arms"]]

    first = loaded[0]
    for name, other in zip(dirs[1:], loaded[1:], strict=True):
        if study(name, other) != study(dirs[0], first):
            print(f"error: --merge {name}: its arms differ from those of {dirs[0]}; merge like with like")
            return 2
    arms = [Arm(a["name"], a["label"], a["overrides"], a.get("short", "")) for a in first["arms"]]
    runs = [run for other in loaded for run in other["runs"]]
    results = {k: v for k, v in first.items() if k not in ("runs", "aggregate", "curves")}
    results["seeds"] = sorted({r["seed"] for r in runs})
    results["merged_from"] = [str(d) for d in dirs]
    results["eval_before"] = next((o["eval_before"] for o in loaded if o.get("eval_before")), {})
    out.mkdir(parents=True, exist_ok=True)
    write_reports(results, runs, arms, out)
    print((out / "summary.md").read_text(encoding="utf-8"))
    print(f"written: {out / 'summary.md'}, {out / 'results.json'}, {out / 'curves.png'}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    out = Path(args.out or f"runs/process_rewards/{time.strftime('%Y%m%d-%H%M%S')}")
    if args.merge:
        return merge(args.merge, out)
    if args.threads:
        torch.set_num_threads(args.threads)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # one progress line per step is ours; no bars per model load
    out.mkdir(parents=True, exist_ok=True)

    base: list[str] = []
    tiny_dir = (out / "tiny-model").resolve()
    if args.tiny:
        base += [f"model.path={tiny_dir}", *TINY_OVERRIDES]
        if args.steps is None:
            args.steps = 3
    if args.model:
        base.append(f"model.path={args.model}")
    if args.steps is not None:
        base.append(f"trainer.steps={args.steps}")
    if args.eval_tasks is not None:
        base.append(f"eval.num_tasks={args.eval_tasks}")
    base += args.overrides

    from agent_r1.config import load_config
    from agent_r1.errors import AgentR1Error

    try:
        arms = build_arms(args.config, base, args.process, args.with_override, args.arm)
    except (AgentR1Error, ValueError) as exc:  # a bad override, --process or --arm fails here,
        print(f"error: {exc}")  # before any model loads
        return 2
    if args.tiny and not (tiny_dir / "config.json").is_file():
        from agent_r1.testing.models import save_tiny_model, tiny_model, tiny_tokenizer

        tokenizer = tiny_tokenizer()
        save_tiny_model(tiny_dir, tiny_model(tokenizer, seed=0), tokenizer)
    steps = load_config(args.config, base).trainer.steps
    results: dict[str, Any] = {
        "config": args.config,
        "seeds": args.seeds,
        "steps": steps,
        "eval": args.eval,
        "threads": torch.get_num_threads(),
        "process_specs": args.process,
        "arms": [
            {"name": a.name, "label": a.label, "short": a.short, "overrides": a.overrides} for a in arms
        ],
        "eval_before": {},
    }
    # resume: the runs of the same study already finished in this output directory are kept
    done: dict[tuple[str, int], dict[str, Any]] = {}
    previous = out / "results.json"
    if previous.is_file():
        earlier = json.loads(previous.read_text(encoding="utf-8"))
        if earlier.get("arms") == results["arms"] and earlier.get("steps") == steps:
            done = {
                (r["arm"], r["seed"]): r
                for r in earlier.get("runs", [])
                if "summary" in r and "error" not in r
            }
            results["eval_before"] = earlier.get("eval_before") or {}
        else:
            print(f"error: {out} holds a different study (other arms or steps); give a new --out")
            return 2
    for arm in arms:
        print(f"{arm.name} arm: {arm.label}", flush=True)
    print(f"output: {out}", flush=True)
    if done:
        print(f"resuming: {len(done)} finished run(s) kept: {sorted(done)}", flush=True)

    selected = [a for a in arms if not args.only_arms or a.name in args.only_arms]
    unknown = sorted(set(args.only_arms or []) - {a.name for a in arms})
    if unknown:
        print(
            f"error: --only-arms {' '.join(unknown)}: no such arm (arms: {', '.join(a.name for a in arms)})"
        )
        return 2
    planned = {(a.name, seed) for seed in args.seeds for a in selected}
    # finished runs of this study that this invocation does not plan stay in the report
    runs: list[dict[str, Any]] = [r for key, r in done.items() if key not in planned]
    for seed in args.seeds:
        for arm in selected:  # paired: the arms of a seed run back to back
            if (arm.name, seed) in done:
                runs.append(done[(arm.name, seed)])
                continue
            print(f"== {arm.name} arm, seed {seed}", flush=True)
            record: dict[str, Any] = {"arm": arm.name, "seed": seed}
            runs.append(record)
            try:
                run_one(arm, seed, args, out, record, results["eval_before"])
            except KeyboardInterrupt:
                record["error"] = "interrupted"
                write_reports(results, runs, arms, out)
                raise
            except Exception as exc:
                print(traceback.format_exc(), flush=True)
                record["error"] = (f"{type(exc).__name__}: {exc}".splitlines() or ["error"])[0]
                record["traceback"] = traceback.format_exc()
            gc.collect()  # free the run's model before the next one
            write_reports(results, runs, arms, out)  # after every run: a crash later loses nothing
    write_reports(results, runs, arms, out)
    print((out / "summary.md").read_text(encoding="utf-8"))
    print(f"written: {out / 'summary.md'}, {out / 'results.json'}, {out / 'curves.png'}")
    return 0 if results["runs_ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
