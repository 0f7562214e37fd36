"""The session: everything a run is made of, built once from the resolved config.

:func:`build_session` is the only place that turns a validated :class:`~agent_r1.config.RunConfig`
and its resolved components into live objects: accelerate, the policy, the reference model and the
critic (when the algorithm needs them), the optimizer and scheduler (only when training), the task
stream, the environment factory, the reward shapers, the rollout backend, the trackers and the
reward-hacking alarms (:mod:`agent_r1.engine.reports.health`). The training step
(:mod:`agent_r1.engine.collect`, :mod:`agent_r1.engine.update`) is plain functions over a session;
``eval`` and ``rollout`` build a rollout-only session (``training=False``): no optimizer, no
reference model, no critic.

Component objects are built from the resolved components: the registry was visited once, during
validation, and the algorithm preset's estimator and loss settings are already merged under the
user's overrides there (:func:`agent_r1.config.validate_components`).
"""

from __future__ import annotations

import copy
import math
import random
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from agent_r1.config import DecodingConfig, ModelConfig, ResolvedComponent, RunConfig
from agent_r1.contracts import AdvantageEstimator, Environment, PolicyLoss, RewardShaper
from agent_r1.engine.artifacts import checkpoint as ckpt
from agent_r1.engine.learner.critic import ValueHead
from agent_r1.engine.learner.loss_utils import AdaptiveKLController, FixedKLController
from agent_r1.engine.learner.packing import prepare_packing
from agent_r1.engine.reports.health import HealthMonitor
from agent_r1.engine.source import EngineSource, RolloutSource
from agent_r1.errors import AgentR1Error, ConfigError
from agent_r1.mdp import Task
from agent_r1.registry import Registry, get_registry
from agent_r1.rollout.generation import run_sampling
from agent_r1.rollout.templates import apply_chat_template_config

__all__ = ["Session", "TaskStream", "build_session", "seed_everything"]


@dataclass
class TaskStream:
    """Endless shuffled passes over the training tasks; the position is saved in checkpoints."""

    tasks: list[Task]
    seed: int
    epoch: int = 0
    index: int = 0
    _order: list[int] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        if not self.tasks:
            raise AgentR1Error("the dataset's train split is empty: there is nothing to train on")
        self._shuffle()

    def _shuffle(self) -> None:
        self._order = list(range(len(self.tasks)))
        random.Random(self.seed * 1_000_003 + self.epoch).shuffle(self._order)

    def take(self, n: int) -> list[Task]:
        out = []
        for _ in range(n):
            if self.index >= len(self._order):
                self.epoch, self.index = self.epoch + 1, 0
                self._shuffle()
            out.append(self.tasks[self._order[self.index]])
            self.index += 1
        return out

    def state(self) -> dict[str, int]:
        return {"epoch": self.epoch, "index": self.index}

    def restore(self, state: dict[str, int]) -> None:
        self.epoch, self.index = state["epoch"], state["index"]
        self._shuffle()


def seed_everything(seed: int) -> None:
    """Seed Python's, numpy's and torch's global generators."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


@dataclass
class Session:
    """The live objects of one run. ``step`` counts completed training steps (the policy version)."""

    config: RunConfig
    run_dir: Path
    registry: Registry
    accelerator: Any
    tokenizer: Any
    model: nn.Module
    """The policy, as accelerate prepared it (wrapped under DDP); :attr:`unwrapped` is the module."""
    dataset: Any
    env_factory: Callable[[], Environment]
    shapers: list[tuple[RewardShaper, float]]
    backend: Any
    estimator: AdvantageEstimator
    policy_loss: PolicyLoss
    aggregation: str
    needs_critic: bool
    training: bool
    ref_model: nn.Module | None = None
    value_head: nn.Module | None = None
    critic_model: nn.Module | None = None
    optimizer: torch.optim.Optimizer | None = None
    scheduler: Any = None
    kl_ctl: FixedKLController | AdaptiveKLController | None = None
    stream: TaskStream | None = None
    trackers: list[Any] = field(default_factory=list)
    step: int = 0
    bad_updates: int = 0
    """Updates skipped for a non-finite loss or gradient since the last good update."""
    decoding: DecodingConfig | None = None
    """How rollouts pick each turn's action; ``None``: ``rollout.decoding`` (see :meth:`decoding_as`)."""
    async_rollouts: Any = None
    """The producer of ``rollout.mode: async`` (:class:`~agent_r1.engine.asynchrony.AsyncRollouts`),
    started at the first training step."""
    launch_role: Any = None
    """This process's role in a ``rollout.async_worker: ranks`` launch
    (:class:`~agent_r1.engine.asynchrony.ranks.LaunchRole`), set by the runner; None otherwise."""
    gateway: Any = None
    """The policy gateway of ``rollout.source: gateway`` (started on the first rollout; see
    :mod:`agent_r1.gateway.training`), stopped by :meth:`close`."""
    source: RolloutSource | None = None
    """Where trajectories come from (:mod:`agent_r1.engine.source`), built once by
    :func:`build_session`: the engine's own agent loop, or the source the caller passed."""
    health: HealthMonitor | None = None
    """The reward-hacking alarms of a training run (``health``; ``None`` when it is off or the
    session does not train); the runner feeds it every step."""
    _gathered: bool = field(default=False, repr=False)

    # -- processes -------------------------------------------------------------------------------
    @property
    def rank(self) -> int:
        return int(self.accelerator.process_index)

    @property
    def world(self) -> int:
        return int(self.accelerator.num_processes)

    @property
    def is_main(self) -> bool:
        return bool(self.accelerator.is_main_process)

    @property
    def device(self) -> torch.device:
        return self.accelerator.device  # type: ignore[no-any-return]

    @property
    def sharded(self) -> bool:
        """Whether the trained models are split across the processes (``trainer.sharding``)."""
        return self.training and self.config.trainer.sharding == "fsdp2"

    @property
    def unwrapped(self) -> nn.Module:
        return self.accelerator.unwrap_model(self.model)  # type: ignore[no-any-return]

    @property
    def pad_id(self) -> int:
        pad = self.tokenizer.pad_token_id
        return int(pad if pad is not None else self.tokenizer.eos_token_id)

    # -- rollout ---------------------------------------------------------------------------------
    def rollout_engine(
        self, *, temperature: float, on_progress: Callable[[int, int], None] | None = None
    ) -> Any:
        """A new :class:`~agent_r1.rollout.loop.RolloutEngine` over this session's backend and
        environments, sampling at ``temperature`` with the run's other rollout settings and
        decoding strategy (:attr:`decoding`). Deprecated: :attr:`source` holds one built once."""
        warnings.warn(
            "Session.rollout_engine() is deprecated (it goes in agent-r1 0.3.0): roll out through "
            "session.source, built once with the session",
            DeprecationWarning,
            stacklevel=2,
        )
        source = EngineSource(self)  # a fresh one: its engine is the caller's to change
        engine = source.engine
        engine.sampling = run_sampling(self.config.rollout, temperature)
        engine.decoder = source.decoder(self.decoding, temperature)
        engine.on_progress = on_progress
        return engine

    @contextmanager
    def rollout_weights(self) -> Iterator[None]:
        """Inside the block the policy (and a critic) can run any number of forward passes on
        this process alone: with ``trainer.sharding: fsdp2`` their parameters are gathered once on
        entry (every process must enter together, e.g. once per training step) and resharded on
        exit; otherwise nothing happens. Re-entering is free."""
        if not self.sharded or self._gathered:
            yield
            return
        from contextlib import ExitStack

        from agent_r1.engine.learner import sharding

        reshard = self.config.trainer.fsdp.reshard_after_forward
        self._gathered = True
        try:
            with ExitStack() as stack:
                for module in sharding.sharded_modules(self):
                    stack.enter_context(sharding.gathered(module, reshard))
                yield
        finally:
            self._gathered = False

    @contextmanager
    def decoding_as(self, decoding: DecodingConfig) -> Iterator[None]:
        """Roll out with ``decoding`` inside the block (evaluation uses ``eval.decoding``)."""
        previous, self.decoding = self.decoding, decoding
        try:
            yield
        finally:
            self.decoding = previous

    def close(self) -> None:
        """Release what the session started outside this thread (its rollout source's servers and
        workers, e.g. the policy gateway). Idempotent; the run layer calls it when a command ends."""
        if self.async_rollouts is not None:
            self.async_rollouts.close()
        if self.source is not None:
            self.source.close()

    # -- checkpoints -----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Everything a resumed run needs to continue exactly (weights, optimizer, data position,
        random generators). Sharded, every process must call it: the weights and the optimizer
        state (keyed by parameter name) are gathered unsharded onto rank 0, so that any number of
        processes, sharded or not, can resume from it."""
        assert self.optimizer is not None and self.stream is not None and self.kl_ctl is not None
        if self.sharded:
            from agent_r1.engine.learner import sharding

            weights: Callable[[nn.Module], dict[str, Any]] = sharding.full_model_state
            optimizer = sharding.full_optimizer_state(sharding.sharded_modules(self), self.optimizer)
        else:
            unwrap = self.accelerator.unwrap_model

            def weights(module: nn.Module) -> dict[str, Any]:
                return {k: v.detach().cpu() for k, v in unwrap(module).state_dict().items()}

            optimizer = self.optimizer.state_dict()
        state: dict[str, Any] = {
            "step": self.step,
            "model": weights(self.model),
            "optimizer": optimizer,
            "scheduler": self.scheduler.state_dict(),
            "kl_coef": self.kl_ctl.value,
            "data": self.async_rollouts.stream_state(self.step)
            if self.async_rollouts
            else self.stream.state(),
            "rng": ckpt.capture_rng(),
            "bad_steps": self.bad_updates,
        }
        if self.sharded:
            state["optimizer_keys"] = "names"
        if self.health is not None:
            state["health"] = self.health.state_dict()
        for name in ("value_head", "critic_model"):
            module = getattr(self, name)
            if module is not None:
                state[name] = weights(module)
        return state

    def exportable(self) -> tuple[nn.Module | None, tuple[dict[str, Any], Any] | None]:
        """The policy and the trained critic (``(value head state, separate critic or None)``, or
        ``None`` without one) as plain modules for an export. Sharded, every process must call it:
        the weights are gathered into fresh copies on rank 0 (``(None, None)`` elsewhere)."""
        if not self.sharded:
            unwrap = self.accelerator.unwrap_model
            critic = None
            if self.value_head is not None:
                separate = unwrap(self.critic_model) if self.critic_model is not None else None
                critic = (unwrap(self.value_head).state_dict(), separate)
            return self.unwrapped, critic
        from agent_r1.engine.learner import sharding

        policy_state = sharding.full_model_state(self.model)
        head = sharding.full_model_state(self.value_head) if self.value_head is not None else None
        critic_state = sharding.full_model_state(self.critic_model) if self.critic_model is not None else None
        if not self.is_main:
            return None, None
        policy = sharding.plain_copy(self.model, policy_state)
        if head is None:
            return policy, None
        separate = None
        if critic_state is not None:
            assert self.critic_model is not None
            separate = sharding.plain_copy(self.critic_model, critic_state)
        return policy, (head, separate)

    def _load_weights(self, state: dict[str, Any], source: str) -> None:
        """The weights of :meth:`state_dict`'s output, into sharded or plain modules."""
        if not self.sharded:
            ckpt.load_model_state(self.unwrapped, state["model"], source=source)
            for name in ("value_head", "critic_model"):
                module = getattr(self, name)
                if module is not None and name in state:
                    self.accelerator.unwrap_model(module).load_state_dict(state[name])
            return
        from agent_r1.engine.learner import sharding

        ckpt.check_model_state(self.model.state_dict(), state["model"], source=source)
        sharding.load_full_state(self.model, state["model"])
        for name in ("value_head", "critic_model"):
            module = getattr(self, name)
            if module is not None and name in state:
                sharding.load_full_state(module, state[name])

    def _load_optimizer(self, state: dict[str, Any], source: str) -> None:
        assert self.optimizer is not None
        if state.get("optimizer_keys") == "names":  # written by a sharded run
            from agent_r1.engine.learner import sharding

            sharding.load_optimizer_state(sharding.sharded_modules(self), self.optimizer, state["optimizer"])
        elif self.sharded:
            raise AgentR1Error(
                f"{source} was written by a run without sharding: its optimizer state cannot be split "
                "across processes. Resume it with trainer.sharding: none (the weights alone load into "
                "a sharded run through model.path after `agent-r1 export`)"
            )
        else:
            self.optimizer.load_state_dict(state["optimizer"])

    def load_state_dict(self, state: dict[str, Any], *, source: str = "the checkpoint") -> None:
        """Restore :meth:`state_dict`'s output (weights only, when not training). A checkpoint of
        another model is an error naming ``source`` and the mismatched weights. A checkpoint of a
        sharded run loads into any number of processes, sharded or not."""
        self._load_weights(state, source)
        self.step = int(state["step"])
        if self.training:
            assert self.optimizer is not None and self.stream is not None and self.kl_ctl is not None
            self._load_optimizer(state, source)
            self.scheduler.load_state_dict(state["scheduler"])
            self.kl_ctl.value = state["kl_coef"]
            self.stream.restore(state["data"])
            ckpt.restore_rng(state["rng"])
            self.bad_updates = int(state.get("bad_steps", 0))
            if self.health is not None and "health" in state:  # older checkpoints: windows refill
                self.health.load_state_dict(state["health"])
        self.backend.sync_weights(self.unwrapped, self.step)


def build_session(
    config: RunConfig,
    components: Sequence[ResolvedComponent],
    run_dir: str | Path,
    *,
    training: bool = True,
    registry: Registry | None = None,
    model: nn.Module | None = None,
    tokenizer: Any = None,
    source: Callable[[Session], RolloutSource] | None = None,
) -> Session:
    """Build a :class:`Session` from a validated config and its resolved components.

    ``training=False`` builds what generation needs only (``eval``, ``rollout``). ``model`` and
    ``tokenizer`` skip loading the policy (tests, embedders). ``source`` builds the session's
    rollout source from the finished session; by default the engine's own agent loop
    (:class:`~agent_r1.engine.source.EngineSource`). ``rollout.source: gateway`` needs the
    gateway's (``source=agent_r1.gateway.training.GatewaySource``), which the run layer passes.
    """
    from accelerate import Accelerator

    from agent_r1.models.loading import load_policy, pick_device

    by_path = {c.path: c for c in components}
    seed_everything(config.seed)
    accelerator = Accelerator(cpu=pick_device(config.model.device).type == "cpu")
    world = accelerator.num_processes
    if training and config.trainer.sharding == "fsdp2":
        _ensure_process_group(accelerator.device)
    if training:
        _check_batch_shape(config, world)

    estimator = _build(by_path["algorithm.estimator"])
    needs_critic = training and bool(estimator.needs_critic or by_path["algorithm"].cls.needs_critic)
    from agent_r1.engine.experimental.decoding import check_decoding

    # value-guided decoding needs the critic a training run trains: say so before loading
    check_decoding(config, has_critic=needs_critic if training else None)
    if model is None:
        model, tokenizer = load_policy(config.model, device=accelerator.device)
    assert model is not None
    tokenizer = apply_chat_template_config(tokenizer, config.model)
    model.to(accelerator.device)

    session = Session(
        config=config,
        run_dir=Path(run_dir),
        registry=registry or get_registry(),
        accelerator=accelerator,
        tokenizer=tokenizer,
        model=model,
        dataset=_build(by_path["data"]),
        env_factory=_factory(by_path["environment"]),
        shapers=[(_build(by_path[f"rewards[{i}]"]), spec.weight) for i, spec in enumerate(config.rewards)],
        backend=None,
        estimator=estimator,
        policy_loss=_build(by_path["algorithm.loss"]),
        aggregation=config.algorithm.aggregation or "token-mean",
        needs_critic=needs_critic,
        training=training,
    )
    if training:
        _build_learner(session, accelerator, load_policy)
        session.stream = TaskStream(session.dataset.load("train"), config.seed)
        if config.health.enabled:
            session.health = HealthMonitor(config.health, eval_every=config.trainer.eval_every)
        if session.is_main:
            session.trackers = [_build(by_path[f"trackers[{i}]"]) for i in range(len(config.trackers))]
    else:
        session.model = accelerator.prepare(model)
    backend = by_path["rollout.backend"]
    session.backend = backend.cls(backend.config, model=session.unwrapped, tokenizer=tokenizer)
    if source is None and config.rollout.source != "engine":
        raise ConfigError(
            f"rollout.source={config.rollout.source!r}: build_session needs that source's factory "
            "(source=agent_r1.gateway.training.GatewaySource for the gateway); agent-r1's commands pass it",
            path="rollout.source",
        )
    session.source = (source or EngineSource)(session)
    return session


def _ensure_process_group(device: torch.device) -> None:
    """A one-process group when sharding is asked for without a launcher (the device mesh needs a
    process group; ``accelerate launch`` and ``torchrun`` start theirs)."""
    import torch.distributed as dist

    if dist.is_available() and not dist.is_initialized():
        import socket

        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)


def _build(component: ResolvedComponent) -> Any:
    return component.cls(component.config)


def _factory(component: ResolvedComponent) -> Callable[[], Environment]:
    """One environment instance per episode, from the validated section."""
    cls, validated = component.cls, component.config
    return lambda: cls(validated)


def _check_batch_shape(config: RunConfig, world: int) -> None:
    per_process, remainder = divmod(config.trainer.tasks_per_step, world)
    if remainder or per_process * config.rollout.group_size < config.trainer.mini_batches:
        raise ConfigError(
            f"trainer.tasks_per_step={config.trainer.tasks_per_step} must be a multiple of the {world} "
            f"processes, and each process's share times rollout.group_size must be at least "
            f"trainer.mini_batches={config.trainer.mini_batches}",
            path="trainer.tasks_per_step",
        )


def _build_learner(session: Session, accelerator: Any, load_policy: Callable[..., Any]) -> None:
    """Reference model, critic, optimizer, scheduler and KL controller, then the wrapping for
    several processes: accelerate's (DDP), or FSDP2 shards (``trainer.sharding: fsdp2``)."""
    config = session.config
    model = session.model
    if config.trainer.packing:  # before copying, sharding and wrapping: a plain model
        prepare_packing(model)
    if config.algorithm.kl.coef > 0:  # beta = 0 loads no reference model at all
        session.ref_model = copy.deepcopy(model).eval().requires_grad_(False)
    critic = config.algorithm.critic
    if session.needs_critic:
        if critic.kind == "separate":
            critic_cfg = ModelConfig(
                **{**config.model.model_dump(), "path": critic.path or config.model.path}
            )
            critic_model, _ = load_policy(critic_cfg, device=accelerator.device)
            if config.trainer.packing:
                prepare_packing(critic_model)
            session.critic_model = critic_model.to(accelerator.device)
        session.value_head = ValueHead(int(model.config.hidden_size)).to(accelerator.device)  # type: ignore[union-attr]
    if session.sharded:
        _shard_learner(session)
    groups: list[dict[str, Any]] = [
        {"params": [p for p in session.model.parameters() if p.requires_grad], "lr": config.trainer.lr}
    ]
    for module in (session.critic_model, session.value_head):
        if module is not None:
            groups.append({"params": list(module.parameters()), "lr": critic.lr})
    t = config.trainer
    optimizer = torch.optim.AdamW(groups, lr=t.lr, betas=t.betas, weight_decay=t.weight_decay)
    session.scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda update: _lr_factor(config, update)
    )
    if session.sharded:
        session.optimizer = optimizer
    else:
        session.model = accelerator.prepare(model)
        if session.value_head is not None:
            session.value_head = accelerator.prepare(session.value_head)
        if session.critic_model is not None:
            session.critic_model = accelerator.prepare(session.critic_model)
        session.optimizer = accelerator.prepare(optimizer)
    kl = config.algorithm.kl
    session.kl_ctl = (
        AdaptiveKLController(kl.coef, kl.target, kl.horizon)
        if kl.target is not None
        else FixedKLController(kl.coef)
    )


def _shard_learner(session: Session) -> None:
    """Shard the policy, the reference model, a separate critic and the value head over every
    process (see :mod:`agent_r1.engine.learner.sharding`)."""
    from agent_r1.engine.learner import sharding

    options = session.config.trainer.fsdp
    mesh = sharding.make_mesh(session.device, session.world)
    wrap = sharding.wrap_classes(session.model, options.wrap)
    session.model = sharding.shard_module(session.model, mesh, options, wrap=wrap)
    if session.ref_model is not None:
        session.ref_model = sharding.shard_module(session.ref_model, mesh, options, wrap=wrap)
    if session.critic_model is not None:
        critic_wrap = sharding.wrap_classes(session.critic_model, options.wrap)
        session.critic_model = sharding.shard_module(session.critic_model, mesh, options, wrap=critic_wrap)
    if session.value_head is not None:
        session.value_head = sharding.shard_module(session.value_head, mesh, options)
    modules = (session.model, session.ref_model, session.critic_model, session.value_head)
    sharding.check_agreement(modules, session.world)


def _lr_factor(config: RunConfig, update: int) -> float:
    """The learning-rate multiplier after ``update`` optimizer steps (warm-up, then the schedule)."""
    t = config.trainer
    total = max(t.steps * t.epochs * t.mini_batches, 1)
    if t.warmup_steps and update < t.warmup_steps:
        return (update + 1) / t.warmup_steps
    if t.schedule == "constant":
        return 1.0
    progress = min((update - t.warmup_steps) / max(total - t.warmup_steps, 1), 1.0)
    if t.schedule == "linear":
        return max(1.0 - progress, 0.0)
    return 0.5 * (1.0 + math.cos(math.pi * progress))
