"""The RL trainer: rollout → rewards → reference/critic passes → advantages → updates.

One training step, top to bottom (:meth:`Trainer.train_step`):

1. take ``tasks_per_step`` tasks from the data stream and roll each out ``group_size`` times;
2. score every trajectory with the configured reward shapers (weights from the run config);
3. optionally drop zero-variance groups and refill (DAPO dynamic sampling);
4. gather the batch across processes so that every estimator sees the whole batch;
5. reference log-probabilities (only when the KL coefficient is positive) and critic values;
6. advantages and returns from the estimator;
7. ``epochs`` passes of ``mini_batches`` optimizer steps, each accumulating micro-batches, with the
   loss normalised over the whole mini-batch (and over all processes);
8. metrics, trackers, observer hooks, checkpoint, weight sync to the rollout backend.

Device placement goes through accelerate, so the same code runs on one CPU, one GPU or many
processes under ``accelerate launch``.
"""

from __future__ import annotations

import asyncio
import copy
import inspect
import math
import random
import time
import warnings
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from agent_r1.config import ResolvedComponent, RunConfig
from agent_r1.contracts import AdvantageInput, LossInput, SamplingParams
from agent_r1.engine import checkpoint as ckpt
from agent_r1.engine.batch import TrainBatch, collate, policy_forward
from agent_r1.engine.loss_utils import (
    AdaptiveKLController,
    FixedKLController,
    Normalizer,
    aggregate,
    kl_penalty,
    masked_mean,
    mismatch_kl,
    tis_weights,
)
from agent_r1.errors import AgentR1Error
from agent_r1.mdp import Task, Trajectory
from agent_r1.registry import Registry, get_registry

LOSS_SHARES = frozenset({"actor/pg_loss", "actor/loss", "critic/value_loss"})
"""Metrics that are a micro-batch's share of an update's loss: summed per update, then averaged."""


class TrainingAborted(AgentR1Error):
    """Training stopped on purpose (e.g. too many non-finite losses in a row)."""


class NonFiniteLossWarning(UserWarning):
    """A step's loss was NaN or infinite and the update was skipped."""


# --------------------------------------------------------------------------------------------
# Data stream with a resumable position
# --------------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------------
# Critic
# --------------------------------------------------------------------------------------------


class ValueHead(nn.Module):
    """A scalar head on a transformer's last hidden state: V(s_t) for every token ``t``."""

    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.proj = nn.Linear(hidden_size, 1)
        nn.init.zeros_(self.proj.weight)
        nn.init.zeros_(self.proj.bias)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:  # [B, T, H] -> [B, T]
        return self.proj(hidden.float()).squeeze(-1)


def _run_async(value: Any) -> Any:
    return asyncio.run(value) if inspect.isawaitable(value) else value


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


# --------------------------------------------------------------------------------------------
# The trainer
# --------------------------------------------------------------------------------------------


class Trainer:
    """Builds every component from a validated :class:`RunConfig` and runs the training loop."""

    def __init__(
        self,
        config: RunConfig,
        components: Sequence[ResolvedComponent],
        run_dir: Path,
        *,
        registry: Registry | None = None,
        model: nn.Module | None = None,
        tokenizer: Any = None,
    ) -> None:
        from accelerate import Accelerator

        from agent_r1.engine.models import load_policy, pick_device

        self.config = config
        self.registry = registry or get_registry()
        self.run_dir = Path(run_dir)
        self.components = {c.path: c for c in components}
        _seed_everything(config.seed)

        device = pick_device(config.model.device)
        self.accelerator = Accelerator(cpu=device.type == "cpu")
        self.rank = self.accelerator.process_index
        self.world = self.accelerator.num_processes
        self.is_main = self.accelerator.is_main_process

        per_process, remainder = divmod(config.trainer.tasks_per_step, self.world)
        if remainder or per_process * config.rollout.group_size < config.trainer.mini_batches:
            from agent_r1.errors import ConfigError

            raise ConfigError(
                f"trainer.tasks_per_step={config.trainer.tasks_per_step} must be a multiple of the "
                f"{self.world} processes, and each process's share times rollout.group_size must be at "
                f"least trainer.mini_batches={config.trainer.mini_batches}",
                path="trainer.tasks_per_step",
            )

        # -- algorithm: estimator + loss + aggregation ----------------------------------------
        algo_cls = self.components["algorithm"].cls
        self.algorithm = algo_cls()
        est_name = config.algorithm.estimator.name if config.algorithm.estimator else algo_cls.estimator
        est_options = (
            config.algorithm.estimator.options if config.algorithm.estimator else algo_cls.estimator_config
        )
        loss_name = config.algorithm.loss.name if config.algorithm.loss else algo_cls.loss
        loss_options = config.algorithm.loss.options if config.algorithm.loss else algo_cls.loss_config
        self.estimator = self.registry.build("advantage_estimators", est_name, est_options)
        self.policy_loss = self.registry.build("policy_losses", loss_name, loss_options)
        self.aggregation = config.algorithm.aggregation or algo_cls.aggregation
        self.needs_critic = bool(self.estimator.needs_critic or algo_cls.needs_critic)

        # -- model, reference, critic, optimizer ------------------------------------------------
        if model is None:
            model, tokenizer = load_policy(config.model, device=self.accelerator.device)
        self.tokenizer = tokenizer
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        model.to(self.accelerator.device)
        self.ref_model: nn.Module | None = None
        if config.algorithm.kl.coef > 0:  # β = 0 loads no reference model at all
            self.ref_model = copy.deepcopy(model).eval().requires_grad_(False)
        self.value_head: ValueHead | None = None
        self.critic_model: nn.Module | None = None
        params = [p for p in model.parameters() if p.requires_grad]
        groups: list[dict[str, Any]] = [{"params": params, "lr": config.trainer.lr}]
        if self.needs_critic:
            hidden = int(model.config.hidden_size)
            if config.algorithm.critic.kind == "separate":
                from agent_r1.config import ModelConfig

                critic_cfg = ModelConfig(
                    **{**config.model.model_dump(), "path": config.algorithm.critic.path or config.model.path}
                )
                self.critic_model, _ = load_policy(critic_cfg, device=self.accelerator.device)
                self.critic_model.to(self.accelerator.device)
                groups.append(
                    {"params": list(self.critic_model.parameters()), "lr": config.algorithm.critic.lr}
                )
            self.value_head = ValueHead(hidden).to(self.accelerator.device)
            groups.append({"params": list(self.value_head.parameters()), "lr": config.algorithm.critic.lr})
        self.optimizer = torch.optim.AdamW(
            groups, lr=config.trainer.lr, betas=config.trainer.betas, weight_decay=config.trainer.weight_decay
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, self._lr_lambda)
        self.model = self.accelerator.prepare(model)
        if self.value_head is not None:
            self.value_head = self.accelerator.prepare(self.value_head)
        if self.critic_model is not None:
            self.critic_model = self.accelerator.prepare(self.critic_model)
        self.optimizer = self.accelerator.prepare(self.optimizer)

        kl = config.algorithm.kl
        self.kl_ctl: FixedKLController | AdaptiveKLController = (
            AdaptiveKLController(kl.coef, kl.target, kl.horizon)
            if kl.target is not None
            else FixedKLController(kl.coef)
        )

        # -- data, environment, rewards, rollout, trackers ---------------------------------------
        data = self.components["data"]
        self.dataset = data.cls(data.config)
        self.train_tasks = self.dataset.load("train")
        self.stream = TaskStream(self.train_tasks, config.seed)
        env = self.components["environment"]
        self.env_factory: Callable[[], Any] = lambda: env.cls(env.config)
        self.shapers = []
        for i, spec in enumerate(config.rewards):
            shaper = self.components[f"rewards[{i}]"]
            self.shapers.append((shaper.cls(shaper.config), spec.weight))
        backend = self.components["rollout.backend"]
        self.backend = backend.cls(backend.config, model=self.unwrapped, tokenizer=tokenizer)
        self.trackers = []
        if self.is_main:
            for i in range(len(config.trackers)):
                tracker = self.components[f"trackers[{i}]"]
                self.trackers.append(tracker.cls(tracker.config))
        self.step = 0
        self.bad_steps = 0
        self.last_trajectories: list[Trajectory] = []

    # -- helpers ---------------------------------------------------------------------------------
    @property
    def unwrapped(self) -> nn.Module:
        return self.accelerator.unwrap_model(self.model)

    def _lr_lambda(self, update: int) -> float:
        cfg = self.config.trainer
        total = max(cfg.steps * cfg.epochs * cfg.mini_batches, 1)
        if cfg.warmup_steps and update < cfg.warmup_steps:
            return (update + 1) / cfg.warmup_steps
        if cfg.schedule == "constant":
            return 1.0
        progress = min((update - cfg.warmup_steps) / max(total - cfg.warmup_steps, 1), 1.0)
        if cfg.schedule == "linear":
            return max(1.0 - progress, 0.0)
        return 0.5 * (1.0 + math.cos(math.pi * progress))

    def rollout_engine(self, *, temperature: float) -> Any:
        from agent_r1.engine.rollout import RolloutEngine

        r = self.config.rollout
        sampling = SamplingParams(
            temperature=temperature, top_p=r.top_p, top_k=r.top_k, max_new_tokens=r.max_new_tokens
        )
        return RolloutEngine(
            self.backend,
            self.tokenizer,
            self.env_factory,
            max_turns=r.max_turns,
            max_new_tokens=r.max_new_tokens,
            max_context=r.max_context,
            sampling=sampling,
            on_env_error="end",  # a faulty environment step ends that episode (counted), not the run
        )

    def collect(
        self, tasks: list[Task], group_size: int, *, seed: int, temperature: float, salt: str
    ) -> list[Trajectory]:
        """Roll out ``tasks`` (each ``group_size`` times) with the current policy and score them."""
        self.unwrapped.eval()
        engine = self.rollout_engine(temperature=temperature)
        with torch.no_grad():
            trajectories: list[Trajectory] = engine.collect(
                tasks, group_size, seed=seed, policy_version=self.step, group_salt=salt
            )
        self.score(trajectories, {t.id: t for t in tasks})
        return trajectories

    def collect_all(
        self, tasks: list[Task], group_size: int, *, seed: int, temperature: float, salt: str
    ) -> list[Trajectory]:
        """Like :meth:`collect`, but the tasks are shared out across processes and every process
        gets all trajectories back (evaluation)."""
        mine = self.collect(
            tasks[self.rank :: self.world], group_size, seed=seed, temperature=temperature, salt=salt
        )
        return self._all_gather(mine)

    def score(self, trajectories: Sequence[Trajectory], tasks: dict[str, Task]) -> None:
        """Add every shaper's signals (with its configured weight) to each trajectory."""
        for trajectory in trajectories:
            task = tasks[trajectory.task_id]
            for shaper, weight in self.shapers:
                signals = _run_async(shaper.score(trajectory, task)) or []
                for signal in signals:
                    signal.weight = weight * signal.weight
                    signal.source = signal.source or shaper.name
                trajectory.rewards.extend(signals)

    def _step_seed(self, step: int, round_: int = 0) -> int:
        return (self.config.seed * 1_000_003 + step * 9_973 + round_ * 101 + self.rank * 7) % 2**31

    # -- one step ----------------------------------------------------------------------------------
    def gather_rollouts(self, step: int) -> tuple[list[Trajectory], dict[str, float]]:
        cfg = self.config
        timings: dict[str, float] = {}
        started = time.perf_counter()
        tasks = self._my_tasks()
        used_tasks = {t.id: t for t in tasks}
        trajectories = self.collect(
            tasks,
            cfg.rollout.group_size,
            seed=self._step_seed(step),
            temperature=cfg.rollout.temperature,
            salt=f"s{step}",
        )
        zero_var = _zero_variance_groups(trajectories)
        stats = {"batch/zero_variance_groups": len(zero_var) / max(len(tasks), 1)}
        if cfg.algorithm.dynamic_sampling and cfg.rollout.group_size > 1:
            kept = [t for t in trajectories if t.group_id not in zero_var]
            rounds = 0
            wanted = len(tasks)
            while len({t.group_id for t in kept}) < wanted and rounds < cfg.algorithm.max_refill_rounds:
                rounds += 1
                more = self._my_tasks()
                used_tasks.update((t.id, t) for t in more)
                extra = self.collect(
                    more,
                    cfg.rollout.group_size,
                    seed=self._step_seed(step, rounds),
                    temperature=cfg.rollout.temperature,
                    salt=f"s{step}r{rounds}",
                )
                extra_zero = _zero_variance_groups(extra)
                kept += [t for t in extra if t.group_id not in extra_zero]
            groups = list(dict.fromkeys(t.group_id for t in kept))[:wanted]
            kept = [t for t in kept if t.group_id in set(groups)]
            stats["batch/refill_rounds"] = rounds
            trajectories = kept if kept else trajectories  # never train on an empty batch
        if self.estimator.needs_baseline_rollout:
            # ReMax: the score of one greedy rollout per task is each trajectory's baseline.
            needed = {t.task_id for t in trajectories}
            greedy = self.collect(
                [t for t in used_tasks.values() if t.id in needed],
                1,
                seed=self._step_seed(step, 77),
                temperature=0.0,
                salt=f"s{step}g",
            )
            baseline = {t.task_id: t.score for t in greedy}
            for trajectory in trajectories:
                trajectory.metrics["baseline_score"] = baseline[trajectory.task_id]
            stats["reward/baseline_score_mean"] = sum(baseline.values()) / max(len(baseline), 1)
        timings["time/rollout_s"] = time.perf_counter() - started
        return trajectories, {**stats, **timings}

    def _my_tasks(self) -> list[Task]:
        """This process's share of the next global batch of tasks (every process draws the same
        global batch from identically seeded streams, then keeps every ``world``-th task)."""
        tasks = self.stream.take(self.config.trainer.tasks_per_step)
        return tasks[self.rank :: self.world]

    def train_step(self) -> dict[str, float]:
        """Run one full training step (rollout, rewards, update) and return its metrics."""
        t0 = time.perf_counter()
        local, metrics = self.gather_rollouts(self.step)
        self.registry.notify("on_rollout_end", step=self.step, trajectories=local)
        metrics.update(self.update_on(local))
        metrics["time/step_s"] = time.perf_counter() - t0
        metrics["time/other_s"] = max(
            metrics["time/step_s"]
            - metrics["time/rollout_s"]
            - metrics.get("time/forward_backward_s", 0.0)
            - metrics.get("time/optimizer_s", 0.0)
            - metrics["time/advantages_s"],
            0.0,
        )
        metrics["perf/tokens_per_s"] = metrics.pop("_tokens") / max(metrics["time/step_s"], 1e-9)
        return metrics

    def update_on(self, local: list[Trajectory]) -> dict[str, float]:
        """Steps 4-8 on already scored trajectories of this process: advantages, updates, weight
        sync. Exposed for embedders that collect trajectories themselves."""
        cfg = self.config
        step = self.step
        metrics: dict[str, float] = {}
        everything = self._all_gather(local)
        t_adv = time.perf_counter()

        batch = collate(local, self.pad_id, mask_truncated=cfg.algorithm.mask_truncated).to(
            self.accelerator.device
        )
        full = collate(everything, self.pad_id, mask_truncated=cfg.algorithm.mask_truncated)
        temperature = cfg.rollout.temperature or 1.0
        one_update = cfg.trainer.epochs * cfg.trainer.mini_batches == 1

        # old log-probs (skipped when the single update can reuse its own forward), ref, values
        old_logprobs = None if one_update else self._no_grad_logprobs(self.model, batch, temperature)
        ref_logprobs = None
        if self.ref_model is not None:
            ref_logprobs = self._no_grad_logprobs(self.ref_model, batch, temperature)
        values = self._no_grad_values(batch) if self.needs_critic else None

        # advantages over the whole (all-process) batch, then this process's rows
        token_rewards = batch.token_rewards.clone()
        kl_reward_mean = 0.0
        if ref_logprobs is not None and cfg.algorithm.kl.placement == "reward":
            base = (
                old_logprobs
                if old_logprobs is not None
                else self._no_grad_logprobs(self.model, batch, temperature)
            )
            kl_tokens = kl_penalty(base, ref_logprobs, cfg.algorithm.kl.estimator)
            token_rewards = token_rewards - self.kl_ctl.value * torch.where(batch.loss_mask, kl_tokens, 0.0)
            kl_reward_mean = float(masked_mean(kl_tokens, batch.loss_mask))
        advantages, returns = self._advantages(batch, full, token_rewards, values)
        metrics["time/advantages_s"] = time.perf_counter() - t_adv

        update_metrics = self._update(
            batch, advantages, returns, old_logprobs, ref_logprobs, values, temperature
        )
        metrics.update(update_metrics)
        if ref_logprobs is not None:
            observed = update_metrics.get("actor/kl", kl_reward_mean)
            if self.world > 1:  # every process must move beta identically
                mean = self.accelerator.reduce(
                    torch.tensor([observed], device=self.accelerator.device), "mean"
                )
                observed = float(mean[0])
            self.kl_ctl.update(observed, len(everything))
            metrics["actor/kl_coef"] = self.kl_ctl.value
        metrics.update(_trajectory_metrics(everything))
        success_signal = cfg.eval.success_signal
        metrics["success/train"] = sum(
            t.reward_by_name().get(success_signal, 0.0) >= 1.0 - 1e-9 for t in everything
        ) / max(len(everything), 1)
        self.last_trajectories = local
        metrics.update(_tensor_stats("advantages", advantages, batch.loss_mask))
        metrics.update(_tensor_stats("returns", returns, batch.loss_mask))
        gen = sum(t.metrics.get("generation_s", 0.0) for t in local) / max(len(local), 1)
        metrics["time/generation_s"] = gen
        metrics["time/tools_s"] = sum(t.metrics.get("tool_s", 0.0) for t in local) / max(len(local), 1)
        metrics["_tokens"] = float(sum(len(t) for t in everything))
        metrics["lr"] = self.scheduler.get_last_lr()[0]
        metrics["step"] = step
        self.step += 1
        self.backend.sync_weights(self.unwrapped, self.step)
        return metrics

    def _all_gather(self, local: list[Trajectory]) -> list[Trajectory]:
        if self.world == 1:
            return list(local)
        from accelerate.utils import gather_object

        gathered: list[Trajectory] = gather_object(local)
        return gathered

    def _no_grad_logprobs(self, model: nn.Module, batch: TrainBatch, temperature: float) -> torch.Tensor:
        out = torch.zeros_like(batch.rollout_logprobs)
        model.eval()
        with torch.no_grad():
            for rows in self._micro_rows(len(batch)):
                micro = batch.select(rows)
                start = _first_policy_position(micro.loss_mask)
                lp = policy_forward(
                    model, micro.input_ids, micro.attention_mask, temperature=temperature, start=start
                )
                out[rows, : lp.logprobs.shape[1]] = lp.logprobs
        return out

    def _values(self, micro: TrainBatch) -> torch.Tensor:
        assert self.value_head is not None
        backbone = self.critic_model if self.critic_model is not None else self.model
        outputs = backbone(
            input_ids=micro.input_ids,
            attention_mask=micro.attention_mask.long(),
            output_hidden_states=True,
            use_cache=False,
            logits_to_keep=1,
        )
        return self.value_head(outputs.hidden_states[-1])  # [B, T]

    def _no_grad_values(self, batch: TrainBatch) -> torch.Tensor:
        out = torch.zeros_like(batch.rollout_logprobs)
        with torch.no_grad():
            for rows in self._micro_rows(len(batch)):
                micro = batch.select(rows)
                v = self._values(micro)
                out[rows, : v.shape[1]] = v.float()
        return out

    def _micro_rows(self, size: int) -> list[list[int]]:
        mb = self.config.trainer.micro_batch_size
        return [list(range(i, min(i + mb, size))) for i in range(0, size, mb)]

    def _advantages(
        self, batch: TrainBatch, full: TrainBatch, token_rewards: torch.Tensor, values: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # Scores are re-derived from the token rewards so that a KL penalty placed in the reward
        # reaches score-based estimators (grpo, rloo...) too.
        if self.world == 1:
            inputs = AdvantageInput(
                token_rewards=token_rewards,
                loss_mask=batch.loss_mask,
                scores=token_rewards.sum(dim=-1),
                group_ids=batch.group_ids,
                values=values,
                baseline_scores=_baseline_scores(batch.trajectories),
            )
            return self.estimator.compute(inputs)
        # Every process computes the advantages of the whole batch from gathered rows (same result
        # everywhere), then keeps its own rows: batch-level statistics stay exact.
        from accelerate.utils import gather_object

        rows_rewards = gather_object([r.cpu() for r in token_rewards])
        rows_values = gather_object([v.cpu() for v in values]) if values is not None else None
        length = full.input_ids.shape[1]
        pad = lambda rows: torch.stack([torch.nn.functional.pad(r, (0, length - r.shape[0])) for r in rows])  # noqa: E731
        all_rewards = pad(rows_rewards)
        inputs = AdvantageInput(
            token_rewards=all_rewards,
            loss_mask=full.loss_mask,
            scores=all_rewards.sum(dim=-1),
            group_ids=full.group_ids,
            values=pad(rows_values) if rows_values is not None else None,
            baseline_scores=_baseline_scores(full.trajectories),
        )
        adv, ret = self.estimator.compute(inputs)
        sizes: list[int] = gather_object([len(batch)])
        offset = sum(sizes[: self.rank])
        mine = slice(offset, offset + len(batch))
        width = batch.input_ids.shape[1]
        return adv[mine, :width].to(batch.input_ids.device), ret[mine, :width].to(batch.input_ids.device)

    def _global_normalizer(self, masks: list[torch.Tensor]) -> Normalizer:
        max_len = self.config.rollout.max_new_tokens * self.config.rollout.max_turns
        norm = Normalizer.from_masks(masks, self.aggregation, max_len=max_len)
        if self.world == 1:
            return norm
        counts = torch.tensor([norm.num_tokens, norm.num_sequences], device=self.accelerator.device)
        counts = self.accelerator.reduce(counts, reduction="sum")
        return Normalizer(norm.mode, int(counts[0]), int(counts[1]), norm.length)

    def _update(
        self,
        batch: TrainBatch,
        advantages: torch.Tensor,
        returns: torch.Tensor,
        old_logprobs: torch.Tensor | None,
        ref_logprobs: torch.Tensor | None,
        old_values: torch.Tensor | None,
        temperature: float,
    ) -> dict[str, float]:
        cfg = self.config
        algo = cfg.algorithm
        sums: dict[str, float] = defaultdict(float)
        counts: dict[str, int] = defaultdict(int)
        fb_time = opt_time = 0.0
        generator = torch.Generator().manual_seed(self._step_seed(self.step, 999))
        self.model.train()
        skipped = False
        # Skipping rows with zero advantage is exact only when no other term (entropy bonus, KL in
        # the loss, value loss) needs them, and only on one process (DDP needs equal work).
        skip_idle = (
            cfg.trainer.skip_idle_rows
            and self.world == 1
            and algo.entropy_coef == 0
            and not self.needs_critic
            and not (self.ref_model is not None and algo.kl.placement == "loss")
        )
        for _epoch in range(cfg.trainer.epochs):
            order = (
                torch.randperm(len(batch), generator=generator).tolist()
                if cfg.trainer.epochs > 1
                else list(range(len(batch)))
            )
            chunks = np.array_split(np.array(order), cfg.trainer.mini_batches)
            for chunk in chunks:
                rows_all = chunk.tolist()
                if not rows_all:
                    continue
                mb = cfg.trainer.micro_batch_size
                micro_rows = [rows_all[i : i + mb] for i in range(0, len(rows_all), mb)]
                normalizer = self._global_normalizer([batch.loss_mask[r] for r in micro_rows])
                if skip_idle:
                    # Rows whose advantages are all zero add nothing to the gradient; they still
                    # count in the normaliser above, so the update is exactly the same.
                    busy = [r for r in rows_all if bool((advantages[r] != 0).any())]
                    micro_rows = [busy[i : i + mb] for i in range(0, len(busy), mb)]
                    sums["batch/idle_rows_skipped"] += len(rows_all) - len(busy)
                    counts["batch/idle_rows_skipped"] = 1
                self.optimizer.zero_grad(set_to_none=True)
                update_sums: dict[str, float] = {}
                step_ok = True
                t_fb = time.perf_counter()
                for k, rows in enumerate(micro_rows):
                    micro = batch.select(rows)
                    width = micro.input_ids.shape[1]
                    idx = torch.as_tensor(rows, device=advantages.device)
                    loss, parts = self._micro_loss(
                        micro,
                        advantages[idx, :width],
                        returns[idx, :width],
                        None if old_logprobs is None else old_logprobs[idx, :width],
                        None if ref_logprobs is None else ref_logprobs[idx, :width],
                        None if old_values is None else old_values[idx, :width],
                        normalizer,
                        temperature,
                    )
                    if not torch.isfinite(loss):
                        step_ok = False
                        break
                    sync = k == len(micro_rows) - 1
                    if sync:
                        self.accelerator.backward(loss * self.world)
                    else:
                        with self.accelerator.no_sync(self.model):
                            self.accelerator.backward(loss * self.world)
                    for name, value in parts.items():
                        if name in LOSS_SHARES:  # a micro-batch's share: sum them per update
                            update_sums[name] = update_sums.get(name, 0.0) + value
                        else:
                            sums[name] += value
                            counts[name] += 1
                fb_time += time.perf_counter() - t_fb
                if not micro_rows:  # nothing to learn from: step with zero gradients, as unskipped
                    for group in self.optimizer.param_groups:
                        for param in group["params"]:
                            param.grad = torch.zeros_like(param)
                for name, value in update_sums.items():
                    sums[name] += value
                    counts[name] += 1
                t_opt = time.perf_counter()
                if step_ok:
                    params = [p for g in self.optimizer.param_groups for p in g["params"]]
                    if cfg.trainer.grad_clip is not None:
                        norm = self.accelerator.clip_grad_norm_(params, cfg.trainer.grad_clip)
                    else:
                        norm = torch.norm(torch.stack([p.grad.norm() for p in params if p.grad is not None]))
                    if not torch.isfinite(torch.as_tensor(norm)):
                        step_ok = False
                    else:
                        sums["actor/grad_norm"] += float(norm)
                        counts["actor/grad_norm"] += 1
                if step_ok:
                    self.optimizer.step()
                    self.scheduler.step()
                else:
                    self.optimizer.zero_grad(set_to_none=True)
                    skipped = True
                opt_time += time.perf_counter() - t_opt
        self.model.eval()
        if skipped:
            self.bad_steps += 1
            warnings.warn(
                f"step {self.step}: the loss or gradient was NaN/infinite; the update was skipped "
                f"({self.bad_steps} in a row, abort after {cfg.trainer.max_bad_steps})",
                NonFiniteLossWarning,
                stacklevel=2,
            )
            if self.bad_steps >= cfg.trainer.max_bad_steps:
                raise TrainingAborted(
                    f"{self.bad_steps} training steps in a row had a NaN or infinite loss (limit "
                    f"trainer.max_bad_steps={cfg.trainer.max_bad_steps}); stopping. Checkpoints and metrics "
                    f"written so far are kept in {self.run_dir}. Lower trainer.lr, enable trainer.grad_clip "
                    "or check the rewards for non-finite values."
                )
        else:
            self.bad_steps = 0
        out = {name: sums[name] / max(counts[name], 1) for name in sums}
        out["actor/skipped_updates"] = float(skipped)
        out["time/forward_backward_s"] = fb_time
        out["time/optimizer_s"] = opt_time
        return out

    def _micro_loss(
        self,
        micro: TrainBatch,
        advantages: torch.Tensor,
        returns: torch.Tensor,
        old_logprobs: torch.Tensor | None,
        ref_logprobs: torch.Tensor | None,
        old_values: torch.Tensor | None,
        normalizer: Normalizer,
        temperature: float,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        algo = self.config.algorithm
        mask = micro.loss_mask
        start = _first_policy_position(mask)
        shared_backbone = self.needs_critic and self.critic_model is None
        out = policy_forward(
            self.model,
            micro.input_ids,
            micro.attention_mask,
            temperature=temperature,
            with_entropy=True,
            with_hidden=shared_backbone,
            start=start,
        )
        logprobs = out.logprobs
        old = old_logprobs if old_logprobs is not None else logprobs.detach()
        token_loss, diagnostics = self.policy_loss.token_loss(
            LossInput(logprobs=logprobs, old_logprobs=old, advantages=advantages, loss_mask=mask)
        )
        if algo.tis_cap is not None:
            weights = tis_weights(old, micro.rollout_logprobs, mask, algo.tis_cap)
            token_loss = token_loss * weights
        loss = aggregate(token_loss, mask, self.aggregation, normalizer=normalizer)
        parts: dict[str, float] = {"actor/pg_loss": float(loss.detach())}
        for name, values in diagnostics.items():
            parts[f"actor/{name}"] = float(masked_mean(values.detach().float(), mask))
        assert out.entropy is not None
        entropy = aggregate(out.entropy, mask, self.aggregation, normalizer=normalizer)
        parts["actor/entropy"] = float(masked_mean(out.entropy.detach(), mask))
        if algo.entropy_coef > 0:
            loss = loss - algo.entropy_coef * entropy
        if ref_logprobs is not None:
            kl_tokens = kl_penalty(logprobs, ref_logprobs, algo.kl.estimator)
            parts["actor/kl"] = float(masked_mean(kl_tokens.detach(), mask))
            if algo.kl.placement == "loss":
                loss = loss + self.kl_ctl.value * aggregate(
                    kl_tokens, mask, self.aggregation, normalizer=normalizer
                )
        parts.update(
            {
                f"rollout/{k}": v
                for k, v in mismatch_kl(logprobs.detach(), micro.rollout_logprobs, mask).items()
            }
        )
        if self.needs_critic:
            if shared_backbone:
                assert out.hidden is not None and self.value_head is not None
                values = self.value_head(out.hidden)
            else:
                values = self._values(micro)
            value_loss_tokens = (values - returns) ** 2
            clip = algo.critic.value_clip
            if clip is not None and old_values is not None:
                clipped = old_values + (values - old_values).clamp(-clip, clip)
                value_loss_tokens = torch.maximum(value_loss_tokens, (clipped - returns) ** 2)
            value_loss = 0.5 * aggregate(value_loss_tokens, mask, self.aggregation, normalizer=normalizer)
            parts["critic/value_loss"] = float(value_loss.detach())
            parts["critic/values_mean"] = float(masked_mean(values.detach(), mask))
            loss = loss + algo.critic.coef * value_loss
        parts["actor/loss"] = float(loss.detach())
        return loss, parts

    # -- state for checkpoints ---------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {
            "step": self.step,
            "model": {k: v.detach().cpu() for k, v in self.unwrapped.state_dict().items()},
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "kl_coef": self.kl_ctl.value,
            "data": self.stream.state(),
            "rng": ckpt.capture_rng(),
            "bad_steps": self.bad_steps,
        }
        if self.value_head is not None:
            state["value_head"] = self.accelerator.unwrap_model(self.value_head).state_dict()
        if self.critic_model is not None:
            state["critic_model"] = self.accelerator.unwrap_model(self.critic_model).state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.unwrapped.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.kl_ctl.value = state["kl_coef"]
        self.stream.restore(state["data"])
        ckpt.restore_rng(state["rng"])
        self.step = state["step"]
        self.bad_steps = state.get("bad_steps", 0)
        if self.value_head is not None and "value_head" in state:
            self.accelerator.unwrap_model(self.value_head).load_state_dict(state["value_head"])
        if self.critic_model is not None and "critic_model" in state:
            self.accelerator.unwrap_model(self.critic_model).load_state_dict(state["critic_model"])
        self.backend.sync_weights(self.unwrapped, self.step)


def _first_policy_position(mask: torch.Tensor) -> int:
    """The earliest column holding a policy token in ``mask`` ``[B, T]`` (0 if there is none)."""
    columns = mask.any(dim=0).nonzero()
    return int(columns[0]) if len(columns) else 0


def _baseline_scores(trajectories: Sequence[Trajectory]) -> torch.Tensor | None:
    """Greedy-baseline scores recorded by :meth:`Trainer.gather_rollouts` (ReMax), else ``None``."""
    if not trajectories or any("baseline_score" not in t.metrics for t in trajectories):
        return None
    return torch.tensor([t.metrics["baseline_score"] for t in trajectories], dtype=torch.float32)


def _zero_variance_groups(trajectories: Sequence[Trajectory]) -> set[str]:
    scores: dict[str, list[float]] = defaultdict(list)
    for t in trajectories:
        scores[t.group_id].append(t.score)
    return {g for g, s in scores.items() if len(s) > 1 and max(s) - min(s) < 1e-9}


def _tensor_stats(prefix: str, values: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    selected = values[mask].float()
    if selected.numel() == 0:
        return {f"{prefix}/mean": 0.0, f"{prefix}/std": 0.0, f"{prefix}/max": 0.0, f"{prefix}/min": 0.0}
    return {
        f"{prefix}/mean": float(selected.mean()),
        f"{prefix}/std": float(selected.std()) if selected.numel() > 1 else 0.0,
        f"{prefix}/max": float(selected.max()),
        f"{prefix}/min": float(selected.min()),
    }


def _trajectory_metrics(trajectories: Sequence[Trajectory]) -> dict[str, float]:
    """Rewards by signal, scores, lengths, turns, tool use and termination reasons of a batch."""
    n = max(len(trajectories), 1)
    out: dict[str, float] = {}
    scores = [t.score for t in trajectories]
    out["reward/score_mean"] = float(np.mean(scores)) if scores else 0.0
    out["reward/score_std"] = float(np.std(scores)) if scores else 0.0
    by_name: dict[str, list[float]] = defaultdict(list)
    for t in trajectories:
        for name, value in t.reward_by_name().items():
            by_name[name].append(value)
    for name, values in by_name.items():
        out[f"reward/{name}"] = float(np.sum(values)) / n
    out["response/length_mean"] = (
        float(np.mean([t.num_policy_tokens for t in trajectories])) if trajectories else 0.0
    )
    out["response/length_max"] = float(max((t.num_policy_tokens for t in trajectories), default=0))
    out["response/turns_mean"] = float(np.mean([t.num_turns for t in trajectories])) if trajectories else 0.0
    out["response/truncated"] = sum(t.truncated for t in trajectories) / n
    calls = [t.metrics.get("tool_calls", 0.0) for t in trajectories]
    errors = [t.metrics.get("tool_errors", 0.0) for t in trajectories]
    out["tools/calls_mean"] = float(np.mean(calls)) if calls else 0.0
    out["tools/errors_mean"] = float(np.mean(errors)) if errors else 0.0
    out["tools/error_rate"] = float(np.sum(errors) / max(np.sum(calls), 1))
    out["rollout/format_error_rate"] = sum(t.metrics.get("format_errors", 0.0) > 0 for t in trajectories) / n
    drift = [t.metrics.get("template_drift_tokens", 0.0) for t in trajectories]
    out["rollout/template_drift_tokens"] = float(np.mean(drift)) if drift else 0.0
    for reason, count in Counter(t.termination or "unknown" for t in trajectories).items():
        out[f"termination/{reason}"] = count / n
    return out
