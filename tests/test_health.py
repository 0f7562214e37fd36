"""Reward-hacking alarms (agent_r1.engine.reports.health): each alarm trips on its signature and stays quiet
on a healthy run, on synthetic metric sequences; the config is validated; a short GRPO run whose
reward shaper is deliberately hackable trips the alarms, logs and prints them, and a resumed run
judges its steps as the uninterrupted run does."""

from __future__ import annotations

import json
import math
import random
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from health_helpers import AuditPlugin, hackable_run
from hypothesis import given, settings
from hypothesis import strategies as st
from trainer_helpers import toy_config, toy_registry, write_config

from agent_r1.config import HealthConfig, RunConfig, load_config
from agent_r1.engine.reports.health import (
    ALARMS,
    HealthEvent,
    HealthMonitor,
    fitted_rise,
    step_figures,
    suspect_paths,
    trajectory_counts,
)
from agent_r1.errors import ConfigError, TrainingAborted
from agent_r1.mdp import RewardSignal, Trajectory
from agent_r1.registry import reset_registry

# --------------------------------------------------------------------------------------------
# Synthetic metric sequences
# --------------------------------------------------------------------------------------------

WATCH_ALL = {
    "audit_gap": {"signals": ["solved"]},
    "disagreement": {"reward_model": "judge", "verifier": "solved"},
}


def monitor(eval_every: int = 0, **sections: Any) -> HealthMonitor:
    return HealthMonitor(HealthConfig.model_validate({**WATCH_ALL, **sections}), eval_every=eval_every)


def healthy_rows(seed: int, steps: int = 120) -> list[dict[str, float]]:
    """An improving run: the score (the verifier's answer reward plus a format bonus learnt early)
    and the audit rise together, responses and tool use stay put, the judge and the verifier
    disagree on a steady tenth; per-step noise of a batch of a few hundred trajectories."""
    rng = random.Random(seed)
    rows = []
    for step in range(1, steps + 1):
        progress = 0.1 + 0.6 * (1 - math.exp(-step / 20))
        bonus = 0.1 * (1 - math.exp(-step / 4))
        row = {
            "reward/score_mean": progress + bonus + rng.gauss(0, 0.03),
            "reward/solved": 0.8 * progress + rng.gauss(0, 0.03),  # partial credit vs. full solves
            "response/length_mean": 180 * (1 - 0.002 * step) + rng.gauss(0, 8),
            "tools/calls_mean": 1.5 + rng.gauss(0, 0.1),
            "health/suspect/rewarded": 150.0,
            "health/suspect/count": float(rng.random() < 0.3),  # now and then one flagged episode
            "health/disagreement/pairs": 256.0,
            "health/disagreement/rate": min(max(0.1 + rng.gauss(0, 0.02), 0.0), 1.0),
        }
        row["health/suspect/rate"] = row["health/suspect/count"] / 150
        if step % 5 == 0:
            row["eval/success"] = progress + rng.gauss(0, 0.05)
        rows.append(row)
    return rows


def feed(
    health: HealthMonitor, rows: list[dict[str, float]], start: int = 1
) -> tuple[list[dict[str, float]], list[HealthEvent]]:
    logged, events = [], []
    for step, row in enumerate(rows, start):
        metrics = dict(row)
        events += health.observe(step, metrics)
        logged.append(metrics)
    return logged, events


def tripped(events: list[HealthEvent]) -> list[tuple[str, int]]:
    return [(e.alarm, e.step) for e in events if e.kind == "tripped"]


@pytest.mark.parametrize("seed", range(8))
def test_a_healthy_improving_run_raises_no_alarm(seed: int) -> None:
    health = monitor(eval_every=5)
    health.note_eval(0, 0.1)
    logged, events = feed(health, healthy_rows(seed))
    assert tripped(events) == []
    assert [e for e in events if e.kind == "notice"] == []
    assert all(m[f"health/{name}"] == 0.0 for m in logged for name in ALARMS)
    assert all(m["health/alarms"] == 0.0 for m in logged)
    late = logged[-1]  # every statistic is there once the windows are full
    for key in ("audit_gap/reward_rise", "length_drop/drop", "tool_drop/drop", "disagreement/rise"):
        assert f"health/{key}" in late, key


Edit = dict[str, Callable[[int, float], float]]


def edit(rows: list[dict[str, float]], steps: range, changes: Edit) -> list[dict[str, float]]:
    """A copy of ``rows`` where, at each step of ``steps`` (1-based), ``changes[key](step, value)``
    replaces the figure ``key``."""
    out = [dict(row) for row in rows]
    for step in steps:
        row = out[step - 1]
        for key, change in changes.items():
            row[key] = change(step, row.get(key, 0.0))
    return out


def test_audit_gap_trips_when_the_reward_outruns_the_audit_and_clears_when_it_stops() -> None:
    rows = healthy_rows(0, steps=100)
    level = rows[38]["reward/solved"]
    # steps 40-59: the score climbs 0.02 a step more while the audit stays where it was; then the
    # score stops rising (the audit stays behind)
    rows = edit(
        rows,
        range(40, 101),
        {
            "reward/score_mean": lambda step, v: v + 0.02 * (min(step, 60) - 40),
            "reward/solved": lambda step, v: level + (v - rows[step - 1]["reward/solved"]),
        },
    )
    logged, events = feed(monitor(), rows)
    trips = tripped(events)
    assert [name for name, _ in trips] == ["audit_gap"], events
    step = trips[0][1]
    assert 42 <= step <= 55
    assert logged[step - 1]["health/audit_gap"] == 1.0 and logged[step - 2]["health/audit_gap"] == 0.0
    assert logged[step - 1]["health/audit_gap/gap"] > 0.75
    message = next(e for e in events if e.kind == "tripped").message
    assert "ALARM audit_gap" in message and "reward/solved" in message and "reward/score_mean" in message
    cleared = [e for e in events if e.kind == "cleared"]
    assert [e.alarm for e in cleared] == ["audit_gap"] and 60 < cleared[0].step <= 85
    assert logged[-1]["health/audit_gap"] == 0.0


def test_audit_gap_reads_held_out_success_once_per_evaluation() -> None:
    rows = healthy_rows(1, steps=60)
    # from step 30 held-out success stops improving while the score climbs on
    rows = edit(rows, range(30, 61), {"reward/score_mean": lambda step, v: v + 0.015 * (step - 30)})
    rows = edit(rows, range(35, 61, 5), {"eval/success": lambda step, v: 0.45})
    health = monitor(eval_every=5, audit_gap={"signals": []})
    health.note_eval(0, 0.1)
    logged, events = feed(health, rows)
    trips = tripped(events)
    assert [name for name, _ in trips] == ["audit_gap"], events
    assert trips[0][1] % 5 == 0  # verdicts come with evaluations: patience counts evaluations
    assert "eval/success" in next(e for e in events if e.kind == "tripped").message
    assert all("health/audit_gap/reward_rise" not in m for step, m in enumerate(logged, 1) if step % 5)


def test_an_audit_signal_that_never_appears_is_noticed_once() -> None:
    health = monitor(audit_gap={"signals": ["solvd"]})
    _, events = feed(health, [{"reward/score_mean": 0.1, "reward/solved": 0.1}] * 3)
    notices = [e for e in events if e.kind == "notice" and e.alarm == "audit_gap"]
    assert len(notices) == 1
    assert "'solvd'" in notices[0].message and "solved" in notices[0].message


def test_length_drop_trips_on_a_reward_jump_with_collapsing_responses_only() -> None:
    rows = healthy_rows(2, steps=70)
    shorter = {"response/length_mean": lambda step, v: v * max(1 - 0.05 * (step - 40), 0.2)}
    rising = {  # the audit follows: only the length alarm has a case
        "reward/score_mean": lambda step, v: v + 0.02 * (step - 40),
        "reward/solved": lambda step, v: v + 0.02 * (step - 40),
    }
    _, events = feed(monitor(), edit(rows, range(40, 71), {**shorter, **rising}))
    assert [name for name, _ in tripped(events)] == ["length_drop"]
    assert "response/length_mean" in next(e for e in events if e.kind == "tripped").message
    # shorter answers while the reward stays flat: a policy learning to be concise, no alarm
    _, events = feed(monitor(), edit(rows, range(40, 71), shorter))
    assert tripped(events) == []


def test_tool_drop_trips_when_tool_use_collapses_and_ignores_runs_without_tools() -> None:
    rows = healthy_rows(3, steps=70)
    rising = {  # the audit follows: only the tool alarm has a case
        "reward/score_mean": lambda step, v: v + 0.02 * max(step - 40, 0),
        "reward/solved": lambda step, v: v + 0.02 * max(step - 40, 0),
    }
    abandoned = {"tools/calls_mean": lambda step, v: v * max(1 - 0.08 * (step - 40), 0.0)}
    logged, events = feed(monitor(), edit(rows, range(40, 71), {**rising, **abandoned}))
    assert [name for name, _ in tripped(events)] == ["tool_drop"]
    assert max(m.get("health/tool_drop/drop", 0.0) for m in logged) > 0.5
    toolless = edit(rows, range(1, 71), {**rising, "tools/calls_mean": lambda step, v: 0.0})
    logged, events = feed(monitor(), toolless)
    assert "tool_drop" not in [name for name, _ in tripped(events)]
    assert all("health/tool_drop/drop" not in m for m in logged)


def test_suspect_trips_on_a_share_of_flagged_rewarded_trajectories() -> None:
    rows = healthy_rows(4, steps=30)
    flagged = edit(
        rows,
        range(20, 31),
        {
            "health/suspect/count": lambda step, v: 30.0,
            "health/suspect/rate": lambda step, v: 0.2,
            "health/suspect_path/passed_without_plain_values": lambda step, v: 30.0,
        },
    )
    logged, events = feed(monitor(), flagged)
    assert tripped(events) == [("suspect", 21)]  # patience 2: the second flagged step
    message = next(e for e in events if e.kind == "tripped").message
    assert "20% of 150 rewarded" in message and "passed_without_plain_values (30)" in message
    assert logged[20]["health/suspect"] == 1.0
    # a step without rewarded trajectories gives no verdict: it neither trips nor clears
    health = monitor(suspect={"min_rewarded": 4})
    row = {"health/suspect/rewarded": 2.0, "health/suspect/count": 2.0, "health/suspect/rate": 1.0}
    _, events = feed(health, [row] * 5)
    assert tripped(events) == []


def test_disagreement_trips_on_a_high_or_a_rising_rate_and_waits_for_its_signals() -> None:
    rows = healthy_rows(5, steps=60)
    high = edit(rows, range(30, 61), {"health/disagreement/rate": lambda step, v: 0.45})
    _, events = feed(monitor(), high)
    assert tripped(events) == [("disagreement", 31)]
    rising = edit(rows, range(30, 61), {"health/disagreement/rate": lambda step, v: 0.1 + 0.01 * (step - 30)})
    logged, events = feed(monitor(), rising)
    assert [name for name, _ in tripped(events)] == ["disagreement"]
    step = tripped(events)[0][1]
    assert (
        logged[step - 1]["health/disagreement/rate"]
        < 0.3
        < 0.15 + logged[step - 1]["health/disagreement/rise"]
    )
    unpaired = [
        {k: v for k, v in row.items() if not k.startswith("health/disagreement/rate")} for row in rows[:3]
    ]
    _, events = feed(monitor(), unpaired)
    assert [(e.kind, e.alarm) for e in events] == [("notice", "disagreement")]
    assert "'judge'" in events[0].message and "'solved'" in events[0].message


def test_patience_one_trips_at_once_and_unwatched_alarms_log_nothing() -> None:
    row = {"health/suspect/rewarded": 10.0, "health/suspect/count": 5.0, "health/suspect/rate": 0.5}
    health = HealthMonitor(HealthConfig(patience=1))
    metrics = dict(row)
    assert tripped(health.observe(1, metrics)) == [("suspect", 1)]
    assert "health/audit_gap" not in metrics and "health/disagreement" not in metrics  # nothing named
    assert metrics["health/length_drop"] == 0.0 and metrics["health/alarms"] == 1.0
    assert "not watching audit_gap (name health.audit_gap.signals" in health.describe()
    off = HealthMonitor(HealthConfig.model_validate({"length_drop": {"enabled": False}}))
    assert "length_drop (off)" in off.describe()


def test_the_windows_survive_a_checkpoint_as_plain_data() -> None:
    rows = edit(
        healthy_rows(6, steps=60),
        range(35, 61),
        {"reward/score_mean": lambda step, v: v + 0.02 * (step - 35), "reward/solved": lambda step, v: 0.3},
    )
    whole, whole_events = feed(monitor(eval_every=5), rows)
    first = monitor(eval_every=5)
    head, head_events = feed(first, rows[:40])
    saved = json.loads(json.dumps(first.state_dict()))  # plain data: torch.save and JSON both carry it
    second = monitor(eval_every=5)
    second.load_state_dict(saved)
    tail, tail_events = feed(second, rows[40:], start=41)
    assert head + tail == whole
    assert head_events + tail_events == whole_events
    assert any(e.kind == "tripped" for e in whole_events)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.floats(-10, 10, allow_nan=False), min_size=2, max_size=25),
    st.integers(0, 500),
)
def test_fitted_rise_matches_a_least_squares_reference(values: list[float], first_step: int) -> None:
    points = [(first_step + 2 * i, v) for i, v in enumerate(values)]
    slope = np.polyfit([float(x) for x, _ in points], values, 1)[0]
    expected = slope * (points[-1][0] - points[0][0])
    assert fitted_rise(points) == pytest.approx(expected, abs=1e-7 * (1 + max(abs(v) for v in values)))


# --------------------------------------------------------------------------------------------
# Per-trajectory figures: the suspect contract, the disagreement count, every process alike
# --------------------------------------------------------------------------------------------


def scored(i: int, rewards: dict[str, float], metrics: dict[str, float] | None = None) -> Trajectory:
    trajectory = Trajectory(id=f"t{i}", task_id="x", metrics=dict(metrics or {}))
    for name, value in rewards.items():
        weight = 0.0 if name.startswith("suspect/") or name == "solved" else 1.0
        trajectory.rewards.append(RewardSignal(name=name, value=value, weight=weight))
    return trajectory


def test_suspect_paths_come_from_metrics_environments_and_signals() -> None:
    trajectory = scored(
        0,
        {"answer_match": 1.0, "suspect/no_plain_values": 1.0, "suspect/unused": 0.0},
        {"suspect/printed_only": 2.0, "env/suspect/patched_test": 1.0, "env/other": 3.0},
    )
    assert suspect_paths(trajectory) == {"no_plain_values", "printed_only", "patched_test"}
    assert suspect_paths(scored(1, {"answer_match": 1.0})) == set()


def test_counts_summed_over_processes_equal_the_counts_of_the_whole_batch() -> None:
    config = HealthConfig.model_validate(WATCH_ALL)
    batch = [
        scored(0, {"answer_match": 1.0, "judge": 0.9, "solved": 0.0, "suspect/no_plain_values": 1.0}),
        scored(1, {"answer_match": 1.0, "judge": 0.9, "solved": 1.0}),
        scored(2, {"answer_match": 0.0, "judge": 0.0, "solved": 1.0, "suspect/no_plain_values": 1.0}),
        scored(3, {"answer_match": 1.0, "judge": 0.7}, {"env/suspect/patched_test": 1.0}),  # no verifier
    ]
    whole = step_figures([trajectory_counts(batch, config)], config)
    split = step_figures([trajectory_counts(batch[:1], config), trajectory_counts(batch[1:], config)], config)
    assert whole == split
    assert whole["health/suspect/rewarded"] == 3.0  # trajectory 2 scored 0: not rewarded
    assert whole["health/suspect/count"] == 2.0
    assert whole["health/suspect/rate"] == pytest.approx(2 / 3)
    assert whole["health/suspect_path/no_plain_values"] == 1.0
    assert whole["health/suspect_path/patched_test"] == 1.0
    assert whole["health/disagreement/pairs"] == 3.0
    assert whole["health/disagreement/rate"] == pytest.approx(2 / 3)  # 0 (judge yes, verifier no), 2
    assert whole["health/disagreement/rm_only"] == pytest.approx(1 / 3)
    quiet = HealthConfig.model_validate({"suspect": {"enabled": False}})
    assert step_figures([trajectory_counts(batch, quiet)], quiet) == {}


# --------------------------------------------------------------------------------------------
# The config
# --------------------------------------------------------------------------------------------


def test_health_defaults_watch_with_a_warning() -> None:
    config = RunConfig().health
    assert config.enabled and config.action == "warn" and config.patience == 2
    assert config.audit_gap.signals == [] and config.audit_gap.use_eval
    assert (config.audit_gap.window, config.audit_gap.min_reward_rise, config.audit_gap.max_gap) == (
        20,
        0.15,
        0.75,
    )
    assert not config.disagreement.configured


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("health.audit_gap.windw=5", "health.audit_gap.windw: unknown key 'windw'. Did you mean 'window'?"),
        ("health.alarm=stop", "health.alarm: unknown key 'alarm'"),
        ("health.action=panic", "health.action: Input should be 'warn' or 'stop' (got 'panic')"),
        ("health.patience=0", "health.patience: Input should be greater than or equal to 1"),
        (
            "health.length_drop.window=2",
            "health.length_drop.window: Input should be greater than or equal to 3",
        ),
        ("health.suspect.max_rate=1.5", "health.suspect.max_rate: Input should be less than 1"),
        ("health.tool_drop.max_drop=0", "health.tool_drop.max_drop: Input should be greater than 0"),
        (
            "health.disagreement.max_rise=2",
            "health.disagreement.max_rise: Input should be less than or equal to 1",
        ),
        (
            "health.audit_gap.eval_points=1",
            "health.audit_gap.eval_points: Input should be greater than or equal to 2",
        ),
        ("health.audit_gap.signals=[solved, solved]", "signals lists 'solved' more than once"),
        ("health.audit_gap.signals=['']", "signals holds an empty name"),
        ("health.disagreement.reward_model=judge", "reward_model is set but verifier is not"),
        ("health.disagreement={reward_model: x, verifier: x}", "reward_model and verifier are both 'x'"),
    ],
)
def test_bad_health_settings_are_explained(override: str, expected: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(None, [override])
    assert expected in str(caught.value)
    assert str(caught.value.path).startswith("health")


# --------------------------------------------------------------------------------------------
# A short GRPO run with a hackable reward
# --------------------------------------------------------------------------------------------


@pytest.fixture
def registry() -> Any:
    registry = toy_registry()
    registry.register_plugin(AuditPlugin(), "audits")
    yield registry
    reset_registry()


def metrics_of(run_dir: Path) -> list[dict[str, float]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def hacked(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """An 8-step run of the hackable toy task, with what it printed on stderr."""
    import contextlib
    import io

    from agent_r1.run.training import train

    registry = toy_registry()
    registry.register_plugin(AuditPlugin(), "audits")
    tmp = tmp_path_factory.mktemp("hacked")
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            train(write_config(tmp / "run.yaml", hackable_run(model_dir, tmp / "run")), [])
    finally:
        reset_registry()
    return tmp / "run", stderr.getvalue()


@pytest.mark.slow
def test_a_hackable_reward_trips_the_alarms_in_metrics_console_and_log(hacked: tuple[Path, str]) -> None:
    run_dir, stderr = hacked
    lines = metrics_of(run_dir)
    curve = [m["reward/answer_match"] for m in lines]
    assert curve[-1] > curve[0] + 0.5, curve  # the policy learnt what the reward pays for
    assert all(m["reward/solved"] == 0.0 for m in lines)  # ... and not the task
    for alarm in ("audit_gap", "suspect", "disagreement"):
        flags = [m[f"health/{alarm}"] for m in lines]
        assert flags[0] == 0.0 and flags[-1] == 1.0, (alarm, flags)
    log = (run_dir / "run.log").read_text(encoding="utf-8")
    for text in (stderr, log):
        assert "health: watching audit_gap" in text
        assert text.count("health: ALARM audit_gap") == 1  # once when it trips, not every step
        assert "What to do:" in text and "docs/reward_hacking.md#audit_gap" in text
        assert "health: ALARM suspect" in text and "digits_without_number" in text
    assert re.search(r"step \d+/8 .*\| ALARM audit_gap", stderr)  # the progress line shows it


@pytest.mark.slow
def test_a_consistent_audit_raises_no_alarm(
    registry: Any, model_dir: Path, tmp_path: Path, capsys: Any
) -> None:
    from agent_r1.run.training import train

    config = toy_config(
        model_dir,
        tmp_path / "run",
        rewards=[{"name": "target_char", "weight": 1.0}, {"name": "digit_audit", "weight": 0.0}],
        trainer={"steps": 8, "checkpoint_every": 0},
        health={
            "audit_gap": {"signals": ["digits"], "window": 6},
            "disagreement": {"reward_model": "answer_match", "verifier": "digits", "window": 6},
        },
    )
    train(write_config(tmp_path / "run.yaml", config), [])
    lines = metrics_of(tmp_path / "run")
    assert lines[-1]["reward/answer_match"] > lines[0]["reward/answer_match"] + 0.5
    assert any("health/audit_gap/gap" in m for m in lines)  # it was judged, and found healthy
    for m in lines:
        assert m["health/alarms"] == 0.0
        assert all(m[f"health/{name}"] == 0.0 for name in ALARMS), m
    assert "ALARM" not in capsys.readouterr().err


@pytest.mark.slow
def test_action_stop_ends_the_run_naming_the_alarm(registry: Any, model_dir: Path, tmp_path: Path) -> None:
    from agent_r1.run.training import train

    config = hackable_run(model_dir, tmp_path / "run", action="stop")
    with pytest.raises(TrainingAborted) as caught:
        train(write_config(tmp_path / "run.yaml", config), [])
    message = str(caught.value)
    assert "reward-hacking alarm 'suspect' tripped" in message
    assert "health.action=stop" in message and "health.action=warn" in message
    assert "health.suspect.enabled=false" in message and "What to do:" in message
    lines = metrics_of(tmp_path / "run")
    assert lines[-1]["health/suspect"] == 1.0  # the step that tripped is logged
    assert "error: step" in (tmp_path / "run" / "run.log").read_text(encoding="utf-8")


@pytest.mark.slow
def test_resume_restores_the_windows_from_the_checkpoint(
    hacked: tuple[Path, str], registry: Any, model_dir: Path, tmp_path: Path
) -> None:
    import torch

    from agent_r1.engine.artifacts import checkpoint as ckpt
    from agent_r1.run.training import train

    reference, _ = hacked
    path = write_config(tmp_path / "run.yaml", hackable_run(model_dir, tmp_path / "run"))
    train(path, ["trainer.steps=4"])
    state = torch.load(
        ckpt.latest_checkpoint(tmp_path / "run" / "checkpoints") / "state.pt", weights_only=False
    )
    assert state["health"]["series"]["reward/score_mean"][-1][0] == 4
    train(path, [], resume=True, allow_config_change=True)
    expected, resumed = metrics_of(reference), metrics_of(tmp_path / "run")
    assert [m["step"] for m in resumed] == list(range(1, 9))
    for want, got in zip(expected[4:], resumed[4:], strict=True):  # the steps after the resume
        health = {k: v for k, v in want.items() if k.startswith("health/")}
        assert {k for k in got if k.startswith("health/")} == set(health), got["step"]
        for key, value in health.items():
            assert got[key] == pytest.approx(value, rel=1e-5, abs=1e-6), (got["step"], key)


@pytest.mark.slow
def test_every_process_judges_the_alarms_alike(model_dir: Path, tmp_path: Path) -> None:
    """Two processes (gloo) see different trajectories but the same gathered figures, so their
    alarms trip at the same steps (``action: stop`` then stops them together)."""
    import os
    import socket
    import subprocess
    import sys

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = str(sock.getsockname()[1])
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}
    worker = Path(__file__).with_name("health_worker.py")
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_addr=127.0.0.1"]
    command += [f"--master_port={port}", str(worker), str(model_dir), str(tmp_path), "5"]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    first, second = (json.loads((tmp_path / f"health.rank{r}.json").read_text()) for r in (0, 1))
    assert first == second
    assert first[-1]["health/suspect"] == 1.0  # not a vacuous comparison: an alarm tripped
    assert first[-1]["health/disagreement/pairs"] == 16.0  # both processes' trajectories counted
