"""Section ``scaling``: step time against tasks per step, group size, turns and context length."""

from __future__ import annotations

import argparse
import traceback
from typing import Any

from benchsuite.arm import run_agent_r1_arm
from benchsuite.stats import median, timed_steps


def scaling_axes(smoke: bool, model: str) -> dict[str, list[int]]:
    """The values of each axis; every other setting stays at the base point (2 tasks, group of 4,
    one turn, a short prompt)."""
    if smoke:
        return {"tasks_per_step": [1, 2], "group_size": [2, 4], "max_turns": [1, 2], "prompt_words": [0, 60]}
    if model == "smollm2":
        return {"tasks_per_step": [1, 2, 4]}
    return {
        "tasks_per_step": [1, 2, 4, 8, 16],
        "group_size": [2, 4, 8, 16],
        "max_turns": [1, 2, 4, 8],
        "prompt_words": [0, 50, 150, 400],  # about 30 to 1550 tokens: within the tiny model's 2048
    }


POINT_FIGURES = (
    "wall_s",
    "generation_s",
    "env_s",
    "no_grad_s",
    "forward_backward_s",
    "optimizer_s",
    "overhead_s",
    "other_s",
    "generated_tokens",
    "trajectories",
    "context_tokens_mean",
    "prompt_tokens_mean",
    "turns_mean",
)
"""The figures of a point: each the median over the steps after the first."""


def run_scaling_section(args: argparse.Namespace, models: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """For each model and axis, a few agent-r1 steps per value, in this process, one after the
    other; the median over the steps after the first is the point."""
    return {"models": {name: _sweep(args, name, models[name]) for name in args.scaling_models}}


def _sweep(args: argparse.Namespace, name: str, model: dict[str, Any]) -> dict[str, Any]:
    """One model's points: a warm-up run, then one run per value of each axis."""
    import gc

    base = {"tasks_per_step": 2, "group_size": 4, "max_turns": 1, "prompt_words": 0}
    steps = 2 if args.smoke else (3 if name == "smollm2" else 4)
    new_tokens = 8 if args.smoke else 16
    points: list[dict[str, Any]] = []
    warm_up = ("warm-up", [base["tasks_per_step"]])
    for axis, values in [warm_up, *scaling_axes(args.smoke, name).items()]:
        for value in values:
            setting = {**base, axis: value} if axis != "warm-up" else dict(base)
            spec = _spec(args, name, model, setting, steps=steps, new_tokens=new_tokens)
            spec["run_dir"] = str(args.work / "scaling" / name / f"{axis}-{value}")
            try:
                result = run_agent_r1_arm(spec)
            except Exception as exc:  # one point's failure is reported; the others go on
                traceback.print_exc()
                points.append({"axis": axis, "value": value, "error": f"{type(exc).__name__}: {exc}"})
                continue
            finally:
                gc.collect()
            if axis == "warm-up":  # the first run in a process pays one-off costs: not a point
                continue
            kept = timed_steps(result["steps"])
            point = {"axis": axis, "value": value, "setting": setting, "steps": result["steps"]}
            point.update({key: median([s[key] for s in kept]) for key in POINT_FIGURES})
            points.append(point)
            print(
                f"   {name} {axis}={value}: {point['wall_s']:.2f} s/step "
                f"({point['trajectories']:.0f} traj, {point['context_tokens_mean']:.0f} ctx tokens)",
                flush=True,
            )
    return {
        "label": model["label"],
        "base": base,
        "steps": steps,
        "max_new_tokens": new_tokens,
        "points": points,
    }


def _spec(
    args: argparse.Namespace,
    name: str,
    model: dict[str, Any],
    setting: dict[str, int],
    *,
    steps: int,
    new_tokens: int,
) -> dict[str, Any]:
    """The agent-r1 arm of one point: the ``turns`` task with the hash reward, at ``setting``."""
    return {
        "task": "turns",
        "reward": "hash",
        "model": model,
        "steps": steps,
        "num_tasks": steps * setting["tasks_per_step"],
        "tasks_per_step": setting["tasks_per_step"],
        "group_size": setting["group_size"],
        "max_turns": setting["max_turns"],
        "prompt_words": setting["prompt_words"],
        "max_new_tokens": new_tokens,
        "max_context": 4096 if name == "smollm2" else 2048,
        "lr": 1e-5 if name == "smollm2" else 1e-3,
        "seed": 0,
        "threads": args.threads,
    }
