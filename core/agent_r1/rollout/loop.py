"""The agent loop: many multi-turn episodes at once, token-faithful, with tools running concurrently.

One call of :meth:`RolloutEngine.run` rolls out ``group_size`` episodes for each task. Every turn,

1. the backend generates for *all* active episodes in one batched call (token ids in, token ids and
   log-probabilities out; identical prompts, such as the group's copies at the first turn, share
   their prefill in the ``hf`` backend);
2. the environment steps of all those episodes run concurrently (``asyncio.gather``), so the tool
   calls of different episodes overlap in time;
3. each episode appends its observation tokens (see :class:`~agent_r1.rollout.chat.ChatRenderer`) or
   ends; finished episodes leave the batch.

Token conventions (:mod:`agent_r1.mdp`): the prompt is ``prompt`` (turn 0); sampled tokens are
``policy`` (turn ``t``), the end-of-turn token included when the policy sampled it; when the
action stopped on a stop sequence or a budget, the end-of-turn closure (``<|im_end|>\\n``) is a
``template`` segment of turn ``t``; the observation is ``env`` (turn ``t``) and the next assistant
header ``template`` (turn ``t + 1``). An episode's final observation (``done``) is recorded in its
:class:`~agent_r1.mdp.Step` but adds no tokens, so a trajectory ends with its last action.

Budgets and truncation (never silent):

* ``max_new_tokens`` per action: a cut action has ``finish_reason="length"`` and counts in the
  ``length_cuts`` metric; the episode goes on unless the environment ends it.
* ``max_context`` tokens per trajectory (prompt included): an action may use at most the room
  left, and one cut by it has ``finish_reason="context"``. An observation that does not fit is
  shortened (message contents cut and marked ``[truncated]``) so that the next action keeps up to
  ``min(max_new_tokens, half the room left)`` tokens; it counts in ``observation_cuts``. When no
  room is left the episode ends with termination ``max_tokens``.
* ``max_turns`` actions per episode: an episode the environment has not ended by then ends with
  termination ``max_turns``.

``Trajectory.truncated`` is true when a budget ended the episode (termination ``max_tokens`` or
``max_turns``, whether the engine's ``max_turns`` or the environment's own turn limit fired first)
or its last action was cut (``length``/``context``), i.e. whenever the episode did not end on its
own terms.

Parse results: an environment returns what it parsed out of an action in
``Observation.tool_calls`` / ``answer`` / ``parse_errors``; the engine records them on the step's
:class:`~agent_r1.mdp.Action`. Environment failures: an exception from ``Environment.step`` ends
the episode (``on_env_error="end"``, counted, and noted in ``Trajectory.errors``) or aborts the
run (``"raise"``); so does one from ``Environment.reset`` (the failed episode then has no tokens;
an :class:`~agent_r1.errors.AgentR1Error` from ``reset`` always aborts);
:class:`~agent_r1.errors.EnvironmentFatalError` always aborts.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
import warnings
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from agent_r1.contracts import Environment, EpisodeStart, Generation, RolloutBackend, SamplingParams
from agent_r1.errors import AgentR1Error, EnvironmentFatalError
from agent_r1.mdp import Action, Message, Observation, Step, Task, TokenSource, Trajectory
from agent_r1.rollout.chat import ChatRenderer
from agent_r1.rollout.generation import (
    action_from_generation,
    generate_within_budgets,
    group_samples,
    run_sync,
    takes_budgets,
)

if TYPE_CHECKING:
    from agent_r1.rollout.decoder import TurnChoice, TurnDecoder

__all__ = ["TRAJECTORY_METRICS", "RolloutEngine", "turn_seed"]

TRAJECTORY_METRICS: dict[str, str] = {
    "generation_s": "seconds of the batched backend calls the episode took part in",
    "tool_s": "seconds spent in the environment's step (tool calls included)",
    "num_turns": "actions taken",
    "tool_calls": "tool calls run (from the observations' tool_results)",
    "tool_errors": "tool calls that failed (ok=False: exception, timeout, unknown tool, bad arguments)",
    "format_errors": "parse errors the environment reported on the actions",
    "template_drift_tokens": "tokens by which the trajectory differs from a full chat-template re-render",
    "truncated": "1 when a budget ended the episode or cut its last action",
    "length_cuts": "actions cut by max_new_tokens",
    "observation_cuts": "observations shortened to fit max_context",
    "env_errors": "environment steps that raised (with on_env_error='end')",
    "env_close_errors": "1 when the environment's aclose() raised after the episode (trajectory kept)",
    "policy_tokens": "tokens sampled by the policy",
    "context_tokens": "tokens in the trajectory",
}
"""Every per-trajectory metric in ``Trajectory.metrics``, with its meaning; besides these,
``env/<name>`` for each figure the environment reported in ``Observation.metrics`` (summed over
the episode's steps)."""


def turn_seed(seed: int, turn: int) -> int:
    """The sampling seed of one turn's backend call, derived from the run seed."""
    return (seed * 1_000_003 + (turn + 1) * 7_919 + 17) % (1 << 62)


@dataclass
class _Episode:
    task: Task
    env: Environment
    trajectory: Trajectory
    start: EpisodeStart | None = None
    messages: list[Message] = field(default_factory=list)
    """The conversation as the model saw it (assistant contents decoded), for the drift metric."""
    action: Action | None = None
    generation_s: float = 0.0
    turn_generation_s: float = 0.0
    done: bool = False
    inline: bool = False
    """The last observation continued the assistant's turn: the next action joins its message."""
    counters: defaultdict[str, float] = field(default_factory=lambda: defaultdict(float))


class RolloutEngine:
    """Collects token-faithful trajectories with a :class:`~agent_r1.RolloutBackend` and one
    environment instance per episode (``env_factory()``).

    ``sampling`` gives temperature, top-p, top-k and extra stop strings; its ``max_new_tokens`` is
    replaced by ``max_new_tokens`` and its seed by the per-turn seeds derived from the run seed.
    ``renderer`` defaults to a :class:`ChatRenderer` of ``tokenizer``. ``on_env_error`` decides what
    an exception raised by ``Environment.step`` does: ``"raise"`` (default) aborts the run with an
    :class:`~agent_r1.errors.AgentR1Error` naming the environment, task and turn; ``"end"`` ends
    that episode with termination ``env_error`` and goes on (counted in ``env_errors``).
    ``on_progress(finished, total)`` is called after every turn. ``decoder`` picks each turn's
    action among several candidates (:mod:`agent_r1.engine.experimental.decoding`: value-guided, best-of-K);
    ``None`` samples one action per turn.
    """

    def __init__(
        self,
        backend: RolloutBackend,
        tokenizer: Any,
        env_factory: Callable[[], Environment],
        *,
        max_turns: int = 4,
        max_new_tokens: int = 256,
        max_context: int = 2048,
        sampling: SamplingParams | None = None,
        renderer: ChatRenderer | None = None,
        on_env_error: Literal["raise", "end"] = "raise",
        on_progress: Callable[[int, int], None] | None = None,
        decoder: TurnDecoder | None = None,
    ) -> None:
        if max_turns < 1 or max_new_tokens < 1 or max_context < 2:
            raise ValueError(
                f"RolloutEngine needs max_turns >= 1, max_new_tokens >= 1 and max_context >= 2 "
                f"(got {max_turns}, {max_new_tokens}, {max_context})"
            )
        self.backend = backend
        self.tokenizer = tokenizer
        self.env_factory = env_factory
        self.max_turns = max_turns
        self.max_new_tokens = max_new_tokens
        self.max_context = max_context
        self.sampling = sampling if sampling is not None else SamplingParams()
        self.renderer = renderer if renderer is not None else ChatRenderer(tokenizer)
        self.on_env_error = on_env_error
        self.on_progress = on_progress
        """Called after every turn with ``(finished episodes, all episodes)`` (progress bars)."""
        self.decoder = decoder
        self.weights: Any = None
        """Optional guard of the backend's weights (asynchronous rollouts): its ``generating()``
        context manager holds them still for one backend call and yields their version, recorded
        in :attr:`~agent_r1.mdp.Trajectory.turn_versions`; ``generating(swap=False)`` inside a
        turn that continues an earlier call keeps the weights that call used."""
        self._decoding_totals: defaultdict[str, float] = defaultdict(float)
        self._backend_takes_budgets = takes_budgets(backend)
        if not self._backend_takes_budgets:
            warnings.warn(
                f"rollout backend {backend.name or type(backend).__name__!r}: generate() takes no "
                "max_new_tokens (per-prompt budgets, declared by RolloutBackend.generate since 0.2.0); "
                "it is called without them and its rows are cut to each budget. Support for such "
                "backends will be removed in 0.3.",
                DeprecationWarning,
                stacklevel=2,
            )
        self.last_metrics: dict[str, float] = {}
        """Batch-level figures of the latest run (``rollout/...``): see :meth:`run`."""
        self.last_close_errors: list[str] = []
        """What each failed :meth:`Environment.aclose` of the latest run raised (also warned)."""

    # -- public API -----------------------------------------------------------------------------
    def collect(self, tasks: Sequence[Task], group_size: int = 1, **options: Any) -> list[Trajectory]:
        """Synchronous :meth:`run`, with the same arguments (in a worker thread when called from a
        running event loop)."""
        return run_sync(self.run(tasks, group_size, **options))

    async def run(
        self,
        tasks: Sequence[Task],
        group_size: int = 1,
        *,
        seed: int | None = None,
        policy_version: int = 0,
        group_salt: str | None = None,
    ) -> list[Trajectory]:
        """Roll out every task ``group_size`` times; returns the trajectories task by task, sample by
        sample.

        ``group_id`` is ``"{task.id}@{group_salt}"`` (``#k`` appended for the k-th repeat of a task id
        in ``tasks``), so that a group is the samples of one task within one call; pass a salt
        unique to the training step (a random one is drawn when omitted). ``seed`` (default
        ``sampling.seed``) makes the run reproducible: the same seed, tasks, weights and
        environments give the same trajectories. Afterwards :attr:`last_metrics` holds
        ``rollout/generation_s``, ``rollout/env_s``, ``rollout/generated_tokens``,
        ``rollout/tokens_per_s``, ``rollout/backend_calls`` and ``rollout/turns`` (tokens of the
        kept actions); with a decoder also ``decoding/candidates``, ``decoding/generated_tokens``
        (discarded candidates included), ``decoding/scored_tokens``, ``decoding/score_s`` and
        ``decoding/picked_other`` (turns whose kept action was not the first candidate).
        """
        if group_size < 1:
            raise ValueError(f"group_size must be >= 1, got {group_size}")
        salt = group_salt if group_salt is not None else uuid.uuid4().hex[:8]
        seed = seed if seed is not None else self.sampling.seed
        episodes = self._make_episodes(tasks, group_size, salt, policy_version)
        totals: defaultdict[str, float] = defaultdict(float)
        self._decoding_totals = defaultdict(float)
        turn = 0
        try:
            await self._reset(episodes)
            while active := [episode for episode in episodes if not episode.done]:
                started = time.perf_counter()
                generated = self._generate(active, turn, seed)
                totals["generation_s"] += time.perf_counter() - started
                totals["generated_tokens"] += generated
                totals["backend_calls"] += 1
                started = time.perf_counter()
                await self._step(active, turn)
                totals["env_s"] += time.perf_counter() - started
                turn += 1
                if self.on_progress is not None:
                    self.on_progress(sum(episode.done for episode in episodes), len(episodes))
        finally:
            await self._close(episodes)
            end_rollout = getattr(self.backend, "end_rollout", None)  # backends older than 0.2.0
            if end_rollout is not None:
                end_rollout()
        for episode in episodes:
            self._finish(episode)
        self.last_metrics = {
            "rollout/generation_s": totals["generation_s"],
            "rollout/env_s": totals["env_s"],
            "rollout/generated_tokens": float(totals["generated_tokens"]),
            "rollout/tokens_per_s": totals["generated_tokens"] / max(totals["generation_s"], 1e-9),
            "rollout/backend_calls": float(totals["backend_calls"]),
            "rollout/turns": float(turn),
        }
        if self.decoder is not None:
            self.last_metrics.update(
                {f"decoding/{name}": value for name, value in sorted(self._decoding_totals.items())}
            )
        return [episode.trajectory for episode in episodes]

    # -- phases ---------------------------------------------------------------------------------
    def _make_episodes(
        self, tasks: Sequence[Task], group_size: int, salt: str, policy_version: int
    ) -> list[_Episode]:
        episodes = []
        for task, group, sample in group_samples(tasks, group_size, salt):
            trajectory = Trajectory(
                id=f"{group}/{sample}",
                task_id=task.id,
                group_id=group,
                sample_index=sample,
                policy_version=policy_version,
            )
            episodes.append(_Episode(task=task, env=self.env_factory(), trajectory=trajectory))
        return episodes

    async def _reset(self, episodes: list[_Episode]) -> None:
        starts = await asyncio.gather(*(self._start(episode) for episode in episodes))
        prompts: dict[str, list[int]] = {}
        for episode, start in zip(episodes, starts, strict=True):
            if start is None:  # its reset raised: a failed episode with no tokens
                self._end(episode, "env_error", truncated=False)
                continue
            episode.start = start
            episode.trajectory.start_info = dict(getattr(start, "info", None) or {})
            episode.messages = [dict(message) for message in start.messages]
            key = json.dumps([start.messages, start.tools], sort_keys=True, default=str)
            if key not in prompts:
                prompts[key] = self.renderer.render_prompt(start.messages, start.tools)
            prompt = prompts[key]
            episode.trajectory.append(TokenSource.PROMPT, 0, prompt)
            if len(prompt) >= self.max_context:
                warnings.warn(
                    f"task {episode.task.id!r}: the prompt has {len(prompt)} tokens, which leaves no room in "
                    f"max_context={self.max_context}; the episode ends before the first action",
                    stacklevel=3,
                )
                self._end(episode, "max_tokens", truncated=True)

    async def _start(self, episode: _Episode) -> EpisodeStart | None:
        """``episode``'s reset; ``None`` when it raised and ``on_env_error`` is ``end`` (the error
        is noted on the trajectory and counted, like a step's). An :class:`~agent_r1.AgentR1Error`
        (agent-r1's own verdict, e.g. a prompt a trainer cannot take) always stops the rollout."""
        try:
            return await episode.env.reset(episode.task)
        except AgentR1Error:  # agent-r1's own verdict (a config the episode cannot start with)
            raise
        except Exception as exc:
            where = (
                f"environment {episode.env.name or type(episode.env).__name__!r} raised in reset (task "
                f"{episode.task.id!r}): {type(exc).__name__}: {exc}"
            )
            if self.on_env_error == "raise":
                raise AgentR1Error(
                    f"{where}. Fix the environment, or pass on_env_error='end' to end such episodes and go "
                    "on."
                ) from exc
            episode.counters["env_errors"] += 1
            episode.trajectory.errors.append(where)
            return None

    def _generate(self, active: list[_Episode], turn: int, seed: int | None) -> int:
        """One batched backend call for every active episode; appends the policy tokens."""
        budgets = [min(self.max_new_tokens, self.max_context - len(e.trajectory)) for e in active]
        stops = set(self.sampling.stop)
        for episode in active:
            stops.update(episode.env.stop_sequences)
        sampling = self.sampling.model_copy(
            update={
                "max_new_tokens": self.max_new_tokens,
                "stop": sorted(stops),
                "seed": turn_seed(seed, turn) if seed is not None else None,
            }
        )
        prompts = [episode.trajectory.token_ids for episode in active]
        started = time.perf_counter()
        guard = (
            self.weights.generating(swap=not any(e.inline for e in active))
            if self.weights is not None
            else contextlib.nullcontext(None)
        )
        # Called in the event loop's thread on purpose: torch's per-thread state (grad mode, the
        # current CUDA device) stays the caller's, and no environment step is pending meanwhile.
        with guard as version:
            if self.decoder is None:
                generations = self._call_backend(prompts, sampling, budgets)
            else:
                generations = self._decode(active, prompts, sampling, budgets)
        elapsed = time.perf_counter() - started
        for episode, generation, budget in zip(active, generations, budgets, strict=True):
            if version is not None:
                episode.trajectory.turn_versions.setdefault(turn, version)
            episode.action = self._action_of(generation, budget)
            ids = list(episode.action.token_ids)
            logprobs = list(episode.action.logprobs) if episode.action.logprobs is not None else None
            episode.trajectory.append(TokenSource.POLICY, turn, ids, logprobs)
            content = self.renderer.action_content(ids, episode.action.finish_reason)
            if episode.inline:  # the same assistant message goes on after a continuation
                episode.messages[-1] = {
                    **episode.messages[-1],
                    "content": episode.messages[-1]["content"] + content,
                }
                episode.inline = False
            else:
                episode.messages.append({"role": "assistant", "content": content})
            episode.generation_s += elapsed
            episode.turn_generation_s = elapsed
        return sum(len(g.token_ids) for g in generations)

    def _action_of(self, generation: Generation, budget: int) -> Action:
        """The action of one generation; a ``length`` stop under a budget smaller than
        ``max_new_tokens`` was the context's doing (``context``)."""
        action = action_from_generation(generation, budget=budget, max_new_tokens=self.max_new_tokens)
        action.text = self.renderer.action_text(action.token_ids, action.finish_reason)
        return action

    def _decode(
        self,
        active: list[_Episode],
        prompts: list[list[int]],
        sampling: SamplingParams,
        budgets: list[int],
    ) -> list[Generation]:
        """The decoder's pick for every active episode; its cost goes to the episodes' counters."""
        from agent_r1.rollout.decoder import TurnRequest

        assert self.decoder is not None
        choice: TurnChoice = self.decoder.decide(
            TurnRequest(
                prompts=prompts,
                budgets=budgets,
                sampling=sampling,
                generate=self._call_backend,
                action_of=self._action_of,
                envs=[episode.env for episode in active],
                messages=[episode.messages for episode in active],
            )
        )
        if len(choice.generations) != len(active):
            raise AgentR1Error(
                f"decoder {self.decoder.kind!r} returned {len(choice.generations)} actions for "
                f"{len(active)} episodes"
            )
        totals = self._decoding_totals
        for i, episode in enumerate(active):
            counters = episode.counters
            counters["decoding_candidates"] += choice.candidates[i]
            counters["decoding_generated_tokens"] += choice.generated_tokens[i]
            counters["decoding_scored_tokens"] += choice.scored_tokens[i]
            counters["decoding_score_s"] += choice.score_s
            counters["decoding_picked_other"] += choice.picked[i] != 0
        totals["candidates"] += sum(choice.candidates)
        totals["generated_tokens"] += sum(choice.generated_tokens)
        totals["scored_tokens"] += sum(choice.scored_tokens)
        totals["score_s"] += choice.score_s
        totals["picked_other"] += sum(j != 0 for j in choice.picked)
        return choice.generations

    def _call_backend(
        self, prompts: list[list[int]], sampling: SamplingParams, budgets: list[int]
    ) -> list[Generation]:
        """Every backend takes per-prompt budgets (``RolloutBackend.generate``'s ``max_new_tokens``);
        a row that comes back longer than its budget is cut to it (the kept tokens are still exact
        samples)."""
        return generate_within_budgets(
            self.backend, prompts, sampling, budgets, with_budgets=self._backend_takes_budgets
        )

    async def _step(self, active: list[_Episode], turn: int) -> None:
        """Step every active episode's environment concurrently, then apply the observations."""

        async def step(episode: _Episode) -> tuple[Observation, float]:
            assert episode.action is not None
            started = time.perf_counter()
            try:
                observation = await episode.env.step(episode.action, turn)
            except EnvironmentFatalError:
                raise
            except Exception as exc:
                if self.on_env_error == "raise":
                    raise AgentR1Error(
                        f"environment {episode.env.name or type(episode.env).__name__!r} raised in step "
                        f"(task {episode.task.id!r}, turn {turn}): {type(exc).__name__}: {exc}. Fix the "
                        "environment, or pass on_env_error='end' to end such episodes and go on."
                    ) from exc
                episode.counters["env_errors"] += 1
                episode.trajectory.errors.append(
                    f"environment {episode.env.name or type(episode.env).__name__!r} raised in step (task "
                    f"{episode.task.id!r}, turn {turn}): {type(exc).__name__}: {exc}"
                )
                observation = Observation(
                    done=True, termination="env_error", info={"error": f"{type(exc).__name__}: {exc}"}
                )
            return observation, time.perf_counter() - started

        results = await asyncio.gather(*(step(episode) for episode in active))
        for episode, (observation, elapsed) in zip(active, results, strict=True):
            self._apply(episode, observation, elapsed, turn)

    def _apply(self, episode: _Episode, observation: Observation, elapsed: float, turn: int) -> None:
        action = episode.action
        assert action is not None
        parsed = {
            name: getattr(observation, name)
            for name in ("tool_calls", "answer", "parse_errors")
            if getattr(observation, name) is not None
        }
        if parsed:  # what the environment parsed out of the action, recorded on it
            action = episode.action = action.model_copy(update=parsed)
        trajectory = episode.trajectory
        trajectory.steps.append(
            Step(
                turn=turn,
                action=action,
                observation=observation,
                generation_s=episode.turn_generation_s,
                tool_s=elapsed,
            )
        )
        counters = episode.counters
        counters["tool_s"] += elapsed
        counters["tool_calls"] += len(observation.tool_results)
        counters["tool_errors"] += sum(not result.ok for result in observation.tool_results)
        counters["format_errors"] += len(action.parse_errors)
        counters["length_cuts"] += action.finish_reason == "length"
        for name, value in observation.metrics.items():  # the environment's own figures
            counters[f"env/{name}"] += value
        source = episode.env.name or type(episode.env).__name__
        for signal in observation.rewards:
            trajectory.rewards.append(
                signal if signal.source else signal.model_copy(update={"source": source})
            )

        cut = action.finish_reason in ("length", "context")
        if observation.done:  # an environment's own turn limit is a budget too
            termination = observation.termination or "done"
            return self._end(episode, termination, truncated=cut or termination == "max_turns")
        room = self.max_context - len(trajectory)
        if action.finish_reason == "context" or room <= 0:
            return self._end(episode, "max_tokens", truncated=True)
        if turn + 1 >= self.max_turns:
            return self._end(episode, "max_turns", truncated=True)
        if observation.continuation is not None:
            return self._continue_turn(episode, observation.continuation, room, turn)
        pieces = self.renderer.render_observation(
            observation.messages, action_ids=action.token_ids, finish_reason=action.finish_reason
        )
        if pieces is not None and len(pieces) >= room:  # no room left for the next action
            reserve = min(self.max_new_tokens, max(1, room // 2))
            pieces = self.renderer.render_observation(
                observation.messages,
                action_ids=action.token_ids,
                finish_reason=action.finish_reason,
                max_tokens=room - reserve,
            )
            counters["observation_cuts"] += 1
        if pieces is None:
            return self._end(episode, "max_tokens", truncated=True)
        trajectory.append(TokenSource.TEMPLATE, turn, pieces.closure)
        trajectory.append(TokenSource.ENV, turn, pieces.env)
        trajectory.append(TokenSource.TEMPLATE, turn + 1, pieces.header)
        episode.messages.extend(pieces.messages)
        return None

    def _continue_turn(self, episode: _Episode, text: str, room: int, turn: int) -> None:
        """Append ``text``'s tokens inside the assistant's turn (no closure, no header), cut to leave
        the next action up to ``min(max_new_tokens, half the room)`` tokens."""
        ids = list(self.tokenizer.encode(text, add_special_tokens=False))
        keep = room - min(self.max_new_tokens, max(1, room // 2))
        if len(ids) >= room:
            ids = ids[: max(keep, 0)]
            episode.counters["observation_cuts"] += 1
        if not ids and text:
            return self._end(episode, "max_tokens", truncated=True)
        episode.trajectory.append(TokenSource.ENV, turn, ids)
        last = episode.messages[-1]
        episode.messages[-1] = {**last, "content": last["content"] + self.tokenizer.decode(ids)}
        episode.inline = True
        return None

    async def _close(self, episodes: list[_Episode]) -> None:
        """Every episode's :meth:`Environment.aclose`, concurrently; failures are counted."""

        async def close(episode: _Episode) -> None:
            aclose = getattr(episode.env, "aclose", None)  # environments written to the protocol only
            if aclose is not None:
                await aclose()

        results = await asyncio.gather(*(close(episode) for episode in episodes), return_exceptions=True)
        messages = []
        for episode, result in zip(episodes, results, strict=True):
            if isinstance(result, BaseException):
                if not isinstance(result, Exception):
                    raise result  # KeyboardInterrupt, SystemExit, cancellation: not a close failure
                # counted, not a trajectory error: the episode itself is intact and is trained on
                episode.counters["env_close_errors"] += 1
                messages.append(
                    f"environment {episode.env.name or type(episode.env).__name__!r} raised in aclose "
                    f"(task {episode.task.id!r}): {type(result).__name__}: {result}"
                )
        self.last_close_errors = messages
        if messages:
            warnings.warn(
                f"{len(messages)} of {len(episodes)} episodes failed to close; first: {messages[0]}. Their "
                "trajectories are kept; fix the environment's aclose() if it leaks resources.",
                RuntimeWarning,
                stacklevel=2,
            )

    def _end(self, episode: _Episode, termination: str, *, truncated: bool) -> None:
        episode.done = True
        episode.trajectory.termination = termination
        episode.trajectory.truncated = truncated

    def _finish(self, episode: _Episode) -> None:
        """Per-trajectory metrics, the template drift included."""
        trajectory = episode.trajectory
        tokens = trajectory.token_ids
        if episode.action is not None:
            tokens += self.renderer.closure_ids(episode.action.token_ids, episode.action.finish_reason)
        tools = episode.start.tools if episode.start is not None else None
        drift = self.renderer.drift(episode.messages, tokens, tools=tools) if episode.start is not None else 0
        counters = episode.counters
        trajectory.metrics = {
            "generation_s": episode.generation_s,
            "tool_s": float(counters["tool_s"]),
            "num_turns": float(len(trajectory.steps)),
            "tool_calls": float(counters["tool_calls"]),
            "tool_errors": float(counters["tool_errors"]),
            "format_errors": float(counters["format_errors"]),
            "template_drift_tokens": float(drift),
            "truncated": float(trajectory.truncated),
            "length_cuts": float(counters["length_cuts"]),
            "observation_cuts": float(counters["observation_cuts"]),
            "env_errors": float(counters["env_errors"]),
            "env_close_errors": float(counters["env_close_errors"]),
            "policy_tokens": float(trajectory.num_policy_tokens),
            "context_tokens": float(len(trajectory)),
        }
        trajectory.metrics.update({name: float(v) for name, v in counters.items() if name.startswith("env/")})
        if self.decoder is not None:
            from agent_r1.rollout.decoder import DECODING_METRICS

            trajectory.metrics.update({name: float(counters[name]) for name in DECODING_METRICS})
