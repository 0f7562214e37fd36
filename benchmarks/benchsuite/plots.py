"""The PNGs of the report: reward curves and speed of the TRL comparison, and the scaling curves."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from benchsuite.stats import num

ARM_COLORS = (("agent-r1", "tab:blue"), ("trl", "tab:orange"))


def plot_all(results: dict[str, Any], out: Path) -> list[str]:
    """Write every plot the results hold into ``out``; their file names."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    written = []
    cases = [c for c in results.get("trl", {}).get("cases", [])]
    if cases:
        written.append(_save(plt, _trl_rewards(plt, cases), out / "bench_trl_rewards.png"))
        written.append(_save(plt, _trl_speed(plt, cases), out / "bench_trl_speed.png"))
    for name, model in results.get("scaling", {}).get("models", {}).items():
        written.append(_save(plt, _scaling(plt, model), out / f"bench_scaling_{name}.png"))
    return written


def _save(plt: Any, fig: Any, path: Path) -> str:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path.name


def _trl_rewards(plt: Any, cases: list[dict[str, Any]]) -> Any:
    """Reward per step of each case: every repeat thin, the mean over repeats thick."""
    fig, axes = plt.subplots(1, len(cases), figsize=(4 * len(cases), 3.2), squeeze=False)
    for ax, case in zip(axes[0], cases, strict=True):
        for arm, color in ARM_COLORS:
            for run in case["runs"]:
                if run.get("arm") == arm and "error" not in run:
                    rewards = [num(s["reward_mean"]) for s in run["steps"]]
                    ax.plot(rewards, color=color, alpha=0.3, linewidth=0.8)
            curve = case["summary"]["reward_curves"].get(arm, [])
            ax.plot(curve, color=color, linewidth=2, label=arm)
        ax.set_title(case["case"], fontsize=9)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("mean reward")
    axes[0][0].legend(fontsize=8)
    fig.suptitle("Reward per step: agent-r1 and TRL on the same task (thin: each repeat)", fontsize=10)
    return fig


def _trl_speed(plt: Any, cases: list[dict[str, Any]]) -> Any:
    """Seconds per step, generated tokens per second and peak memory of both arms, per case."""
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.4))
    labels = [c["case"] for c in cases]
    panels = (
        ("step_s", "seconds per step"),
        ("tokens_per_s", "generated tokens / s"),
        ("peak_rss_mib", "peak RSS (MiB)"),
    )
    for ax, (key, title) in zip(axes, panels, strict=True):
        for offset, (arm, color) in zip((-0.2, 0.2), ARM_COLORS, strict=True):
            values = [c["summary"]["per_arm"][arm].get(key, math.nan) for c in cases]
            ax.bar([i + offset for i in range(len(cases))], values, width=0.4, color=color, label=arm)
        ax.set_xticks(range(len(cases)))
        ax.set_xticklabels(labels, rotation=20, ha="right", fontsize=8)
        ax.set_title(title, fontsize=9)
        if key != "peak_rss_mib":  # the tiny and the 135M model differ by orders of magnitude
            ax.set_yscale("log")
        ax.grid(alpha=0.3, axis="y")
    axes[0].legend(fontsize=8)
    return fig


def _scaling(plt: Any, model: dict[str, Any]) -> Any:
    """Step time and its parts against each axis of one model's scaling sweep."""
    axes_names = list(dict.fromkeys(p["axis"] for p in model["points"]))
    fig, axes = plt.subplots(1, len(axes_names), figsize=(3.6 * len(axes_names), 3.3), squeeze=False)
    for ax, axis in zip(axes[0], axes_names, strict=True):
        points = [p for p in model["points"] if p["axis"] == axis and "error" not in p]
        if points:
            _scaling_axis(ax, axis, points)
    axes[0][0].set_ylabel("seconds per step")
    axes[0][0].legend(fontsize=7)
    fig.suptitle(f"Step time against the work per step: {model['label']}", fontsize=10)
    return fig


def _scaling_axis(ax: Any, axis: str, points: list[dict[str, Any]]) -> None:
    x = [p["context_tokens_mean"] if axis == "prompt_words" else p["value"] for p in points]
    ax.plot(x, [p["wall_s"] for p in points], "o-", color="black", label="step")
    ax.plot(x, [p["generation_s"] for p in points], "s--", color="tab:blue", label="generation")
    ax.plot(
        x,
        [p["forward_backward_s"] + p["optimizer_s"] for p in points],
        "^--",
        color="tab:green",
        label="fwd+bwd+opt",
    )
    ax.plot(x, [p["overhead_s"] for p in points], "x:", color="tab:red", label="outside compute+tools")
    first = points[0]
    ax.plot(
        x,
        [first["wall_s"] * v / x[0] for v in x],
        color="gray",
        alpha=0.5,
        linewidth=1,
        label="linear from first",
    )
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel({"prompt_words": "context tokens", "max_turns": "turns"}.get(axis, axis))
    ax.grid(alpha=0.3, which="both")
