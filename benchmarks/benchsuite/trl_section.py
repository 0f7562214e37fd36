"""Section ``trl``: agent-r1 and TRL's ``GRPOTrainer`` side by side on the same work, arms
alternating (A B, then B A, ...), each in a subprocess of its own."""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchsuite import REPO
from benchsuite.codebook import CodeBook
from benchsuite.stats import mean, timed_steps
from benchsuite.tasks import make_tasks


def trl_cases(smoke: bool, models: Sequence[str]) -> list[dict[str, Any]]:
    """The side-by-side cases (task × model) with their sizes. Both arms get every field."""
    if smoke:
        base = {"steps": 2, "tasks_per_step": 2, "group_size": 2, "repeats": 1}
        cases = [
            _case(base, "single-tiny", "single", "tiny", 8, 1e-3),
            # the random model (no fine-tuning in smoke mode): the tool path runs, few calls are made
            _case(base, "tools-tiny-50ms", "tools", "tiny", 16, 2e-4, latency_s=0.05),
        ]
    else:
        tiny = {"steps": 12, "tasks_per_step": 4, "group_size": 4, "repeats": 2}
        smol = {"steps": 4, "tasks_per_step": 2, "group_size": 4, "repeats": 2}
        cases = [
            _case(tiny, "single-tiny", "single", "tiny", 24, 1e-3),
            _case(tiny, "tools-tiny-0ms", "tools", "tiny-tools", 32, 2e-4, latency_s=0.0),
            _case(tiny, "tools-tiny-50ms", "tools", "tiny-tools", 32, 2e-4, latency_s=0.05),
            _case(smol, "single-smollm2", "single", "smollm2", 24, 1e-5),
            _case(
                smol,
                "tools-smollm2-50ms",
                "tools",
                "smollm2",
                32,
                1e-5,
                latency_s=0.05,
                group_size=2,
                steps=3,
            ),
            # the learning check: long enough for the reward to move, latency 0 to keep it short
            _case(
                tiny, "learn-tools-tiny", "tools", "tiny-tools", 32, 1e-3, latency_s=0.0, steps=40, repeats=1
            ),
        ]
    return [
        case for case in cases if case["model_name"].split("-")[0] in models or case["model_name"] in models
    ]


def _case(
    sizes: dict[str, Any],
    name: str,
    task: str,
    model_name: str,
    max_new_tokens: int,
    lr: float,
    *,
    latency_s: float | None = None,
    **overrides: Any,
) -> dict[str, Any]:
    """One case: its sizes, what it runs, and for the tool task 3 turns with tools that wait
    ``latency_s``; ``overrides`` replace sizes."""
    case: dict[str, Any] = {**sizes, "case": name, "task": task, "model_name": model_name}
    case["max_new_tokens"] = max_new_tokens
    if task == "tools":
        case.update(max_turns=3, tool_latency_s=latency_s)
    case["lr"] = lr
    case.update(overrides)
    return case


def completion_budget(case: dict[str, Any]) -> int:
    """Tokens after the prompt, all turns together: TRL's ``max_completion_length``. A tool turn
    adds its result message (about 16 tokens here) to the actions' budgets."""
    turns = case.get("max_turns", 1)
    return case["max_new_tokens"] * turns + 16 * (turns - 1)


def prompt_tokens(case: dict[str, Any], model: dict[str, Any]) -> int:
    """The longest rendered prompt of the case's tasks (both arms render the same way)."""
    from transformers import AutoTokenizer
    from transformers.utils import get_json_schema

    tokenizer = AutoTokenizer.from_pretrained(model["dir"])
    tools: list[Any] | None = None
    if case["task"] == "tools":
        tools = [get_json_schema(CodeBook().lookup)]
        if model.get("tools_template"):
            tokenizer.chat_template = model["tools_template"]
    tasks = make_tasks(case["task"], case["num_tasks"], case.get("seed", 0))
    return max(
        len(
            tokenizer.apply_chat_template(
                t["messages"], tools=tools, add_generation_prompt=True, return_dict=False
            )
        )
        for t in tasks
    )


def run_arm_subprocess(
    python: str, script: Path, spec: dict[str, Any], work: Path, label: str, timeout_s: float
) -> dict[str, Any]:
    """Run one arm (``script arm SPEC OUT`` for agent-r1, ``script SPEC OUT`` for TRL) in a fresh
    process; its result, or ``{"error": ...}`` with the end of its output."""
    work.mkdir(parents=True, exist_ok=True)
    spec_path, out_path, log_path = work / f"{label}.spec.json", work / f"{label}.json", work / f"{label}.log"
    spec_path.write_text(json.dumps(spec, indent=2), encoding="utf-8")
    out_path.unlink(missing_ok=True)
    command = [python, str(script)]
    if script.name == "bench.py":
        command.append("arm")
    command += [str(spec_path), str(out_path)]
    env = {**os.environ, "OMP_NUM_THREADS": str(spec.get("threads", 1)), "TRL_EXPERIMENTAL_SILENCE": "1"}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "benchmarks"), env.get("PYTHONPATH", "")]).rstrip(
        os.pathsep
    )
    started = time.perf_counter()
    with log_path.open("w", encoding="utf-8") as log:
        try:
            process = subprocess.run(
                command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO, timeout=timeout_s
            )
            code: int | str = process.returncode
        except subprocess.TimeoutExpired:
            code = f"timed out after {timeout_s:.0f} s"
    wall = time.perf_counter() - started
    if code == 0 and out_path.exists():
        result: dict[str, Any] = json.loads(out_path.read_text(encoding="utf-8"))
        result["process_wall_s"] = wall
        return result
    tail = log_path.read_text(encoding="utf-8", errors="replace").splitlines()[-15:]
    return {"error": f"{label}: exit {code}", "log_tail": tail, "log": str(log_path), "process_wall_s": wall}


def run_trl_section(args: argparse.Namespace, models: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Every case, arms alternating (A B, then B A, ...), each in its own subprocess."""
    python = args.trl_python
    section: dict[str, Any] = {"python": python, "cases": []}
    for case in trl_cases(args.smoke, list(models)):
        if args.cases and case["case"] not in args.cases:
            continue
        model = models[case["model_name"]]
        case = {**case, "seed": 0, "threads": args.threads}
        case["num_tasks"] = case["steps"] * case["tasks_per_step"]
        case["max_completion"] = completion_budget(case)
        case["prompt_tokens_max"] = prompt_tokens(case, model)
        case["max_context"] = case["prompt_tokens_max"] + case["max_completion"]
        print(
            f"== trl: {case['case']} ({model['label']}), {case['steps']} steps x {case['repeats']} repeats",
            flush=True,
        )
        runs: list[dict[str, Any]] = []
        for repeat in range(case["repeats"]):
            order = ["agent-r1", "trl"] if repeat % 2 == 0 else ["trl", "agent-r1"]
            for arm in order:
                spec = {**case, "model": model, "arm": arm, "repeat": repeat}
                spec["run_dir"] = str(args.work / "trl" / case["case"] / f"{arm}-{repeat}")
                script = REPO / "benchmarks" / ("bench.py" if arm == "agent-r1" else "bench_trl.py")
                result = run_arm_subprocess(
                    python,
                    script,
                    spec,
                    args.work / "trl" / case["case"],
                    f"{arm}-{repeat}",
                    args.arm_timeout,
                )
                result.update(arm=arm, repeat=repeat)
                runs.append(result)
                print(f"   {arm} #{repeat}: {describe_run(result)}", flush=True)
        case_out = {key: value for key, value in case.items() if key != "model"}
        case_out["model_label"] = model["label"]
        case_out["runs"] = runs
        case_out["summary"] = summarise_case(runs)
        section["cases"].append(case_out)
    return section


def describe_run(result: dict[str, Any]) -> str:
    if "error" in result:
        return f"FAILED ({result['error']}; see {result.get('log')})"
    summary = arm_summary(result)
    return (
        f"{summary['step_s']:.2f} s/step, {summary['tokens_per_s']:.0f} tok/s, "
        f"reward {summary['reward_mean']:.3f}, peak RSS {summary['peak_rss_mib']:.0f} MiB"
    )


def arm_summary(result: dict[str, Any]) -> dict[str, float]:
    """Speed figures of one arm run (over :func:`timed_steps`) and its memory."""
    steps = timed_steps(result["steps"])
    seconds = sum(s["wall_s"] for s in steps)
    return {
        "step_s": seconds / max(len(steps), 1),
        "steps_per_s": len(steps) / seconds if seconds else math.nan,
        "trajectories_per_s": sum(s["trajectories"] for s in steps) / seconds if seconds else math.nan,
        "tokens_per_s": sum(s["generated_tokens"] for s in steps) / seconds if seconds else math.nan,
        "generation_s": mean([s.get("generation_s", math.nan) for s in steps]),
        "tool_wall_s": mean([s.get("tool_wall_s", math.nan) for s in steps]),
        "first_step_s": result["steps"][0]["wall_s"] if result["steps"] else math.nan,
        "reward_mean": mean([s["reward_mean"] for s in result["steps"]]),
        "zero_variance_groups": mean([s.get("zero_variance_groups", math.nan) for s in result["steps"]]),
        "tool_calls_per_trajectory": sum(s.get("tool_calls", 0.0) for s in result["steps"])
        / max(sum(s["trajectories"] for s in result["steps"]), 1),
        "generated_tokens_per_trajectory": sum(s["generated_tokens"] for s in result["steps"])
        / max(sum(s["trajectories"] for s in result["steps"]), 1),
        "load_s": result.get("load_s", math.nan),
        "peak_rss_mib": result.get("peak_rss_mib", math.nan),
        "rss_loaded_mib": result.get("rss_loaded_mib", math.nan),
    }


SPEED_KEYS = (
    "steps_per_s",
    "trajectories_per_s",
    "tokens_per_s",
    "step_s",
    "generation_s",
    "tool_wall_s",
    "peak_rss_mib",
)


def summarise_case(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Per arm: the mean of each figure over its repeats; and agent-r1 / TRL ratios."""
    per_arm: dict[str, dict[str, float]] = {}
    for arm in ("agent-r1", "trl"):
        summaries = [arm_summary(r) for r in runs if r.get("arm") == arm and "error" not in r]
        keys = summaries[0].keys() if summaries else []
        per_arm[arm] = {key: mean([s[key] for s in summaries]) for key in keys}
        per_arm[arm]["runs"] = len(summaries)
    ratios = {}
    for key in SPEED_KEYS:
        ours, theirs = per_arm["agent-r1"].get(key, math.nan), per_arm["trl"].get(key, math.nan)
        ratios[key] = ours / theirs if theirs and math.isfinite(ours) and math.isfinite(theirs) else math.nan
    curves: dict[str, list[float]] = {}
    for arm in ("agent-r1", "trl"):
        series = [
            [s["reward_mean"] for s in r["steps"]] for r in runs if r.get("arm") == arm and "error" not in r
        ]
        length = max((len(s) for s in series), default=0)
        curves[arm] = [mean([s[i] for s in series if i < len(s)]) for i in range(length)]
    return {"per_arm": per_arm, "ratio_agent_r1_over_trl": ratios, "reward_curves": curves}
