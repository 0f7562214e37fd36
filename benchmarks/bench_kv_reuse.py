"""Time multi-turn rollouts with and without KV-cache reuse across turns in the ``hf`` backend.

Rolls out the main task (the bundled ``demo`` config: SmolLM2-135M-Instruct, the calculator
environment with its few-shot turns, ``rollout.*`` as configured) through the real rollout engine,
once with ``reuse_kv_across_turns`` on and once off, alternating the order from repeat to repeat
so that drifts in machine load hit both. Every repeat uses the same seed, so both modes must
produce the same trajectories; the script checks that (token for token) and reports the largest
log-probability difference, the best and median wall time of each mode (and the process CPU time,
steadier on a shared machine) and their ratio, and where the time went (prefill vs decode, prompt
tokens prefilled vs reused, turns). Sampling uses the config's temperature (the demo trains at 1.0)
unless ``--temperature`` says otherwise; with the same seed both modes draw the same tokens.

    .venv/bin/python benchmarks/bench_kv_reuse.py --tiny                 # smoke: tiny random model
    .venv/bin/python benchmarks/bench_kv_reuse.py                        # the demo task, sampled
    .venv/bin/python benchmarks/bench_kv_reuse.py --temperature 0        # greedy decoding

Trailing ``KEY=VALUE`` arguments are config overrides (both modes). ``--tiny`` swaps in a tiny random
model and keeps episodes going for ``max_turns`` turns (a random model writes no tool calls). Runs
on one CPU thread unless ``--threads`` says otherwise; writes ``results.json`` to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

MODES = ("reuse", "no reuse")


def build(args: argparse.Namespace, model_dir: Path | None) -> tuple[Any, list[Any]]:
    """The demo session (generation only) and the tasks to roll out."""
    from agent_r1.config import load_config, validate_components
    from agent_r1.engine.session import build_session

    overrides = [f"seed={args.seed}", *args.overrides]
    if model_dir is not None:
        # the tiny tokenizer spells the demo's worked examples out in many more tokens: more room
        overrides += [
            f"model.path={model_dir}",
            "environment.end_on_no_tool_call=false",
            "rollout.max_context=2048",
        ]
    if args.max_turns is not None:
        overrides.append(f"rollout.max_turns={args.max_turns}")
    config = load_config(args.config, overrides)
    components = validate_components(config)
    session = build_session(config, components, Path(args.out), training=False)
    tasks = session.dataset.load("train")[: args.tasks or config.trainer.tasks_per_step]
    return session, tasks


def engines(session: Any, temperature: float) -> dict[str, Any]:
    """One rollout engine per mode over the session's model, environments and rollout settings."""
    from agent_r1.builtins.hf_backend import HFBackend
    from agent_r1.contracts import SamplingParams
    from agent_r1.rollout.loop import RolloutEngine

    rollout = session.config.rollout
    options = rollout.backend.options
    sampling = SamplingParams(
        temperature=temperature,
        top_p=rollout.top_p,
        top_k=rollout.top_k,
        max_new_tokens=rollout.max_new_tokens,
    )
    built = {}
    for mode in MODES:
        backend = HFBackend(
            {**options, "reuse_kv_across_turns": mode == "reuse"},
            model=session.unwrapped,
            tokenizer=session.tokenizer,
        )
        built[mode] = RolloutEngine(
            backend,
            session.tokenizer,
            session.env_factory,
            max_turns=rollout.max_turns,
            max_new_tokens=rollout.max_new_tokens,
            max_context=rollout.max_context,
            sampling=sampling,
            on_env_error="end",
        )
    return built


def run_once(engine: Any, tasks: list[Any], group_size: int, seed: int) -> dict[str, Any]:
    engine.backend.step_metrics()  # start from zero
    started, cpu_started = time.perf_counter(), time.process_time()
    trajectories = engine.collect(tasks, group_size, seed=seed, group_salt="bench")
    seconds, cpu_seconds = time.perf_counter() - started, time.process_time() - cpu_started
    figures = engine.backend.step_metrics()
    return {
        "seconds": seconds,
        "cpu_s": cpu_seconds,
        "trajectories": trajectories,
        "prefill_s": figures["time/generate_prefill_s"],
        "decode_s": figures["time/generate_decode_s"],
        "prefill_tokens": figures["rollout/prefill_tokens"],
        "reused_prefix_tokens": figures["rollout/reused_prefix_tokens"],
        "shared_prefix_tokens": figures["rollout/shared_prefix_tokens"],
        "generation_s": engine.last_metrics["rollout/generation_s"],
        "env_s": engine.last_metrics["rollout/env_s"],
        "generated_tokens": engine.last_metrics["rollout/generated_tokens"],
        "backend_calls": engine.last_metrics["rollout/backend_calls"],
        "turns_per_episode": statistics.mean(len(t.steps) for t in trajectories),
    }


def compare(a: list[Any], b: list[Any]) -> tuple[bool, float]:
    """Whether two runs' trajectories are token-identical, and the largest log-probability gap."""
    same = [x.token_ids for x in a] == [y.token_ids for y in b]
    gap = 0.0
    for x, y in zip(a, b, strict=True):
        for p, q in zip(x.logprobs, y.logprobs, strict=False):
            if p is not None and q is not None:
                gap = max(gap, abs(p - q))
    return same, gap


def summarise(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for mode, records in runs.items():
        times = [r["seconds"] for r in records]
        last = records[-1]
        summary[mode] = {
            "best_s": min(times),
            "median_s": statistics.median(times),
            "times_s": times,
            "cpu_best_s": min(r["cpu_s"] for r in records),
            "cpu_median_s": statistics.median(r["cpu_s"] for r in records),
            "prefill_s_median": statistics.median(r["prefill_s"] for r in records),
            "decode_s_median": statistics.median(r["decode_s"] for r in records),
            "env_s_median": statistics.median(r["env_s"] for r in records),
            **{
                key: last[key]
                for key in (
                    "prefill_tokens",
                    "reused_prefix_tokens",
                    "shared_prefix_tokens",
                    "generated_tokens",
                    "backend_calls",
                    "turns_per_episode",
                )
            },
        }
    plain, reuse = summary["no reuse"], summary["reuse"]
    summary["speedup_best"] = plain["best_s"] / reuse["best_s"]
    summary["speedup_median"] = plain["median_s"] / reuse["median_s"]
    summary["cpu_speedup_median"] = plain["cpu_median_s"] / reuse["cpu_median_s"]
    summary["prefill_speedup_median"] = plain["prefill_s_median"] / max(reuse["prefill_s_median"], 1e-9)
    return summary


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="demo", help="run config (default: the bundled demo)")
    parser.add_argument("--tiny", action="store_true", help="tiny random model: a smoke run of a few seconds")
    parser.add_argument(
        "--tasks", type=int, default=None, help="tasks per rollout (default: trainer.tasks_per_step)"
    )
    parser.add_argument(
        "--group-size", type=int, default=None, help="episodes per task (default: the config's)"
    )
    parser.add_argument("--max-turns", type=int, default=None, help="override rollout.max_turns")
    parser.add_argument(
        "--temperature", type=float, default=None, help="default: the config's rollout.temperature; 0: greedy"
    )
    parser.add_argument("--repeats", type=int, default=3, help="timed rollouts per mode (alternating)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--out", default=None, help="output directory (default runs/bench_kv_reuse/<time>)")
    parser.add_argument("overrides", nargs="*", help="config overrides KEY=VALUE")
    args = parser.parse_args(argv)
    if args.out is None:
        args.out = f"runs/bench_kv_reuse/{time.strftime('%Y%m%d-%H%M%S')}"
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    from transformers.utils import logging as hf_logging

    from agent_r1.errors import AgentR1Error

    hf_logging.disable_progress_bar()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="bench-kv-") as scratch:
        model_dir = None
        if args.tiny:
            from agent_r1.testing.models import save_tiny_model, tiny_model, tiny_tokenizer

            tokenizer = tiny_tokenizer()
            model = tiny_model(tokenizer, tie_word_embeddings=False, seed=0)
            model_dir = save_tiny_model(Path(scratch) / "tiny", model, tokenizer)
        try:
            session, tasks = build(args, model_dir)
        except AgentR1Error as exc:  # a bad override fails here, before any rollout
            print(f"error: {exc}")
            return 2
        group_size = args.group_size or session.config.rollout.group_size
        if args.temperature is None:
            args.temperature = session.config.rollout.temperature
        built = engines(session, args.temperature)
        print(
            f"model: {session.config.model.path}  tasks: {len(tasks)} x {group_size}  "
            f"max_turns: {session.config.rollout.max_turns}  temperature: {args.temperature}  "
            f"threads: {torch.get_num_threads()}",
            flush=True,
        )
        for engine in built.values():  # warm-up: first-call allocations and lazy imports
            run_once(engine, tasks[:1], 1, args.seed)
        runs: dict[str, list[dict[str, Any]]] = {mode: [] for mode in MODES}
        equal, gaps = [], []
        for repeat in range(args.repeats):
            order = MODES if repeat % 2 == 0 else MODES[::-1]
            results = {}
            for mode in order:
                results[mode] = run_once(built[mode], tasks, group_size, args.seed)
                runs[mode].append(results[mode])
                print(
                    f"  repeat {repeat + 1} {mode:>8}: {results[mode]['seconds']:7.2f} s  "
                    f"(CPU {results[mode]['cpu_s']:.2f} s; "
                    f"prefill {results[mode]['prefill_s']:.2f} s, decode {results[mode]['decode_s']:.2f} s)",
                    flush=True,
                )
            same, gap = compare(results["reuse"]["trajectories"], results["no reuse"]["trajectories"])
            equal.append(same)
            gaps.append(gap)

    summary = summarise(runs)
    summary.update(
        tokens_identical=all(equal),
        max_logprob_diff=max(gaps),
        model=str(session.config.model.path),
        tasks=len(tasks),
        group_size=group_size,
        max_turns=session.config.rollout.max_turns,
        temperature=args.temperature,
        repeats=args.repeats,
        threads=torch.get_num_threads(),
        overrides=args.overrides,
    )
    for mode in MODES:
        s = summary[mode]
        print(
            f"{mode:>8}: best {s['best_s']:7.2f} s  median {s['median_s']:7.2f} s  CPU median "
            f"{s['cpu_median_s']:7.2f} s  prefill "
            f"{s['prefill_s_median']:6.2f} s  decode {s['decode_s_median']:6.2f} s  prefilled "
            f"{s['prefill_tokens']:7.0f} tok  reused {s['reused_prefix_tokens']:7.0f} tok  "
            f"turns/episode {s['turns_per_episode']:.2f}"
        )
    print(
        f"speed-up (no reuse / reuse): best {summary['speedup_best']:.2f}x  median "
        f"{summary['speedup_median']:.2f}x  CPU median {summary['cpu_speedup_median']:.2f}x  "
        f"prefill {summary['prefill_speedup_median']:.2f}x; "
        f"tokens identical: {summary['tokens_identical']}; "
        f"max |logprob diff| {summary['max_logprob_diff']:.2e}"
    )
    (out / "results.json").write_text(json.dumps(summary, indent=2), encoding="utf-8")
    print(f"wrote {out / 'results.json'}")
    return 0 if summary["tokens_identical"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
