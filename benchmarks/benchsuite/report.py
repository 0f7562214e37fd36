"""``bench.md``: every section's tables, with the setup they ran under."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from benchsuite.stats import num


def _fmt(value: Any, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "n/a"
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    return str(value)


def _row(*cells: Any) -> str:
    """A Markdown table row."""
    return "| " + " | ".join(str(cell) for cell in cells) + " |"


def _header(*names: str) -> list[str]:
    """A Markdown table header and its rule."""
    return [_row(*names), _row(*(["---"] * len(names)))]


def markdown(results: dict[str, Any]) -> str:
    """``bench.md``: every section's tables, with the setup they ran under."""
    m = results["machine"]
    runs = results.get("history") or [run_entry(results)]
    lines = [
        "# agent-r1 benchmarks",
        "",
        *[f"- `{run['command']}`: {run['date']}, {num(run['wall_s']) / 60:.1f} min" for run in runs],
        f"- machine: {m.get('cpu', '?')}, {m.get('nproc', '?')} cores (`nproc`), "
        + f"{m.get('memory_gib', '?')} GiB memory, GPU: {m.get('gpu', '?')}",
        f"- torch threads per run: {results['threads']}",
        f"- this interpreter: {_versions_text(results['versions'])}",
    ]
    if "trl" in results:
        lines += _trl_markdown(results["trl"])
    if "tools" in results:
        lines += _tools_markdown(results["tools"])
    if "scaling" in results:
        lines += _scaling_markdown(results["scaling"])
    if results.get("overhead"):
        lines += _overhead_markdown(results["overhead"])
    failures = results.get("failures", [])
    if failures:
        lines += ["", "## Failures", "", *[f"- {f}" for f in failures]]
    if results.get("notes"):
        lines += ["", "## Notes", "", *[f"- {n}" for n in results["notes"]]]
    return "\n".join(lines) + "\n"


def _overhead_markdown(rows: Sequence[dict[str, Any]]) -> list[str]:
    lines = [
        "",
        "## Step time outside model compute and tool waiting (agent-r1 runs)",
        "",
        "`other` is the engine's `time/other_s` (step time not in rollout, no-grad passes, advantages,",
        "forward/backward or optimizer); `outside compute+tools` is step time minus generation, no-grad",
        "passes, forward/backward, optimizer and the rollout's environment time (so it holds rewards,",
        "advantages, collation, rendering and the Python around them). Mean over the steps after the",
        "first.",
        "",
        *_header("run", "s/step", "other", "outside compute+tools", "rewards", "advantages"),
    ]
    for row in rows:
        lines.append(
            _row(
                row["run"],
                _fmt(row["step_s"]),
                _pct(row["other_share"]),
                _pct(row["overhead_share"]),
                _pct(row["rewards_share"]),
                _pct(row["advantages_share"]),
            )
        )
    worst = max(rows, key=lambda r: r["overhead_share"] if math.isfinite(num(r["overhead_share"])) else -1)
    share = _pct(worst["overhead_share"])
    return [*lines, "", f"Largest share outside compute+tools: {share} ({worst['run']}); target <= 5%."]


def _pct(value: float) -> str:
    return f"{100 * value:.1f}%" if value is not None and math.isfinite(value) else "n/a"


def _versions_text(versions: dict[str, str]) -> str:
    return ", ".join(f"{k} {v}" for k, v in versions.items())


TRL_COLUMNS = (
    "case",
    "model",
    "T x G",
    "steps x repeats",
    "new tokens (per action / all turns)",
    "arm",
    "steps/s",
    "trajectories/s",
    "generated tokens/s",
    "s/step",
    "generation s/step",
    "tool wall s/step",
    "peak RSS MiB",
    "reward (mean over steps)",
    "tool calls / trajectory",
    "zero-variance groups",
)


def _trl_markdown(section: dict[str, Any]) -> list[str]:
    lines = ["", "## Side by side with TRL", ""]
    if section.get("skipped"):
        return [*lines, f"Skipped: {section['skipped']}"]
    versions: dict[str, str] = next(
        (r["versions"] for c in section["cases"] for r in c["runs"] if "versions" in r), {}
    )
    lines += [
        f"Both arms run with `{section['python']}` ({_versions_text(versions)}), each in a subprocess of",
        "its own, alternating (agent-r1 first in even repeats, TRL first in odd ones). Speed is over the",
        "steps after the first (warm-up); `peak RSS` is the arm process's high-water mark (model,",
        "optimizer, libraries). Ratios are agent-r1 / TRL (above 1: agent-r1 faster, except for s/step,",
        "generation and tool time and memory, where below 1 is better).",
        "",
        *_header(*TRL_COLUMNS),
    ]
    for case in section["cases"]:
        summary = case["summary"]
        setup = (
            case["case"],
            case["model_label"],
            f"{case['tasks_per_step']} x {case['group_size']}",
            f"{case['steps']} x {case['repeats']}",
            f"{case['max_new_tokens']} / {case['max_completion']}",
        )
        for arm in ("agent-r1", "trl"):
            s = summary["per_arm"][arm]
            if not s.get("runs"):
                lines.append(_row(*setup, arm, "failed", *([""] * (len(TRL_COLUMNS) - 7))))
                continue
            figures = [_fmt(s[k]) for k in ("steps_per_s", "trajectories_per_s", "tokens_per_s", "step_s")]
            figures += [_fmt(s["generation_s"]), _fmt(s["tool_wall_s"]), _fmt(s["peak_rss_mib"], 4)]
            figures += [_fmt(s["reward_mean"]), _fmt(s["tool_calls_per_trajectory"])]
            lines.append(_row(*setup, arm, *figures, _pct(s["zero_variance_groups"])))
        r = summary["ratio_agent_r1_over_trl"]
        ratios = [f"**{_fmt(r['steps_per_s'])}**"]
        ratios += [_fmt(r[k]) for k in ("trajectories_per_s", "tokens_per_s", "step_s", "generation_s")]
        ratios += [_fmt(r["tool_wall_s"]), _fmt(r["peak_rss_mib"])]
        lines.append(_row(case["case"], "", "", "", "", "**ratio**", *ratios, "", "", ""))
    lines += ["", "Reward per step (mean over repeats), agent-r1 / TRL:", ""]
    for case in section["cases"]:
        curves = case["summary"]["reward_curves"]
        pairs = [
            f"{_fmt(a, 2)} / {_fmt(b, 2)}"
            for a, b in zip(curves.get("agent-r1", []), curves.get("trl", []), strict=False)
        ]
        lines.append(f"- {case['case']}: " + ", ".join(pairs))
    failed = [r for c in section["cases"] for r in c["runs"] if "error" in r]
    if failed:
        lines += ["", "Failed arm runs:", ""]
        lines += [f"- {r['error']}: {' / '.join(r.get('log_tail', [])[-3:])}" for r in failed]
    return lines


def _tools_markdown(section: dict[str, Any]) -> list[str]:
    lines = [
        "",
        "## Tool concurrency",
        "",
        "A scripted policy calls the tool in every action; `ToolEnv` (hermes format) runs it; each episode",
        "takes 3 turns, so it waits for 3 calls. `env s` is the engine's `rollout/env_s` (wall time of the",
        "environment steps, all turns; median over repeats), `calls' union` the time at least one call was",
        "running. Target: at most 1.5 x one call per turn. Synchronous tools run in a pool of",
        f"{section['thread_pool_workers']} worker threads.",
        "",
        *_header(
            "tool",
            "trajectories",
            "calls",
            "latency",
            "env s",
            "calls' union s",
            "one call per turn s",
            "target s",
            "serial s",
            "meets target",
        ),
    ]
    for row in section["rows"]:
        lines.append(
            _row(
                row["tool"],
                row["trajectories"],
                f"{row['calls']:.0f}",
                f"{row['latency_s'] * 1000:.0f} ms",
                _fmt(row["env_s"]),
                _fmt(row["tool_wall_s"]),
                _fmt(row["ideal_s"]),
                _fmt(row["target_s"]),
                _fmt(row["serial_s"]),
                "yes" if row["meets_target"] else "no",
            )
        )
    return lines


SCALING_COLUMNS = (
    "axis",
    "value",
    "trajectories",
    "context tokens",
    "s/step",
    "x base",
    "work x",
    "generation",
    "tools",
    "fwd+bwd",
    "optimizer",
    "outside compute+tools",
)


def _scaling_markdown(section: dict[str, Any]) -> list[str]:
    lines = ["", "## Scaling", ""]
    for model in section["models"].values():
        base = model["base"]
        lines += [
            f"### {model['label']}",
            "",
            f"Base point: {base['tasks_per_step']} tasks x group {base['group_size']}, "
            f"{base['max_turns']} turn,",
            f"{model['max_new_tokens']} new tokens per action; one axis changes at a time. Median of steps",
            f"2..{model['steps']}. `x base` is the step time over that of the axis's base value (measured in",
            "the same sweep); `work x` how many more tokens the point's trajectories hold in all",
            "(trajectories x mean length). Times in seconds per step.",
            "",
            *_header(*SCALING_COLUMNS),
        ]
        for point in model["points"]:
            if "error" in point:
                lines.append(_row(point["axis"], point["value"], f"failed: {point['error']}"))
                continue
            base_point = next(
                (
                    p
                    for p in model["points"]
                    if "error" not in p and p["axis"] == point["axis"] and p["setting"] == base
                ),
                None,
            )
            ratio = point["wall_s"] / base_point["wall_s"] if base_point else math.nan
            work = _work(point) / _work(base_point) if base_point else math.nan
            times = [
                point[k] for k in ("generation_s", "env_s", "forward_backward_s", "optimizer_s", "overhead_s")
            ]
            lines.append(
                _row(
                    point["axis"],
                    point["value"],
                    f"{point['trajectories']:.0f}",
                    f"{point['context_tokens_mean']:.0f}",
                    _fmt(point["wall_s"]),
                    _fmt(ratio),
                    _fmt(work),
                    *(_fmt(t) for t in times),
                )
            )
        lines.append("")
    return lines


def _work(point: dict[str, Any]) -> float:
    """Trajectories x their mean length in tokens: the token work of a point."""
    return point["trajectories"] * max(point["context_tokens_mean"], 1.0)


def run_entry(results: dict[str, Any]) -> dict[str, Any]:
    return {key: results.get(key) for key in ("command", "date", "wall_s", "sections")}
