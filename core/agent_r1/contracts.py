"""Base classes of every pluggable component.

A component is a class with a ``name`` (unique within its kind) and a pydantic ``Config``. The core
builds it from the component's section of the run config, which the ``Config`` validates (unknown
keys are errors). Plugins return these classes from ``register_*`` hooks (see :mod:`agent_r1.hookspecs`).

This module imports no torch: numerical contracts mention tensors only in type hints.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from agent_r1.mdp import (
    Action,
    FinishReason,
    Message,
    Observation,
    RewardSignal,
    Task,
    ToolCall,
    ToolResult,
    Trajectory,
)

if TYPE_CHECKING:  # pragma: no cover
    import torch


@dataclass(frozen=True)
class Provenance:
    """Where a component came from: the plugin (entry point), its distribution and version."""

    plugin: str
    distribution: str
    version: str
    module: str

    def __str__(self) -> str:
        return f"{self.plugin} ({self.distribution} {self.version}, module {self.module})"


class ComponentSpec(BaseModel):
    """A component section of the run config: ``{name: ..., <options of that component>}``; the
    options are validated by the component's own ``Config``."""

    model_config = ConfigDict(extra="allow")

    name: str = Field(
        description="registered component name, 'plugin:name' to pick a provider, or a Python path "
        "'module:attribute' (a class or function; see docs/configuration.md)"
    )

    @property
    def options(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


class RewardSpec(ComponentSpec):
    """A reward-shaper section: a :class:`ComponentSpec` plus the shaper's ``weight``."""

    weight: float = Field(1.0, description="multiplies every signal this shaper emits")


class ComponentConfig(BaseModel):
    """Base of every component ``Config``: unknown keys are errors."""

    model_config = ConfigDict(extra="forbid")


class Component:
    """Common base: a ``name``, a ``Config`` and the validated ``config`` instance."""

    name: ClassVar[str] = ""
    kind: ClassVar[str] = ""
    """The kind this contract registers under (``tools``...); set on the contract classes only."""
    label: ClassVar[str] = ""
    """The kind in words for messages (``tool-call format``)."""
    provenance: ClassVar[Provenance | None] = None
    """Set by the registry on the class it loaded."""

    class Config(ComponentConfig):
        pass

    def __init__(self, config: ComponentConfig | Mapping[str, Any] | None = None) -> None:
        if config is None:
            config = self.Config()
        elif isinstance(config, Mapping):
            config = self.Config.model_validate(dict(config))
        self.config = config

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"

    @classmethod
    def requires(cls, config: Any) -> list[tuple[Any, ...]]:
        """Other components this one will build from its validated ``config``, as
        ``(kind, name, section)`` or ``(kind, name, section, config_subpath)`` tuples (the sub-path,
        e.g. ``"tools[1]"``, makes errors point at the right place), so that a run can check them
        all before loading a model."""
        return []


# --------------------------------------------------------------------------------------------
# Tools and environments (the transition of the MDP)
# --------------------------------------------------------------------------------------------


class Tool(Component):
    """A callable the agent may invoke.

    Subclasses set ``name``, ``description`` and an ``Arguments`` model; its JSON schema is what the
    chat template shows the model. ``run`` may be a plain or an ``async`` method and returns the
    text observation (or a full :class:`~agent_r1.mdp.ToolResult`).

    What raising does (in ``tool_env`` and the environments built on it):

    * :class:`~agent_r1.ToolError` or any ordinary exception: the agent reads it as an error
      result (``Error: <message>``; other exceptions with their type name). For the agent's own
      mistakes (bad input, nothing found).
    * :class:`~agent_r1.errors.ToolInfrastructureError`: not the agent's doing (a missing corpus,
      a failing backend). The environment step raises instead, so the engine counts an environment
      error (or aborts, under its error policy) and the policy never trains on it; unless the
      class sets ``infrastructure_errors_visible``, which shows it to the agent (error kind
      ``infrastructure``).
    * :class:`~agent_r1.errors.EnvironmentFatalError`: the step raises and the run stops.

    One instance serves every episode of a run (``tool_env`` builds its tools once per config), so
    a tool must keep no per-episode state, or set ``per_episode``.
    """

    kind = "tools"
    label = "tool"
    description: ClassVar[str] = ""
    isolation: ClassVar[Literal["thread", "process"]] = "thread"
    """How a synchronous ``run`` is executed under the call timeout. ``"thread"``: in a daemon
    worker thread; at the timeout the call is abandoned (the episode goes on at once, the thread
    finishes in the background). ``"process"``: each call in a fresh child process (its own process
    group, killed at the timeout or on Ctrl-C); the instance and the arguments must pickle, the
    class must be importable, and each call pays for starting Python. An ``async`` ``run`` with
    ``"thread"`` runs on the event loop and is cancelled at the timeout. Since: 0.2.0"""
    infrastructure_errors_visible: ClassVar[bool] = False
    """Show :class:`~agent_r1.errors.ToolInfrastructureError` to the agent as an error result
    instead of failing the environment step. Since: 0.2.0"""
    per_episode: ClassVar[bool] = False
    """Build a fresh instance for each episode (a tool that keeps per-episode state); by default
    one instance is shared by every episode with the same environment config. Since: 0.2.0"""

    class Arguments(BaseModel):
        model_config = ConfigDict(extra="forbid")

    def run(self, arguments: Any) -> Any:  # pragma: no cover - abstract
        """Run the tool on ``arguments``, an already validated instance of ``Arguments``. Raise
        :class:`~agent_r1.ToolError` to show the agent a message as is."""
        raise NotImplementedError

    @property
    def is_async(self) -> bool:
        """True when ``run`` is an ``async def`` (the environment awaits it instead of using a thread)."""
        return inspect.iscoroutinefunction(self.run)

    @classmethod
    def schema(cls) -> dict[str, Any]:
        """OpenAI-style function schema, as accepted by ``tokenizer.apply_chat_template(tools=...)``."""
        parameters = cls.Arguments.model_json_schema()
        parameters.pop("title", None)
        return {
            "type": "function",
            "function": {"name": cls.name, "description": cls.description, "parameters": parameters},
        }


@dataclass
class EpisodeStart:
    """What :meth:`Environment.reset` returns: the initial messages and the tool schemas that the
    chat template should render (empty when the tools are described in the messages instead)."""

    messages: list[Message]
    tools: list[dict[str, Any]] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)
    """Facts about the initial state, recorded on :attr:`Trajectory.start_info
    <agent_r1.mdp.Trajectory.start_info>`. ``info["state_key"]`` (a string) names the initial
    state the way ``Observation.info["state_key"]`` names later ones, so that GiGPO groups turn 0
    with later turns that return to the same state. Since: 0.2.0"""


class Environment(Component):
    """An episode's world. The engine creates one instance per trajectory, so instances may keep
    per-episode state; share heavy resources (indexes, servers) through a module-level cache.

    ``reset`` starts an episode from a task; ``step`` answers one action. Both are ``async`` because
    environments wait (on tools, processes, servers).
    """

    kind = "environments"
    label = "environment"

    @property
    def stop_sequences(self) -> list[str]:
        """Strings that end a generation turn (e.g. ``</tool_call>``), in addition to EOS."""
        return []

    async def reset(self, task: Task) -> EpisodeStart:  # pragma: no cover - abstract
        """Start an episode from ``task``: the initial messages and the tool schemas to render."""
        raise NotImplementedError

    async def step(self, action: Action, turn: int) -> Observation:  # pragma: no cover - abstract
        """Answer the action of turn ``turn`` (0-based): messages to append, process rewards,
        and whether the episode ended (then ``termination`` says why).

        ``action`` belongs to the engine: read it, do not modify it. What the environment parsed
        out of it goes into the observation's ``tool_calls``, ``answer`` and ``parse_errors``, and
        the engine records them on the step's action (since 0.2.0; writing into the action still
        works but is deprecated). Raising ends the episode as an environment error (counted; the
        episode is not trained on); raise :class:`~agent_r1.errors.EnvironmentFatalError` to stop
        the run instead."""
        raise NotImplementedError

    async def aclose(self) -> None:
        """Release what this episode holds (sessions, sandboxes, processes). The engine awaits it
        once per episode after the whole batch has ended, whatever ended the episode: the
        environment itself, an engine budget (``max_turns``, ``max_tokens``), an error, or the run
        being stopped. The default does nothing. A failure here is counted in the trajectory
        metric ``env_close_errors`` and warned about (``RuntimeWarning``); the trajectory is kept
        and the run goes on."""
        return None


@dataclass
class ParsedAction:
    """The result of :meth:`ToolCallFormat.parse`."""

    tool_calls: list[ToolCall] = field(default_factory=list)
    answer: str | None = None
    errors: list[str] = field(default_factory=list)
    """Human-readable problems (bad JSON, unknown tool...), shown to the agent as an observation."""


class ToolCallFormat(Component):
    """How tool calls are written in an action and how results are shown back."""

    kind = "tool_call_formats"
    label = "tool-call format"
    tools_in_template: ClassVar[bool] = True
    """True when tool schemas go to the chat template (``tools=``); false when :meth:`instructions`
    describes them in the system prompt."""

    @property
    def stop_sequences(self) -> list[str]:
        """Strings that end a generation turn whatever the tools (see :meth:`stop_sequences_for`)."""
        return []

    def stop_sequences_for(self, tools: Sequence[type[Tool]]) -> list[str]:
        """Stop sequences when ``tools`` are available (e.g. each tool's closing tag)."""
        return self.stop_sequences

    def render_call(self, call: ToolCall, tools: Mapping[str, type[Tool]]) -> str:
        """Write ``call`` exactly as :meth:`parse` reads it (few-shot prompts, scripted policies)."""
        raise NotImplementedError(f"tool-call format {self.name!r} cannot render calls")

    def render_answer(self, answer: str) -> str:
        """Write a final answer exactly as :meth:`parse` reads it."""
        raise NotImplementedError(f"tool-call format {self.name!r} cannot render answers")

    def instructions(self, tools: Sequence[type[Tool]]) -> str:
        """Text for the system prompt that explains how to call ``tools``."""
        return ""

    def parse(self, text: str, tools: Mapping[str, type[Tool]]) -> ParsedAction:  # pragma: no cover
        """Find the tool calls (and the final answer) in an action's ``text``; problems go to
        ``errors`` rather than raising."""
        raise NotImplementedError

    def render_results(self, results: Sequence[ToolResult], errors: Sequence[str] = ()) -> list[Message]:
        """Messages that carry tool results (and parse errors) back to the agent."""
        raise NotImplementedError  # pragma: no cover


# --------------------------------------------------------------------------------------------
# Rewards and learning
# --------------------------------------------------------------------------------------------


class RewardShaper(Component):
    """Scores a finished trajectory: outcome signals for the whole of it, process signals per turn.

    The run config lists shapers with weights; the engine multiplies each signal by its shaper's
    weight and places it on the tokens (see :meth:`agent_r1.mdp.Trajectory.token_rewards`).
    ``score`` may be ``async``.
    """

    kind = "reward_shapers"
    label = "reward shaper"

    def score(self, trajectory: Trajectory, task: Task) -> list[RewardSignal]:  # pragma: no cover
        """The reward signals of a finished ``trajectory`` of ``task`` (may be ``async``)."""
        raise NotImplementedError

    def score_batch(
        self, trajectories: Sequence[Trajectory], tasks: Sequence[Task]
    ) -> list[list[RewardSignal] | Exception]:
        """The signals of many finished trajectories at once (``tasks[i]`` is the task of
        ``trajectories[i]``), in order; a shaper that runs a model (``reward_model``,
        ``llm_judge``) overrides it to batch its forward passes. An item may be the exception that
        scoring that one trajectory raised, which a caller treats as if :meth:`score` had raised
        for it. The default calls :meth:`score` on each (awaiting it when it is ``async``).
        Since: 0.2.0"""
        import asyncio

        out: list[list[RewardSignal] | Exception] = []
        for trajectory, task in zip(trajectories, tasks, strict=True):
            try:
                result = self.score(trajectory, task)
                if inspect.isawaitable(result):
                    result = asyncio.run(_awaited(result))
                out.append(list(result or []))
            except Exception as exc:  # handed back in place: the caller attributes it to this item
                out.append(exc)
        return out


async def _awaited(awaitable: Any) -> Any:
    return await awaitable


@dataclass
class AdvantageInput:
    """Everything an estimator may need, as padded ``[B, T]`` tensors over full trajectories."""

    token_rewards: torch.Tensor  # [B, T] float
    loss_mask: torch.Tensor  # [B, T] bool: policy tokens
    scores: torch.Tensor  # [B] float: sum of weighted rewards per trajectory
    group_ids: Sequence[str]  # [B]: trajectories sampled for the same task share an id
    values: torch.Tensor | None = None  # [B, T] critic values (gae)
    baseline_scores: torch.Tensor | None = None  # [B] greedy-rollout scores (remax)
    turn_ids: torch.Tensor | None = None
    """``[B, T]`` long: the turn of each policy-sampled token, -1 on every other token (turn-level
    estimators: ``gigpo``, ``turn_level`` options). Set by the engine; see
    :func:`agent_r1.engine.learner.turns.turn_ids`. Since: 0.2.0"""
    anchor_keys: Sequence[Sequence[str]] | None = None
    """Per trajectory, one key per turn number naming the state before that turn (``gigpo``'s
    step groups). Set by the engine; see :func:`agent_r1.engine.learner.turns.anchor_keys`. Since: 0.2.0"""


class AdvantageEstimator(Component):
    """Turns rewards into per-token advantages and returns (both ``[B, T]``, zero outside the mask)."""

    kind = "advantage_estimators"
    label = "advantage estimator"
    needs_critic: ClassVar[bool] = False
    needs_baseline_rollout: ClassVar[bool] = False

    def compute(self, batch: AdvantageInput) -> tuple[torch.Tensor, torch.Tensor]:  # pragma: no cover
        """``(advantages, returns)`` for ``batch``, both ``[B, T]`` and zero outside the loss mask."""
        raise NotImplementedError

    def step_metrics(self) -> dict[str, float]:
        """Figures of the latest :meth:`compute` (e.g. ``gigpo/step_group_size_mean``), logged with
        the training step's metrics. Since: 0.2.0 (default: none)."""
        return {}


@dataclass
class LossInput:
    """Per-token inputs of a policy loss, all ``[B, T]``."""

    logprobs: torch.Tensor  # current policy, with grad
    old_logprobs: torch.Tensor  # policy that collected the data (no grad)
    advantages: torch.Tensor
    loss_mask: torch.Tensor  # bool


class PolicyLoss(Component):
    """A per-token surrogate loss. The framework (not the plugin) aggregates it over the optimizer
    batch, so loss plugins cannot get normalisation wrong."""

    kind = "policy_losses"
    label = "policy loss"

    def token_loss(
        self, inputs: LossInput
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:  # pragma: no cover
        """Return the per-token loss ``[B, T]`` and per-token diagnostics (e.g. ``clipped`` as 0/1
        floats ``[B, T]``), which the framework averages over policy tokens."""
        raise NotImplementedError


class Algorithm(Component):
    """A named bundle of an advantage estimator, a policy loss and defaults (e.g. ``grpo``)."""

    kind = "algorithms"
    label = "algorithm"
    estimator: ClassVar[str] = ""
    estimator_config: ClassVar[dict[str, Any]] = {}
    loss: ClassVar[str] = "ppo_clip"
    loss_config: ClassVar[dict[str, Any]] = {}
    aggregation: ClassVar[str] = "token-mean"
    needs_critic: ClassVar[bool] = False


# --------------------------------------------------------------------------------------------
# Infrastructure
# --------------------------------------------------------------------------------------------


class SamplingParams(BaseModel):
    """How a rollout backend samples one turn."""

    model_config = ConfigDict(extra="forbid")

    temperature: float = Field(1.0, ge=0.0, description="0 means greedy decoding")
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=0, description="0 disables top-k filtering")
    max_new_tokens: int = Field(256, ge=1)
    stop: list[str] = Field(default_factory=list, description="stop sequences besides EOS")
    seed: int | None = None


@dataclass
class Generation:
    """One sampled continuation: token ids, their sampling log-probabilities, and why it stopped."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: FinishReason
    stop_sequence: str | None = None


class RolloutBackend(Component):
    """Generates continuations for a batch of token-id prompts. Token ids in, token ids out: no
    decode/re-encode on the training path."""

    kind = "rollout_backends"
    label = "rollout backend"

    def __init__(self, config: ComponentConfig | Mapping[str, Any] | None = None, **resources: Any) -> None:
        super().__init__(config)
        self.resources = resources

    policy_version: int = 0

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        sampling: SamplingParams,
        *,
        max_new_tokens: Sequence[int] | None = None,
    ) -> list[Generation]:
        """One continuation per prompt (token ids in, token ids and log-probabilities out).

        ``max_new_tokens`` gives each prompt its own token budget (the room its trajectory has
        left); ``None`` means ``sampling.max_new_tokens`` for every prompt. The engine always passes
        it. Since: 0.2.0 (a backend whose ``generate`` lacks it still works, with a deprecation
        warning, and is cut to each budget by the engine).
        """
        if max_new_tokens is not None and len(max_new_tokens) != len(prompts):
            raise ValueError(f"got {len(max_new_tokens)} token budgets for {len(prompts)} prompts")
        caps = max_new_tokens if max_new_tokens is not None else [sampling.max_new_tokens] * len(prompts)
        budgets = [min(sampling.max_new_tokens, int(cap)) for cap in caps]
        return self._generate_within(prompts, sampling, budgets)

    def _generate_within(
        self, prompts: Sequence[Sequence[int]], sampling: SamplingParams, budgets: list[int]
    ) -> list[Generation]:  # pragma: no cover - abstract
        """One continuation per prompt within ``budgets`` (one per prompt). The bundled backends
        implement this instead of :meth:`generate`, which checks ``max_new_tokens`` and works out each
        row's budget once for all of them: the smaller of its ``max_new_tokens`` and
        ``sampling.max_new_tokens``. Private: plugin backends override :meth:`generate`."""
        raise NotImplementedError

    def sync_weights(self, model: Any, version: int) -> None:
        """Make the backend sample from ``model``'s current weights (tagged ``version``)."""
        self.policy_version = version

    def end_rollout(self) -> None:
        """Called by the rollout engine when a batch of episodes has ended: drop what only its
        episodes could use (the ``hf`` backend frees the KV caches it kept across turns, so that
        they do not sit in memory through the update). Since: 0.2.0 (default: nothing)."""
        return None

    def step_metrics(self) -> dict[str, float]:
        """Figures of the backend's latest weight sync, sleep and wake (``backend/...``), logged with
        each training step's metrics. Since: 0.2.0 (default: none)."""
        return {}

    # Optional, for ``rollout.mode: async`` (looked up with getattr, so not declared here):
    # ``async_replica(version) -> (backend, weights)``: the backend the background rollouts generate
    # with, and the guard of its weights, with ``push(model, version)`` (the trainer's new weights,
    # staged), ``generating(swap=True)`` (a context manager around one backend call that applies a
    # staged push first when ``swap`` and yields the version the call runs with) and ``version``.
    # The ``hf`` backend returns a copy of itself over a frozen copy of the policy (and offers
    # ``lane()``: another backend over that copy, so that several batches can be rolled out at
    # once); the ``vllm`` backend returns itself (vLLM keeps its own copy of the weights) and a
    # :class:`~agent_r1.builtins.vllm_backend.VLLMWeights` guard that stages pushes in CPU memory.


class Tracker(Component):
    """Receives metrics once per step (never per token)."""

    kind = "trackers"
    label = "tracker"

    def start(self, run_dir: Path, config: Mapping[str, Any]) -> None:
        """Called once before the first step with the run directory and the resolved config."""
        pass

    def log(self, metrics: Mapping[str, float], step: int) -> None:  # pragma: no cover
        """Record one step's metrics (names such as ``reward/score_mean``; values are numbers)."""
        raise NotImplementedError

    def close(self) -> None:
        """Called once at the end of the run (also after an error): flush and release resources."""
        pass


class Dataset(Component):
    """A source of tasks. ``load`` returns the tasks of a split (``train``, ``eval``...)."""

    kind = "datasets"
    label = "dataset"

    def load(self, split: Literal["train", "eval"] | str) -> list[Task]:  # pragma: no cover
        """The tasks of ``split``; the same config must give the same tasks (seed any shuffling)."""
        raise NotImplementedError


CONTRACTS: dict[str, type[Component]] = {
    contract.kind: contract
    for contract in (
        Tool,
        Environment,
        ToolCallFormat,
        RewardShaper,
        AdvantageEstimator,
        PolicyLoss,
        Algorithm,
        RolloutBackend,
        Tracker,
        Dataset,
    )
}
"""The one table of component kinds: kind → the base class its components subclass. Everything
else that lists kinds (``KINDS``, ``KIND_LABELS``, the registration hooks) is derived from it."""

KINDS: tuple[str, ...] = tuple(CONTRACTS)
"""Component kinds, each with a ``register_<kind>`` hook."""

KIND_LABELS: dict[str, str] = {kind: contract.label for kind, contract in CONTRACTS.items()}
"""Kind → its name in words, for messages."""

__all__ = [
    "CONTRACTS",
    "KINDS",
    "KIND_LABELS",
    "AdvantageEstimator",
    "AdvantageInput",
    "Algorithm",
    "Component",
    "ComponentConfig",
    "ComponentSpec",
    "Dataset",
    "Environment",
    "EpisodeStart",
    "Generation",
    "LossInput",
    "Observation",
    "ParsedAction",
    "PolicyLoss",
    "Provenance",
    "RewardShaper",
    "RewardSpec",
    "RolloutBackend",
    "SamplingParams",
    "Tool",
    "ToolCallFormat",
    "Tracker",
]
