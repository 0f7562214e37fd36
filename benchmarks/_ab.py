"""Helpers shared by the benchmarks that compare two ways of computing the same gradients
(``bench_shared_prefix_value.py``, ``bench_step_prefix.py``): the gradient gap, alternating
timings, and the results file; and :func:`run_in_subprocess`, which runs one arm of a benchmark
in a process of its own (``bench_packing.py``, ``bench_async.py``), so that its peak memory and
threads are its own."""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch


def max_relative_gap(grads: Mapping[str, torch.Tensor], reference: Mapping[str, torch.Tensor]) -> float:
    """The largest gradient difference, relative to each parameter's largest reference entry."""
    return max(
        float((grads[name] - grad).abs().max() / grad.abs().max().clamp(min=1e-12))
        for name, grad in reference.items()
    )


def time_alternating(run: Callable[[str], object], modes: Sequence[str], repeats: int) -> dict[str, Any]:
    """Wall and CPU seconds of ``run(mode)`` for each mode, ``repeats`` times, the order of the
    modes reversed every other repeat so that machine noise hits both; prints a line per mode."""
    wall: dict[str, list[float]] = {mode: [] for mode in modes}
    cpu: dict[str, list[float]] = {mode: [] for mode in modes}
    for repeat in range(repeats):
        for mode in modes if repeat % 2 == 0 else modes[::-1]:
            started, cpu_started = time.perf_counter(), time.process_time()
            run(mode)
            wall[mode].append(time.perf_counter() - started)
            cpu[mode].append(time.process_time() - cpu_started)
    width = max(len(mode) for mode in modes)
    results: dict[str, Any] = {}
    for mode in modes:
        results[mode] = {
            "best_s": min(wall[mode]),
            "median_s": statistics.median(wall[mode]),
            "cpu_median_s": statistics.median(cpu[mode]),
            "times_s": wall[mode],
        }
        print(
            f"{mode:>{width}}: best {min(wall[mode]):6.2f} s  median {results[mode]['median_s']:6.2f} s  "
            f"CPU median {results[mode]['cpu_median_s']:6.2f} s"
        )
    return results


def write_results(results: Mapping[str, Any], out: str | None, name: str) -> None:
    """``results.json`` in ``out`` (default ``runs/<name>/<time>``)."""
    directory = Path(out or f"runs/{name}/{time.strftime('%Y%m%d-%H%M%S')}")
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "results.json").write_text(json.dumps(results, indent=2), encoding="utf-8")
    print(f"wrote {directory / 'results.json'}")


def run_in_subprocess(script: str, spec: dict[str, Any], label: str, threads: int) -> dict[str, Any]:
    """Run ``script --worker SPEC.json`` with ``threads`` torch threads and return the JSON object
    it prints last; a failing arm stops the benchmark with its error output."""
    import os
    import subprocess
    import sys
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as handle:
        json.dump(spec, handle)
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    done = subprocess.run(
        [sys.executable, script, "--worker", handle.name], env=env, capture_output=True, text=True
    )
    os.unlink(handle.name)
    if done.returncode != 0:
        sys.exit(f"error: {label} failed:\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result
