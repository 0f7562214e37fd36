"""agent-r1 inside verl (tested with verl 0.9.1, transformers 5.10, torch 2.13).

:class:`AgentR1AgentLoop` is a verl ``AgentLoopBase``: for each dataset row whose ``agent_name``
column says ``agent_r1`` (or the name given in an agent-loop YAML file), it runs an agent-r1
environment with agent-r1's :class:`~agent_r1.rollout.loop.RolloutEngine`, generating through
verl's LLM server manager (vLLM or SGLang servers), and returns an ``AgentLoopOutput`` whose
``prompt_ids + response_ids`` are the trajectory's tokens exactly, ``response_mask`` is 1 on
policy-sampled tokens only (environment and template tokens 0), ``response_logprobs`` are the
server's sampling log-probabilities (when ``rollout.calculate_log_probs`` is on), and
``reward_score`` is agent-r1's weighted reward sum (when reward shapers are configured or the
environment emits rewards; otherwise verl's reward manager scores the row).

Registration, both ways verl 0.9 supports:

- the ``verl.plugins`` entry point ``agent_r1 = "agent_r1.integrations.verl"`` (declared by the
  agent-r1 distribution): ``import verl`` imports this module, which registers the loop under the
  name ``agent_r1`` (options then come from the trainer config's ``agent_r1`` section);
- an agent-loop YAML file named by ``actor_rollout_ref.rollout.agent.agent_loop_config_path``,
  whose entries may carry the loop's options as keywords::

      - name: agent_r1_calculator
        _target_: agent_r1.integrations.verl.AgentR1AgentLoop
        environment: calculator
        env_options: {few_shot: 1}
        reward_shapers: [{name: answer_match, options: {mode: numeric}, weight: 1.0}]
        max_turns: 4
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal

from agent_r1.contracts import Environment, EpisodeStart, Generation, RolloutBackend, SamplingParams
from agent_r1.integrations import IntegrationError, require
from agent_r1.integrations._common import (
    build_shapers,
    environment_factory,
    reward_columns,
    score,
    split,
)
from agent_r1.mdp import Action, Observation, Task, Trajectory

TESTED_VERL = "verl==0.9.1"
require("verl", "verl", TESTED_VERL)

from verl.experimental.agent_loop.agent_loop import (  # noqa: E402
    AgentLoopBase,
    AgentLoopMetrics,
    AgentLoopOutput,
    register,
)

__all__ = ["TESTED_VERL", "AgentR1AgentLoop", "VerlServerBackend", "task_from_row"]

_OPTION_KEYS = ("environment", "env_options", "reward_shapers", "max_turns", "max_new_tokens", "on_env_error")


class VerlServerBackend(RolloutBackend):
    """An agent-r1 rollout backend that generates through verl's LLM server manager.

    The agent-r1 engine is synchronous inside an episode, while verl's server manager is async on
    verl's event loop: the engine runs in a worker thread, and each ``generate`` submits the
    requests to ``loop`` and waits for them. Stop strings are passed to the server with
    ``include_stop_str_in_output`` (so the returned ids are everything sampled), the per-prompt
    token budget as ``max_tokens``; the finish reason is read off the tokens (end-of-turn token,
    stop string, or budget).
    """

    name = "verl_server"

    def __init__(
        self,
        server_manager: Any,
        tokenizer: Any,
        loop: asyncio.AbstractEventLoop,
        *,
        request_id: str,
        base_params: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__({})
        from agent_r1.rollout.chat import end_of_turn_token_ids

        self.server_manager = server_manager
        self.tokenizer = tokenizer
        self.loop = loop
        self.request_id = request_id
        self.base_params = dict(base_params or {})
        stop_ids = set(end_of_turn_token_ids(tokenizer))
        if tokenizer.eos_token_id is not None:
            stop_ids.add(int(tokenizer.eos_token_id))
        self.stop_token_ids = frozenset(stop_ids)

    def _generate_within(
        self, prompts: Sequence[Sequence[int]], sampling: SamplingParams, budgets: list[int]
    ) -> list[Generation]:
        """Sample one continuation per prompt through the server manager (see the class docstring)."""
        futures = [
            asyncio.run_coroutine_threadsafe(self._generate_one(list(prompt), sampling, budget), self.loop)
            for prompt, budget in zip(prompts, budgets, strict=True)
        ]
        return [future.result() for future in futures]

    async def _generate_one(self, prompt: list[int], sampling: SamplingParams, budget: int) -> Generation:
        if budget <= 0:
            return Generation(token_ids=[], logprobs=[], finish_reason="length")
        params = {
            **self.base_params,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "top_k": sampling.top_k if sampling.top_k > 0 else -1,
            "max_tokens": budget,
        }
        if sampling.stop:
            params["stop"] = list(sampling.stop)
            params["include_stop_str_in_output"] = True
        output = await self.server_manager.generate(
            request_id=self.request_id, prompt_ids=prompt, sampling_params=params
        )
        ids = [int(t) for t in output.token_ids][:budget]
        logprobs = [float(x) for x in (output.log_probs or [])][: len(ids)]
        if getattr(output, "stop_reason", None) == "aborted":
            raise IntegrationError(
                f"verl's rollout server aborted request {self.request_id!r} (weights being updated?); the "
                "agent-r1 episode cannot continue from a partial action"
            )
        finish: Any = "length"
        stop_sequence = None
        if ids and ids[-1] in self.stop_token_ids:
            finish = "eos"
        elif sampling.stop and ids:
            tail = self.tokenizer.decode(ids[-64:], skip_special_tokens=False)
            for stop in sampling.stop:
                if tail.endswith(stop) or tail.rstrip().endswith(stop):
                    finish, stop_sequence = "stop", stop
                    break
        if finish == "length" and len(ids) < budget:
            finish = "eos"  # the server stopped on a token of its own (the model's eos list)
        return Generation(
            token_ids=ids,
            logprobs=logprobs if len(logprobs) == len(ids) else [],
            finish_reason=finish,
            stop_sequence=stop_sequence,
        )


class _PromptBudget(Environment):
    """Wraps the episode's environment to learn the rendered prompt's length at reset, and sets the
    engine's context so that the response fits verl's ``response_length`` exactly."""

    def __init__(self, inner: Environment, loop_owner: AgentR1AgentLoop, engine_ref: list[Any]) -> None:
        super().__init__({})
        self.inner = inner
        self.owner = loop_owner
        self.engine_ref = engine_ref
        self.name = inner.name  # type: ignore[misc]

    @property
    def stop_sequences(self) -> list[str]:
        return self.inner.stop_sequences

    async def reset(self, task: Task) -> EpisodeStart:
        start = await self.inner.reset(task)
        engine = self.engine_ref[0]
        prompt = engine.renderer.render_prompt(start.messages, start.tools or None)
        limit = int(self.owner.rollout_config.prompt_length)
        if len(prompt) > limit:
            raise IntegrationError(
                f"verl agent loop 'agent_r1': the prompt of task {task.id!r} renders to {len(prompt)} "
                "tokens, "
                f"more than actor_rollout_ref.rollout.prompt_length={limit}; raise prompt_length (agent-r1 "
                "does not cut prompts: the trajectory would no longer be what the policy saw)"
            )
        engine.max_context = len(prompt) + int(self.owner.rollout_config.response_length)
        return start

    async def step(self, action: Action, turn: int) -> Observation:
        return await self.inner.step(action, turn)

    async def aclose(self) -> None:
        await self.inner.aclose()


def task_from_row(row: Mapping[str, Any]) -> Task:
    """The agent-r1 task of a verl dataset row: ``raw_prompt`` (the chat messages), and from
    ``extra_info`` the optional ``task_id``, ``answer`` and ``metadata`` (the answer falls back to
    ``reward_model.ground_truth``, verl's convention)."""
    messages = row.get("raw_prompt")
    if messages is None:
        raise IntegrationError(
            "verl agent loop 'agent_r1': the row has no 'raw_prompt' column (set data.return_raw_chat=True)"
        )
    messages = [dict(m) for m in list(messages)]
    extra = dict(row.get("extra_info") or {})
    reward_model = dict(row.get("reward_model") or {})
    answer = extra.get("answer", reward_model.get("ground_truth"))
    task_id = str(extra.get("task_id", extra.get("index", row.get("index", uuid.uuid4().hex[:8]))))
    return Task(id=task_id, messages=messages, answer=answer, metadata=dict(extra.get("metadata") or {}))


@register("agent_r1")
class AgentR1AgentLoop(AgentLoopBase):
    """A verl agent loop that runs one agent-r1 episode per dataset row (see the module docstring).

    Options (keywords from the agent-loop YAML entry, else the trainer config's ``agent_r1``
    section): ``environment`` (an installed environment's name, required), ``env_options``,
    ``reward_shapers`` (a list of ``{name, options, weight}``), ``max_turns`` (default 4),
    ``max_new_tokens`` per action (default: ``rollout.response_length``) and ``on_env_error``
    (``"end"``, the default, ends a failing episode with termination ``env_error``; ``"raise"``).
    The response never exceeds ``rollout.response_length``: the engine's context is the rendered
    prompt plus that length.

    ``num_turns`` follows verl's meaning (chat messages: the user's, then every action and
    observation); ``extra_fields`` carry ``agent_r1_rewards`` (unweighted sum per signal),
    ``agent_r1_termination``, ``agent_r1_num_actions``, ``agent_r1_errors`` and the whole
    trajectory as ``agent_r1_trajectory`` (a JSON line, :meth:`~agent_r1.mdp.Trajectory.from_json_line`).
    An episode whose environment or a reward shaper failed is set aside as in agent-r1's own
    trainer: its ``response_mask`` is all 0 (no loss) and its reward 0; ``agent_r1_errors`` says why.
    """

    _executor: ThreadPoolExecutor | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        options = {key: kwargs.pop(key) for key in _OPTION_KEYS if key in kwargs}
        kwargs.pop("name", None)  # the YAML entry's name, passed along by hydra
        super().__init__(*args, **kwargs)
        section = self.config.get("agent_r1", None) if hasattr(self.config, "get") else None
        defaults = dict(section) if section is not None else {}
        unknown = set(defaults) - set(_OPTION_KEYS)
        if unknown:
            raise IntegrationError(
                f"verl agent loop 'agent_r1': unknown keys {sorted(unknown)} in the trainer config's "
                "agent_r1 "
                f"section; known: {list(_OPTION_KEYS)}"
            )
        merged = {**defaults, **options}
        environment = merged.get("environment")
        if not environment:
            raise IntegrationError(
                "verl agent loop 'agent_r1' needs an environment: set `environment: <name>` in its "
                "agent-loop "
                "YAML entry or `+agent_r1.environment=<name>` in the trainer config"
            )
        self.environment = str(environment)
        self.env_options = dict(merged.get("env_options") or {})
        self.env_factory = environment_factory(self.environment, self.env_options)
        self.shapers = build_shapers([_plain(spec) for spec in merged.get("reward_shapers") or []])
        self.max_turns = int(merged.get("max_turns", 4))
        self.max_new_tokens = merged.get("max_new_tokens")
        on_env_error: Literal["raise", "end"] = merged.get("on_env_error", "end")
        self.on_env_error = on_env_error

    @classmethod
    def _pool(cls) -> ThreadPoolExecutor:
        # The engine blocks while it waits for the server: one thread per episode in flight.
        if cls._executor is None:
            cls._executor = ThreadPoolExecutor(max_workers=256, thread_name_prefix="agent-r1-episode")
        return cls._executor

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        """Run one episode of the row ``kwargs`` and return verl's ``AgentLoopOutput``."""
        from agent_r1.rollout.loop import RolloutEngine

        task = task_from_row(kwargs)
        loop = asyncio.get_running_loop()
        request_id = uuid.uuid4().hex
        base = {k: v for k, v in sampling_params.items() if k not in ("temperature", "top_p", "top_k")}
        base["logprobs"] = bool(sampling_params.get("logprobs", False))
        backend = VerlServerBackend(
            self.server_manager, self.tokenizer, loop, request_id=request_id, base_params=base
        )
        response_length = int(self.rollout_config.response_length)
        engine_ref: list[Any] = []
        engine = RolloutEngine(
            backend,
            self.tokenizer,
            lambda: _PromptBudget(self.env_factory(), self, engine_ref),
            max_turns=self.max_turns,
            max_new_tokens=int(self.max_new_tokens or response_length),
            max_context=int(self.rollout_config.prompt_length) + response_length,
            sampling=SamplingParams(
                temperature=float(sampling_params.get("temperature", 1.0)),
                top_p=float(sampling_params.get("top_p", 1.0)),
                top_k=max(int(sampling_params.get("top_k", -1) or -1), 0),
            ),
            on_env_error=self.on_env_error,
        )
        engine_ref.append(engine)
        started = time.perf_counter()
        [trajectory] = await loop.run_in_executor(
            self._pool(), lambda: engine.collect([task], 1, group_salt=request_id[:8])
        )
        score([trajectory], {task.id: task}, self.shapers)
        return self.output(trajectory, time.perf_counter() - started)

    def output(self, trajectory: Trajectory, seconds: float) -> AgentLoopOutput:
        """verl's ``AgentLoopOutput`` for a scored trajectory."""
        part = split(trajectory, where="verl agent loop 'agent_r1': ")
        columns = reward_columns(trajectory)
        has_logprobs = all(
            s.logprobs is not None for s in trajectory.segments if s.source.value == "policy" and s.token_ids
        )
        scored = bool(self.shapers) or bool(trajectory.rewards)
        messages = 1 + sum(
            1 + int(step.observation is not None and not step.observation.done) for step in trajectory.steps
        )
        extra: dict[str, Any] = {
            "agent_r1_rewards": columns["rewards"],
            "agent_r1_termination": columns["termination"],
            "agent_r1_num_actions": columns["num_turns"],
            "agent_r1_errors": columns["errors"],
            "agent_r1_trajectory": trajectory.to_json_line(),
        }
        failed = columns["score"] is None  # the environment or a reward shaper failed
        return AgentLoopOutput(
            prompt_ids=part.prompt_ids,
            response_ids=part.completion_ids,
            # a failed episode is set aside as in agent-r1's own trainer: no token of it carries loss
            response_mask=[0] * len(part.policy_mask) if failed else part.policy_mask,
            response_logprobs=part.logprobs if has_logprobs else None,
            reward_score=(0.0 if failed else columns["score"]) if scored else None,
            num_turns=messages,
            metrics=AgentLoopMetrics(
                generate_sequences=float(trajectory.metrics.get("generation_s", 0.0)),
                tool_calls=float(trajectory.metrics.get("tool_s", 0.0)),
            ),
            extra_fields=extra,
        )


def _plain(spec: Any) -> Any:
    """OmegaConf nodes to plain dicts (reward shaper specs from YAML)."""
    try:
        from omegaconf import DictConfig, OmegaConf

        if isinstance(spec, DictConfig):
            return OmegaConf.to_container(spec, resolve=True)
    except ImportError:  # omegaconf comes with agent-r1 and verl; nothing to convert without it
        pass
    return spec
