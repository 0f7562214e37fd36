"""Trajectories → padded tensors, and the policy's per-token log-probabilities."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

import numpy as np
import torch

from agent_r1.mdp import TokenSource, Trajectory
from agent_r1.models.kv import with_cache


@dataclass
class TrainBatch:
    """A right-padded batch of whole trajectories. Position ``t`` of every ``[B, T]`` tensor refers
    to token ``t`` (its log-probability is predicted from the logits at ``t - 1``)."""

    input_ids: torch.Tensor  # [B, T] long
    attention_mask: torch.Tensor  # [B, T] bool
    loss_mask: torch.Tensor  # [B, T] bool: policy tokens
    token_rewards: torch.Tensor  # [B, T] float
    rollout_logprobs: torch.Tensor  # [B, T] float, 0 outside the loss mask
    scores: torch.Tensor  # [B] float
    truncated: torch.Tensor  # [B] bool
    group_ids: list[str]
    trajectories: list[Trajectory]
    lengths: list[int]
    """Each row's token count (host-side, so trimming never waits for the device)."""
    first_policy: list[int]
    """Each row's first loss position, -1 for a row without one (host-side, like ``lengths``)."""

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    def first_policy_position(self, rows: Sequence[int] | None = None) -> int:
        """The earliest column holding a policy token in any row (of ``rows``; 0 if there is none):
        the :func:`first_policy_position` of ``loss_mask``, read without the device."""
        firsts = self.first_policy if rows is None else [self.first_policy[r] for r in rows]
        return min((f for f in firsts if f >= 0), default=0)

    def select(self, index: Sequence[int] | torch.Tensor) -> TrainBatch:
        """Rows ``index`` of every field, trimmed to their longest row."""
        rows = torch.as_tensor(index, dtype=torch.long)
        picked = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, torch.Tensor):
                picked[f.name] = value[rows.to(value.device)]
            else:
                picked[f.name] = [value[int(i)] for i in rows]
        batch = replace(self, **picked)
        return batch.trim()

    def trim(self) -> TrainBatch:
        length = max(max(self.lengths, default=0), 1)
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, torch.Tensor) and value.dim() == 2:
                out[f.name] = value[:, :length]
        return replace(self, **out)

    def to(self, device: torch.device) -> TrainBatch:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        for name, value in out.items():
            if isinstance(value, torch.Tensor):
                out[name] = value.to(device)
        return TrainBatch(**out)


def collate(
    trajectories: Sequence[Trajectory], pad_token_id: int, *, mask_truncated: bool = False
) -> TrainBatch:
    """Pad trajectories on the right into a :class:`TrainBatch`. With ``mask_truncated`` the loss
    mask of truncated trajectories is emptied (DAPO's overlong filtering)."""
    length = max(len(t) for t in trajectories)
    size = len(trajectories)
    # filled segment by segment in numpy (one C-level copy per segment, not a Python step per token)
    input_ids = np.full((size, length), pad_token_id, dtype=np.int64)
    attention = np.zeros((size, length), dtype=np.bool_)
    loss_mask = np.zeros((size, length), dtype=np.bool_)
    rewards = np.zeros((size, length), dtype=np.float32)
    logprobs = np.zeros((size, length), dtype=np.float32)
    lengths: list[int] = []
    first_policy: list[int] = []
    for row, trajectory in enumerate(trajectories):
        masked = mask_truncated and trajectory.truncated
        position, first = 0, -1
        for segment in trajectory.segments:
            end = position + len(segment.token_ids)
            input_ids[row, position:end] = segment.token_ids
            if segment.source is TokenSource.POLICY and end > position and not masked:
                loss_mask[row, position:end] = True
                first = position if first < 0 else first
            if segment.source is TokenSource.POLICY and segment.logprobs is not None:
                logprobs[row, position:end] = segment.logprobs
            position = end
        attention[row, :position] = True
        lengths.append(position)
        first_policy.append(first)
        dense: dict[int, float] = {}
        for index, value in trajectory.reward_positions():  # summed as token_rewards() sums them
            dense[index] = dense.get(index, 0.0) + value
        for index, value in dense.items():
            rewards[row, index] = value
    return TrainBatch(
        input_ids=torch.from_numpy(input_ids),
        attention_mask=torch.from_numpy(attention),
        loss_mask=torch.from_numpy(loss_mask),
        token_rewards=torch.from_numpy(rewards),
        rollout_logprobs=torch.from_numpy(logprobs),
        scores=torch.tensor([t.score for t in trajectories], dtype=torch.float32),
        truncated=torch.tensor([t.truncated for t in trajectories], dtype=torch.bool),
        group_ids=[t.group_id for t in trajectories],
        trajectories=list(trajectories),
        lengths=lengths,
        first_policy=first_policy,
    )


@dataclass
class ForwardOut:
    logprobs: torch.Tensor  # [B, T]: log p(token t | tokens < t), 0 at t = 0
    entropy: torch.Tensor | None  # [B, T]
    hidden: torch.Tensor | None  # [B, T, H] last hidden state (for a value head)


def shared_prefix_length(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> int:
    """Length of the token prefix that every row of ``input_ids`` ``[B, T]`` has in common."""
    if input_ids.shape[0] < 2:
        return 0
    same = (input_ids == input_ids[:1]).all(dim=0) & attention_mask.all(dim=0)  # [T]
    different = (~same).nonzero()
    return int(different[0]) if len(different) else int(input_ids.shape[1])


class StepPrefix:
    """The prompt prefix that every row of an optimizer step shares (system prompt, worked
    examples), run once for the whole step instead of once per micro-batch.

    Each micro-batch reads the prefix's KV cache through detached copies (leaves), so its backward
    pass stops there and leaves the gradient with respect to the cache on those leaves, summed over
    micro-batches; :meth:`backward` then carries that sum through the prefix's single forward pass.
    The parameters' gradients are those of running the prefix in every micro-batch (the chain rule
    is linear in the cache's gradient), at one prefix forward and backward per step.
    """

    def __init__(self, model: torch.nn.Module, ids: torch.Tensor) -> None:
        from transformers import DynamicCache

        cache = DynamicCache()
        model(input_ids=ids, **with_cache(model, cache), use_cache=True, logits_to_keep=1)
        self.ids = ids  # [1, P]
        self.tensors: list[torch.Tensor] = []  # per layer keys, values [1, heads, P, head_dim]
        for layer in cache.layers:
            self.tensors += [layer.keys, layer.values]
        self.leaves = [t.detach().requires_grad_(t.requires_grad) for t in self.tensors]

    def __len__(self) -> int:
        return int(self.ids.shape[1])

    def cache(self, size: int) -> object:
        """A fresh KV cache holding the prefix for ``size`` rows (the leaves, expanded)."""
        from transformers import DynamicCache

        cache = DynamicCache()
        for layer in range(len(self.leaves) // 2):
            keys, values = self.leaves[2 * layer], self.leaves[2 * layer + 1]
            cache.update(keys.expand(size, -1, -1, -1), values.expand(size, -1, -1, -1), layer)
        return cache

    def backward(self) -> None:
        """Carry the gradient the micro-batches left on the cache through the prefix's pass."""
        pairs = [(t, leaf.grad) for t, leaf in zip(self.tensors, self.leaves, strict=True)]
        pairs = [(t, grad) for t, grad in pairs if grad is not None]
        if pairs:
            torch.autograd.backward([t for t, _ in pairs], grad_tensors=[g for _, g in pairs])
        self.release()

    def release(self) -> None:
        """Drop the prefix's graph and cache (after :meth:`backward`, or when the step is given up)."""
        self.tensors, self.leaves = [], []


def _prefix_pass(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    first: int,
    share_prefix: int,
    step_prefix: StepPrefix | None,
    with_hidden: bool,
) -> tuple[int, Any, torch.Tensor | None]:
    """The prefix every row shares, run once: ``(its length, its KV cache expanded to the batch,
    its last hidden states [B, P, H] when asked)``; ``(0, None, None)`` when none is worth it."""
    size = input_ids.shape[0]
    if step_prefix is not None:
        prefix = len(step_prefix)
        if with_hidden or prefix > first or not bool((input_ids[:, :prefix] == step_prefix.ids).all()):
            raise ValueError(
                "policy_forward: step_prefix must be a prefix of every row, end before the first "
                "scored position, and cannot be used with with_hidden"
            )
        return prefix, step_prefix.cache(size), None
    prefix = min(shared_prefix_length(input_ids, attention_mask), first) if share_prefix else 0
    if prefix < max(share_prefix, 1):
        return 0, None, None
    from transformers import DynamicCache

    past = DynamicCache()
    head = model(
        input_ids=input_ids[:1, :prefix],
        **with_cache(model, past),
        use_cache=True,
        logits_to_keep=1,
        output_hidden_states=with_hidden,
    )
    past.batch_repeat_interleave(size)
    prefix_hidden = head.hidden_states[-1].expand(size, -1, -1) if with_hidden else None
    return prefix, past, prefix_hidden


def policy_forward(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
    entropy_grad: bool = True,
    with_hidden: bool = False,
    start: int = 0,
    share_prefix: int = 32,
    step_prefix: StepPrefix | None = None,
) -> ForwardOut:
    """Per-token log-probabilities of ``input_ids`` ``[B, T]`` under ``model``, with logits scaled
    by ``1 / temperature`` (the definition the rollout backend uses for its log-probabilities).

    Only positions ``>= start`` are computed (earlier ones are 0), which skips the vocabulary
    projection over the prompt. When all rows share a prefix of at least ``share_prefix`` tokens
    (the G samples of one task share their whole prompt), the prefix is run once and its KV cache
    expanded to the batch; gradients flow through the cache, so the result and its gradient are
    those of the plain forward pass at a fraction of the cost (0 disables this). ``with_hidden``
    returns the last hidden state of every position ``[B, T, H]`` (for a value head on the shared
    backbone); with a shared prefix, the prefix's positions come from its single pass, expanded.
    ``step_prefix`` supplies a prefix already run for the whole optimizer step (see
    :class:`StepPrefix`); every row must start with its tokens. ``entropy_grad=False`` computes the
    entropy as a detached figure (a metric): no softmax over the vocabulary is kept for backward.
    """
    length = input_ids.shape[1]
    first = min(max(start - 1, 0), length - 1)
    prefix, past, prefix_hidden = _prefix_pass(
        model, input_ids, attention_mask, first, share_prefix, step_prefix, with_hidden
    )
    outputs = model(
        input_ids=input_ids[:, prefix:],
        attention_mask=attention_mask.long(),
        **with_cache(model, past),
        output_hidden_states=with_hidden,
        use_cache=past is not None,
        logits_to_keep=length - first,  # logits of positions first .. T-1 only
    )
    logits = outputs.logits[:, :-1].float()  # [B, T - first - 1, V]
    if temperature not in (0.0, 1.0):
        logits = logits / temperature
    targets = input_ids[:, first + 1 :]  # [B, T - first - 1]
    log_norm = torch.logsumexp(logits, dim=-1)  # [B, T']
    picked = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - log_norm
    logprobs = torch.zeros(input_ids.shape, dtype=picked.dtype, device=picked.device)
    logprobs[:, first + 1 :] = picked
    entropy = None
    if with_entropy:
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            probs = torch.softmax(logits, dim=-1)
            token_entropy = log_norm - (probs * logits).sum(-1)  # [B, T']
        entropy = torch.zeros_like(logprobs)
        entropy[:, first + 1 :] = token_entropy
    hidden = outputs.hidden_states[-1] if with_hidden else None  # [B, T - P, H]
    if hidden is not None and prefix_hidden is not None:
        hidden = torch.cat([prefix_hidden, hidden], dim=1)  # [B, T, H]
    return ForwardOut(logprobs=logprobs, entropy=entropy, hidden=hidden)


def first_policy_position(mask: torch.Tensor) -> int:
    """The earliest column holding a policy token in ``mask`` ``[B, T]`` (0 if there is none)."""
    columns = mask.any(dim=0).nonzero()
    return int(columns[0]) if len(columns) else 0
