"""Training-run reports: a reward-curve PNG and a self-contained HTML page.

Inputs are what a run directory holds: ``metrics.jsonl`` (one JSON object per step with ``step``
and metric keys such as ``reward/score_mean``, ``reward/<signal>``, ``batch/zero_variance_groups``,
``rollout/format_error_rate``), the before/after evaluation summaries of
:func:`agent_r1.engine.reports.evaluation.summarize_eval`, and optionally ``samples.jsonl`` with example
trajectories.

The figure is laid out to make a reward-hacking collapse visible: besides the reward curves it
shows the share of zero-variance groups (no gradient), the format-error, truncation and tool-error
rates and how often episodes ran out of turns, and the mean tool calls and turns per episode.
"""

from __future__ import annotations

import base64
import html
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from agent_r1.engine.reports.evaluation import comparison_rows
from agent_r1.errors import AgentR1Error
from agent_r1.mdp import Trajectory, load_trajectories

REWARD_MEAN_KEYS = ("reward/mean", "reward/score_mean")
"""Keys holding the mean trajectory score, in order of preference."""

_REWARD_STAT_SUFFIXES = ("mean", "std", "min", "max", "score_mean", "score_std")

HEALTH_KEYS: tuple[tuple[str, str], ...] = (
    ("batch/zero_variance_groups", "zero-variance groups"),
    ("rollout/format_error_rate", "format-error rate"),
    ("response/truncated", "truncated"),
    ("tools/error_rate", "tool-error rate"),
    ("termination/max_turns", "ran out of turns"),
)
"""Shares drawn on the second panel (the ones that move when a policy collapses)."""

BEHAVIOUR_KEYS: tuple[tuple[str, str], ...] = (
    ("tools/calls_mean", "tool calls / episode"),
    ("response/turns_mean", "turns / episode"),
)
"""Per-episode means drawn on the third panel."""

SAMPLE_FILES = ("samples.jsonl", "eval_after.jsonl")
"""Files of example trajectories the HTML report looks for in the run directory, in order."""


# --------------------------------------------------------------------------------------------
# Metrics
# --------------------------------------------------------------------------------------------


def load_metrics(path: str | Path) -> list[dict[str, Any]]:
    """Read ``metrics.jsonl``: one dict per line, sorted by ``step``.

    A missing file gives ``[]``; lines that are not JSON objects (e.g. one cut short by a kill) are
    skipped, as are lines without a numeric ``step``.
    """
    path = Path(path)
    if not path.exists():
        return []
    rows: list[dict[str, Any]] = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and isinstance(row.get("step"), int | float):
            rows.append(row)
    rows.sort(key=lambda row: row["step"])
    return rows


def _series(metrics: Sequence[Mapping[str, Any]], key: str) -> tuple[list[float], list[float]]:
    """``(steps, values)`` of the rows that hold a finite number under ``key``."""
    steps, values = [], []
    for row in metrics:
        value = row.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
            steps.append(float(row["step"]))
            values.append(float(value))
    return steps, values


def _plot_recorded(ax: Any, metrics: Sequence[Mapping[str, Any]], keys: Sequence[tuple[str, str]]) -> None:
    """One line per ``(key, label)`` of ``keys`` that the run recorded, on the axes ``ax``."""
    for key, label in keys:
        steps, values = _series(metrics, key)
        if steps:
            ax.plot(steps, values, linewidth=1.4, label=label)


def rolling_mean(values: Sequence[float], window: int) -> list[float]:
    """Trailing mean over the last ``window`` values (fewer at the start)."""
    if window < 1:
        raise ValueError(f"rolling window must be >= 1, got {window}")
    out, total = [], 0.0
    for i, value in enumerate(values):
        total += value
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def reward_mean_key(metrics: Sequence[Mapping[str, Any]]) -> str | None:
    """The key of the mean score in ``metrics`` (see :data:`REWARD_MEAN_KEYS`), or ``None``."""
    for key in REWARD_MEAN_KEYS:
        if any(key in row for row in metrics):
            return key
    return None


def signal_keys(metrics: Sequence[Mapping[str, Any]]) -> list[str]:
    """``reward/<signal>`` keys of individual signals (statistics such as ``reward/score_std`` excluded)."""
    keys: dict[str, None] = {}
    for row in metrics:
        for key in row:
            if key.startswith("reward/") and key.split("/", 1)[1] not in _REWARD_STAT_SUFFIXES:
                keys[key] = None
    return sorted(keys)


# --------------------------------------------------------------------------------------------
# Figure
# --------------------------------------------------------------------------------------------


def plot_curves(
    metrics: Sequence[Mapping[str, Any]], path_png: str | Path, *, window: int | None = None
) -> Path:
    """Draw the training curves into ``path_png`` (matplotlib, Agg backend) and return the path.

    Panel 1: mean score per step (faint) with its rolling mean over ``window`` steps (default: a
    fifth of the run, between 1 and 10 steps), the rolling mean of every ``reward/<signal>``, and
    ``success/train`` / ``eval/success`` when present.
    Panel 2: shares in [0, 1] from :data:`HEALTH_KEYS`. Panel 3: :data:`BEHAVIOUR_KEYS`.
    With no metrics at all, the figure says so instead of failing.
    """
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    path_png = Path(path_png)
    if window is None:
        window = max(1, min(10, len(metrics) // 5))
    path_png.parent.mkdir(parents=True, exist_ok=True)
    fig, (ax_reward, ax_health, ax_behaviour) = plt.subplots(
        3, 1, figsize=(9, 10), sharex=True, gridspec_kw={"height_ratios": [3, 2, 1.5]}
    )
    try:
        mean_key = reward_mean_key(metrics)
        if mean_key is not None:
            steps, values = _series(metrics, mean_key)
            ax_reward.plot(steps, values, color="tab:blue", alpha=0.3, linewidth=1, label=f"{mean_key}")
            ax_reward.plot(
                steps,
                rolling_mean(values, window),
                color="tab:blue",
                linewidth=2.2,
                label=f"rolling mean ({window})",
            )
        signals = [key for key in signal_keys(metrics) if key != mean_key]
        for color, key in enumerate(signals, start=1):  # C0 is the mean score's colour
            steps, values = _series(metrics, key)
            ax_reward.plot(
                steps, rolling_mean(values, window), color=f"C{color % 10}", linewidth=1.2, label=key
            )
        for key, style in (("success/train", "-"), ("eval/success", "o--")):
            steps, values = _series(metrics, key)
            if steps:
                ax_reward.plot(steps, values, style, color="black", linewidth=1.2, label=key)
        ax_reward.set_ylabel("reward")
        ax_reward.set_title("Rewards")

        _plot_recorded(ax_health, metrics, HEALTH_KEYS)
        ax_health.set_ylim(-0.03, 1.03)
        ax_health.set_ylabel("share")
        ax_health.set_title("Health (a collapse shows here first)")

        _plot_recorded(ax_behaviour, metrics, BEHAVIOUR_KEYS)
        ax_behaviour.set_ylabel("per episode")
        ax_behaviour.set_xlabel("step")

        if not metrics:
            ax_reward.text(
                0.5, 0.5, "no metrics recorded", ha="center", va="center", transform=ax_reward.transAxes
            )
        for ax in (ax_reward, ax_health, ax_behaviour):
            ax.grid(alpha=0.3)
            if ax.get_legend_handles_labels()[0]:
                ax.legend(loc="best", fontsize=8)
        fig.tight_layout()
        fig.savefig(path_png, dpi=100)
    finally:
        plt.close(fig)
    return path_png


# --------------------------------------------------------------------------------------------
# HTML
# --------------------------------------------------------------------------------------------

_CSS = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1100px; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: left; vertical-align: top; }
th { background: #f3f3f3; }
pre { background: #f7f7f7; padding: 0.6em; overflow-x: auto; white-space: pre-wrap; }
.warning { color: #a33; }
.trajectory { border: 1px solid #ddd; padding: 0.6em 1em; margin-bottom: 1em; }
.observation pre { background: #eef5ee; }
img { max-width: 100%; }
"""


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _html_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _eval_section(before: Mapping[str, Any] | None, after: Mapping[str, Any] | None) -> str:
    if before is None and after is None:
        return "<p>No evaluation was run.</p>"
    parts = []
    if before is not None and after is not None:
        parts.append(_html_table(["metric", "before", "after", "Δ"], comparison_rows(before, after)))
    else:
        label, summary = ("before training", before) if after is None else ("after training", after)
        assert summary is not None
        rows = comparison_rows(summary, summary)
        parts.append(_html_table(["metric", label], [[row[0], row[2]] for row in rows]))
    for label, summary in (("before", before), ("after", after)):
        for warning in (summary or {}).get("warnings") or []:
            parts.append(f'<p class="warning">{_e(label)}: {_e(warning)}</p>')
    return "\n".join(parts)


def _termination_section(
    before: Mapping[str, Any] | None, after: Mapping[str, Any] | None, metrics: Sequence[Mapping[str, Any]]
) -> str:
    parts = []
    b_term, a_term = (before or {}).get("termination") or {}, (after or {}).get("termination") or {}
    if b_term or a_term:
        reasons = list(dict.fromkeys([*a_term, *b_term]))
        parts.append("<h3>Evaluation episodes</h3>")
        parts.append(
            _html_table(
                ["reason", "before", "after"], [[r, b_term.get(r, "–"), a_term.get(r, "–")] for r in reasons]
            )
        )
    if metrics:
        last = metrics[-1]
        train = {k.split("/", 1)[1]: v for k, v in last.items() if k.startswith("termination/")}
        if train:
            parts.append(f"<h3>Training batch of the last step ({_e(last['step'])})</h3>")
            parts.append(
                _html_table(
                    ["reason", "share"], [[r, f"{100 * float(v):.1f}%"] for r, v in sorted(train.items())]
                )
            )
    return "\n".join(parts) or "<p>No termination reasons recorded.</p>"


def _last_metrics_section(metrics: Sequence[Mapping[str, Any]]) -> str:
    if not metrics:
        return "<p>No training metrics recorded.</p>"
    last = metrics[-1]
    rows = [[k, f"{v:.4g}" if isinstance(v, float) else v] for k, v in sorted(last.items())]
    return _html_table(["metric", "value"], rows)


def _trajectory_html(trajectory: Trajectory) -> str:
    rewards = (
        ", ".join(f"{name}={value:.3g}" for name, value in trajectory.reward_by_name().items()) or "none"
    )
    parts = [
        '<div class="trajectory">',
        f"<p><b>{_e(trajectory.id)}</b> · task {_e(trajectory.task_id)} · termination "
        f"{_e(trajectory.termination or 'unknown')}{' (truncated)' if trajectory.truncated else ''} · "
        f"score {trajectory.score:.3g} · rewards {_e(rewards)}</p>",
    ]
    for step in trajectory.steps:
        action = step.action
        parts.append(f"<p>turn {step.turn}: action</p><pre>{_e(action.text)}</pre>")
        if action.answer is not None:
            parts.append(f"<p>answer: <code>{_e(action.answer)}</code></p>")
        for error in action.parse_errors:
            parts.append(f'<p class="warning">parse error: {_e(error)}</p>')
        observation = step.observation
        if observation is not None:
            for result in observation.tool_results:
                status = "ok" if result.ok else f"failed ({result.error or 'error'})"
                parts.append(
                    f'<div class="observation"><p>tool {_e(result.name)}: {_e(status)}</p>'
                    f"<pre>{_e(result.content)}</pre></div>"
                )
    parts.append("</div>")
    return "\n".join(parts)


def _samples_section(run_dir: Path, max_samples: int) -> str:
    for name in SAMPLE_FILES:
        path = run_dir / name
        if not path.exists():
            continue
        try:
            trajectories = load_trajectories(path)
        except (AgentR1Error, OSError) as exc:
            return f'<p class="warning">Could not read {_e(name)}: {_e(exc)}</p>'
        shown = trajectories[:max_samples]
        header = f"<p>{len(shown)} of {len(trajectories)} trajectories from <code>{_e(name)}</code>.</p>"
        return header + "\n".join(_trajectory_html(t) for t in shown)
    return "<p>No example trajectories (samples.jsonl) in the run directory.</p>"


def _figure_section(png: str | Path | None) -> str:
    if png is None or not Path(png).is_file():
        return "<p>No figure was drawn.</p>"
    data = base64.b64encode(Path(png).read_bytes()).decode("ascii")
    return f'<img alt="training curves" src="data:image/png;base64,{data}">'


def write_html_report(
    run_dir: str | Path,
    config_dict: Mapping[str, Any],
    metrics: Sequence[Mapping[str, Any]],
    before: Mapping[str, Any] | None,
    after: Mapping[str, Any] | None,
    png: str | Path | None,
    *,
    max_samples: int = 3,
) -> Path:
    """Write ``<run_dir>/report.html`` and return its path.

    The page is self-contained (inline CSS, the PNG embedded as base64) and every piece of text
    from the run is HTML-escaped. Sections: training curves, evaluation before/after (overall, pass@k,
    per category, behaviour), termination reasons, the last step's metrics, up to ``max_samples``
    example trajectories from ``samples.jsonl`` (else ``eval_after.jsonl``), and the resolved config.
    """
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    steps = f"{len(metrics)} training steps logged" if metrics else "no training steps logged"
    body = [
        f"<h1>agent-r1 run report: {_e(run_dir.name)}</h1>",
        f"<p>{_e(steps)}.</p>",
        "<h2>Training curves</h2>",
        _figure_section(png),
        "<h2>Evaluation</h2>",
        _eval_section(before, after),
        "<h2>Termination reasons</h2>",
        _termination_section(before, after, metrics),
        "<h2>Last training step</h2>",
        _last_metrics_section(metrics),
        "<h2>Example trajectories</h2>",
        _samples_section(run_dir, max_samples),
        "<h2>Configuration</h2>",
        f"<pre>{_e(json.dumps(config_dict, indent=2, default=str, sort_keys=True))}</pre>",
    ]
    page = (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>agent-r1 report: {_e(run_dir.name)}</title>\n<style>{_CSS}</style>\n</head>\n<body>\n"
        + "\n".join(body)
        + "\n</body>\n</html>\n"
    )
    out = run_dir / "report.html"
    out.write_text(page, encoding="utf-8")
    return out


__all__ = [
    "BEHAVIOUR_KEYS",
    "HEALTH_KEYS",
    "REWARD_MEAN_KEYS",
    "SAMPLE_FILES",
    "load_metrics",
    "plot_curves",
    "reward_mean_key",
    "rolling_mean",
    "signal_keys",
    "write_html_report",
]
