"""Long contexts: padded micro-batches against a token budget and padding-free packing.

One agent-r1 update (``engine.update.update``: GRPO advantages, token-mean loss, AdamW) on a
long-tailed batch of multi-turn trajectories (16 rows, context lengths drawn log-normal between
200 and 8,000 tokens, the longest always 8,000; a prompt, then policy turns of ~120 tokens
alternating with tool observations of ~250), three ways:

* ``padded``: ``micro_batch_size: 4`` rows padded to the longest of them (agent-r1's default);
* ``budget``: ``max_tokens_per_micro_batch`` = the longest row (8,000): rows grouped by length;
* ``packed``: the same budget with ``packing: true`` (trajectories end to end, ``sdpa_varlen``).

Each arm runs in a subprocess of its own (its peak resident memory is its own: the figure is the
peak during the update minus the resident memory just before it), alternating A B C C B A so
that machine noise hits every arm alike. Reported: step time, peak memory, padding share, the
number of micro-batches, and ``agent-r1 check``'s estimate of the same update. Then the longest
context that trains within a fixed memory budget: rows ``[L, 200, 200, 200]`` for several ``L``,
padded (one micro-batch of 4) against packed (one packed row), the peak fitted linearly in ``L``
and solved for the padded arm's peak at ``L = 2,048``.

Models: ``small`` (a random Llama, hidden 256, 4 layers, the tiny ChatML tokenizer, float32) and
``smollm2`` (the bundled SmolLM2-135M-Instruct, float32, lengths divided by 4 to fit a 2-core CPU).

    .venv/bin/python benchmarks/bench_packing.py                  # both models, about 10 min
    .venv/bin/python benchmarks/bench_packing.py --models small   # about 3 min
    .venv/bin/python benchmarks/bench_packing.py --smoke          # seconds, in-process (the tests)

Writes ``bench_packing.json`` and ``bench_packing.md`` to ``--out`` (default benchmarks/results).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import resource
import tempfile
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).with_name("results")
ARMS = {
    "padded": {},
    "budget": {"budget": True},
    "packed": {"budget": True, "packing": True},
}


def long_tailed_lengths(rows: int, shortest: int, longest: int, seed: int = 0) -> list[int]:
    """``rows`` context lengths, log-normal (median 2.5 x ``shortest``) clipped to
    ``[shortest, longest]``, the longest present once, in a shuffled order."""
    rng = random.Random(seed)
    lengths = [
        min(max(int(rng.lognormvariate(math.log(2.5 * shortest), 1.0)), shortest), longest)
        for _ in range(rows - 1)
    ]
    lengths.append(longest)
    rng.shuffle(lengths)
    return lengths


def trajectories(tokenizer: Any, lengths: list[int], scale: float = 1.0) -> list[Any]:
    """Multi-turn trajectories of exactly ``lengths`` tokens: a prompt of 15%, then policy turns
    of ~120 x ``scale`` tokens and observations of ~250 x ``scale``, ending on a policy turn;
    rewards differ within each group of 4 so that every row carries a gradient."""
    import torch

    from agent_r1.mdp import RewardSignal, TokenSource, Trajectory

    generator = torch.Generator().manual_seed(0)
    vocab = len(tokenizer)
    out = []
    for i, length in enumerate(lengths):
        trajectory = Trajectory(
            id=f"t{i}", task_id=f"task{i // 4}", group_id=f"g{i // 4}", sample_index=i % 4
        )
        token = lambda n: torch.randint(5, vocab, (n,), generator=generator).tolist()  # noqa: E731
        prompt = max(int(0.15 * length), 1)
        trajectory.append(TokenSource.PROMPT, 0, token(prompt))
        left, turn = length - prompt, 0
        while left > 0:
            act = min(max(int(120 * scale), 1), left)
            trajectory.append(TokenSource.POLICY, turn, token(act), [-1.0] * act)
            left -= act
            observe = min(max(int(250 * scale), 1), left - 1) if left > 1 else 0
            if observe > 0:
                trajectory.append(TokenSource.ENV, turn, token(observe))
                left -= observe
            turn += 1
        assert len(trajectory) == length
        trajectory.rewards.append(RewardSignal(name="answer_match", value=float(i % 4 in (0, 3))))
        out.append(trajectory)
    return out


def _rss() -> int:
    with open("/proc/self/status", encoding="utf-8") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def run_arm(spec: dict[str, Any]) -> dict[str, Any]:
    """One update of one arm, in this process."""
    import torch
    from transformers import AutoConfig

    from agent_r1.config import RunConfig, validate_components
    from agent_r1.engine.session import build_session
    from agent_r1.engine.update import update
    from agent_r1.models.memory import estimate_training_memory
    from agent_r1.models.paths import resolve_model_path

    torch.set_num_threads(spec.get("threads", 2))
    lengths = spec["lengths"]
    arm = ARMS[spec["arm"]]
    trainer: dict[str, Any] = {
        "steps": 1,
        "tasks_per_step": max(len(lengths) // 4, 1),
        "micro_batch_size": spec.get("micro", 4),
        "lr": 1e-6,
        "skip_idle_rows": False,
        "packing": bool(arm.get("packing")),
    }
    if arm.get("budget"):
        trainer["max_tokens_per_micro_batch"] = spec["budget"]
    config = {
        "seed": 0,
        "output_dir": str(Path(spec["work"]) / "run"),
        "model": {"path": spec["model"], "dtype": "float32"},
        "data": {"name": "arithmetic"},
        "environment": {"name": "calculator"},
        "rewards": [{"name": "answer_match"}],
        "rollout": {"group_size": 4, "max_context": max(lengths)},
        "algorithm": {"name": "grpo"},
        "trainer": trainer,
        "trackers": [],
    }
    run = RunConfig.model_validate(config)
    session = build_session(run, validate_components(run), run.output_dir)
    batch = trajectories(session.tokenizer, lengths, spec.get("scale", 1.0))
    before = _rss()
    started = time.perf_counter()
    metrics = update(session, batch)
    step_s = time.perf_counter() - started
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    hf_config = AutoConfig.from_pretrained(resolve_model_path(spec["model"]))
    parameters = sum(p.numel() for p in session.unwrapped.parameters())
    estimate = estimate_training_memory(run, hf_config, parameters)
    return {
        "arm": spec["arm"],
        "lengths": lengths,
        "step_s": step_s,
        "peak_gib": (peak - before) / 2**30,
        "estimate_gib": estimate.total / 2**30,
        "padding_share": metrics["batch/padding_share"],
        "micro_batches": metrics["batch/micro_batches"],
        "max_micro_tokens": metrics["batch/max_micro_tokens"],
        "pg_loss": metrics["actor/pg_loss"],
    }


def _spawn(spec: dict[str, Any], smoke: bool) -> dict[str, Any]:
    if smoke:  # in-process: the figures are not meaningful, the code paths are
        return run_arm(spec)
    from _ab import run_in_subprocess

    return run_in_subprocess(__file__, spec, f"arm {spec['arm']} ({spec['model']})", spec.get("threads", 2))


def _model(name: str, work: Path, smoke: bool) -> tuple[str, float, int, int]:
    """(model path, length scale, shortest, longest) of a benchmark model."""
    from agent_r1.testing.models import save_tiny_model, tiny_model, tiny_tokenizer

    if name == "smollm2":
        return "smollm2-135m-instruct", 0.25, 50, 2000
    tokenizer = tiny_tokenizer()
    if smoke:
        model = tiny_model(tokenizer, hidden=64, layers=2, max_positions=4096)
        return str(save_tiny_model(work / "tiny", model, tokenizer)), 0.1, 20, 200
    model = tiny_model(tokenizer, hidden=256, layers=4, heads=4, max_positions=16384)
    return str(save_tiny_model(work / "small", model, tokenizer)), 1.0, 200, 8000


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    return (
        ordered[len(ordered) // 2]
        if len(ordered) % 2
        else sum(ordered[len(ordered) // 2 - 1 : len(ordered) // 2 + 1]) / 2
    )


def compare(name: str, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """The three arms on the long-tailed batch, alternating, ``args.repeats`` times each."""
    path, scale, shortest, longest = _model(name, work, args.smoke)
    lengths = long_tailed_lengths(16, shortest, longest)
    order = list(ARMS) + list(reversed(ARMS))
    runs: dict[str, list[dict[str, Any]]] = {arm: [] for arm in ARMS}
    for repeat in range(args.repeats):
        for arm in order if repeat % 2 == 0 else list(reversed(order)):
            if len(runs[arm]) >= args.repeats:
                continue
            print(f"{name}: {arm} ({len(runs[arm]) + 1}/{args.repeats})...", flush=True)
            spec = {"arm": arm, "model": path, "lengths": lengths, "budget": longest, "scale": scale,
                    "work": str(work / f"{name}-{arm}"), "threads": args.threads}  # fmt: skip
            runs[arm].append(_spawn(spec, args.smoke))
    arms = {}
    for arm, results in runs.items():
        arms[arm] = {
            **results[0],
            "step_s": _median([r["step_s"] for r in results]),
            "peak_gib": _median([r["peak_gib"] for r in results]),
            "repeats": len(results),
        }
    return {"model": name, "lengths": lengths, "real_tokens": sum(lengths), "arms": arms}


def longest_context(name: str, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """Peak memory against the longest row for padded and packed, fitted linearly; the longest
    row each trains within the padded arm's peak at the second length."""
    path, _scale, shortest, _longest = _model(name, work, args.smoke)
    sizes = [64, 128, 256] if args.smoke else [1024, 2048, 4096, 8192]
    short = shortest
    points: dict[str, list[tuple[int, float]]] = {"padded": [], "packed": []}
    for size in sizes:
        for arm in points:
            lengths = [size, short, short, short]
            spec = {"arm": arm, "model": path, "lengths": lengths, "budget": sum(lengths), "micro": 4,
                    "work": str(work / f"sweep-{arm}-{size}"), "threads": args.threads}  # fmt: skip
            print(f"{name}: longest row {size}, {arm}...", flush=True)
            points[arm].append((size, _spawn(spec, args.smoke)["peak_gib"]))
    budget = points["padded"][1][1]
    fits = {}
    for arm, pairs in points.items():
        xs, ys = [p[0] for p in pairs], [p[1] for p in pairs]
        mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
        slope = sum((x - mean_x) * (y - mean_y) for x, y in pairs) / sum((x - mean_x) ** 2 for x in xs)
        intercept = mean_y - slope * mean_x
        fits[arm] = {"gib_per_1k_tokens": slope * 1000, "intercept_gib": intercept,
                     "longest": (budget - intercept) / slope if slope > 0 else float("inf")}  # fmt: skip
    return {"model": name, "budget_gib": budget, "points": points, "fits": fits,
            "ratio": fits["packed"]["longest"] / max(fits["padded"]["longest"], 1.0)}  # fmt: skip


def report(results: dict[str, Any]) -> str:
    lines = ["# Long contexts: padded, token budget, packed", ""]
    for case in results["compare"]:
        padded = case["arms"]["padded"]
        lines += [
            f"## {case['model']}: one update on 16 trajectories of {min(case['lengths'])}-"
            f"{max(case['lengths'])} tokens ({case['real_tokens']:,} in all)",
            "",
            "| arm | step s | vs padded | peak GiB | vs padded | estimate GiB | padding share "
            "| micro-batches |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for arm, row in case["arms"].items():
            lines.append(
                f"| {arm} | {row['step_s']:.2f} | {row['step_s'] / padded['step_s']:.2f}x | "
                f"{row['peak_gib']:.2f} | {row['peak_gib'] / max(padded['peak_gib'], 1e-9):.0%} | "
                f"{row['estimate_gib']:.2f} | "
                f"{row['padding_share']:.1%} | {row['micro_batches']:.0f} |"
            )
        lines.append("")
    sweep = results.get("longest")
    if sweep:
        lines += [
            f"## {sweep['model']}: the longest context within {sweep['budget_gib']:.2f} GiB",
            "",
            "Rows [L, short, short, short]: padded in one micro-batch of 4 against one packed row.",
            "",
            "| arm | GiB per 1k tokens of L | longest L in the budget |",
            "| --- | --- | --- |",
        ]
        for arm, fit in sweep["fits"].items():
            lines.append(f"| {arm} | {fit['gib_per_1k_tokens']:.3f} | {fit['longest']:,.0f} |")
        lines += ["", f"Packed trains a {sweep['ratio']:.1f}x longer context in the same memory.", ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--models", default="small,smollm2", help="small, smollm2 (comma-separated)")
    parser.add_argument("--repeats", type=int, default=2, help="runs of each arm (median reported)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads")
    parser.add_argument("--smoke", action="store_true", help="tiny shapes, in-process, seconds")
    parser.add_argument("--out", default=str(RESULTS), help="where bench_packing.{json,md} go")
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(run_arm(json.loads(Path(args.worker).read_text(encoding="utf-8")))))
        return
    if args.smoke:
        args.models, args.repeats = "small", 1
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        results: dict[str, Any] = {"compare": [compare(m, args, work) for m in args.models.split(",")]}
        results["longest"] = longest_context("small", args, work)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench_packing.json").write_text(json.dumps(results, indent=2), encoding="utf-8")
    text = report(results)
    (out / "bench_packing.md").write_text(text, encoding="utf-8")
    print(text)


if __name__ == "__main__":
    main()
