"""Run reports (agent_r1.engine.reports.report): metrics loading, the curve PNG and the HTML page."""

from __future__ import annotations

import base64
import json
import math
import re
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from agent_r1.engine.reports.evaluation import summarize_eval
from agent_r1.engine.reports.report import (
    load_metrics,
    plot_curves,
    rolling_mean,
    signal_keys,
    write_html_report,
)
from agent_r1.mdp import (
    Action,
    Observation,
    RewardSignal,
    Step,
    Task,
    TokenSource,
    ToolCall,
    ToolResult,
    Trajectory,
    save_trajectories,
)

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
VOID_ELEMENTS = {"meta", "img", "br", "hr", "link", "input"}


def fake_metrics(steps: int = 30) -> list[dict[str, Any]]:
    """Metrics of a run that learns, then collapses (zero-variance groups and format errors rise)."""
    rows = []
    for step in range(steps):
        collapsed = step >= 20
        reward = 0.0 if collapsed else 0.2 + 0.03 * step + 0.05 * math.sin(step)
        rows.append(
            {
                "step": step,
                "reward/score_mean": reward,
                "reward/score_std": 0.1,
                "reward/answer_match": reward,
                "reward/tool_call": 0.1,
                "batch/zero_variance_groups": 1.0 if collapsed else 0.25,
                "rollout/format_error_rate": 0.8 if collapsed else 0.1,
                "response/truncated": 0.0,
                "tools/error_rate": 0.05,
                "termination/max_turns": 1.0 if collapsed else 0.0,
                "termination/answer": 0.0 if collapsed else 1.0,
                "tools/calls_mean": 4.0 if collapsed else 1.0,
                "response/turns_mean": 4.0 if collapsed else 2.0,
                "time/step_s": 3.5,
            }
        )
        if step % 10 == 9:
            rows[-1]["eval/success"] = 0.5
    return rows


def test_load_metrics_skips_broken_lines_and_sorts(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text(
        '{"step": 1, "reward/score_mean": 0.5}\n'
        '{"step": 0, "reward/score_mean": 0.25}\n'
        "\n"
        '["not", "a", "dict"]\n'
        '{"no_step": 3}\n'
        '{"step": 2, "reward/sc',  # a line cut short by a kill
        encoding="utf-8",
    )
    assert load_metrics(path) == [
        {"step": 0, "reward/score_mean": 0.25},
        {"step": 1, "reward/score_mean": 0.5},
    ]
    assert load_metrics(tmp_path / "missing.jsonl") == []


def test_rolling_mean_matches_naive() -> None:
    values = [3.0, 1.0, 4.0, 1.0, 5.0, 9.0, 2.0]
    for window in (1, 2, 3, 10):
        naive = [
            sum(values[max(0, i - window + 1) : i + 1]) / len(values[max(0, i - window + 1) : i + 1])
            for i in range(len(values))
        ]
        assert rolling_mean(values, window) == pytest.approx(naive)
    with pytest.raises(ValueError):
        rolling_mean(values, 0)


def test_signal_keys_skip_statistics() -> None:
    assert signal_keys(fake_metrics(2)) == ["reward/answer_match", "reward/tool_call"]


def _assert_png(path: Path, min_bytes: int) -> None:
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE
    assert data[12:16] == b"IHDR"
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert width >= 400 and height >= 400
    assert len(data) > min_bytes


def test_plot_curves_writes_a_png(tmp_path: Path) -> None:
    path = plot_curves(fake_metrics(), tmp_path / "plots" / "reward_curve.png")
    _assert_png(path, min_bytes=20_000)
    empty = plot_curves([], tmp_path / "empty.png")
    _assert_png(empty, min_bytes=5_000)
    # more curves draw more pixels: the figure really depends on the metrics
    assert path.stat().st_size > empty.stat().st_size


class _Checker(HTMLParser):
    """Collects tags and checks that every non-void element is closed in order."""

    def __init__(self) -> None:
        super().__init__()
        self.stack: list[str] = []
        self.tags: list[str] = []
        self.images: list[str] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        if tag == "img":
            self.images.append(dict(attrs).get("src") or "")
        if tag not in VOID_ELEMENTS:
            self.stack.append(tag)

    def handle_endtag(self, tag: str) -> None:
        assert self.stack and self.stack[-1] == tag, f"</{tag}> closes {self.stack[-1:]}"
        self.stack.pop()

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def _trajectory(index: int, text: str) -> Trajectory:
    trajectory = Trajectory(id=f"eval#{index}", task_id="t1", termination="answer")
    trajectory.append(TokenSource.PROMPT, 0, [1, 2])
    trajectory.append(TokenSource.POLICY, 0, [3, 4], [-0.1, -0.2])
    trajectory.append(TokenSource.ENV, 0, [5])
    trajectory.append(TokenSource.POLICY, 1, [6])
    call = ToolCall(id="c0", name="calculator", arguments={"expression": "2<3"})
    trajectory.steps = [
        Step(
            turn=0,
            action=Action(text=text, tool_calls=[call]),
            observation=Observation(
                tool_results=[ToolResult(call_id="c0", name="calculator", content="True & <ok>", ok=True)]
            ),
        ),
        Step(turn=1, action=Action(text="<answer>7</answer>", answer="7 <b>")),
    ]
    trajectory.rewards = [RewardSignal(name="answer_match", value=1.0)]
    return trajectory


def _summaries() -> tuple[dict[str, Any], dict[str, Any]]:
    task_map = {
        "t1": Task(id="t1", messages=[{"role": "user", "content": "q"}], answer="7", category="add<sub>"),
        "t2": Task(id="t2", messages=[{"role": "user", "content": "q"}], answer="8", category="mul"),
    }
    good = _trajectory(0, "x")
    bad = _trajectory(1, "y")
    bad.rewards = [RewardSignal(name="answer_match", value=0.0)]
    other = _trajectory(2, "z").model_copy(update={"task_id": "t2", "termination": "max_turns"})
    before = summarize_eval([bad, other], task_map)
    after = summarize_eval([good, other], task_map)
    return before, after


def test_html_report_is_self_contained_and_escaped(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    metrics = fake_metrics()
    png = plot_curves(metrics, run_dir / "reward_curve.png")
    save_trajectories(
        run_dir / "samples.jsonl", [_trajectory(i, f"<script>alert({i})</script> 1 < 2") for i in range(5)]
    )
    before, after = _summaries()
    config = {"model": {"path": "<tiny>"}, "rewards": [{"name": "answer_match", "weight": 1.0}]}

    out = write_html_report(run_dir, config, metrics, before, after, png, max_samples=2)
    assert out == run_dir / "report.html"
    page = out.read_text(encoding="utf-8")

    checker = _Checker()
    checker.feed(page)
    checker.close()
    assert checker.stack == [], f"unclosed elements: {checker.stack}"
    assert "script" not in checker.tags and "sub" not in checker.tags

    (src,) = checker.images
    assert src.startswith("data:image/png;base64,")
    assert base64.b64decode(src.split(",", 1)[1]) == png.read_bytes()
    assert not re.search(r"""(src|href)=["']?(https?:|//|file:)""", page)  # nothing external

    text = "".join(checker.text)
    assert "<script>alert(0)</script> 1 < 2" in text  # shown as text...
    assert "&lt;script&gt;alert(0)&lt;/script&gt; 1 &lt; 2" in page  # ...because it was escaped
    assert "alert(2)" not in text  # only max_samples trajectories
    assert "2 of 5 trajectories" in text
    assert "True & <ok>" in text and "7 <b>" in text
    assert '"path": "<tiny>"' in text
    assert "success: add<sub> (n=1)" in text
    assert "+50.0 pp" in text
    assert "max_turns" in text  # termination reasons
    assert "time/step_s" in text  # last step's metrics


def test_html_report_without_figure_eval_or_samples(tmp_path: Path) -> None:
    out = write_html_report(tmp_path, {}, [], None, None, None)
    page = out.read_text(encoding="utf-8")
    checker = _Checker()
    checker.feed(page)
    assert checker.stack == []
    assert "No figure was drawn." in page
    assert "No evaluation was run." in page
    assert "No example trajectories" in page


def test_html_report_falls_back_to_eval_trajectories_and_one_summary(tmp_path: Path) -> None:
    save_trajectories(tmp_path / "eval_after.jsonl", [_trajectory(0, "from eval")])
    _, after = _summaries()
    page = write_html_report(tmp_path, {}, fake_metrics(3), None, after, tmp_path / "missing.png").read_text(
        encoding="utf-8"
    )
    assert "from eval" in page and "eval_after.jsonl" in page
    assert "<th>after training</th>" in page
    (tmp_path / "samples.jsonl").write_text("{not json}\n", encoding="utf-8")
    page = write_html_report(tmp_path, {}, [], None, after, None).read_text(encoding="utf-8")
    assert "Could not read samples.jsonl" in page


def test_metrics_file_round_trip(tmp_path: Path) -> None:
    metrics = fake_metrics(5)
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in metrics), encoding="utf-8")
    assert load_metrics(path) == metrics
