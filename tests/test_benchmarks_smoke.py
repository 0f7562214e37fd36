"""``benchmarks/bench.py`` (``make bench``) in its smoke mode, so that the benchmark cannot rot: the
tool-concurrency and scaling sections run for real (a real subprocess, the real engine, the tiny
model) in seconds; and the helpers the figures are computed with. The TRL side-by-side smoke run
needs trl and lives in tests/integrations/test_bench_trl_smoke.py."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))

import bench  # noqa: E402  (benchmarks/ is not a package; the path is set just above)


@given(st.lists(st.tuples(st.integers(0, 60), st.integers(0, 25)), max_size=15))
def test_interval_union_counts_the_time_any_call_runs(spans: list[tuple[int, int]]) -> None:
    # naive reference: on integer end points, count the unit cells that some interval covers
    covered = {cell for start, width in spans for cell in range(start, start + width)}
    intervals = [(float(start), float(start + width)) for start, width in spans]
    assert bench.interval_union(intervals) == pytest.approx(len(covered))


def test_text_reward_scores_the_last_number_and_the_share_of_digits() -> None:
    text = "The sum is 68."
    assert bench.text_reward(text + "<|im_end|>", "68") == pytest.approx(1.0 + 0.2 * 2 / len(text))
    assert bench.text_reward("68, or maybe 12", "68") == pytest.approx(0.2 * 4 / len("68, or maybe 12"))
    assert bench.text_reward("no digits here", "68") == 0.0


def test_tasks_are_the_same_for_both_arms_and_the_codebook_scores_lookups() -> None:
    first, again = bench.make_tasks("tools", 4, seed=3), bench.make_tasks("tools", 4, seed=3)
    assert first == again
    assert first != bench.make_tasks("tools", 4, seed=4)
    keys = first[0]["metadata"]["keys"]
    assert first[0]["messages"][: len(bench.ONE_SHOT)] == bench.ONE_SHOT
    assert first[0]["answer"] == " ".join(str(bench.code_of(k)) for k in keys)

    book = bench.CodeBook()
    book.reset(prompt=first[0]["messages"], **first[0]["metadata"])
    assert book.get_reward() == 0.0
    assert asyncio.run(book.lookup("zz9")) == f"code {bench.code_of('zz9')}"
    assert book.get_reward() == 0.25  # a call, not a requested key
    asyncio.run(book.lookup(keys[0]))
    assert book.get_reward() == 0.75  # two calls, one of them a requested key
    asyncio.run(book.lookup(keys[1]))
    assert book.get_reward() == 1.0  # calls count two at most, and both keys were looked up
    book.reset(**first[0]["metadata"])  # a new episode starts from nothing
    assert book.get_reward() == 0.0
    asyncio.run(book.lookup(keys[1]))
    assert book.get_reward() == 0.5


def test_smoke_run_of_the_tool_concurrency_and_scaling_sections(tmp_path: Path) -> None:
    out, work = tmp_path / "out", tmp_path / "work"
    command = [
        sys.executable,
        str(REPO / "benchmarks" / "bench.py"),
        "--smoke",
        "--only",
        "tools,scaling",
        "--out",
        str(out),
        "--work",
        str(work),
    ]
    process = subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert process.returncode == 0, process.stdout[-3000:] + process.stderr[-3000:]
    results = json.loads((out / "bench.json").read_text(encoding="utf-8"))
    assert results["failures"] == []

    rows = results["tools"]["rows"]
    assert {row["tool"] for row in rows} == {"SlowLookup", "AsyncSlowLookup"}
    for row in rows:
        assert row["calls"] == row["trajectories"] * row["turns"] and row["tool_errors"] == 0
        # the calls overlap: far from one after the other, never faster than one call per turn
        assert row["ideal_s"] * 0.95 <= row["tool_wall_s"] < 0.5 * row["serial_s"]
        assert row["env_s"] >= row["tool_wall_s"] * 0.95

    points = results["scaling"]["models"]["tiny"]["points"]
    assert {p["axis"] for p in points} == {"tasks_per_step", "group_size", "max_turns", "prompt_words"}
    for point in points:
        assert "error" not in point
        assert point["wall_s"] > 0 and point["generation_s"] > 0
        assert point["forward_backward_s"] > 0  # the hash reward leaves no group without advantages
        assert point["trajectories"] == point["setting"]["tasks_per_step"] * point["setting"]["group_size"]
    turns = {p["value"]: p for p in points if p["axis"] == "max_turns"}
    assert turns[2]["turns_mean"] == 2 and turns[1]["turns_mean"] == 1
    context = {p["value"]: p for p in points if p["axis"] == "prompt_words"}
    assert context[60]["prompt_tokens_mean"] > context[0]["prompt_tokens_mean"] + 50
    assert results["overhead"] and all(0 <= r["overhead_share"] <= 1 for r in results["overhead"])

    report = (out / "bench.md").read_text(encoding="utf-8")
    for heading in ("## Tool concurrency", "## Scaling", "## Step time outside model compute"):
        assert heading in report
    assert (out / "bench_scaling_tiny.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_an_unknown_section_is_refused_with_the_choices() -> None:
    process = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "bench.py"), "--only", "tools,speed"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert process.returncode == 2
    assert "unknown section(s) speed" in process.stderr and "trl, tools, scaling" in process.stderr


def _smoke(script: str, out: Path) -> None:
    """Run ``benchmarks/SCRIPT --smoke --out OUT`` and require it to succeed."""
    completed = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / script), "--smoke", "--out", str(out)],
        cwd=REPO,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]


def test_bench_packing_smoke_runs_every_arm(tmp_path: Path) -> None:
    """``benchmarks/bench_packing.py --smoke``: every arm's update runs on the real engine (in
    one process, tiny shapes) and the report holds the layout figures."""
    _smoke("bench_packing.py", tmp_path)
    results = json.loads((tmp_path / "bench_packing.json").read_text(encoding="utf-8"))
    arms = results["compare"][0]["arms"]
    assert (
        arms["padded"]["padding_share"]
        > arms["budget"]["padding_share"]
        > arms["packed"]["padding_share"]
        == 0
    )
    losses = {round(arm["pg_loss"], 5) for arm in arms.values()}
    assert len(losses) == 1, losses  # the same update in every layout
    assert set(results["longest"]["fits"]) == {"padded", "packed"}
    assert "| packed |" in (tmp_path / "bench_packing.md").read_text(encoding="utf-8")


def test_bench_async_smoke_runs_sync_and_async(tmp_path: Path) -> None:
    """``benchmarks/bench_async.py --smoke``: sync and async runs (staleness 1 and 2) train the
    tiny model on the multi-turn toy task in-process and the report compares them."""
    _smoke("bench_async.py", tmp_path)
    runs = json.loads((tmp_path / "bench_async.json").read_text(encoding="utf-8"))["runs"]
    assert sorted(r["mode"] for r in runs) == ["async-1", "async-2", "sync"]
    assert all(r["wall_s"] > 0 and 0 <= r["held_out"] <= 1 for r in runs)
    assert all(r["staleness_max"] <= int(r["mode"][-1]) for r in runs if r["mode"] != "sync")
    assert "| async-2 |" in (tmp_path / "bench_async.md").read_text(encoding="utf-8")
