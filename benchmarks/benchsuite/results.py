"""The report files: ``bench.json`` (every figure, as plain JSON that names no machine path),
``bench.md`` and the plots, and the merge of a new run into an earlier report (``--update``)."""

from __future__ import annotations

import json
import math
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

from benchsuite import REPO
from benchsuite.overhead import overhead_rows
from benchsuite.plots import plot_all
from benchsuite.report import markdown, run_entry
from benchsuite.stats import num


def machine() -> dict[str, Any]:
    """What the figures ran on: CPU model and count, memory, OS, Python."""
    info: dict[str, Any] = {
        "nproc": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
    }
    try:
        # nproc obeys OMP_NUM_THREADS, which the benchmark sets to 1: ask it without
        plain = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "OMP_THREAD_LIMIT")}
        info["nproc"] = int(
            subprocess.run(["nproc"], capture_output=True, text=True, check=True, env=plain).stdout.strip()
        )
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        for line in lscpu.splitlines():
            if line.startswith("Model name:"):
                info["cpu"] = line.split(":", 1)[1].strip()
    except (OSError, subprocess.CalledProcessError, ValueError):
        info["cpu"] = platform.processor() or "unknown"  # no nproc/lscpu: what Python knows
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                info["memory_gib"] = round(int(line.split()[1]) / 1024**2, 1)
    except OSError:
        pass  # not Linux: memory is left out of the report
    try:
        import torch

        info["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
    except ImportError:
        info["gpu"] = "unknown"
    return info


def jsonable(value: Any) -> Any:
    """Plain JSON data: NaN and infinities become null, floats keep 6 significant digits (timings
    are not more precise than that), and paths name no machine: the repository is ``.``, the
    home directory ``~``."""
    if isinstance(value, float):
        return float(f"{value:.6g}") if math.isfinite(value) else None
    if isinstance(value, str) and value.startswith("/"):
        return value.replace(str(REPO), ".").replace(str(Path.home()), "~")
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    return value


def merge_results(previous: dict[str, Any], current: dict[str, Any]) -> dict[str, Any]:
    """``previous`` with what ``current`` ran put in its place: ``trl`` cases by name, ``scaling``
    by model, ``tools`` whole. The runs that made the merged report are listed in ``history``."""
    merged: dict[str, Any] = {
        **previous,
        **{k: current[k] for k in ("machine", "versions", "threads", "smoke") if k in current},
    }
    merged["history"] = [*previous.get("history", [run_entry(previous)]), run_entry(current)]
    merged["wall_s"] = sum(num(run.get("wall_s")) for run in merged["history"])
    rerun: list[str] = []
    if "trl" in current:
        old = previous.get("trl", {}).get("cases", [])
        new = current["trl"].get("cases", [])
        names = {case["case"] for case in new}
        rerun += [f"trl/{name}" for name in names]
        merged["trl"] = {**current["trl"], "cases": [c for c in old if c["case"] not in names] + new}
    if "tools" in current:
        merged["tools"] = current["tools"]
        rerun.append("tools")
    if "scaling" in current:
        models = {**previous.get("scaling", {}).get("models", {}), **current["scaling"]["models"]}
        merged["scaling"] = {"models": models}
        rerun += [f"scaling/{name}" for name in current["scaling"]["models"]]
    merged["models"] = {**previous.get("models", {}), **current.get("models", {})}
    kept = [f for f in previous.get("failures", []) if not any(f.startswith(prefix) for prefix in rerun)]
    merged["failures"] = kept + current.get("failures", [])
    return merged


def write_reports(results: dict[str, Any], out: Path) -> None:
    """``bench.json``, ``bench.md`` and the PNGs into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    results["overhead"] = overhead_rows(results)
    try:
        results["plots"] = plot_all(results, out)
    except ImportError as exc:  # an environment without matplotlib (the trl one): tables only
        results["plots"] = []
        results["notes"] = [f"no plots: {exc} (install matplotlib, e.g. agent-r1[plots])"]
        print(f"warning: {results['notes'][0]}", flush=True)
    except Exception as exc:  # a plotting problem must not lose the figures
        results.setdefault("failures", []).append(f"plots: {type(exc).__name__}: {exc}")
    (out / "bench.json").write_text(json.dumps(jsonable(results)), encoding="utf-8")
    (out / "bench.md").write_text(markdown(results), encoding="utf-8")
