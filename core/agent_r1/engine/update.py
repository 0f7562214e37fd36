"""One policy update on scored trajectories, top to bottom.

:func:`update` is the whole learner of a training step:

1. gather every process's trajectories (estimators see the whole batch) and pad this process's
   rows into a :class:`~agent_r1.engine.learner.batch.TrainBatch`;
2. no-grad passes: the old policy's log-probabilities (skipped when there is a single optimizer
   step, which reuses its own forward pass), the reference's (only when ``algorithm.kl.coef > 0``)
   and the critic's values (only when the algorithm needs a critic);
3. token rewards, minus ``beta * KL`` when ``algorithm.kl.placement == "reward"``;
4. advantages and returns from the estimator, over the whole batch;
5. ``trainer.epochs`` passes of ``trainer.mini_batches`` optimizer steps; each step accumulates
   micro-batches (``trainer.micro_batch_size`` rows, or rows grouped by length within
   ``trainer.max_tokens_per_micro_batch``; padded, or packed end to end with ``trainer.packing``),
   with the loss normalised over the whole mini-batch (and every process), so the update does not
   depend on how rows are grouped;
6. the micro-batch loss (:func:`micro_loss`): the policy loss on policy tokens, optionally
   truncated importance sampling, the entropy bonus, the KL term, and the critic's clipped value
   loss;
7. the adaptive KL controller, metrics, ``session.step += 1`` and the weight sync to the backend.

Algorithm options are the named branches you see here (``kl.placement``, ``rollout_correction``,
``critic.kind``, ``skip_idle_rows``); everything else is the estimator's and the loss's business.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from agent_r1.contracts import AdvantageInput, LossInput
from agent_r1.engine.dist import all_gather, gather_padded_rows, mean_across, sum_across
from agent_r1.engine.guards import NonFiniteLossWarning, check_rewards, track_bad_updates
from agent_r1.engine.learner import sharding
from agent_r1.engine.learner.batch import StepPrefix, TrainBatch, collate, shared_prefix_length
from agent_r1.engine.learner.critic import critic_values, no_grad_values, state_values
from agent_r1.engine.learner.loss_utils import (
    Normalizer,
    aggregate,
    host_floats,
    kl_penalty,
    masked_mean,
    mismatch_kl_tensors,
)
from agent_r1.engine.learner.packing import (
    MicroBatching,
    equalize,
    micro_forward,
    no_grad_logprobs,
    prefix_supported,
)
from agent_r1.engine.learner.rollout_correction import correction_weights, ratio_stats_tensors
from agent_r1.engine.learner.turns import anchor_keys, turn_ids
from agent_r1.engine.reports.stats import batch_metrics, mean_metric, tensor_stats
from agent_r1.engine.session import Session
from agent_r1.mdp import Trajectory

__all__ = [
    "LOSS_SHARES",
    "NonFiniteLossWarning",
    "Targets",
    "advantage_input",
    "compute_advantages",
    "micro_loss",
    "optimize",
    "update",
]

LOSS_SHARES = frozenset({"actor/pg_loss", "actor/loss", "critic/value_loss"})
"""Metrics that are a micro-batch's share of an update's loss: summed per update, then averaged."""


@dataclass
class Targets:
    """What the optimizer steps fit, per row of this process's batch (all ``[B, T]``)."""

    advantages: torch.Tensor
    returns: torch.Tensor
    old_logprobs: torch.Tensor | None  # None: one optimizer step, which reuses its own forward
    ref_logprobs: torch.Tensor | None
    old_values: torch.Tensor | None

    def rows(self, rows: Sequence[int], width: int) -> Targets:
        idx = torch.as_tensor(list(rows), device=self.advantages.device)
        pick = lambda x: None if x is None else x[idx, :width]  # noqa: E731
        return Targets(*(pick(getattr(self, name)) for name in self.__dataclass_fields__))  # type: ignore[arg-type]


def update(session: Session, local: list[Trajectory]) -> dict[str, float]:
    """Advantages and optimizer steps on this process's scored trajectories; returns the metrics."""
    config = session.config
    algo = config.algorithm
    everything = all_gather(session, local)
    started = time.perf_counter()
    ghosts = _ghost_rows(session, local, everything)
    batch = collate(local + ghosts, session.pad_id, mask_truncated=algo.mask_truncated).to(session.device)
    if ghosts:
        batch = _masked_rows(batch, range(len(local), len(batch)))
    check_rewards(batch)
    reset_peak_memory(session.device)
    temperature = config.rollout.temperature or 1.0
    micro = MicroBatching.of(config.trainer)
    one_update = config.trainer.epochs * config.trainer.mini_batches == 1

    old_logprobs = None if one_update else no_grad_logprobs(session.model, batch, temperature, micro)
    ref_logprobs = None
    if session.ref_model is not None:
        ref_logprobs = no_grad_logprobs(session.ref_model, batch, temperature, micro)
    values = (
        no_grad_values(session.value_head, _critic_backbone(session), batch, micro)
        if session.needs_critic
        else None
    )

    passes_s = time.perf_counter() - started
    token_rewards = batch.token_rewards.clone()  # [B, T]
    kl_in_reward = 0.0
    if ref_logprobs is not None and algo.kl.placement == "reward":
        assert session.kl_ctl is not None
        base = (
            old_logprobs
            if old_logprobs is not None
            else no_grad_logprobs(session.model, batch, temperature, micro)
        )
        kl_tokens = kl_penalty(base, ref_logprobs, algo.kl.estimator)  # [B, T]
        token_rewards -= session.kl_ctl.value * torch.where(batch.loss_mask, kl_tokens, 0.0)
        kl_in_reward = float(masked_mean(kl_tokens, batch.loss_mask))
    advantages, returns = compute_advantages(
        session, batch, everything, token_rewards, values, real_rows=len(local)
    )
    metrics = {
        "time/no_grad_passes_s": passes_s,
        "time/advantages_s": time.perf_counter() - started - passes_s,
        **session.estimator.step_metrics(),  # e.g. gigpo's step-group figures
    }

    targets = Targets(advantages, returns, old_logprobs, ref_logprobs, values)
    metrics.update(optimize(session, batch, targets, temperature))
    if ref_logprobs is not None:
        metrics["actor/kl_coef"] = _update_kl_controller(
            session, metrics.get("actor/kl", kl_in_reward), len(everything)
        )
    metrics.update(batch_metrics(everything, success_signal=config.eval.success_signal))
    metrics.update(tensor_stats("advantages", advantages, batch.loss_mask))
    metrics.update(tensor_stats("returns", returns, batch.loss_mask))
    metrics["time/generation_s"] = mean_metric(local, "generation_s")
    metrics["time/tools_s"] = mean_metric(local, "tool_s")
    metrics["_tokens"] = float(sum(len(t) for t in everything))
    metrics["memory/peak_gib"] = peak_memory_gib(session.device)
    assert session.scheduler is not None
    metrics["lr"] = session.scheduler.get_last_lr()[0]
    session.step += 1
    metrics["step"] = session.step  # the N-th completed update (1-based)
    session.backend.sync_weights(session.unwrapped, session.step)
    return metrics


# --------------------------------------------------------------------------------------------
# No-grad passes and advantages
# --------------------------------------------------------------------------------------------


def compute_advantages(
    session: Session,
    batch: TrainBatch,
    everything: list[Trajectory],
    token_rewards: torch.Tensor,
    values: torch.Tensor | None,
    *,
    real_rows: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The estimator's advantages and returns for this process's rows, computed over the whole batch
    of every process (group and batch statistics stay exact). Scores are re-derived from the token
    rewards so that a KL penalty placed in the reward reaches score-based estimators too. Rows
    after the first ``real_rows`` (padding that keeps sharded processes in step) get zeros."""
    real = len(batch) if real_rows is None else real_rows
    if session.world == 1:
        return session.estimator.compute(advantage_input(batch, token_rewards, values))
    full = collate(everything, session.pad_id, mask_truncated=session.config.algorithm.mask_truncated)
    length = full.input_ids.shape[1]
    all_rewards = gather_padded_rows(session, token_rewards[:real], length)
    all_values = gather_padded_rows(session, values[:real], length) if values is not None else None
    adv, ret = session.estimator.compute(advantage_input(full, all_rewards, all_values))
    sizes = all_gather(session, [real])
    mine = slice(sum(sizes[: session.rank]), sum(sizes[: session.rank]) + real)
    width = batch.input_ids.shape[1]
    pad = (0, 0, 0, len(batch) - real)  # zero rows for the padding
    adv = torch.nn.functional.pad(adv[mine, :width], pad)
    ret = torch.nn.functional.pad(ret[mine, :width], pad)
    return adv.to(session.device), ret.to(session.device)


def advantage_input(
    batch: TrainBatch, token_rewards: torch.Tensor, values: torch.Tensor | None = None
) -> AdvantageInput:
    """The estimator's input for ``batch`` (rows on ``token_rewards``' device): scores are the sum
    of each row's token rewards, turn ids and anchor keys come from the trajectories."""
    return AdvantageInput(
        token_rewards=token_rewards,
        loss_mask=batch.loss_mask.to(token_rewards.device),
        scores=token_rewards.sum(dim=-1),
        group_ids=batch.group_ids,
        values=values,
        baseline_scores=_baseline_scores(batch.trajectories, token_rewards.device),
        turn_ids=turn_ids(batch.trajectories, batch.loss_mask.shape[1], token_rewards.device),
        anchor_keys=[anchor_keys(t) for t in batch.trajectories],
    )


# --------------------------------------------------------------------------------------------
# Optimizer steps
# --------------------------------------------------------------------------------------------


def optimize(session: Session, batch: TrainBatch, targets: Targets, temperature: float) -> dict[str, float]:
    """``epochs`` x ``mini_batches`` optimizer steps over the batch; guards against non-finite
    losses and gradients."""
    config = session.config
    sums: dict[str, torch.Tensor | float] = defaultdict(float)  # device tensors: read once, at the end
    counts: dict[str, int] = defaultdict(int)
    generator = torch.Generator().manual_seed(_update_seed(session))
    timings = {"time/forward_backward_s": 0.0, "time/optimizer_s": 0.0}
    skipped = 0
    session.model.train()
    for _epoch in range(config.trainer.epochs):
        shuffled = config.trainer.epochs > 1
        order = (
            torch.randperm(len(batch), generator=generator).tolist() if shuffled else list(range(len(batch)))
        )
        for chunk in np.array_split(np.array(order), config.trainer.mini_batches):
            if len(chunk):
                status = _mini_batch_step(
                    session, batch, targets, chunk.tolist(), temperature, sums, counts, timings
                )
                skipped += status == "skipped"
                track_bad_updates(session, status)
    session.model.eval()
    if session.world > 1:  # a loss share is this process's part of the loss: add the others'
        names = sorted(LOSS_SHARES)  # the same collective on every process, whatever it logged
        local = [torch.as_tensor(sums.get(n, 0.0), dtype=torch.float32, device=session.device) for n in names]
        totals = sum_across(session, torch.stack(local))
        for index, name in enumerate(names):
            if name in sums:
                sums[name] = totals[index]
    computed, real = sums.pop("_computed_tokens", 0.0), sums.pop("_real_tokens", 0.0)
    out = host_floats({name: sums[name] / max(counts[name], 1) for name in sums})
    out["batch/padding_share"] = 1.0 - float(real) / float(computed) if computed else 0.0
    out["actor/skipped_updates"] = float(skipped)
    return {**out, **timings}


def _mini_batch_step(
    session: Session,
    batch: TrainBatch,
    targets: Targets,
    rows: list[int],
    temperature: float,
    sums: dict[str, torch.Tensor | float],
    counts: dict[str, int],
    timings: dict[str, float],
) -> str:
    """One optimizer step on ``rows``: ``"ok"``, ``"skipped"`` (non-finite) or ``"idle"`` (no row
    had anything to learn; the step ran with zero gradients, exactly as without skipping).

    The micro-batch loop never waits for the device: row widths and first policy positions come
    from the host-side fields of the batch, losses are checked for finiteness and diagnostics
    summed on the device, and all of them come to the host after the last backward pass."""
    assert session.optimizer is not None
    normalizer = global_normalizer(session, [batch.loss_mask[rows]])  # before any grouping
    micro_rows = _micro_plan(session, batch, targets, rows, sums, counts)
    session.optimizer.zero_grad(set_to_none=True)
    started = time.perf_counter()
    prefix = _step_prefix(session, batch, [chunk for chunk in micro_rows if chunk])
    nonfinite: torch.Tensor | None = None  # any micro-batch loss so far not finite (on the device)
    step_sums: dict[str, torch.Tensor | float] = defaultdict(float)  # this step's diagnostics
    step_counts: dict[str, int] = defaultdict(int)
    for k, chunk in enumerate(micro_rows):
        micro = batch.select(chunk or rows[:1] or [0])  # an empty chunk: a loss-free pass (see equalize)
        loss, parts = micro_loss(
            session,
            micro,
            targets.rows(chunk or rows[:1] or [0], micro.input_ids.shape[1]),
            normalizer,
            temperature,
            step_prefix=prefix,
        )
        if not chunk:
            loss, parts = loss * 0.0, {}
        bad = ~torch.isfinite(loss.detach())
        nonfinite = bad if nonfinite is None else nonfinite | bad
        if k == len(micro_rows) - 1:
            session.accelerator.backward(loss * session.world)
        else:
            with _no_sync(session):
                session.accelerator.backward(loss * session.world)
        _accumulate(step_sums, step_counts, parts)
    finite = nonfinite is None or not bool(nonfinite)  # the step's one wait before the optimizer
    if prefix is not None:
        if finite:
            prefix.backward()
        else:
            prefix.release()
    timings["time/forward_backward_s"] += time.perf_counter() - started
    started = time.perf_counter()
    params = [p for group in session.optimizer.param_groups for p in group["params"]]
    if not micro_rows:  # nothing to learn from: step with zero gradients, as unskipped
        for param in params:
            param.grad = torch.zeros_like(param)
    if finite:
        norm = _grad_norm(session, params)
        finite = bool(torch.isfinite(torch.as_tensor(norm)))
        if finite:
            step_sums["actor/grad_norm"] = float(norm)
            step_counts["actor/grad_norm"] = 1
    if finite:  # a skipped step logs no diagnostics (they would hold its non-finite values)
        for name, total in step_sums.items():
            sums[name] += total
            counts[name] += step_counts[name]
        session.optimizer.step()
        assert session.scheduler is not None
        session.scheduler.step()
    else:
        session.optimizer.zero_grad(set_to_none=True)
    timings["time/optimizer_s"] += time.perf_counter() - started
    return "skipped" if not finite else ("ok" if micro_rows else "idle")


def micro_loss(
    session: Session,
    micro: TrainBatch,
    targets: Targets,
    normalizer: Normalizer,
    temperature: float,
    *,
    step_prefix: StepPrefix | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """One micro-batch's share of the mini-batch loss, and its diagnostics as detached 0-dim
    tensors (read on the host once per optimizer step: no synchronisation with the device here).
    ``step_prefix``: the prompt prefix the whole optimizer step shares, already run (see
    :func:`_step_prefix`)."""
    algo = session.config.algorithm
    mask = micro.loss_mask  # [B, T] policy tokens
    shared_backbone = _critic_on_policy_backbone(session)
    packed = session.config.trainer.packing
    out = micro_forward(
        session.model,
        micro,
        packed,
        temperature=temperature,
        with_entropy=True,
        entropy_grad=algo.entropy_coef > 0,  # otherwise a metric: nothing kept for backward
        with_hidden=shared_backbone,
        step_prefix=step_prefix,
    )
    logprobs = out.logprobs  # [B, T]
    old = targets.old_logprobs if targets.old_logprobs is not None else logprobs.detach()
    token_loss, diagnostics = session.policy_loss.token_loss(
        LossInput(logprobs=logprobs, old_logprobs=old, advantages=targets.advantages, loss_mask=mask)
    )
    correction = algo.rollout_correction  # the rollout sampled from a slightly different policy
    weights = correction_weights(correction, old, micro.rollout_logprobs, mask)
    if weights is not None:
        token_loss = token_loss * weights
    loss = aggregate(token_loss, mask, session.aggregation, normalizer=normalizer)
    parts = {"actor/pg_loss": loss.detach()}
    parts.update({f"actor/{k}": masked_mean(v.detach().float(), mask) for k, v in diagnostics.items()})
    assert out.entropy is not None
    parts["actor/entropy"] = masked_mean(out.entropy.detach(), mask)
    if algo.entropy_coef > 0:
        loss = loss - algo.entropy_coef * aggregate(
            out.entropy, mask, session.aggregation, normalizer=normalizer
        )
    if targets.ref_logprobs is not None:
        kl_tokens = kl_penalty(logprobs, targets.ref_logprobs, algo.kl.estimator)  # [B, T]
        parts["actor/kl"] = masked_mean(kl_tokens.detach(), mask)
        if algo.kl.placement == "loss":
            assert session.kl_ctl is not None
            loss = loss + session.kl_ctl.value * aggregate(
                kl_tokens, mask, session.aggregation, normalizer=normalizer
            )
    parts.update(
        {
            f"rollout/{k}": v
            for k, v in mismatch_kl_tensors(logprobs.detach(), micro.rollout_logprobs, mask).items()
        }
    )
    stats = ratio_stats_tensors(old, micro.rollout_logprobs, mask, level=correction.level, cap=correction.cap)
    parts.update({f"rollout/{k}": v for k, v in stats.items()})
    if session.needs_critic:
        if shared_backbone:
            assert out.hidden is not None and session.value_head is not None
            values = state_values(session.value_head, out.hidden)  # [B, T], V(s_t) from position t - 1
        else:
            values = critic_values(session.value_head, _critic_backbone(session), micro, packed=packed)
        value_loss_tokens = (values - targets.returns) ** 2
        clip = algo.critic.value_clip
        if clip is not None and targets.old_values is not None:
            clipped = targets.old_values + (values - targets.old_values).clamp(-clip, clip)
            value_loss_tokens = torch.maximum(value_loss_tokens, (clipped - targets.returns) ** 2)
        value_loss = 0.5 * aggregate(value_loss_tokens, mask, session.aggregation, normalizer=normalizer)
        parts["critic/value_loss"] = value_loss.detach()
        parts["critic/values_mean"] = masked_mean(values.detach(), mask)
        loss = loss + algo.critic.coef * value_loss
    parts["actor/loss"] = loss.detach()
    return loss, parts


# --------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------


def global_normalizer(session: Session, masks: list[torch.Tensor]) -> Normalizer:
    """The loss denominator of one optimizer step, over every process's share of it."""
    config = session.config
    norm = Normalizer.from_masks(
        masks, session.aggregation, max_len=config.rollout.max_new_tokens * config.rollout.max_turns
    )
    if session.world == 1:
        return norm
    counts = sum_across(session, torch.tensor([norm.num_tokens, norm.num_sequences], device=session.device))
    return Normalizer(norm.mode, int(counts[0]), int(counts[1]), norm.length)


STEP_PREFIX_MIN_TOKENS = 32
"""A step-wide prefix shorter than this is not worth its own pass."""


def _step_prefix(session: Session, batch: TrainBatch, micro_rows: list[list[int]]) -> StepPrefix | None:
    """The prompt prefix that every row of this optimizer step shares, run once for all its
    micro-batches; ``None`` where that cannot pay (one micro-batch: it shares its prefix by
    itself), where the prefix is short, or where it is not exact: several processes or sharded
    parameters (gradients are reduced at the last micro-batch's backward, before the prefix's) and
    a critic on the policy's backbone (it reads the prefix's hidden states too)."""
    if len(micro_rows) < 2 or session.world != 1 or session.sharded:
        return None
    if session.config.trainer.packing and not prefix_supported(session.model):
        return None  # flash attention takes no mask for a packed row reading a prefix
    if _critic_on_policy_backbone(session):
        return None
    rows = [r for chunk in micro_rows for r in chunk]
    ids, attention = batch.input_ids[rows], batch.attention_mask[rows]
    length = min(shared_prefix_length(ids, attention), batch.first_policy_position(rows) - 1)
    if length < STEP_PREFIX_MIN_TOKENS:
        return None
    return StepPrefix(session.model, ids[:1, :length])


def _micro_plan(
    session: Session,
    batch: TrainBatch,
    targets: Targets,
    rows: list[int],
    sums: dict[str, torch.Tensor | float],
    counts: dict[str, int],
) -> list[list[int]]:
    """This process's micro-batches of an optimizer step's ``rows``, counted in ``sums``. With a
    token budget on several processes, grown to as many as the busiest process runs (an empty one
    is a loss-free pass)."""
    batching = MicroBatching.of(session.config.trainer)
    if _can_skip_idle_rows(session):
        # Rows whose advantages are all zero add nothing to the gradient; they still count in the
        # step's loss normaliser, so the update is exactly the same.
        busy = _busy_rows(targets, rows)
        sums["batch/idle_rows_skipped"] += len(rows) - len(busy)
        counts["batch/idle_rows_skipped"] = 1
        rows = busy
    lengths = batch.lengths
    plan = batching.plan(lengths, rows)
    if session.world > 1 and batching.max_tokens is not None:
        most = max(all_gather(session, [len(plan)]))
        plan = equalize(plan, most, lambda chunk: batching.cost([lengths[r] for r in chunk]))
    _count_layout(sums, counts, batching, lengths, plan)
    return plan


def _count_layout(
    sums: dict[str, torch.Tensor | float],
    counts: dict[str, int],
    batching: MicroBatching,
    lengths: Sequence[int],
    micro_rows: list[list[int]],
) -> None:
    """Layout figures of an optimizer step's micro-batches: token positions computed, of which
    padding (a loss-free pass counts as padding), the largest micro-batch and rows over budget."""
    computed = real = 0
    for chunk in micro_rows:
        sizes = [lengths[r] for r in chunk] or [max(lengths, default=0)]
        computed += batching.cost(sizes)
        real += sum(sizes) if chunk else 0
        sums["batch/max_micro_tokens"] = max(float(sums["batch/max_micro_tokens"]), batching.cost(sizes))
        counts["batch/max_micro_tokens"] = 1
    over = sum(
        1 for chunk in micro_rows for r in chunk if batching.max_tokens and lengths[r] > batching.max_tokens
    )
    for name, value in (("micro_batches", len(micro_rows)), ("over_budget_rows", over)):
        sums[f"batch/{name}"] += value
        counts[f"batch/{name}"] = 1
    sums["_computed_tokens"] += computed
    sums["_real_tokens"] += real


def _accumulate(sums: dict[str, torch.Tensor | float], counts: dict[str, int], parts: dict[str, Any]) -> None:
    """Add a micro-batch's diagnostics; a loss share is summed over the step's micro-batches and
    counts as one value."""
    for name, value in parts.items():
        sums[name] += value
        counts[name] = 1 if name in LOSS_SHARES else counts[name] + 1


def _busy_rows(targets: Targets, rows: list[int]) -> list[int]:
    """The rows with a non-zero advantage somewhere (one transfer from the device for all)."""
    active = (targets.advantages[rows] != 0).any(dim=1).tolist()
    return [r for r, keep in zip(rows, active, strict=True) if keep]


def _critic_on_policy_backbone(session: Session) -> bool:
    """A value head that reads the policy's own hidden states (no separate critic model)."""
    return session.needs_critic and session.critic_model is None


def _critic_backbone(session: Session) -> torch.nn.Module:
    """The model whose hidden states the value head reads: a separate critic, or the policy."""
    return session.critic_model if session.critic_model is not None else session.model


def _can_skip_idle_rows(session: Session) -> bool:
    """Skipping rows with zero advantage is exact only when no other term (entropy bonus, KL in the
    loss, value loss) needs them, and only on one process (DDP needs equal work)."""
    algo = session.config.algorithm
    return (
        session.config.trainer.skip_idle_rows
        and session.world == 1
        and algo.entropy_coef == 0
        and not session.needs_critic
        and not (session.ref_model is not None and algo.kl.placement == "loss")
    )


def _ghost_rows(session: Session, local: list[Trajectory], everything: list[Trajectory]) -> list[Trajectory]:
    """Rows that carry no loss, added so that every process of a sharded run holds as many rows as
    the largest one: its forward and backward passes gather parameters with the others, so all
    must run the same number of them. Copies of a real trajectory (this process's, or any)."""
    if not session.sharded or session.world == 1:
        return []
    missing = max(all_gather(session, [len(local)])) - len(local)
    if missing <= 0 or not everything:
        return []
    return [(local or everything)[0]] * missing


def _masked_rows(batch: TrainBatch, rows: Sequence[int]) -> TrainBatch:
    """``batch`` with ``rows`` out of the loss: no policy token, no reward."""
    index = torch.as_tensor(list(rows), dtype=torch.long, device=batch.loss_mask.device)
    batch.loss_mask[index] = False
    batch.token_rewards[index] = 0.0
    batch.rollout_logprobs[index] = 0.0
    batch.scores[index] = 0.0
    first = list(batch.first_policy)
    for row in rows:
        first[row] = -1
    batch.first_policy = first
    return batch


def _no_sync(session: Session) -> Any:
    """Backward passes that accumulate gradients without reducing them across processes (all
    micro-batches of a step but the last)."""
    if session.sharded:
        return sharding.gradient_sync(sharding.sharded_modules(session), enabled=False)
    return session.accelerator.no_sync(session.model)


def _grad_norm(session: Session, params: list[torch.nn.Parameter]) -> torch.Tensor:
    clip = session.config.trainer.grad_clip
    if session.sharded:  # the norm over every shard: the unsharded gradient's
        return sharding.clip_grad_norm(params, clip)
    if clip is not None:
        return session.accelerator.clip_grad_norm_(params, clip)  # type: ignore[no-any-return]
    return torch.norm(torch.stack([p.grad.norm() for p in params if p.grad is not None]))


def _update_kl_controller(session: Session, observed: float, samples: int) -> float:
    assert session.kl_ctl is not None
    observed = mean_across(session, observed)  # every process must move beta identically
    session.kl_ctl.update(observed, samples)
    return float(session.kl_ctl.value)


def reset_peak_memory(device: torch.device) -> None:
    """Start measuring the peak memory of an update (GPUs; a CPU's peak is the process's)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory_gib(device: torch.device) -> float:
    """The peak memory since :func:`reset_peak_memory`, in GiB: allocated GPU memory on a GPU, the
    process's peak resident memory since it started on a CPU (it never goes down)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


def _update_seed(session: Session) -> int:
    return (session.config.seed * 1_000_003 + session.step * 9_973 + 999 * 101 + session.rank * 7) % 2**31


def _baseline_scores(trajectories: Sequence[Trajectory], device: torch.device) -> torch.Tensor | None:
    """Greedy-baseline scores recorded by :func:`~agent_r1.engine.collect.collect` (ReMax)."""
    if not trajectories or any("baseline_score" not in t.metrics for t in trajectories):
        return None
    scores = [t.metrics["baseline_score"] for t in trajectories]
    return torch.tensor(scores, dtype=torch.float32, device=device)
