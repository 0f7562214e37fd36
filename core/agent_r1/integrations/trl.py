"""agent-r1 inside TRL (tested with trl 1.16.0, transformers 5.10, torch 2.13 on CPU).

Three adapters:

- :class:`AgentR1RolloutFunc`: a ``rollout_func`` for ``trl.GRPOTrainer``. It runs agent-r1's
  multi-turn :class:`~agent_r1.rollout.loop.RolloutEngine` with any installed environment,
  sampling with the trainer's own model through agent-r1's ``hf`` backend, and returns
  ``prompt_ids``, ``completion_ids``, ``logprobs`` and ``env_mask`` (1 on policy-sampled tokens, 0
  on environment, template and prompt-continuation tokens) plus agent-r1's reward signals as extra
  columns. :meth:`AgentR1RolloutFunc.reward_func` passes the score through to TRL, which then
  computes its own group advantages and loss.
- :class:`AgentR1RolloutWorker`: a ``rollout_worker`` for TRL's experimental ``AsyncGRPOTrainer``
  (its ``RolloutWorkerProtocol``). It pushes ``RolloutSample`` rows whose ``advantage`` comes from
  an agent-r1 advantage estimator (``grpo``, ``rloo``, ``reinforce_pp``...), so agent-r1 keeps the
  credit assignment.
- :class:`TRLEnvironment`: the other direction: a TRL ``environment_factory`` class (``reset``,
  public tool methods, optional ``get_reward``) used as an agent-r1 environment.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import inspect
import json
import queue
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Literal

from agent_r1.builtins.formats import HermesFormat
from agent_r1.builtins.tool_runner import CallTimedOut, run_in_thread
from agent_r1.contracts import Environment, EpisodeStart, RolloutBackend, SamplingParams, Tool
from agent_r1.gateway.tools import tool_class
from agent_r1.integrations import IntegrationError, require
from agent_r1.integrations._common import (
    EnvironmentSpec,
    ShaperSpec,
    build_shapers,
    environment_factory,
    reward_columns,
    score,
    split,
)
from agent_r1.mdp import Action, Message, Observation, RewardSignal, Task, ToolCall, ToolResult, Trajectory

TESTED_TRL = "trl==1.16.0"
require("trl", "trl", TESTED_TRL)

__all__ = ["TESTED_TRL", "AgentR1RolloutFunc", "AgentR1RolloutWorker", "TRLEnvironment", "task_key"]


def task_key(messages: Sequence[Message] | str) -> str:
    """A stable key of a prompt (conversational or plain text), used to find the task a prompt
    came from: TRL hands ``rollout_func`` the prompts only, not the other dataset columns."""
    data = messages if isinstance(messages, str) else [dict(m) for m in messages]
    text = json.dumps(data, sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha1(text.encode("utf-8")).hexdigest()


class _TaskBook:
    """Tasks by prompt; a prompt seen for the first time becomes a task of its own (no answer)."""

    def __init__(self, tasks: Sequence[Task]) -> None:
        self.by_key: dict[str, Task] = {}
        for task in tasks:
            self.by_key.setdefault(task_key(task.messages), task)

    def task(self, prompt: Sequence[Message] | str) -> Task:
        key = task_key(prompt)
        found = self.by_key.get(key)
        if found is None:
            messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
            found = self.by_key[key] = Task(id=f"prompt-{key[:12]}", messages=messages)
        return found


def _model_and_tokenizer(trainer: Any) -> tuple[Any, Any]:
    model = trainer.accelerator.unwrap_model(trainer.model)
    tokenizer = getattr(trainer.processing_class, "tokenizer", trainer.processing_class)
    return model, tokenizer


# --------------------------------------------------------------------------------------------
# GRPOTrainer(rollout_func=...)
# --------------------------------------------------------------------------------------------


class AgentR1RolloutFunc:
    """A ``rollout_func`` for ``trl.GRPOTrainer`` that runs agent-r1's multi-turn agent loop.

    ``environment`` is an installed environment's name (built with ``env_options``) or a callable
    returning a fresh :class:`~agent_r1.Environment`; one is built per episode. ``tasks`` are the
    agent-r1 tasks the dataset's prompts come from (:meth:`dataset` builds that dataset): TRL passes
    ``rollout_func`` only the prompts, so a prompt is matched to its task (answer, metadata) by its
    content; an unknown prompt becomes a task without an answer. ``reward_shapers`` score every
    trajectory (``(name, options, weight)``, ``(shaper, weight)`` or a mapping); environments' own
    process rewards are included in the score. Sampling uses the trainer's model with agent-r1's
    ``hf`` backend (or ``backend``, any :class:`~agent_r1.RolloutBackend`), the trainer's
    ``temperature``, ``top_p`` and ``top_k``, at most ``max_new_tokens`` per action (default: the
    trainer's ``max_completion_length``) and ``max_context`` tokens per trajectory.

    Each call returns, per prompt, ``prompt_ids``, ``completion_ids`` (everything after the
    prompt: actions, observations, template tokens), ``logprobs`` (sampling log-probabilities, 0.0
    on tokens the policy did not sample), ``env_mask`` and the extra columns ``agent_r1_score``
    (None for an episode whose environment or a reward shaper failed: TRL then gives it no
    advantage), ``agent_r1_rewards`` (unweighted sum per signal name), ``agent_r1_num_turns``,
    ``agent_r1_termination`` and ``agent_r1_truncated``. The latest trajectories and output are kept
    in :attr:`last_trajectories` and :attr:`last_output`.
    """

    def __init__(
        self,
        environment: EnvironmentSpec,
        env_options: Mapping[str, Any] | None = None,
        *,
        tasks: Sequence[Task] = (),
        reward_shapers: Sequence[ShaperSpec] = (),
        max_turns: int = 4,
        max_new_tokens: int | None = None,
        max_context: int = 2048,
        on_env_error: Literal["raise", "end"] = "end",
        backend: RolloutBackend | None = None,
        seed: int = 0,
    ) -> None:
        self.env_factory = environment_factory(environment, env_options)
        self.book = _TaskBook(tasks)
        self.shapers = build_shapers(reward_shapers)
        self.max_turns = max_turns
        self.max_new_tokens = max_new_tokens
        self.max_context = max_context
        self.on_env_error = on_env_error
        self.backend = backend
        self.seed = seed
        self.calls = 0
        self.last_trajectories: list[Trajectory] = []
        self.last_output: dict[str, list[Any]] = {}
        """What the latest call returned to TRL."""
        self.__name__ = "agent_r1_rollout"  # TRL and accelerate log callables by name

    def dataset(self, tasks: Sequence[Task] | None = None) -> Any:
        """A ``datasets.Dataset`` with a conversational ``prompt`` column (the tasks' messages) and an
        ``agent_r1_task_id`` column, for ``GRPOTrainer(train_dataset=...)``. ``tasks`` default to
        the ones given at construction; new ones are remembered."""
        from datasets import Dataset

        tasks = list(tasks) if tasks is not None else list(self.book.by_key.values())
        for task in tasks:
            self.book.by_key.setdefault(task_key(task.messages), task)
        return Dataset.from_list([{"prompt": task.messages, "agent_r1_task_id": task.id} for task in tasks])

    def _check(self, trainer: Any) -> None:
        if getattr(trainer, "tools", None):
            raise IntegrationError(
                "GRPOTrainer was given tools= together with rollout_func=AgentR1RolloutFunc: with tools, TRL "
                "runs its own tool loop and ignores env_mask, so environment tokens would carry loss. "
                "Drop tools= (agent-r1's environment runs the tools) or drop the rollout_func."
            )
        if getattr(trainer, "environment_factories", None):
            raise IntegrationError(
                "GRPOTrainer was given environment_factory= together with rollout_func=AgentR1RolloutFunc; "
                "the agent-r1 environment runs the episode. Drop environment_factory= (use "
                "agent_r1.integrations.trl.TRLEnvironment to run a TRL environment inside agent-r1)."
            )
        if getattr(trainer, "use_vllm", False) and self.backend is None:
            raise IntegrationError(
                "GRPOConfig(use_vllm=True) with AgentR1RolloutFunc: sampling through TRL's vLLM is not "
                "supported by this adapter (it needs per-turn stop strings and token budgets that TRL's "
                "vLLM helper does not take). Set use_vllm=False to sample with the trainer's model, or "
                "pass backend= (an agent-r1 RolloutBackend, such as the 'vllm' one) and sync its weights."
            )

    @contextlib.contextmanager
    def _backend(self, trainer: Any) -> Iterator[tuple[RolloutBackend, Any]]:
        """The backend to sample with: ``backend=`` (told the trainer's version), or the ``hf``
        backend on the trainer's model, unwrapped the way TRL unwraps it for its own generation
        (DeepSpeed ZeRO-3 parameters gathered, gradient checkpointing off)."""
        model, tokenizer = _model_and_tokenizer(trainer)
        version = int(trainer.state.global_step)
        if self.backend is not None:
            self.backend.sync_weights(model, version)
            yield self.backend, tokenizer
            return
        from trl.models import unwrap_model_for_generation

        from agent_r1.builtins.hf_backend import HFBackend

        with unwrap_model_for_generation(
            trainer.model_wrapped,
            trainer.accelerator,
            gather_deepspeed3_params=bool(getattr(trainer.args, "ds3_gather_for_generation", True)),
            gradient_checkpointing_kwargs=getattr(trainer.args, "gradient_checkpointing_kwargs", None),
        ) as unwrapped:
            backend = HFBackend({}, model=unwrapped, tokenizer=tokenizer)
            backend.sync_weights(unwrapped, version)
            yield backend, tokenizer

    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, list[Any]]:
        """Roll out one episode per prompt (TRL already repeats each prompt ``num_generations``
        times) and return TRL's rollout dict."""
        from agent_r1.rollout.loop import RolloutEngine

        self._check(trainer)
        tasks = [self.book.task(prompt) for prompt in prompts]
        top_k = int(getattr(trainer, "top_k", 0) or 0)
        step = int(trainer.state.global_step)
        self.calls += 1
        rank = int(getattr(trainer.accelerator, "process_index", 0))  # processes sample differently
        seed = (self.seed * 1_000_003 + step * 9_973 + self.calls * 101 + rank * 7) % 2**31
        with self._backend(trainer) as (backend, tokenizer):
            engine = RolloutEngine(
                backend,
                tokenizer,
                self.env_factory,
                max_turns=self.max_turns,
                max_new_tokens=self.max_new_tokens or int(trainer.max_completion_length),
                max_context=self.max_context,
                sampling=SamplingParams(
                    temperature=float(trainer.temperature),
                    top_p=float(getattr(trainer, "top_p", 1.0) or 1.0),
                    top_k=max(top_k, 0),
                ),
                on_env_error=self.on_env_error,
            )
            trajectories = engine.collect(
                tasks, 1, seed=seed, policy_version=step, group_salt=f"trl-s{step}-c{self.calls}"
            )
        score(trajectories, {task.id: task for task in tasks}, self.shapers)
        self.last_trajectories = trajectories
        self.last_output = rollout_dict(trajectories)
        return self.last_output

    @property
    def reward_func(self) -> Callable[..., list[float | None]]:
        """A TRL reward function that returns ``agent_r1_score`` (agent-r1's weighted reward sum)."""

        def agent_r1_score(
            completions: list[Any], agent_r1_score: list[float | None], **_: Any
        ) -> list[float | None]:
            return list(agent_r1_score)

        return agent_r1_score


def rollout_dict(trajectories: Sequence[Trajectory]) -> dict[str, list[Any]]:
    """TRL's ``rollout_func`` output for ``trajectories`` (see :class:`AgentR1RolloutFunc`)."""
    out: dict[str, list[Any]] = {
        key: []
        for key in (
            "prompt_ids",
            "completion_ids",
            "logprobs",
            "env_mask",
            "agent_r1_score",
            "agent_r1_rewards",
            "agent_r1_num_turns",
            "agent_r1_termination",
            "agent_r1_truncated",
        )
    }
    for trajectory in trajectories:
        part = split(trajectory, where="AgentR1RolloutFunc: ")
        columns = reward_columns(trajectory)
        out["prompt_ids"].append(part.prompt_ids)
        out["completion_ids"].append(part.completion_ids)
        out["logprobs"].append(part.logprobs)
        out["env_mask"].append(part.policy_mask)
        out["agent_r1_score"].append(columns["score"])
        out["agent_r1_rewards"].append(columns["rewards"])
        out["agent_r1_num_turns"].append(columns["num_turns"])
        out["agent_r1_termination"].append(columns["termination"])
        out["agent_r1_truncated"].append(columns["truncated"])
    return out


# --------------------------------------------------------------------------------------------
# AsyncGRPOTrainer(rollout_worker=...)
# --------------------------------------------------------------------------------------------


class AgentR1RolloutWorker:
    """A ``rollout_worker`` for TRL's experimental ``AsyncGRPOTrainer`` (``RolloutWorkerProtocol``):
    agent-r1 rolls out, scores and computes advantages; TRL packs and trains.

    Each round takes ``tasks_per_round`` tasks (cycling through ``tasks``), rolls each out
    ``group_size`` times with ``backend`` (any :class:`~agent_r1.RolloutBackend`: the ``hf``
    backend on a copy of the policy, or the ``vllm`` one), scores them with ``reward_shapers``,
    computes advantages with the agent-r1 estimator ``estimator`` over the round, and puts one
    ``RolloutSample`` per trajectory (``granularity="trajectory"``) or per action
    (``granularity="turn"``, rows sharing their prefix, which TRL's packer forwards once) on
    :attr:`rollout_buffer`. A row's ``input_ids`` are the trajectory's tokens (up to the end of
    its action for a turn row), ``completion_mask`` is 1 on the policy tokens it trains, and
    ``old_log_probs`` are the sampling log-probabilities (0 elsewhere). TRL's format holds one
    advantage per row: an estimator whose advantages vary within a row (REINFORCE++ with
    ``gamma < 1`` or process rewards, under ``"trajectory"``) is refused with an error rather
    than averaged. Episodes whose environment or a reward shaper failed are dropped and counted
    in :attr:`metrics_queue`.

    Weights: :meth:`update_model_version` records the trainer's version and calls
    ``backend.sync_weights(None, version)``; moving the weights into the backend is the job of the
    trainer's ``weight_transfer`` (TRL's ``WeightTransferProtocol``).
    """

    def __init__(
        self,
        backend: RolloutBackend,
        tokenizer: Any,
        environment: EnvironmentSpec,
        env_options: Mapping[str, Any] | None = None,
        *,
        tasks: Sequence[Task],
        group_size: int = 4,
        tasks_per_round: int = 1,
        estimator: str = "grpo",
        estimator_options: Mapping[str, Any] | None = None,
        reward_shapers: Sequence[ShaperSpec] = (),
        granularity: Literal["trajectory", "turn"] = "trajectory",
        max_turns: int = 4,
        max_new_tokens: int = 256,
        max_context: int = 2048,
        sampling: SamplingParams | None = None,
        max_queue: int = 256,
        seed: int = 0,
    ) -> None:
        from agent_r1.registry import get_registry
        from agent_r1.rollout.loop import RolloutEngine

        if not tasks:
            raise IntegrationError("AgentR1RolloutWorker needs at least one task")
        if granularity not in ("trajectory", "turn"):
            raise IntegrationError(f"granularity must be 'trajectory' or 'turn', got {granularity!r}")
        self.backend = backend
        self.tokenizer = tokenizer
        self.env_factory = environment_factory(environment, env_options)
        self.tasks = list(tasks)
        self.group_size = group_size
        self.tasks_per_round = tasks_per_round
        self.estimator = get_registry().build(
            "advantage_estimators", estimator, dict(estimator_options or {})
        )
        if self.estimator.needs_critic or self.estimator.needs_baseline_rollout:
            raise IntegrationError(
                f"advantage estimator {estimator!r} needs a critic or a baseline rollout, which "
                "AgentR1RolloutWorker does not run; use grpo, rloo, reinforce_pp or reinforce_pp_baseline"
            )
        self.shapers = build_shapers(reward_shapers)
        self.granularity = granularity
        self.sampling = sampling if sampling is not None else SamplingParams(temperature=1.0)
        self.engine = RolloutEngine(  # one agent loop for every round
            backend,
            tokenizer,
            self.env_factory,
            max_turns=max_turns,
            max_new_tokens=max_new_tokens,
            max_context=max_context,
            sampling=self.sampling,
            on_env_error="end",
        )
        self.seed = seed
        self.rollout_buffer: queue.Queue[Any] = queue.Queue(maxsize=max_queue)
        self.metrics_queue: queue.Queue[dict[str, float]] = queue.Queue()
        self.model_version = 0
        self.rounds = 0
        self._group_numbers: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failure: BaseException | None = None
        self._last_push = time.monotonic()
        self.last_trajectories: list[Trajectory] = []
        """The trajectories behind the latest round's rows (failed episodes left out)."""

    # -- RolloutWorkerProtocol -----------------------------------------------------------------
    def start(self) -> None:
        """Start producing rounds in a daemon thread until :meth:`stop`."""
        if self._thread is not None:
            return
        self._stop.clear()
        self._last_push = time.monotonic()
        self._thread = threading.Thread(target=self._loop, name="agent-r1-rollout-worker", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop after the round in progress."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=60)
            self._thread = None

    def update_model_version(self, model_version: int) -> None:
        """Tag later rows with ``model_version`` and tell the backend."""
        self.model_version = int(model_version)
        self.backend.sync_weights(None, self.model_version)

    def check_health(self, stale_after_s: float) -> None:
        """Raise when the worker thread failed, or pushed nothing for ``stale_after_s`` seconds."""
        if self._failure is not None:
            raise IntegrationError(
                f"AgentR1RolloutWorker failed: {type(self._failure).__name__}: {self._failure}"
            ) from self._failure
        if self._thread is None or not self._thread.is_alive():
            raise IntegrationError("AgentR1RolloutWorker is not running: call start() first")
        idle = time.monotonic() - self._last_push
        if idle > stale_after_s:
            raise IntegrationError(
                f"AgentR1RolloutWorker pushed no rollout for {idle:.0f} s (stale_after_s={stale_after_s})"
            )

    # -- producing -----------------------------------------------------------------------------
    def _loop(self) -> None:
        try:
            while not self._stop.is_set():
                for sample in self.produce():
                    while not self._stop.is_set():
                        try:
                            self.rollout_buffer.put(sample, timeout=0.5)
                            self._last_push = time.monotonic()
                            break
                        except queue.Full:  # the trainer is behind: wait, then retry (backpressure)
                            continue
        except BaseException as exc:  # reported by check_health, which the trainer polls
            self._failure = exc

    def produce(self) -> list[Any]:
        """One round: roll out, score, compute advantages, and return the ``RolloutSample`` rows
        (without putting them on the queue)."""
        from trl.experimental.async_grpo.async_rollout_worker import RolloutSample

        start = self.rounds * self.tasks_per_round
        tasks = [self.tasks[(start + i) % len(self.tasks)] for i in range(self.tasks_per_round)]
        version = self.model_version
        self.rounds += 1
        engine = self.engine
        engine.sampling = self.sampling
        seed = (self.seed * 1_000_003 + self.rounds * 9_973) % 2**31
        trajectories = engine.collect(
            tasks, self.group_size, seed=seed, policy_version=version, group_salt=f"async-r{self.rounds}"
        )
        score(trajectories, {task.id: task for task in tasks}, self.shapers)
        failed = [t for t in trajectories if t.errors]
        trajectories = [t for t in trajectories if not t.errors and t.num_policy_tokens > 0]
        self.metrics_queue.put(
            {
                "agent_r1/failed_episodes": float(len(failed)),
                "agent_r1/score_mean": sum(t.score for t in trajectories) / max(len(trajectories), 1),
            }
        )
        self.last_trajectories = trajectories
        if not trajectories:
            return []
        rows = self.rows(trajectories)
        by_task = {task.id: task for task in tasks}
        samples = []
        for row in rows:
            trajectory: Trajectory = row["trajectory"]
            samples.append(
                RolloutSample(
                    prompt=list(by_task[trajectory.task_id].messages),
                    completion=_completion_messages(trajectory),
                    input_ids=row["input_ids"],
                    completion_mask=row["completion_mask"],
                    old_log_probs=row["old_log_probs"],
                    advantage=row["advantage"],
                    model_version=version,
                    group_id=self._group_number(trajectory.group_id),
                    metrics={"reward": trajectory.score, **reward_columns(trajectory)["rewards"]},
                    enqueued_at=time.time(),
                )
            )
        return samples

    def rows(self, trajectories: Sequence[Trajectory]) -> list[dict[str, Any]]:
        """The rows of ``trajectories`` (numpy ``input_ids``, ``completion_mask``, ``old_log_probs``,
        a float ``advantage`` and the ``trajectory``), advantages computed over all of them."""
        import numpy as np
        import torch

        from agent_r1.contracts import AdvantageInput
        from agent_r1.engine.learner.batch import collate
        from agent_r1.engine.learner.turns import anchor_keys, turn_ids

        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        batch = collate(trajectories, pad_token_id=int(pad))
        with torch.no_grad():
            advantages, _ = self.estimator.compute(
                AdvantageInput(
                    token_rewards=batch.token_rewards,
                    loss_mask=batch.loss_mask,
                    scores=batch.scores,
                    group_ids=batch.group_ids,
                    turn_ids=turn_ids(trajectories, batch.loss_mask.shape[1]),
                    anchor_keys=[anchor_keys(t) for t in trajectories],
                )
            )  # [B, T]
        rows: list[dict[str, Any]] = []
        for index, trajectory in enumerate(trajectories):
            tokens = trajectory.token_ids
            mask = np.asarray(trajectory.loss_mask, dtype=np.int64)
            logprobs = np.asarray(trajectory.logprobs, dtype=np.float32)
            row_advantages = advantages[index, : len(tokens)].numpy()
            if self.granularity == "trajectory":
                spans = [(len(tokens), mask.astype(bool))]
            else:
                turns = np.asarray(trajectory.turn_ids)
                spans = []
                for turn in sorted({int(t) for t in turns[mask.astype(bool)]}):
                    trained = mask.astype(bool) & (turns == turn)
                    end = int(np.nonzero(trained)[0][-1]) + 1
                    spans.append((end, trained[:end]))
            for end, trained in spans:
                values = row_advantages[:end][trained]
                if values.size == 0:
                    continue
                if float(values.max() - values.min()) > 1e-5 * max(1.0, float(np.abs(values).max())):
                    raise IntegrationError(
                        f"advantage estimator {self.estimator.name!r} gives different advantages within one "
                        f"{self.granularity} of trajectory {trajectory.id!r} ({float(values.min()):.4g} to "
                        f"{float(values.max()):.4g}); TRL's rows hold one advantage each. Use "
                        "granularity='turn', gamma=1, or a score-level estimator (grpo, rloo)."
                    )
                rows.append(
                    {
                        "input_ids": np.asarray(tokens[:end], dtype=np.int64),
                        "completion_mask": trained.astype(np.int64),
                        "old_log_probs": np.where(trained, logprobs[:end], 0.0).astype(np.float32),
                        "advantage": float(values.mean()),
                        "trajectory": trajectory,
                    }
                )
        return rows

    def _group_number(self, group_id: str) -> int:
        return self._group_numbers.setdefault(group_id, len(self._group_numbers))


def _completion_messages(trajectory: Trajectory) -> list[Message]:
    messages: list[Message] = []
    for step in trajectory.steps:
        messages.append({"role": "assistant", "content": step.action.text})
        if step.observation is not None and not step.observation.done:
            messages.extend(dict(message) for message in step.observation.messages)
    return messages


# --------------------------------------------------------------------------------------------
# The other direction: a TRL environment_factory class as an agent-r1 environment
# --------------------------------------------------------------------------------------------


class TRLEnvironment(Environment):
    """Runs a TRL ``environment_factory`` class inside agent-r1.

    TRL's contract (``GRPOTrainer(environment_factory=...)``): the class has ``reset(**row)``,
    which may return a string appended to the last user message; every other public method is a
    tool the model may call (type hints and a Google-style docstring give its schema, read with
    ``transformers.utils.get_json_schema``); an optional ``get_reward()`` scores the finished
    episode. Here ``factory()`` builds one instance per episode; ``reset`` gets ``prompt`` (the
    task's messages), ``answer`` and the task's ``metadata`` as keywords. The tool schemas go to the
    chat template; the policy calls tools in the Hermes format (``<tool_call>{"name": ...,
    "arguments": {...}}</tool_call>``, as Qwen2.5 and TRL's parser expect); results come back as
    ``tool`` messages; a turn without a tool call ends the episode (termination ``answer``) and
    ``get_reward()`` becomes an outcome :class:`~agent_r1.RewardSignal` named ``reward_name``.
    A tool that raises is shown to the agent as ``Error: ...``.

    A synchronous tool method runs in a worker thread (the engine's pool for synchronous tools),
    so the episodes of a batch wait on their tools at the same time; the calls of one episode stay
    in order, one after another, on that episode's own instance. A call that takes longer than
    ``call_timeout_s`` is abandoned and shown as ``Error: ... timed out``. ``threaded_tools=False``
    runs synchronous methods inline on the event loop instead (one call at a time in the whole
    batch), for classes whose instances share state that is not thread-safe. ``async def``
    methods are awaited either way.
    """

    name = "trl_environment"

    def __init__(
        self,
        factory: Callable[[], Any],
        *,
        max_turns: int = 4,
        reward_name: str = "trl_env_reward",
        threaded_tools: bool = True,
        call_timeout_s: float = 30.0,
    ) -> None:
        super().__init__({})
        if call_timeout_s <= 0:
            raise IntegrationError(f"TRLEnvironment: call_timeout_s={call_timeout_s}; give a positive number")
        self.factory = factory
        self.max_turns = max_turns
        self.reward_name = reward_name
        self.threaded_tools = threaded_tools
        self.call_timeout_s = call_timeout_s
        self.instance: Any = None
        self.methods: dict[str, Callable[..., Any]] = {}
        self.tool_classes: dict[str, type[Tool]] = {}
        self._format = HermesFormat({"answer_tag": None, "stop_on_call_end": True})

    @property
    def stop_sequences(self) -> list[str]:
        return self._format.stop_sequences

    async def reset(self, task: Task) -> EpisodeStart:
        from transformers.utils import get_json_schema

        self.instance = self.factory()
        cls = type(self.instance)
        if not callable(getattr(self.instance, "reset", None)):
            raise IntegrationError(f"TRL environment {cls.__name__}: it has no reset() method")
        self.methods = {
            name: getattr(self.instance, name)
            for name, _ in inspect.getmembers(cls, predicate=inspect.isfunction)
            if not name.startswith("_") and name not in ("reset", "get_reward")
        }
        try:
            tools = [get_json_schema(method) for method in self.methods.values()]
        except Exception as exc:  # transformers explains what the docstring or hints lack
            raise IntegrationError(
                f"TRL environment {cls.__name__}: cannot read a tool schema ({type(exc).__name__}: {exc}); "
                "every public method needs type hints and a Google-style docstring"
            ) from exc
        self.tool_classes = {name: tool_class(spec) for name, spec in zip(self.methods, tools, strict=True)}
        extra = self.instance.reset(prompt=list(task.messages), answer=task.answer, **task.metadata)
        messages = [dict(message) for message in task.messages]
        if extra is not None:
            if not isinstance(extra, str) or not messages or not isinstance(messages[-1].get("content"), str):
                raise IntegrationError(
                    f"TRL environment {cls.__name__}: reset() returned {type(extra).__name__}; only text "
                    "appended to a text user message is supported"
                )
            messages[-1]["content"] += extra
        return EpisodeStart(messages=messages, tools=tools)

    async def step(self, action: Action, turn: int) -> Observation:
        calls, errors = self._parse(action.text)
        if not calls and not errors:
            return Observation(
                done=True, termination="answer", answer=action.text, rewards=await self._reward(turn)
            )
        results = [await self._call(call) for call in calls]
        messages: list[Message] = [{"role": "tool", "name": r.name, "content": r.content} for r in results]
        messages += [{"role": "tool", "content": f"Error: {error}"} for error in errors]
        done = turn + 1 >= self.max_turns
        return Observation(
            messages=[] if done else messages,
            tool_results=results,
            done=done,
            termination="max_turns" if done else None,
            rewards=await self._reward(turn) if done else [],
            tool_calls=calls,
            parse_errors=errors,
        )

    def _parse(self, text: str) -> tuple[list[ToolCall], list[str]]:
        """The calls of ``text`` in the Hermes format, read by agent-r1's own parser (arguments
        checked against each method's schema). A final call missing its closing tag is accepted:
        generation stops on it, and some backends leave the stop string out."""
        fmt = self._format
        parsed = fmt.parse(text, self.tool_classes)
        if parsed.errors and fmt.OPEN in text and not text.rstrip().endswith(fmt.CLOSE):
            closed = fmt.parse(text + fmt.CLOSE, self.tool_classes)
            if len(closed.errors) < len(parsed.errors):
                parsed = closed
        return parsed.tool_calls, parsed.errors

    async def _call(self, call: ToolCall) -> ToolResult:
        def failed(content: str, error: str) -> ToolResult:
            return ToolResult(call_id=call.id, name=call.name, content=content, ok=False, error=error)

        method = self.methods.get(call.name)
        if method is None:
            return failed(f"Error: unknown tool {call.name!r}; tools: {sorted(self.methods)}", "unknown_tool")
        try:
            if inspect.iscoroutinefunction(method):
                value = await asyncio.wait_for(method(**call.arguments), self.call_timeout_s)
            elif self.threaded_tools:
                bound = functools.partial(method, **call.arguments)
                value = await run_in_thread(bound, timeout=self.call_timeout_s, label=f"trl tool {call.name}")
            else:
                value = method(**call.arguments)
            if inspect.isawaitable(value):
                value = await asyncio.wait_for(value, self.call_timeout_s)
        except (CallTimedOut, TimeoutError):
            timeout = f"Error: the call to {call.name} timed out after {self.call_timeout_s:g} s"
            return failed(timeout, "timeout")
        except Exception as exc:  # the agent reads the failure, as in TRL's own tool loop
            return failed(f"Error: {exc}", "exception")
        return ToolResult(call_id=call.id, name=call.name, content=str(value))

    async def _reward(self, turn: int) -> list[RewardSignal]:
        get_reward = getattr(self.instance, "get_reward", None)
        if get_reward is None:
            return []
        value = get_reward()
        if inspect.isawaitable(value):
            value = await value
        return [RewardSignal(name=self.reward_name, value=float(value), kind="outcome")]
