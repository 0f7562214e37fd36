"""Contracts of the extended MDP (Agent-R1, arXiv 2511.14460).

State = the whole interaction history, token-exact. Action = a token sequence the policy sampled,
which may contain tool calls. Transition = append the action, then the environment's (possibly
stochastic) response. Reward = outcome signals at the end plus process signals at turns.

A :class:`Trajectory` is *token-faithful*: it is an ordered list of :class:`Segment`s, each holding
exactly the token ids that were sampled by the policy or inserted by the prompt, the environment or
the chat template, with the turn it belongs to and (for policy tokens) the log-probability each
token had under the sampling distribution. Everything the learner needs (loss mask, turn ids,
per-token rewards) is *derived* from the segments, never stored twice.

Turn numbering: the prompt and the first action are turn 0; the observation that answers action
``t`` belongs to turn ``t``; template tokens that open the next assistant message belong to turn
``t + 1``.

End-of-turn tokens: when the policy itself samples the end-of-turn token (``<|im_end|>``, EOS), it is
a policy token and carries loss like any other sampled token. When generation stopped on a stop
sequence (e.g. ``</tool_call>``) the engine inserts the end-of-turn token as a ``template`` token:
it was not sampled, has no log-probability and carries no loss.

This module imports neither torch nor any other heavy dependency.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator
from enum import Enum
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from agent_r1.errors import TrajectoryError

SCHEMA_VERSION = 2
"""Version of the trajectory JSONL schema. Loaders refuse newer versions with a clear error.
Version 2 added :attr:`Trajectory.start_info`; files of version 1 load unchanged."""

Message = dict[str, Any]
"""A chat message as accepted by Hugging Face chat templates (``{"role": ..., "content": ...}``)."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=False)


class TokenSource(str, Enum):
    """Who produced a token."""

    PROMPT = "prompt"
    """The rendered task (system prompt, user message, tool schemas)."""
    POLICY = "policy"
    """Sampled by the policy: the only tokens that carry loss, KL and entropy."""
    ENV = "env"
    """Inserted by the environment: tool results and feedback, with their chat-template wrapping."""
    TEMPLATE = "template"
    """Inserted by the engine between an action and an observation (e.g. an end-of-turn token
    after a stop sequence, or the header that opens the next assistant message)."""


class Task(_Model):
    """One problem instance: the initial messages, the reference answer and free metadata."""

    id: str
    messages: list[Message]
    answer: Any = None
    category: str | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)

    @field_validator("messages")
    @classmethod
    def _messages_have_roles(cls, messages: list[Message]) -> list[Message]:
        for i, message in enumerate(messages):
            if "role" not in message:
                raise ValueError(f"message {i} has no 'role' key: {message!r}")
        return messages


class ToolCall(_Model):
    """A tool invocation parsed out of an action."""

    id: str
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    raw: str = ""
    """The exact text span of the call in the action."""


class ToolResult(_Model):
    """What a tool returned (or why it failed) for one :class:`ToolCall`."""

    call_id: str
    name: str
    content: str
    ok: bool = True
    error: str | None = None
    """Error kind when ``ok`` is false: ``exception``, ``timeout``, ``unknown_tool``, ``bad_arguments``,
    ``infrastructure`` (a tool that shows its infrastructure errors to the agent)..."""
    truncated: bool = False
    started_at: float | None = None
    """Monotonic clock time (``time.monotonic()``) when the call started."""
    finished_at: float | None = None

    @property
    def duration_s(self) -> float:
        """Seconds the call took (0.0 when either time is unknown)."""
        if self.started_at is None or self.finished_at is None:
            return 0.0
        return self.finished_at - self.started_at


class RewardSignal(_Model):
    """One named reward. ``outcome`` signals score the whole trajectory; ``process`` signals a turn.

    The engine places an outcome signal on the last policy token of the trajectory and a process
    signal on the last policy token of its turn, multiplied by ``weight``.
    """

    name: str
    value: float
    kind: Literal["outcome", "process"] = "outcome"
    turn: int | None = None
    weight: float = 1.0
    source: str | None = None
    """The component that emitted it (reward shaper or environment name)."""

    @model_validator(mode="after")
    def _check(self) -> RewardSignal:
        if not math.isfinite(self.value):
            raise ValueError(f"reward signal {self.name!r} has a non-finite value {self.value}")
        if self.kind == "process" and self.turn is None:
            raise ValueError(f"process reward signal {self.name!r} needs the turn it rewards")
        return self

    @property
    def weighted(self) -> float:
        """``value * weight``: what the engine adds to the token rewards."""
        return self.value * self.weight


FinishReason = Literal["eos", "stop", "length", "context"]


class Action(_Model):
    """What the policy produced in one turn: sampled token ids, their log-probabilities, the decoded
    text, and what the tool-call format parsed out of it."""

    token_ids: list[int] = Field(default_factory=list)
    logprobs: list[float] | None = None
    text: str = ""
    finish_reason: FinishReason = "eos"
    stop_sequence: str | None = None
    """The stop sequence that ended generation (``finish_reason == "stop"``); ``text`` includes it."""
    tool_calls: list[ToolCall] = Field(default_factory=list)
    answer: str | None = None
    parse_errors: list[str] = Field(default_factory=list)


class Observation(_Model):
    """The environment's response to an action: messages to append (or a continuation of the
    assistant's turn), rewards, and whether it ended."""

    messages: list[Message] = Field(default_factory=list)
    tool_results: list[ToolResult] = Field(default_factory=list)
    rewards: list[RewardSignal] = Field(default_factory=list)
    done: bool = False
    termination: str | None = None
    """Why the episode ended: ``answer``, ``no_tool_call``, ``max_turns``, ``max_tokens``, ..."""
    info: dict[str, Any] = Field(default_factory=dict)
    metrics: dict[str, float] = Field(default_factory=dict)
    """Numeric figures of this step that a run should log (a retriever's latency, reconnects to a
    server, a sandbox's memory). The engine sums each name over the episode's steps into
    ``Trajectory.metrics["env/<name>"]``, and the trainer logs their mean over the batch as the step
    metric ``env/<name>``. Report per-step amounts (deltas), not running totals."""
    tool_calls: list[ToolCall] | None = None
    """What the environment parsed out of the action (``None``: it does not parse actions). The
    engine copies ``tool_calls``, ``answer`` and ``parse_errors`` into the recorded
    :class:`Action`; an environment returns them here instead of writing into the action."""
    answer: str | None = None
    parse_errors: list[str] | None = None
    continuation: str | None = None
    """Text that continues the assistant's own turn instead of chat ``messages`` (Search-R1's
    ``<information>`` blocks): the engine appends its tokens (tokenised on their own) as
    environment tokens with no chat-template closure or header, and the next action goes on in the
    same assistant message. Leave ``messages`` empty when it is set."""


class Step(_Model):
    """One turn of an episode: the action, the observation that answered it and timings."""

    turn: int
    action: Action
    observation: Observation | None = None
    generation_s: float = 0.0
    tool_s: float = 0.0


class Segment(_Model):
    """A run of consecutive tokens with one provenance and one turn."""

    source: TokenSource
    turn: int
    token_ids: list[int]
    logprobs: list[float] | None = None

    @model_validator(mode="after")
    def _check(self) -> Segment:
        if self.source is TokenSource.POLICY:
            if self.logprobs is not None and len(self.logprobs) != len(self.token_ids):
                raise ValueError(
                    f"policy segment of turn {self.turn} has {len(self.token_ids)} tokens but "
                    f"{len(self.logprobs)} log-probabilities"
                )
        elif self.logprobs is not None:
            raise ValueError(f"{self.source.value} segment of turn {self.turn} must not carry logprobs")
        if self.turn < 0:
            raise ValueError(f"segment turn must be >= 0, got {self.turn}")
        return self


class Trajectory(_Model):
    """A token-faithful episode. See the module docstring for the conventions."""

    schema_version: int = SCHEMA_VERSION
    id: str
    task_id: str
    group_id: str = ""
    sample_index: int = 0
    segments: list[Segment] = Field(default_factory=list)
    steps: list[Step] = Field(default_factory=list)
    rewards: list[RewardSignal] = Field(default_factory=list)
    policy_version: int = 0
    turn_versions: dict[int, int] = Field(default_factory=dict)
    """The weights version (completed updates) that generated each action turn, by turn index,
    when it may differ from ``policy_version`` (asynchronous rollouts, whose weights can change
    between turns); empty when every turn was generated by ``policy_version``. Since: 0.3.0"""
    start_info: dict[str, Any] = Field(default_factory=dict)
    """What the environment said about the initial state when the episode started
    (``EpisodeStart.info``), e.g. ``state_key``: the name of the initial state, GiGPO's anchor
    for turn 0 (see :mod:`agent_r1.engine.learner.turns`). Since: 0.2.0"""
    termination: str | None = None
    truncated: bool = False
    """True when a budget (tokens per turn or total context) cut the episode short."""
    metrics: dict[str, float] = Field(default_factory=dict)
    errors: list[str] = Field(default_factory=list)
    """Failures that were not the agent's doing (an environment step or a reward shaper raised),
    one line each. Training leaves such trajectories out of the update and counts them."""

    def versions(self) -> list[int]:
        """The weights version of each action turn, in turn order (``policy_version`` for turns
        :attr:`turn_versions` does not list)."""
        turns = sorted({segment.turn for segment in self.segments if segment.source is TokenSource.POLICY})
        return [self.turn_versions.get(turn, self.policy_version) for turn in turns]

    @field_validator("schema_version")
    @classmethod
    def _known_version(cls, version: int) -> int:
        if version > SCHEMA_VERSION:
            raise ValueError(
                f"trajectory schema version {version} is newer than this agent-r1 understands "
                f"({SCHEMA_VERSION}); upgrade agent-r1 to read it"
            )
        return version

    @model_validator(mode="after")
    def _turns_do_not_go_back(self) -> Trajectory:
        last = 0
        for i, segment in enumerate(self.segments):
            if segment.turn < last:
                raise ValueError(f"segment {i} has turn {segment.turn} after turn {last}")
            last = segment.turn
        return self

    # -- building -------------------------------------------------------------------------
    def append(
        self,
        source: TokenSource,
        turn: int,
        token_ids: list[int],
        logprobs: list[float] | None = None,
    ) -> None:
        """Append tokens; consecutive tokens with the same source and turn share a segment."""
        if not token_ids:
            return
        segment = Segment(source=source, turn=turn, token_ids=list(token_ids), logprobs=logprobs)
        if self.segments and self.segments[-1].turn > turn:
            raise TrajectoryError(f"cannot append turn {turn} after turn {self.segments[-1].turn}")
        last = self.segments[-1] if self.segments else None
        if last is not None and last.source is source and last.turn == turn:
            if source is TokenSource.POLICY:
                if (last.logprobs is None) != (logprobs is None):
                    raise TrajectoryError("cannot mix policy tokens with and without logprobs in a turn")
                if last.logprobs is not None and logprobs is not None:
                    last.logprobs.extend(logprobs)
            last.token_ids.extend(token_ids)
        else:
            self.segments.append(segment)

    # -- derived views --------------------------------------------------------------------
    @property
    def token_ids(self) -> list[int]:
        """Every token of the trajectory, in order (prompt, actions, observations, template)."""
        return [t for s in self.segments for t in s.token_ids]

    def __len__(self) -> int:
        """Number of tokens."""
        return sum(len(s.token_ids) for s in self.segments)

    @property
    def sources(self) -> list[TokenSource]:
        """The provenance of each token."""
        return [s.source for s in self.segments for _ in s.token_ids]

    @property
    def turn_ids(self) -> list[int]:
        """The turn of each token (see the module docstring for the numbering)."""
        return [s.turn for s in self.segments for _ in s.token_ids]

    @property
    def loss_mask(self) -> list[int]:
        """1 on policy-sampled tokens, 0 on prompt, environment and template tokens."""
        return [int(s.source is TokenSource.POLICY) for s in self.segments for _ in s.token_ids]

    @property
    def logprobs(self) -> list[float]:
        """Sampling log-probabilities per token; 0.0 where the token was not sampled."""
        out: list[float] = []
        for s in self.segments:
            if s.source is TokenSource.POLICY and s.logprobs is not None:
                out.extend(s.logprobs)
            else:
                out.extend([0.0] * len(s.token_ids))
        return out

    @property
    def prompt_length(self) -> int:
        """Number of tokens before the first policy token."""
        n = 0
        for s in self.segments:
            if s.source is TokenSource.POLICY:
                break
            n += len(s.token_ids)
        return n

    @property
    def num_turns(self) -> int:
        """Number of turns in which the policy produced at least one token."""
        return len({s.turn for s in self.segments if s.source is TokenSource.POLICY})

    @property
    def num_policy_tokens(self) -> int:
        """Number of policy-sampled tokens (the tokens that carry loss)."""
        return sum(len(s.token_ids) for s in self.segments if s.source is TokenSource.POLICY)

    def last_policy_index(self, turn: int | None = None) -> int | None:
        """Index of the last policy token (of ``turn``, or of the whole trajectory).

        A turn without policy tokens falls back to the last policy token before it.
        """
        index = None
        position = 0
        for s in self.segments:
            if turn is not None and s.turn > turn:
                break
            if s.source is TokenSource.POLICY and s.token_ids:
                index = position + len(s.token_ids) - 1
            position += len(s.token_ids)
        return index

    @property
    def score(self) -> float:
        """Sum of all weighted reward signals: the scalar s_i of group-based estimators."""
        return sum(r.weighted for r in self.rewards)

    def token_rewards(self) -> list[float]:
        """Dense per-token rewards: outcome signals at the last policy token, process signals at the
        last policy token of their turn. Trajectories without policy tokens get all zeros."""
        rewards = [0.0] * len(self)
        for index, value in self.reward_positions():
            rewards[index] += value
        return rewards

    def reward_positions(self) -> list[tuple[int, float]]:
        """:meth:`token_rewards` in sparse form: ``(token index, weighted reward)`` per signal, in
        the order of :attr:`rewards` (an index may repeat); empty without policy tokens."""
        final = self.last_policy_index()
        if final is None:
            return []
        out = []
        for signal in self.rewards:
            index = final if signal.kind == "outcome" else self.last_policy_index(signal.turn)
            if index is None:  # a process reward before any policy token: credit the first action
                index = final if signal.turn is None else self._first_policy_index()
            out.append((index, signal.weighted))
        return out

    def _first_policy_index(self) -> int:
        return self.loss_mask.index(1)

    def reward_by_name(self) -> dict[str, float]:
        """Unweighted sum of each named signal (for logging)."""
        out: dict[str, float] = {}
        for signal in self.rewards:
            out[signal.name] = out.get(signal.name, 0.0) + signal.value
        return out

    # -- serialisation --------------------------------------------------------------------
    def to_json_line(self) -> str:
        """One JSON line; the steps' action tokens are left out (the segments hold them)."""
        data = self.model_dump(
            mode="json", exclude={"steps": {"__all__": {"action": {"token_ids", "logprobs"}}}}
        )
        return json.dumps(data, ensure_ascii=False, separators=(",", ":"))

    @classmethod
    def from_json_line(cls, line: str) -> Trajectory:
        """Parse one JSONL line written by :meth:`to_json_line`.

        Raises :class:`~agent_r1.TrajectoryError` for a schema version newer than
        :data:`SCHEMA_VERSION` and ``ValueError`` (``pydantic.ValidationError`` included) for text
        that is not a valid trajectory.
        """
        data = json.loads(line)
        if not isinstance(data, dict):
            raise ValueError(f"expected a JSON object, got {type(data).__name__}")
        version = data.get("schema_version", SCHEMA_VERSION)
        if isinstance(version, int) and version > SCHEMA_VERSION:
            raise TrajectoryError(
                f"trajectory schema version {version} is newer than this agent-r1 understands "
                f"({SCHEMA_VERSION}); upgrade agent-r1 to read it"
            )
        trajectory = cls.model_validate(data)
        for step in trajectory.steps:  # action tokens are stored once, in the segments
            if not step.action.token_ids:
                policy = [
                    s for s in trajectory.segments if s.source is TokenSource.POLICY and s.turn == step.turn
                ]
                step.action.token_ids = [t for s in policy for t in s.token_ids]
                if policy and all(s.logprobs is not None for s in policy):
                    step.action.logprobs = [lp for s in policy for lp in (s.logprobs or [])]
        return trajectory


def save_trajectories(path: str | Path, trajectories: Iterable[Trajectory], *, append: bool = False) -> int:
    """Write trajectories as JSONL (one per line, with ``schema_version``). Returns the count."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    count = 0
    with path.open("a" if append else "w", encoding="utf-8") as handle:
        for trajectory in trajectories:
            handle.write(trajectory.to_json_line() + "\n")
            count += 1
    return count


def iter_trajectories(path: str | Path) -> Iterator[Trajectory]:
    """Read trajectories from JSONL; a bad line raises :class:`TrajectoryError` naming file and line."""
    path = Path(path)
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                yield Trajectory.from_json_line(line)
            except TrajectoryError as exc:
                raise TrajectoryError(f"{path}:{number}: {exc}") from exc
            except ValueError as exc:  # pydantic.ValidationError and json errors are ValueErrors
                raise TrajectoryError(f"{path}:{number}: not a valid trajectory: {exc}") from exc


def load_trajectories(path: str | Path) -> list[Trajectory]:
    """Read every trajectory of a JSONL file (see :func:`iter_trajectories`)."""
    return list(iter_trajectories(path))
