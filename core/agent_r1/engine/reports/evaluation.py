"""Evaluation summaries and reports (``agent-r1 eval``, before/after training).

:func:`summarize_eval` turns scored trajectories into a JSON-ready summary; :func:`eval_markdown`
renders one summary, :func:`compare_markdown` two of them side by side, and
:func:`write_eval_report` writes ``eval.json`` and ``eval.md``. No torch is needed here.

Success of a trajectory means: its ``success_signal`` reward (the unweighted sum of the signals of
that name, normally the one ``answer_match`` signal) is at least ``success_threshold``. A
trajectory without that signal counts as a failure, and the summary's ``warnings`` say so.

pass@k uses the unbiased estimator of Chen et al. 2021 ("Evaluating Large Language Models Trained on
Code", section 2.1): with ``n`` samples of a task of which ``c`` succeed,
``pass@k = 1 - C(n - c, k) / C(n, k)``, averaged over tasks; only tasks with ``n >= k`` count.
With ``eval.samples = K`` at a temperature above 0, ``pass@K`` is the oracle best-of-K: a task
counts when any of its K sampled episodes succeeds, as if a verifier knew the ground truth.

:func:`decoding_summary` records how the actions were chosen (``eval.decoding``) and what that
cost: generated tokens per episode (discarded candidates included), critic tokens, wall time.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent_r1.engine.reports.stats import SUCCESS_EPS as _SUCCESS_EPS
from agent_r1.engine.reports.stats import format_errors as _format_errors
from agent_r1.engine.reports.stats import termination as _termination
from agent_r1.engine.reports.stats import tool_calls as _tool_calls
from agent_r1.engine.reports.stats import tool_results as _tool_results
from agent_r1.engine.reports.stats import turns as _turns
from agent_r1.mdp import Task, Trajectory

UNCATEGORIZED = "uncategorized"
"""Category name of tasks whose ``category`` is ``None``."""


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one task: ``1 - C(n-c, k) / C(n, k)`` (Chen et al. 2021).

    Computed as ``1 - prod_{i=n-c+1}^{n} (1 - k / i)``, the numerically stable form of the paper's
    reference code. Requires ``0 <= c <= n`` and ``1 <= k <= n``.
    """
    if not 0 <= c <= n:
        raise ValueError(f"pass_at_k needs 0 <= c <= n, got n={n}, c={c}")
    if not 1 <= k <= n:
        raise ValueError(f"pass_at_k needs 1 <= k <= n, got n={n}, k={k}")
    if n - c < k:
        return 1.0
    product = 1.0
    for i in range(n - c + 1, n + 1):
        product *= 1.0 - k / i
    return 1.0 - product


def _pass_at_ks(counts: Iterable[tuple[int, int]], ks: Sequence[int]) -> dict[str, float]:
    counts = list(counts)
    out: dict[str, float] = {}
    for k in ks:
        eligible = [(n, c) for n, c in counts if n >= k]
        if eligible:
            out[f"pass@{k}"] = sum(pass_at_k(n, c, k) for n, c in eligible) / len(eligible)
    return out


def _mean(values: Sequence[float]) -> float:
    return float(sum(values) / len(values)) if values else 0.0


def dataset_of(category: str) -> str:
    """The dataset of a ``<dataset>/<type>`` category (``hotpotqa/bridge`` → ``hotpotqa``); a
    category without ``/`` is its own dataset."""
    return category.split("/", 1)[0]


def summarize_eval(
    trajectories: Sequence[Trajectory],
    tasks_by_id: Mapping[str, Task],
    *,
    success_signal: str = "answer_match",
    success_threshold: float = 1.0,
    ks: Sequence[int] = (1,),
) -> dict[str, Any]:
    """Summarise scored evaluation trajectories into a JSON-ready dict.

    Keys (rates are shares in [0, 1], means are per trajectory):

    * ``num_trajectories``, ``num_tasks``, ``samples_per_task`` (``{"min", "max"}``),
      ``success_signal``, ``success_threshold``;
    * ``success`` (share of trajectories that succeed), ``successes`` (their count);
    * ``pass_at_k``: ``{"pass@k": value}`` for each ``k`` in ``ks`` that at least one task has
      ``n >= k`` samples for (tasks with fewer samples are left out of that k);
    * ``categories``: per ``task.category`` (``"uncategorized"`` when ``None``):
      ``{"trajectories", "tasks", "successes", "success", "pass_at_k", "rewards", "turns_mean",
      "tool_calls_mean"}``, where ``rewards`` holds the mean of every signal of the evaluation (as
      in the overall ``rewards``: a trajectory without the signal counts 0), so e.g.
      ``categories["hotpotqa/bridge"]["rewards"]["qa_em"]`` is that category's exact match;
    * ``datasets``: when some category reads ``<dataset>/<type>`` (``hotpotqa/bridge``), the same
      statistics per dataset (the part before the first ``/``; a category without ``/`` is its own
      dataset), each with ``categories`` listing its categories; empty otherwise;
    * ``rewards``: mean per trajectory of each signal's unweighted per-episode sum, by signal name
      (a trajectory without the signal counts 0); ``score_mean``: mean weighted score;
    * ``tool_use_rate`` (share with at least one tool call that ran), ``tool_calls_mean``,
      ``tool_error_rate`` (failed tool results / tool calls), ``format_error_rate`` (share with at
      least one parse error), ``format_errors_mean``, ``turns_mean``, ``termination`` (reason →
      count), ``truncation_rate``, ``response_length_mean`` (policy tokens);
    * ``warnings``: problems worth a look (missing success signal, tasks with too few samples).

    Raises ``KeyError`` naming the task id when a trajectory's task is not in ``tasks_by_id``.
    """
    if any(k < 1 for k in ks):
        raise ValueError(f"every k of pass@k must be >= 1, got {list(ks)}")
    rows = _EvalRows.of(trajectories, tasks_by_id, success_signal, success_threshold)
    warnings: list[str] = []
    if rows.missing_signal:
        warnings.append(
            f"{rows.missing_signal} of {len(trajectories)} trajectories have no {success_signal!r} reward "
            "signal and count as failures; add a reward shaper that emits it (e.g. answer_match) or set "
            "eval.success_signal"
        )
    sample_counts = [n for n, _ in rows.counts.values()]
    for k in ks:
        short = sum(n < k for n in sample_counts)
        if short:
            warnings.append(f"pass@{k}: {short} task(s) have fewer than {k} samples and are left out")
    categories, datasets = rows.breakdowns(tasks_by_id, ks)
    tool_calls, turns, successes = rows.tool_calls, rows.turns, rows.successes
    results = [_tool_results(t) for t in trajectories]
    format_errors = [_format_errors(t) for t in trajectories]
    failed_results = sum(failed for _, failed in results)
    tool_denominator = max(sum(tool_calls), sum(n for n, _ in results))
    return {
        "num_trajectories": len(trajectories),
        "num_tasks": len(rows.per_task),
        "samples_per_task": {"min": min(sample_counts, default=0), "max": max(sample_counts, default=0)},
        "success_signal": success_signal,
        "success_threshold": success_threshold,
        "success": _mean([float(ok) for ok in successes]),
        "successes": sum(successes),
        "pass_at_k": _pass_at_ks(rows.counts.values(), ks),
        "categories": categories,
        "datasets": datasets,
        "rewards": {name: _mean([r.get(name, 0.0) for r in rows.rewards_of]) for name in rows.signals},
        "score_mean": _mean([t.score for t in trajectories]),
        "tool_use_rate": _mean([float(n > 0) for n in tool_calls]),
        "tool_calls_mean": _mean([float(n) for n in tool_calls]),
        "tool_error_rate": failed_results / tool_denominator if tool_denominator else 0.0,
        "format_error_rate": _mean([float(n > 0) for n in format_errors]),
        "format_errors_mean": _mean([float(n) for n in format_errors]),
        "turns_mean": _mean([float(n) for n in turns]),
        "termination": dict(Counter(_termination(t) for t in trajectories).most_common()),
        "truncation_rate": _mean([float(t.truncated) for t in trajectories]),
        "response_length_mean": _mean([float(t.num_policy_tokens) for t in trajectories]),
        "warnings": warnings,
    }


def decoding_summary(
    trajectories: Sequence[Trajectory], decoding: Mapping[str, Any], *, temperature: float, wall_s: float
) -> dict[str, Any]:
    """How an evaluation chose its actions and what that cost, per episode.

    Keys: ``kind``, ``candidates`` (K; 1 under plain sampling), ``temperature``, ``verifier``
    (best_of_k), ``episodes``; means per episode of ``generated_tokens`` (every sampled token,
    discarded candidates included; under plain sampling the policy tokens), ``kept_tokens`` (the
    policy tokens the trajectories keep), ``scored_tokens`` (tokens the critic read), ``turns``;
    ``picked_other_rate`` (share of turns whose kept action was not the first candidate, i.e. not
    what plain sampling would have drawn); ``wall_s`` (the rollout's wall time) and
    ``wall_s_per_episode``."""
    n = max(len(trajectories), 1)
    decoded = [t for t in trajectories if "decoding_candidates" in t.metrics]
    turns = sum(_turns(t) for t in trajectories)

    def mean(name: str, fallback: str | None = None) -> float:
        return sum(t.metrics.get(name, t.metrics.get(fallback or name, 0.0)) for t in trajectories) / n

    kind = str(decoding.get("kind", "sample"))
    summary: dict[str, Any] = {
        "kind": kind,
        "candidates": int(decoding.get("candidates", 1)) if decoded else 1,
        "temperature": temperature,
        "episodes": len(trajectories),
        "generated_tokens_mean": mean("decoding_generated_tokens", "policy_tokens"),
        "kept_tokens_mean": mean("policy_tokens"),
        "scored_tokens_mean": mean("decoding_scored_tokens"),
        "turns_mean": turns / n,
        "picked_other_rate": (
            sum(t.metrics.get("decoding_picked_other", 0.0) for t in decoded) / max(turns, 1)
        ),
        "wall_s": wall_s,
        "wall_s_per_episode": wall_s / n,
    }
    if kind == "best_of_k":
        summary["verifier"] = decoding.get("verifier")
    return summary


@dataclass
class _EvalRows:
    """Per-trajectory figures of an evaluation, indexed by row, and the rows of each task."""

    successes: list[bool]
    rewards_of: list[dict[str, float]]
    turns: list[int]
    tool_calls: list[int]
    per_task: dict[str, list[bool]]
    rows_of_task: dict[str, list[int]]
    signals: list[str]
    missing_signal: int

    @classmethod
    def of(
        cls,
        trajectories: Sequence[Trajectory],
        tasks_by_id: Mapping[str, Task],
        signal: str,
        threshold: float,
    ) -> _EvalRows:
        per_task: dict[str, list[bool]] = defaultdict(list)
        rows_of_task: dict[str, list[int]] = defaultdict(list)
        rewards_of, successes = [], []
        for row, trajectory in enumerate(trajectories):
            if trajectory.task_id not in tasks_by_id:
                raise KeyError(
                    f"trajectory {trajectory.id!r} belongs to task {trajectory.task_id!r}, which is not "
                    f"among the {len(tasks_by_id)} evaluation tasks passed to summarize_eval"
                )
            by_name = trajectory.reward_by_name()
            rewards_of.append(by_name)
            ok = by_name.get(signal, 0.0) >= threshold - _SUCCESS_EPS
            successes.append(ok)
            per_task[trajectory.task_id].append(ok)
            rows_of_task[trajectory.task_id].append(row)
        return cls(
            successes=successes,
            rewards_of=rewards_of,
            turns=[_turns(t) for t in trajectories],
            tool_calls=[_tool_calls(t) for t in trajectories],
            per_task=per_task,
            rows_of_task=rows_of_task,
            signals=sorted({name for by_name in rewards_of for name in by_name}),
            missing_signal=sum(signal not in by_name for by_name in rewards_of),
        )

    @property
    def counts(self) -> dict[str, tuple[int, int]]:
        """Task id -> (samples, successes)."""
        return {task_id: (len(oks), sum(oks)) for task_id, oks in self.per_task.items()}

    def group(self, task_ids: Sequence[str], ks: Sequence[int]) -> dict[str, Any]:
        """The statistics of a set of tasks (a category or a dataset)."""
        oks = [ok for task_id in task_ids for ok in self.per_task[task_id]]
        rows = [row for task_id in task_ids for row in self.rows_of_task[task_id]]
        counts = self.counts
        return {
            "trajectories": len(oks),
            "tasks": len(task_ids),
            "successes": sum(oks),
            "success": _mean([float(ok) for ok in oks]),
            "pass_at_k": _pass_at_ks((counts[t] for t in task_ids), ks),
            "rewards": {
                name: _mean([self.rewards_of[r].get(name, 0.0) for r in rows]) for name in self.signals
            },
            "turns_mean": _mean([float(self.turns[r]) for r in rows]),
            "tool_calls_mean": _mean([float(self.tool_calls[r]) for r in rows]),
        }

    def breakdowns(
        self, tasks_by_id: Mapping[str, Task], ks: Sequence[int]
    ) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
        """Statistics per category, and per dataset when categories read ``<dataset>/<type>`` or
        tasks name their dataset (``task.metadata["dataset"]``)."""
        by_category: dict[str, list[str]] = defaultdict(list)
        for task_id in self.per_task:
            by_category[tasks_by_id[task_id].category or UNCATEGORIZED].append(task_id)
        categories = {category: self.group(by_category[category], ks) for category in sorted(by_category)}
        datasets: dict[str, dict[str, Any]] = {}
        named = {task_id: tasks_by_id[task_id].metadata.get("dataset") for task_id in self.per_task}
        if not any("/" in category for category in by_category) and any(named.values()):
            by_name: dict[str, list[str]] = defaultdict(list)
            for task_id, name in named.items():
                by_name[str(name or UNCATEGORIZED)].append(task_id)
            for name, task_ids in sorted(by_name.items()):
                members = sorted({tasks_by_id[t].category or UNCATEGORIZED for t in task_ids})
                datasets[name] = {**self.group(task_ids, ks), "categories": members}
        elif any("/" in category for category in by_category):
            by_dataset: dict[str, list[str]] = defaultdict(list)
            for category in sorted(by_category):
                by_dataset[dataset_of(category)].append(category)
            for name, members in sorted(by_dataset.items()):
                task_ids = [task_id for category in members for task_id in by_category[category]]
                datasets[name] = {**self.group(task_ids, ks), "categories": members}
        return categories, datasets


# --------------------------------------------------------------------------------------------
# Markdown
# --------------------------------------------------------------------------------------------


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{100.0 * value:.1f}%"


def _num(value: float | None, digits: int = 2) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def _pp(before: float | None, after: float | None) -> str:
    if before is None or after is None:
        return "–"
    return f"{100.0 * (after - before):+.1f} pp"


def _diff(before: float | None, after: float | None, digits: int = 2) -> str:
    if before is None or after is None:
        return "–"
    return f"{after - before:+.{digits}f}"


def _table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    def cell(text: str) -> str:
        return str(text).replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(cell(h) for h in header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return lines


RATE_METRICS: tuple[tuple[str, str], ...] = (
    ("tool_use_rate", "tool-use rate"),
    ("tool_error_rate", "tool error rate"),
    ("format_error_rate", "format error rate"),
    ("truncation_rate", "truncation rate"),
)
"""Summary keys that are shares, shown in percent (deltas in percentage points)."""

MEAN_METRICS: tuple[tuple[str, str], ...] = (
    ("tool_calls_mean", "tool calls per episode"),
    ("turns_mean", "turns per episode"),
    ("response_length_mean", "response length (policy tokens)"),
    ("score_mean", "score (weighted reward sum)"),
)
"""Summary keys that are means, shown as numbers."""


def _group_table(label: str, groups: Mapping[str, Mapping[str, Any]], signals: Sequence[str]) -> list[str]:
    """One row per category or dataset: counts, success, the mean of every reward signal (e.g. EM
    and F1), turns and tool calls per episode (searches per question, with the search tool)."""
    header = [label, "tasks", "trajectories", "success", *signals, "turns / episode", "tool calls / episode"]
    rows = []
    for name, g in groups.items():
        rewards = g.get("rewards") or {}
        rows.append(
            [
                name,
                str(g.get("tasks", 0)),
                str(g.get("trajectories", 0)),
                _pct(g.get("success")),
                *[_num(rewards.get(signal), 3) for signal in signals],
                _num(g.get("turns_mean")),
                _num(g.get("tool_calls_mean")),
            ]
        )
    return _table(header, rows)


def eval_markdown(summary: Mapping[str, Any], *, title: str = "Evaluation") -> str:
    """A Markdown report of one :func:`summarize_eval` summary: overall success and pass@k; tables
    by dataset (when the summary has ``datasets``) and by category with success, the mean of every
    reward signal (EM and F1 with the search plugin), turns and tool calls per episode; then the
    rewards, behaviour, termination reasons and warnings."""
    lines = [f"# {title}", ""]
    signal = summary.get("success_signal", "answer_match")
    threshold = summary.get("success_threshold", 1.0)
    lines.append(
        f"**Success ({signal} ≥ {threshold:g}): "
        f"{_pct(summary.get('success'))}** — {summary.get('successes', 0)} of "
        f"{summary.get('num_trajectories', 0)} trajectories, {summary.get('num_tasks', 0)} tasks."
    )
    normalization = summary.get("answer_normalization") or {}
    if normalization:
        shown = ", ".join(f"{name}: {mode}" for name, mode in sorted(normalization.items()))
        lines.append(f"Answers normalised as: {shown} (`official`: the HotpotQA / SQuAD scripts' rules).")
    lines.append("")
    pass_k = summary.get("pass_at_k") or {}
    if pass_k:
        lines += _table(list(pass_k), [[_pct(v) for v in pass_k.values()]])
        lines.append("")
    signals = list(summary.get("rewards") or {})
    datasets = summary.get("datasets") or {}
    if datasets:
        lines += ["## By dataset", ""]
        lines += _group_table("dataset", datasets, signals)
        lines.append("")
    categories = summary.get("categories") or {}
    if categories:
        lines += ["## By category", ""]
        lines += _group_table("category", categories, signals)
        lines.append("")
    rewards = summary.get("rewards") or {}
    if rewards:
        lines += ["## Rewards (mean per episode)", ""]
        lines += _table(["signal", "mean"], [[name, _num(value, 3)] for name, value in rewards.items()])
        lines.append("")
    lines += ["## Behaviour", ""]
    rows = [[label, _pct(summary.get(key))] for key, label in RATE_METRICS]
    rows += [[label, _num(summary.get(key))] for key, label in MEAN_METRICS]
    lines += _table(["metric", "value"], rows)
    lines.append("")
    termination = summary.get("termination") or {}
    if termination:
        lines += ["## Termination", ""]
        lines += _table(["reason", "count"], [[reason, str(count)] for reason, count in termination.items()])
        lines.append("")
    decoding = summary.get("decoding") or {}
    if decoding:
        lines += ["## Decoding", ""]
        how = f"{decoding.get('kind')}, K = {decoding.get('candidates')}"
        if decoding.get("verifier"):
            how += f", verifier {decoding['verifier']}"
        rows = [
            ["decoding", f"{how}, temperature {decoding.get('temperature', 0.0):g}"],
            [
                "generated tokens / episode (discarded candidates included)",
                _num(decoding.get("generated_tokens_mean"), 1),
            ],
            ["kept tokens / episode", _num(decoding.get("kept_tokens_mean"), 1)],
            ["critic tokens / episode", _num(decoding.get("scored_tokens_mean"), 1)],
            ["turns picking another candidate than the first", _pct(decoding.get("picked_other_rate"))],
            ["wall time / episode (s)", _num(decoding.get("wall_s_per_episode"), 3)],
        ]
        lines += _table(["metric", "value"], rows)
        lines.append("")
    warnings = summary.get("warnings") or []
    if warnings:
        lines += ["## Warnings", ""]
        lines += [f"- {warning}" for warning in warnings]
        lines.append("")
    return "\n".join(lines)


def comparison_rows(before: Mapping[str, Any], after: Mapping[str, Any]) -> list[list[str]]:
    """Rows ``[metric, before, after, delta]`` of :func:`compare_markdown` (also used by the HTML
    report): overall success, pass@k, success per category (with task counts), then behaviour."""
    rows: list[list[str]] = [
        [
            "success (overall)",
            _pct(before.get("success")),
            _pct(after.get("success")),
            _pp(before.get("success"), after.get("success")),
        ]
    ]
    before_k, after_k = before.get("pass_at_k") or {}, after.get("pass_at_k") or {}
    for key in sorted(set(before_k) | set(after_k), key=lambda k: int(str(k).split("@")[-1])):
        rows.append(
            [key, _pct(before_k.get(key)), _pct(after_k.get(key)), _pp(before_k.get(key), after_k.get(key))]
        )
    before_c, after_c = before.get("categories") or {}, after.get("categories") or {}
    for name in sorted(set(before_c) | set(after_c)):
        b, a = before_c.get(name, {}), after_c.get(name, {})
        tasks = a.get("tasks", b.get("tasks", 0))
        rows.append(
            [
                f"success: {name} (n={tasks})",
                _pct(b.get("success")),
                _pct(a.get("success")),
                _pp(b.get("success"), a.get("success")),
            ]
        )
    for key, label in RATE_METRICS:
        rows.append(
            [label, _pct(before.get(key)), _pct(after.get(key)), _pp(before.get(key), after.get(key))]
        )
    for key, label in MEAN_METRICS:
        rows.append(
            [label, _num(before.get(key)), _num(after.get(key)), _diff(before.get(key), after.get(key))]
        )
    return rows


def compare_markdown(before: Mapping[str, Any], after: Mapping[str, Any]) -> str:
    """A side-by-side Markdown table of two summaries (before / after training).

    Rows: overall success, pass@k, success per category with its task count, then tool use, error
    and truncation rates (deltas in percentage points) and per-episode means (plain deltas).
    """
    lines = [
        "# Evaluation before and after training",
        "",
        f"{after.get('num_tasks', 0)} tasks, {after.get('num_trajectories', 0)} trajectories; success = "
        f"{after.get('success_signal', 'answer_match')} ≥ {after.get('success_threshold', 1.0):g}.",
        "",
    ]
    lines += _table(["metric", "before", "after", "Δ"], comparison_rows(before, after))
    lines.append("")
    return "\n".join(lines)


def write_eval_report(summary: Mapping[str, Any], out_dir: str | Path) -> tuple[Path, Path]:
    """Write ``eval.json`` (the summary) and ``eval.md`` (:func:`eval_markdown`) into ``out_dir``
    (created if needed); return both paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    json_path, md_path = out / "eval.json", out / "eval.md"
    json_path.write_text(json.dumps(summary, indent=2, default=str), encoding="utf-8")
    md_path.write_text(eval_markdown(summary), encoding="utf-8")
    return json_path, md_path


__all__ = [
    "MEAN_METRICS",
    "RATE_METRICS",
    "UNCATEGORIZED",
    "compare_markdown",
    "comparison_rows",
    "dataset_of",
    "decoding_summary",
    "eval_markdown",
    "pass_at_k",
    "summarize_eval",
    "write_eval_report",
]
