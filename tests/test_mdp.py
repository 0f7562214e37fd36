"""Token-faithful trajectories: derived views against a naive reference, and the JSONL round trip."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent_r1 import SCHEMA_VERSION, TrajectoryError
from agent_r1.mdp import (
    Action,
    Observation,
    RewardSignal,
    Segment,
    Step,
    Task,
    TokenSource,
    Trajectory,
    load_trajectories,
    save_trajectories,
)

SETTINGS = settings(max_examples=120, deadline=None, derandomize=True)


@dataclass
class Piece:
    """One ``Trajectory.append`` call of a generated episode."""

    source: TokenSource
    turn: int
    token_ids: list[int]
    logprobs: list[float] | None


@st.composite
def pieces(draw: st.DrawFn) -> list[Piece]:
    """A random episode: sources and token runs in any order, turns that never go back."""
    count = draw(st.integers(0, 12))
    turn = 0
    out: list[Piece] = []
    for _ in range(count):
        turn += draw(st.sampled_from([0, 0, 1, 2]))
        source = draw(st.sampled_from(list(TokenSource)))
        n = draw(st.integers(1, 4))
        token_ids = draw(st.lists(st.integers(0, 50_000), min_size=n, max_size=n))
        logprobs = None
        if source is TokenSource.POLICY:
            logprobs = draw(
                st.lists(st.floats(-30.0, 0.0, allow_nan=False, allow_infinity=False), min_size=n, max_size=n)
            )
        out.append(Piece(source, turn, token_ids, logprobs))
    return out


@st.composite
def signals(draw: st.DrawFn, max_turn: int) -> list[RewardSignal]:
    values = st.floats(-10.0, 10.0, allow_nan=False, allow_infinity=False)
    out = []
    for i in range(draw(st.integers(0, 5))):
        kind = draw(st.sampled_from(["outcome", "process"]))
        out.append(
            RewardSignal(
                name=f"r{i}",
                value=draw(values),
                kind=kind,
                turn=draw(st.integers(0, max_turn + 1)) if kind == "process" else None,
                weight=draw(st.floats(0.0, 2.0, allow_nan=False)),
                source="test",
            )
        )
    return out


def build(episode: list[Piece]) -> Trajectory:
    trajectory = Trajectory(id="t", task_id="task", group_id="g")
    for piece in episode:
        trajectory.append(piece.source, piece.turn, piece.token_ids, piece.logprobs)
    return trajectory


def naive_views(episode: list[Piece], rewards: list[RewardSignal]) -> dict[str, list]:
    """Per-token views computed the obvious way, from the appended pieces (not the segments)."""
    tokens = [
        (p.source, p.turn, t, (p.logprobs or [0.0] * len(p.token_ids))[i])
        for p in episode
        for i, t in enumerate(p.token_ids)
    ]
    policy = [i for i, (source, _, _, _) in enumerate(tokens) if source is TokenSource.POLICY]
    token_rewards = [0.0] * len(tokens)
    if policy:
        for signal in rewards:
            if signal.kind == "outcome":
                index = policy[-1]
            else:
                earlier = [i for i in policy if tokens[i][1] <= (signal.turn or 0)]
                index = earlier[-1] if earlier else policy[0]
            token_rewards[index] += signal.value * signal.weight
    return {
        "token_ids": [t for _, _, t, _ in tokens],
        "sources": [s for s, _, _, _ in tokens],
        "turn_ids": [turn for _, turn, _, _ in tokens],
        "loss_mask": [int(s is TokenSource.POLICY) for s, _, _, _ in tokens],
        "logprobs": [lp if s is TokenSource.POLICY else 0.0 for s, _, _, lp in tokens],
        "token_rewards": token_rewards,
        "prompt_length": [policy[0] if policy else len(tokens)],
        "num_turns": [len({tokens[i][1] for i in policy})],
    }


def with_steps(trajectory: Trajectory) -> Trajectory:
    """Add one step per turn with policy tokens, its action holding exactly those tokens."""
    for turn in sorted({s.turn for s in trajectory.segments if s.source is TokenSource.POLICY}):
        segments = [s for s in trajectory.segments if s.source is TokenSource.POLICY and s.turn == turn]
        action = Action(
            token_ids=[t for s in segments for t in s.token_ids],
            logprobs=[lp for s in segments for lp in (s.logprobs or [])],
            text=f"action {turn}",
        )
        trajectory.steps.append(Step(turn=turn, action=action, observation=Observation(done=False)))
    return trajectory


@SETTINGS
@given(data=st.data())
def test_derived_views_match_a_naive_reference(data: st.DataObject) -> None:
    episode = data.draw(pieces())
    trajectory = build(episode)
    max_turn = max((p.turn for p in episode), default=0)
    trajectory.rewards = data.draw(signals(max_turn))
    expected = naive_views(episode, trajectory.rewards)
    assert trajectory.token_ids == expected["token_ids"]
    assert trajectory.sources == expected["sources"]
    assert trajectory.turn_ids == expected["turn_ids"]
    assert trajectory.loss_mask == expected["loss_mask"]
    assert trajectory.logprobs == expected["logprobs"]
    assert trajectory.token_rewards() == pytest.approx(expected["token_rewards"])
    assert [trajectory.prompt_length] == expected["prompt_length"]
    assert [trajectory.num_turns] == expected["num_turns"]
    assert len(trajectory) == len(expected["token_ids"])
    assert trajectory.num_policy_tokens == sum(expected["loss_mask"])
    if any(expected["loss_mask"]):
        assert sum(trajectory.token_rewards()) == pytest.approx(trajectory.score)
    # consecutive appends with one source and turn share a segment
    for before, after in zip(trajectory.segments, trajectory.segments[1:], strict=False):
        assert (before.source, before.turn) != (after.source, after.turn)


@SETTINGS
@given(data=st.data())
def test_jsonl_round_trip_is_lossless(data: st.DataObject) -> None:
    episode = data.draw(pieces())
    trajectory = with_steps(build(episode))
    trajectory.rewards = data.draw(signals(max((p.turn for p in episode), default=0)))
    trajectory.termination = data.draw(st.sampled_from([None, "answer", "max_turns"]))
    trajectory.truncated = data.draw(st.booleans())
    trajectory.policy_version = data.draw(st.integers(0, 1000))
    trajectory.metrics = {"tool_s": data.draw(st.floats(0, 100, allow_nan=False))}
    line = trajectory.to_json_line()
    assert "\n" not in line
    stored = json.loads(line)
    assert stored["schema_version"] == SCHEMA_VERSION
    assert all("token_ids" not in step["action"] for step in stored["steps"]), "tokens are stored once"
    restored = Trajectory.from_json_line(line)
    assert restored == trajectory
    assert restored.loss_mask == trajectory.loss_mask
    assert restored.token_rewards() == trajectory.token_rewards()


def test_save_and_load_a_file(tmp_path: Path) -> None:
    first = with_steps(
        build([Piece(TokenSource.PROMPT, 0, [1, 2], None), Piece(TokenSource.POLICY, 0, [3], [-0.5])])
    )
    second = first.model_copy(update={"id": "t2"}, deep=True)
    path = tmp_path / "sub" / "trajectories.jsonl"
    assert save_trajectories(path, [first]) == 1
    assert save_trajectories(path, [second], append=True) == 1
    assert load_trajectories(path) == [first, second]


def test_a_newer_schema_version_is_refused_clearly(tmp_path: Path) -> None:
    data = json.loads(build([Piece(TokenSource.POLICY, 0, [3], [-0.5])]).to_json_line())
    data["schema_version"] = SCHEMA_VERSION + 1
    path = tmp_path / "future.jsonl"
    path.write_text(json.dumps(data) + "\n", encoding="utf-8")
    with pytest.raises(TrajectoryError) as caught:
        load_trajectories(path)
    message = str(caught.value)
    assert message.startswith(f"{path}:1: trajectory schema version {SCHEMA_VERSION + 1} is newer")
    assert "upgrade agent-r1" in message


@pytest.mark.parametrize(
    ("bad_line", "expected"),
    [
        ("{not json", "not a valid trajectory"),
        ('["a list"]', "expected a JSON object"),
        ('{"id": "x"}', "task_id"),
        (
            '{"id": "x", "task_id": "t", "segments": '
            '[{"source": "env", "turn": 0, "token_ids": [1], "logprobs": [0.0]}]}',
            "env segment of turn 0 must not carry logprobs",
        ),
        (
            '{"id": "x", "task_id": "t", "segments": [{"source": "policy", "turn": 1, "token_ids": [1]},'
            ' {"source": "env", "turn": 0, "token_ids": [2]}]}',
            "segment 1 has turn 0 after turn 1",
        ),
    ],
)
def test_a_corrupt_line_names_file_and_line(tmp_path: Path, bad_line: str, expected: str) -> None:
    good = build([Piece(TokenSource.POLICY, 0, [3], [-0.5])]).to_json_line()
    path = tmp_path / "mixed.jsonl"
    path.write_text(f"{good}\n\n{bad_line}\n", encoding="utf-8")
    with pytest.raises(TrajectoryError) as caught:
        load_trajectories(path)
    assert str(caught.value).startswith(f"{path}:3: ")
    assert expected in str(caught.value)


def test_segment_and_signal_validation() -> None:
    with pytest.raises(ValueError, match="2 tokens but 1 log-probabilities"):
        Segment(source=TokenSource.POLICY, turn=0, token_ids=[1, 2], logprobs=[-0.1])
    with pytest.raises(ValueError, match="needs the turn it rewards"):
        RewardSignal(name="p", value=1.0, kind="process")
    with pytest.raises(ValueError, match="non-finite"):
        RewardSignal(name="o", value=float("nan"))
    with pytest.raises(ValueError, match="no 'role' key"):
        Task(id="t", messages=[{"content": "hi"}])


def test_append_refuses_going_back_and_mixing_logprobs() -> None:
    trajectory = build([Piece(TokenSource.POLICY, 1, [1], [-0.1])])
    with pytest.raises(TrajectoryError, match="cannot append turn 0 after turn 1"):
        trajectory.append(TokenSource.ENV, 0, [2])
    with pytest.raises(TrajectoryError, match="with and without logprobs"):
        trajectory.append(TokenSource.POLICY, 1, [3])
    trajectory.append(TokenSource.ENV, 1, [])  # nothing to add is fine
    assert trajectory.token_ids == [1]


def test_process_reward_placement_follows_the_turn() -> None:
    # prompt(t0) policy(t0) env(t0) template(t1) policy(t1) env(t1) [turn 2 has no policy token]
    trajectory = build(
        [
            Piece(TokenSource.PROMPT, 0, [1, 2], None),
            Piece(TokenSource.POLICY, 0, [3, 4], [-0.1, -0.2]),
            Piece(TokenSource.ENV, 0, [5], None),
            Piece(TokenSource.TEMPLATE, 1, [6], None),
            Piece(TokenSource.POLICY, 1, [7], [-0.3]),
            Piece(TokenSource.ENV, 2, [8], None),
        ]
    )
    trajectory.rewards = [
        RewardSignal(name="outcome", value=1.0),
        RewardSignal(name="turn0", value=0.5, kind="process", turn=0),
        RewardSignal(name="turn2", value=0.25, kind="process", turn=2, weight=2.0),
    ]
    assert trajectory.token_rewards() == [0.0, 0.0, 0.0, 0.5, 0.0, 0.0, 1.5, 0.0]
    assert trajectory.score == pytest.approx(2.0)
    assert trajectory.reward_by_name() == {"outcome": 1.0, "turn0": 0.5, "turn2": 0.25}
    assert trajectory.last_policy_index(0) == 3 and trajectory.last_policy_index() == 6
