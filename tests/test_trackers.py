"""Built-in trackers: jsonl, tensorboard (event file read back), wandb (adapter and missing
package), console; and the harness's tracker checker."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from agent_r1.builtins.trackers import (
    TRACKERS,
    ConsoleTracker,
    JsonlTracker,
    TensorBoardTracker,
    TrackerError,
    WandbTracker,
)
from agent_r1.testing import check_tracker


def test_the_bundled_trackers() -> None:
    assert [t.name for t in TRACKERS] == ["jsonl", "tensorboard", "wandb", "console"]


def test_jsonl_writes_one_flushed_object_per_step(tmp_path: Path) -> None:
    tracker = JsonlTracker()
    tracker.start(tmp_path, {"seed": 0})
    tracker.log({"reward/mean": 0.5, "actor/loss": 1.25, "step": 99}, 0)
    lines = (tmp_path / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    assert [json.loads(line) for line in lines] == [{"step": 0, "reward/mean": 0.5, "actor/loss": 1.25}]
    tracker.log({"reward/mean": float("nan"), "actor/kl": float("inf"), "note": "text", "flag": True}, 1)
    tracker.close()
    records = [
        json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    ]
    assert records[1] == {"step": 1, "reward/mean": None, "actor/kl": None, "flag": 1}


def test_jsonl_appends_for_a_resumed_run_and_converts_tensors(tmp_path: Path) -> None:
    import numpy as np
    import torch

    for step in range(2):
        tracker = JsonlTracker({"filename": "m.jsonl"})
        tracker.start(tmp_path / "run", {})
        tracker.log({"loss": torch.tensor(0.25), "tokens": np.int64(7), "vector": torch.ones(3)}, step)
        tracker.close()
    records = [
        json.loads(line) for line in (tmp_path / "run" / "m.jsonl").read_text(encoding="utf-8").splitlines()
    ]
    assert records == [{"step": 0, "loss": 0.25, "tokens": 7}, {"step": 1, "loss": 0.25, "tokens": 7}]


def test_logging_before_start_is_an_error() -> None:
    with pytest.raises(TrackerError, match="before start"):
        JsonlTracker().log({"a": 1.0}, 0)


@pytest.mark.skipif(importlib.util.find_spec("tensorboard") is None, reason="tensorboard is not installed")
def test_tensorboard_event_file_reads_back(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tracker = check_tracker(TensorBoardTracker, tmp_path)
    assert isinstance(tracker, TensorBoardTracker)
    log_dir = tmp_path / "tensorboard"
    assert any(log_dir.glob("events.out.tfevents.*"))
    events = EventAccumulator(str(log_dir))
    events.Reload()
    assert set(events.Tags()["scalars"]) == {"reward/score_mean", "actor/loss"}
    rewards = [(e.step, e.value) for e in events.Scalars("reward/score_mean")]
    assert rewards == [(0, 0.5), (1, 0.75)]


def test_tensorboard_missing_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "tensorboard" else real(name, *a)
    )
    with pytest.raises(TrackerError, match=r"pip install agent-r1\[tensorboard\]"):
        TensorBoardTracker()


def test_wandb_missing_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a)
    )
    with pytest.raises(TrackerError) as caught:
        WandbTracker({"mode": "offline"})
    assert "pip install agent-r1[wandb]" in str(caught.value)
    assert "remove 'wandb' from `trackers`" in str(caught.value)


def test_wandb_passes_options_and_numbers_to_the_library(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[tuple[str, Any]] = []

    class FakeRun:
        def log(self, data: dict[str, Any], step: int) -> None:
            calls.append(("log", (data, step)))

        def finish(self) -> None:
            calls.append(("finish", None))

    fake = types.ModuleType("wandb")
    fake.init = lambda **kwargs: calls.append(("init", kwargs)) or FakeRun()  # type: ignore[attr-defined]
    fake.__spec__ = importlib.machinery.ModuleSpec("wandb", None)
    monkeypatch.setitem(sys.modules, "wandb", fake)
    tracker = WandbTracker({"project": "p", "mode": "offline", "tags": ["a"]})
    tracker.start(tmp_path, {"seed": 3})
    tracker.log({"reward/mean": 0.5, "bad": float("nan"), "text": "x", "step": 4}, 4)
    tracker.close()
    init = calls[0][1]
    assert (init["project"], init["mode"], init["tags"], init["dir"]) == (
        "p",
        "offline",
        ["a"],
        str(tmp_path),
    )
    assert init["config"] == {"seed": 3}
    assert calls[1:] == [("log", ({"reward/mean": 0.5}, 4)), ("finish", None)]


def test_wandb_rejects_an_unknown_mode() -> None:
    with pytest.raises(ValueError, match="mode"):
        WandbTracker.Config(mode="sometimes")  # type: ignore[arg-type]


def test_console_prints_the_chosen_metrics(capsys: pytest.CaptureFixture[str]) -> None:
    tracker = ConsoleTracker({"every": 2, "keys": ["reward/mean", "missing"], "stream": "stdout"})
    for step in range(4):
        tracker.log({"reward/mean": step / 4}, step)
    assert capsys.readouterr().out.splitlines() == ["step 0: reward/mean=0", "step 2: reward/mean=0.5"]
