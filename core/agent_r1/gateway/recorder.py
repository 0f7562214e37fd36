"""Episodes: the gateway's calls, recorded token for token and assembled into trajectories.

Every call of an episode records the exact prompt token ids the backend was given, the token ids
it sampled and their log-probabilities. Text is never tokenised again to build a trajectory.

**Prompts that extend earlier calls.** Before a call is generated, :meth:`EpisodeRecorder.plan_chat`
looks for an earlier call of the episode whose conversation the new request continues: the
request's messages start with that call's messages followed by the very assistant message the
gateway returned (its content and tool calls, matched by id). Then the new prompt is built by
appending, as agent-r1's own rollouts do (:meth:`~agent_r1.rollout.chat.ChatRenderer.render_observation`):
``prompt_k = prompt_j + completion_j + closure + observation + header``. The model sees exactly the
tokens it sampled before, not a re-rendering of their text. When no earlier call matches (the agent
edited, dropped or summarised its history, changed its tools, or the template cannot append
these messages), the whole conversation is rendered with the chat template, and the result is
still checked token by token against every earlier ``prompt_j + completion_j``.

**Segments.** A call whose prompt extends the *latest* call of a chain of calls continues that chain:
the inserted tokens are masked (the end-of-turn ``closure`` and the next assistant ``header`` are
``template`` tokens, the observation ``env`` tokens) and the sampled tokens are ``policy`` tokens of
the next turn. Any other call starts a new chain, whose ``prompt`` holds everything before its
first action (when the call branched off an earlier point, that includes the shared history, which
is then masked in the new chain and trained once, in the chain where it was sampled). Each chain
becomes one :class:`~agent_r1.Trajectory` of the episode: a token sequence that one causal forward
pass can score, which two diverging contexts cannot share. The first keeps the episode's
trajectory id; later ones get ``~seg1``, ``~seg2``...

**Versions.** A call generated under a weights guard (asynchronous rollouts) records the version
of the weights that generated it on its turn (:attr:`~agent_r1.Trajectory.turn_versions`), so that
an episode whose weights changed between calls is seen as a partial rollout and its staleness is
that of its first call.

**Finishing.** :meth:`EpisodeRecorder.finish` closes the episode: every segment gets the agent's
final answer on its last step (so outcome reward shapers score each segment by the episode's
outcome), the rewards posted for the episode (outcome rewards on every segment, a process reward
on the segment and turn of the call it names), the termination, and per-trajectory metrics.

**Ended ids.** An episode id that has ended (finished, or closed by :meth:`EpisodeRecorder.close_idle`
after a time without activity) is never opened again: a call, reward, show, finish or open on it is
a :class:`~agent_r1.gateway.protocol.ConflictError` (HTTP 409) saying how and when it ended, so
that no output holds one trajectory id twice. The recorder remembers the ``FINISHED_IDS_KEPT`` most
recently ended ids.

**Activity.** Every call, reward and show marks its episode active. A call holds its episode for
the whole HTTP request (:meth:`EpisodeRecorder.request_scope`), however the request ends, so an
episode is never closed for idleness while one of its calls is generating.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from agent_r1.contracts import Generation
from agent_r1.errors import AgentR1Error, TrajectoryError
from agent_r1.gateway.protocol import ConflictError, NotFoundError, RequestError
from agent_r1.gateway.tools import ParsedReply, ToolRendering
from agent_r1.mdp import (
    Action,
    FinishReason,
    Message,
    Observation,
    RewardSignal,
    Step,
    Task,
    TokenSource,
    ToolResult,
    Trajectory,
)
from agent_r1.rollout.chat import ChatRenderer

__all__ = ["FINISHED_IDS_KEPT", "CallPlan", "CallRecord", "Episode", "EpisodeRecorder", "assistant_message"]

FINISHED_IDS_KEPT = 100_000
"""How many ended episode ids a recorder remembers (the most recent ones) to refuse their reuse.
Each costs about 250 bytes, so the record stays under 30 MB however long a server runs; an id
that ended more than this many episodes ago is unknown again and would open a new episode."""

_HELD: ContextVar[list[Episode] | None] = ContextVar("agent_r1_gateway_held_episodes", default=None)
"""The episodes the current HTTP request holds (see :meth:`EpisodeRecorder.request_scope`)."""


@dataclass
class CallPlan:
    """The prompt of one call before it is generated, and how it relates to the episode's earlier
    calls: ``base`` is the call whose ``prompt + completion`` the prompt extends (``None``: none),
    and ``closure + env + header`` the tokens inserted after it (``env`` alone when the split is
    unknown)."""

    prompt_ids: list[int]
    base: CallRecord | None = None
    closure: list[int] = field(default_factory=list)
    env: list[int] = field(default_factory=list)
    header: list[int] = field(default_factory=list)
    messages: list[Message] | None = None
    """The request's conversation (canonical form); ``None`` for ``/v1/completions``."""
    new_messages: list[Message] = field(default_factory=list)
    """The messages after ``base``'s reply (the observation it got)."""
    tools: list[dict[str, Any]] | None = None
    tools_key: str = "[]"
    how: str = "fresh"
    """``extended`` (appended to an earlier call's tokens), ``prefix`` (a full render that starts
    with an earlier call's tokens) or ``fresh``."""


@dataclass
class CallRecord:
    """One generated call: its plan, what was sampled and returned, and where it sits."""

    index: int
    completion_id: str
    plan: CallPlan
    action: Action
    reply: Message | None
    """The assistant message returned (canonical form); ``None`` for ``/v1/completions``."""
    chain: int
    turn: int
    generation_s: float
    version: int | None = None
    """The weights version that generated it (``None``: no weights guard, the episode's
    ``policy_version``)."""

    @property
    def context(self) -> list[int]:
        """``prompt + completion``: what a later call extends."""
        return [*self.plan.prompt_ids, *self.action.token_ids]


@dataclass
class _Chain:
    trajectory: Trajectory
    calls: list[CallRecord] = field(default_factory=list)


@dataclass
class Episode:
    """One run of an agent program: its calls, segments, posted rewards and final answer."""

    id: str
    trajectory_id: str
    task_id: str
    group_id: str = ""
    sample_index: int = 0
    task: Task | None = None
    policy_version: int = 0
    calls: list[CallRecord] = field(default_factory=list)
    chains: list[_Chain] = field(default_factory=list)
    rewards: list[tuple[RewardSignal, str | None]] = field(default_factory=list)
    answer: str | None = None
    finished: bool = False
    created: float = field(default_factory=time.monotonic)
    last_active: float = field(default_factory=time.monotonic)
    """When its latest call, reward or show happened (``time.monotonic``; a call counts when it
    starts and when it ends)."""
    calls_running: int = 0
    """HTTP requests holding the episode now; an episode is never closed for idleness while above 0."""
    counters: dict[str, float] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def count(self, name: str, by: float = 1.0) -> None:
        """Add to one of the episode's counters (timeouts, failed calls...)."""
        self.counters[name] = self.counters.get(name, 0.0) + by


class _Ended(NamedTuple):
    """How an episode id ended: ``at`` (``time.monotonic``), and the time it had been idle when
    :meth:`EpisodeRecorder.close_idle` closed it (``None``: finished)."""

    at: float
    idle_s: float | None = None


def _message_key(message: Message) -> tuple[Any, ...]:
    """What must agree for two canonical messages to be the same turn (names and null fields that
    client libraries add or drop are ignored)."""
    calls = tuple(
        (c.get("id", ""), c.get("name", ""), json.dumps(c.get("arguments", {}), sort_keys=True))
        for c in message.get("tool_calls") or []
    )
    return (message.get("role"), message.get("content") or "", calls, message.get("tool_call_id", ""))


class EpisodeRecorder:
    """Records the calls of every open episode and assembles their trajectories (see the module
    docstring). ``open_on_demand``: an unknown episode id on a call opens it (standalone server);
    otherwise only episodes opened with :meth:`open` are served (training)."""

    def __init__(
        self,
        renderer: ChatRenderer,
        rendering: ToolRendering,
        *,
        open_on_demand: bool,
        remember_ended: int = FINISHED_IDS_KEPT,
    ) -> None:
        self.renderer = renderer
        self.rendering = rendering
        self.open_on_demand = open_on_demand
        self.remember_ended = remember_ended
        self._episodes: dict[str, Episode] = {}
        self._ended: OrderedDict[str, _Ended] = OrderedDict()
        # One lock for the episode table, the ended ids and every episode's activity fields; an
        # episode's own lock may be taken inside it, never the other way round.
        self._lock = threading.Lock()
        self._header_ids = renderer.encode(renderer.header_text)

    # -- episodes ---------------------------------------------------------------------------------
    def open(
        self,
        episode_id: str | None = None,
        *,
        task: Task | None = None,
        trajectory_id: str | None = None,
        group_id: str = "",
        sample_index: int = 0,
        policy_version: int = 0,
    ) -> Episode:
        """Open an episode (a fresh id when none is given); raises :class:`RequestError` when the
        id is open and :class:`ConflictError` when it has ended."""
        episode_id = episode_id or f"ep-{uuid.uuid4().hex[:16]}"
        with self._lock:
            if episode_id in self._episodes:
                raise RequestError(f"episode {episode_id!r} is already open", param="id")
            if episode_id in self._ended:
                raise self._ended_error(episode_id, param="id")
            episode = Episode(
                id=episode_id,
                trajectory_id=trajectory_id or episode_id,
                task_id=task.id if task is not None else episode_id,
                group_id=group_id,
                sample_index=sample_index,
                task=task,
                policy_version=policy_version,
            )
            self._episodes[episode_id] = episode
        return episode

    def get(self, episode_id: str) -> Episode:
        """The open episode ``episode_id`` for a call (opened now when ``open_on_demand``), held
        until the current request ends (:meth:`request_scope`); raises :class:`ConflictError` when
        the id has ended and :class:`NotFoundError` when it is unknown."""
        with self._lock:
            episode = self._episodes.get(episode_id)
            if episode is None and self.open_on_demand and episode_id not in self._ended:
                episode = Episode(id=episode_id, trajectory_id=episode_id, task_id=episode_id)
                self._episodes[episode_id] = episode
            if episode is None:
                raise self._missing(episode_id)
            episode.last_active = time.monotonic()
            held = _HELD.get()
            if held is not None:
                held.append(episode)
                episode.calls_running += 1
        return episode

    def find(self, episode_id: str) -> Episode:
        """The open episode ``episode_id`` (marked active: a show, reward or finish); raises
        :class:`ConflictError` when the id has ended and :class:`NotFoundError` when it is unknown."""
        with self._lock:
            episode = self._episodes.get(episode_id)
            if episode is None:
                raise self._missing(episode_id)
            episode.last_active = time.monotonic()
        return episode

    @contextmanager
    def request_scope(self) -> Iterator[None]:
        """Run one HTTP request inside this: every episode :meth:`get` hands out within it counts
        as running a call until the request ends, however it ends (answered, refused, timed out,
        the client gone), and is marked active then. The gateway wraps every request in it."""
        held: list[Episode] = []
        token = _HELD.set(held)
        try:
            yield
        finally:
            _HELD.reset(token)
            now = time.monotonic()
            with self._lock:
                for episode in held:
                    episode.calls_running -= 1
                    episode.last_active = now

    def close_idle(
        self, idle_s: float, *, now: float | None = None
    ) -> list[tuple[Episode, list[Trajectory]]]:
        """Close every open episode that runs no call and has had no activity for ``idle_s``
        seconds at ``now`` (``time.monotonic()`` by default): its trajectories carry an error, so
        they are never trained on, and end with ``idle_timeout``; its id is refused from then on.
        Returns the closed episodes with their trajectories."""
        now = time.monotonic() if now is None else now
        closing: list[tuple[Episode, float]] = []
        with self._lock:
            for episode in list(self._episodes.values()):
                idle = now - episode.last_active
                if episode.calls_running > 0 or idle < idle_s:
                    continue
                with episode.lock:
                    episode.finished = True
                del self._episodes[episode.id]
                self._remember(episode.id, _Ended(time.monotonic(), idle))
                closing.append((episode, idle))
        closed = []
        for episode, idle in closing:
            error = (
                f"episode {episode.id!r} was closed after {idle:.1f} s idle (no call, reward or show; the "
                f"gateway's limit is {idle_s:g} s) before it was finished"
            )
            closed.append((episode, self.assemble(episode, error=error, termination="idle_timeout")))
        return closed

    def _remember(self, episode_id: str, ended: _Ended) -> None:
        """Record an ended id (under ``self._lock``), forgetting the oldest beyond the bound."""
        self._ended[episode_id] = ended
        while len(self._ended) > self.remember_ended:
            self._ended.popitem(last=False)

    def _missing(self, episode_id: str) -> ConflictError | NotFoundError:
        """The error for an id with no open episode (under ``self._lock``)."""
        if episode_id in self._ended:
            return self._ended_error(episode_id, param="episode")
        return NotFoundError(
            f"unknown episode {episode_id!r}: no open episode has this id (in training, the trainer "
            "opens each episode before its agent starts and closes it when the agent exits; is the "
            "agent using the OPENAI_BASE_URL it was given, within its timeout?)",
            param="episode",
            code="unknown_episode",
        )

    def _ended_error(self, episode_id: str, *, param: str | None) -> ConflictError:
        """Why ``episode_id`` takes no more requests (under ``self._lock``)."""
        ended = self._ended[episode_id]
        ago = f"{time.monotonic() - ended.at:.1f} s ago"
        reuse = "an episode id is used once: start a new episode with a new id"
        if ended.idle_s is None:
            return ConflictError(
                f"episode {episode_id!r} was finished {ago}; {reuse}", param=param, code="episode_finished"
            )
        return ConflictError(
            f"episode {episode_id!r} was closed {ago} after {ended.idle_s:.1f} s idle (no call, reward or "
            f"show in that time) and counted as failed; {reuse}",
            param=param,
            code="episode_idle_closed",
        )

    def open_ids(self) -> list[str]:
        """The ids of the open episodes."""
        with self._lock:
            return list(self._episodes)

    # -- planning -----------------------------------------------------------------------------------
    def plan_chat(
        self, episode: Episode, messages: list[Message], tools: list[dict[str, Any]] | None
    ) -> CallPlan:
        """The prompt tokens of a chat call (see the module docstring); raises :class:`RequestError`
        when the template cannot render the conversation."""
        tools_key = json.dumps(tools or [], sort_keys=True, default=str)
        with episode.lock:
            earlier = [c for c in episode.calls if c.reply is not None and c.plan.tools_key == tools_key]
        keys = [_message_key(m) for m in messages]
        for call in sorted(earlier, key=lambda c: len(c.plan.messages or []), reverse=True):
            assert call.plan.messages is not None and call.reply is not None
            seen = [*call.plan.messages, call.reply]
            if len(messages) <= len(seen) or keys[: len(seen)] != [_message_key(m) for m in seen]:
                continue
            new = messages[len(seen) :]
            try:
                observation = self.rendering.observation_input(new, history=seen, tools=tools)
                pieces = self.renderer.render_observation(
                    observation, action_ids=call.action.token_ids, finish_reason=call.action.finish_reason
                )
            except AgentR1Error:
                break  # the template cannot append these messages: render the whole conversation
            assert pieces is not None  # no max_tokens: never cut
            return CallPlan(
                prompt_ids=[*call.context, *pieces.token_ids],
                base=call,
                closure=pieces.closure,
                env=pieces.env,
                header=pieces.header,
                messages=messages,
                new_messages=new,
                tools=tools,
                tools_key=tools_key,
                how="extended",
            )
        try:
            template_messages, template_tools = self.rendering.template_input(messages, tools)
            prompt = self.renderer.render_prompt(template_messages, template_tools)
        except AgentR1Error as exc:
            raise RequestError(
                f"the chat template cannot render this conversation: {exc}", param="messages"
            ) from None
        plan = self._plan_by_prefix(episode, prompt)
        plan.messages, plan.tools, plan.tools_key = messages, tools, tools_key
        if plan.base is not None and plan.base.reply is not None:
            seen = [*(plan.base.plan.messages or []), plan.base.reply]
            same = len(messages) > len(seen) and [_message_key(m) for m in messages[: len(seen)]] == [
                _message_key(m) for m in seen
            ]
            plan.new_messages = messages[len(seen) :] if same else []
        return plan

    def plan_tokens(self, episode: Episode, prompt_ids: list[int]) -> CallPlan:
        """The plan of a call whose prompt tokens are given (``/v1/completions``)."""
        return self._plan_by_prefix(episode, list(prompt_ids))

    def _plan_by_prefix(self, episode: Episode, prompt: list[int]) -> CallPlan:
        """Find the earlier call whose ``prompt + completion`` is the longest prefix of ``prompt``."""
        with episode.lock:
            earlier = list(episode.calls)
        best: CallRecord | None = None
        for call in earlier:
            context = call.context
            longer = best is None or len(context) > len(best.context)
            if longer and len(context) <= len(prompt) and prompt[: len(context)] == context:
                best = call
        if best is None:
            return CallPlan(prompt_ids=prompt)
        inserted = prompt[len(best.context) :]
        closure = self.renderer.closure_ids(best.action.token_ids, best.action.finish_reason)
        header = self._header_ids
        if (
            len(inserted) >= len(closure) + len(header)
            and inserted[: len(closure)] == closure
            and inserted[len(inserted) - len(header) :] == header
        ):
            middle = inserted[len(closure) : len(inserted) - len(header)]
            return CallPlan(prompt, best, closure, middle, list(header), how="prefix")
        return CallPlan(prompt, best, env=inserted, how="prefix")

    # -- recording ----------------------------------------------------------------------------------
    def record(
        self,
        episode: Episode,
        plan: CallPlan,
        generation: Generation,
        *,
        text: str,
        reply: ParsedReply | None,
        completion_id: str,
        generation_s: float,
        finish_reason: str | None = None,
        version: int | None = None,
    ) -> CallRecord:
        """Record a generated call and append it to its segment (see the module docstring);
        ``version``: the weights version that generated it, recorded on its turn. Raises
        :class:`ConflictError` when the episode was finished meanwhile, and
        :class:`~agent_r1.errors.TrajectoryError` if the segment's tokens would not be exactly
        ``prompt + completion`` (a bug, never expected)."""
        ids = list(generation.token_ids)
        logprobs = list(generation.logprobs) if len(generation.logprobs) == len(ids) else None
        finish: FinishReason = finish_reason or generation.finish_reason  # type: ignore[assignment]
        action = Action(
            token_ids=ids,
            logprobs=logprobs,
            text=text,
            finish_reason=finish,
            stop_sequence=generation.stop_sequence if finish == "stop" else None,
            tool_calls=list(reply.tool_calls) if reply is not None else [],
            parse_errors=list(reply.errors) if reply is not None else [],
        )
        reply_message = assistant_message(reply)
        with episode.lock:
            if episode.finished:
                raise ConflictError(
                    f"episode {episode.id!r} was finished while this call was generating; its result is not "
                    "recorded",
                    param="episode",
                    code="episode_finished",
                )
            chain_index, turn = self._segment_for(episode, plan)
            chain = episode.chains[chain_index]
            trajectory = chain.trajectory
            trajectory.append(TokenSource.POLICY, turn, ids, logprobs)
            if version is not None:
                trajectory.turn_versions[turn] = version
            call = CallRecord(
                index=len(episode.calls),
                completion_id=completion_id,
                plan=plan,
                action=action,
                reply=reply_message,
                chain=chain_index,
                turn=turn,
                generation_s=generation_s,
                version=version,
            )
            if trajectory.token_ids != call.context:
                raise TrajectoryError(
                    f"episode {episode.id!r}: segment {chain_index} does not hold exactly the prompt and "
                    f"completion of call {call.index} ({len(trajectory)} tokens vs {len(call.context)})"
                )
            trajectory.steps.append(Step(turn=turn, action=action, generation_s=generation_s))
            chain.calls.append(call)
            episode.calls.append(call)
            episode.count(f"plan_{plan.how}")
        return call

    @staticmethod
    def _segment_for(episode: Episode, plan: CallPlan) -> tuple[int, int]:
        """``(chain index, turn)`` of a call about to be recorded (under ``episode.lock``): the
        chain of the call its prompt extends, with the inserted tokens appended, when that call is
        the chain's latest; otherwise a new chain whose prompt is the call's whole prompt."""
        base = plan.base
        if base is not None and episode.chains[base.chain].calls[-1] is base:
            trajectory, turn = episode.chains[base.chain].trajectory, base.turn + 1
            trajectory.append(TokenSource.TEMPLATE, base.turn, plan.closure)
            trajectory.append(TokenSource.ENV, base.turn, plan.env)
            trajectory.append(TokenSource.TEMPLATE, turn, plan.header)
            trajectory.steps[-1].observation = _observation(plan.new_messages, base.reply)
            return base.chain, turn
        if base is not None:  # branched off an earlier point, or raced with a sibling call
            episode.count("forks")
        chain_index = len(episode.chains)
        suffix = f"~seg{chain_index}" if chain_index else ""
        trajectory = Trajectory(
            id=f"{episode.trajectory_id}{suffix}",
            task_id=episode.task_id,
            group_id=episode.group_id,
            sample_index=episode.sample_index,
            policy_version=episode.policy_version,
        )
        episode.chains.append(_Chain(trajectory))
        trajectory.append(TokenSource.PROMPT, 0, plan.prompt_ids)
        return chain_index, 0

    def add_reward(self, episode: Episode, signal: RewardSignal, completion_id: str | None = None) -> None:
        """Record a reward posted for the episode; a ``process`` reward names the call it rewards
        by ``completion_id`` (the response id)."""
        with episode.lock:
            if episode.finished:
                raise ConflictError(
                    f"episode {episode.id!r} ended while this reward was posted; post rewards before it ends",
                    param="episode",
                    code="episode_finished",
                )
            if completion_id is not None and all(c.completion_id != completion_id for c in episode.calls):
                raise RequestError(
                    f"episode {episode.id!r} has no call with completion id {completion_id!r}",
                    param="completion_id",
                )
            episode.rewards.append((signal, completion_id))

    # -- assembling ---------------------------------------------------------------------------------
    def finish(
        self,
        episode: Episode,
        *,
        answer: str | None = None,
        error: str | None = None,
        termination: str | None = None,
        metrics: Mapping[str, float] | None = None,
    ) -> list[Trajectory]:
        """Close the episode (later requests on its id get HTTP 409) and return its trajectories, one
        per segment, in order. ``error`` marks every segment as failed (never trained on). Raises
        :class:`ConflictError` when the episode has already ended (finished, or closed for
        idleness), so that its trajectories are handed out once."""
        with self._lock:
            with episode.lock:
                if episode.finished:
                    if episode.id in self._ended:
                        raise self._ended_error(episode.id, param="episode")
                    raise ConflictError(
                        f"episode {episode.id!r} has already ended", param="episode", code="episode_finished"
                    )
                episode.finished = True
                if answer is not None:
                    episode.answer = answer
            if self._episodes.get(episode.id) is episode:
                del self._episodes[episode.id]
            self._remember(episode.id, _Ended(time.monotonic()))
        return self.assemble(episode, error=error, termination=termination, metrics=metrics)

    def assemble(
        self,
        episode: Episode,
        *,
        error: str | None = None,
        termination: str | None = None,
        metrics: Mapping[str, float] | None = None,
    ) -> list[Trajectory]:
        """The episode's trajectories as they stand (copies; see :meth:`finish`)."""
        with episode.lock:
            chains = list(episode.chains)
            calls = list(episode.calls)
            rewards = list(episode.rewards)
            answer = episode.answer
            counters = dict(episode.counters)
        if not chains:
            return [
                Trajectory(
                    id=episode.trajectory_id,
                    task_id=episode.task_id,
                    group_id=episode.group_id,
                    sample_index=episode.sample_index,
                    policy_version=episode.policy_version,
                    termination=termination or "no_calls",
                    errors=[
                        error
                        or f"episode {episode.id!r}: the agent made no model call through the gateway "
                        "(does it use the OPENAI_BASE_URL it was given?)"
                    ],
                    metrics={**dict(metrics or {}), "gateway_calls": 0.0},
                )
            ]
        last_chain = calls[-1].chain
        out = []
        for index, chain in enumerate(chains):
            trajectory = chain.trajectory.model_copy(deep=True)
            if trajectory.steps and answer is not None:
                trajectory.steps[-1].action.answer = answer
            for signal, completion_id in rewards:
                if signal.kind == "outcome" or completion_id is None:  # the episode's outcome: every segment
                    trajectory.rewards.append(signal.model_copy())
                    continue
                call = next((c for c in chain.calls if c.completion_id == completion_id), None)
                if call is not None:  # a process reward: the segment and turn of the call it names
                    trajectory.rewards.append(signal.model_copy(update={"turn": call.turn}))
            last = chain.calls[-1].action
            trajectory.truncated = last.finish_reason in ("length", "context")
            trajectory.termination = (termination or "agent_done") if index == last_chain else "superseded"
            if error:
                trajectory.errors.append(error)
            trajectory.metrics = {
                **self._metrics(chain, trajectory),
                "gateway_segments": float(len(chains)),
                "gateway_calls": float(len(calls)),
                "gateway_forks": counters.get("forks", 0.0),
                **dict(metrics or {}),
            }
            out.append(trajectory)
        return out

    def _metrics(self, chain: _Chain, trajectory: Trajectory) -> dict[str, float]:
        steps = trajectory.steps
        figures = {
            "generation_s": sum(c.generation_s for c in chain.calls),
            "tool_s": 0.0,
            "num_turns": float(len(steps)),
            "tool_calls": float(sum(len(s.action.tool_calls) for s in steps)),
            "tool_errors": 0.0,
            "format_errors": float(sum(len(s.action.parse_errors) for s in steps)),
            "truncated": float(trajectory.truncated),
            "length_cuts": float(sum(s.action.finish_reason == "length" for s in steps)),
            "observation_cuts": 0.0,
            "env_errors": 0.0,
            "policy_tokens": float(trajectory.num_policy_tokens),
            "context_tokens": float(len(trajectory)),
        }
        drift = self._drift(chain, trajectory)
        if drift is not None:
            figures["template_drift_tokens"] = float(drift)
        return figures

    def _drift(self, chain: _Chain, trajectory: Trajectory) -> int | None:
        """Tokens by which a chat segment differs from a full re-render of its conversation (what a
        gateway that re-tokenised text would have trained on); ``None`` for completions."""
        last = chain.calls[-1]
        if last.plan.messages is None or last.reply is None:
            return None
        try:
            messages, tools = self.rendering.template_input(
                [*last.plan.messages, last.reply], last.plan.tools
            )
            tokens = trajectory.token_ids + self.renderer.closure_ids(
                last.action.token_ids, last.action.finish_reason
            )
            return self.renderer.drift(messages, tokens, tools=tools)
        except AgentR1Error:  # a conversation the template cannot re-render has no drift figure
            return None


def assistant_message(reply: ParsedReply | None) -> Message | None:
    """The assistant message the gateway returned for a chat call (``None`` for completions), in
    the canonical form later requests are matched against."""
    if reply is None:
        return None
    message: Message = {"role": "assistant", "content": reply.content or ""}
    if reply.tool_calls:
        message["tool_calls"] = [
            {"id": c.id, "name": c.name, "arguments": dict(c.arguments)} for c in reply.tool_calls
        ]
    return message


def _observation(messages: Sequence[Message], reply: Message | None) -> Observation:
    """The messages an agent sent after a ``reply``, as the step's observation (tool messages also
    as tool results, so that tool-use statistics count them)."""
    names = {c["id"]: c["name"] for c in (reply or {}).get("tool_calls") or []}
    results = [
        ToolResult(
            call_id=m.get("tool_call_id", ""),
            name=m.get("name") or names.get(m.get("tool_call_id", ""), ""),
            content=m.get("content", ""),
        )
        for m in messages
        if m.get("role") == "tool"
    ]
    return Observation(messages=[dict(m) for m in messages], tool_results=results)
