"""Micro-batches by token budget, and several trajectories in one row (padding-free packing).

A micro-batch of right-padded rows computes ``rows x longest row`` token positions: one long
episode pads every row beside it. Two remedies, usable together (``trainer`` config):

* ``max_tokens_per_micro_batch``: rows are grouped by length so that no micro-batch computes more
  than the budget (padded: ``rows x longest``; packed: the sum of the lengths). Memory then
  depends on the budget, not on the unluckiest batch. The loss normaliser is computed over the
  whole mini-batch before any grouping, so the update does not depend on how rows are grouped.
* ``packing``: a micro-batch's trajectories are laid end to end in one row of ``sum(lengths)``
  tokens, positions restarting at 0 for each; transformers keeps attention inside each trajectory
  when it sees restarting ``position_ids`` and no attention mask (a block-diagonal causal mask for
  ``sdpa`` and ``eager``, the variable-length kernels for ``flash_attention_2``). Nothing is
  padded and only the positions that score a policy token reach the vocabulary projection.

When every row of a packed micro-batch (or optimizer step) shares a prompt prefix, it runs once
and the packed row reads its KV cache through a 4-D mask (prefix visible to every trajectory,
causal within each): ``sdpa`` and ``eager`` only, since flash attention takes no custom mask.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from agent_r1.engine.learner.batch import ForwardOut, TrainBatch, policy_forward, shared_prefix_length
from agent_r1.errors import AgentR1Error
from agent_r1.models.attention import VARLEN_ATTENTION, use_varlen_attention
from agent_r1.models.kv import with_cache

__all__ = [
    "MicroBatching",
    "Packed",
    "check_packing",
    "equalize",
    "micro_forward",
    "no_grad_logprobs",
    "pack",
    "packed_forward",
    "packed_values",
    "prefix_supported",
    "prepare_packing",
]

PREFIX_ATTENTION = ("sdpa", "eager", VARLEN_ATTENTION)
"""Attention implementations with which a packed row can read a shared prefix's KV cache (the
first two through a custom 4-D mask, the last by itself)."""


@dataclass(frozen=True)
class MicroBatching:
    """How rows are grouped into micro-batches and laid out in them."""

    rows: int = 4
    """Rows per micro-batch when there is no token budget (``trainer.micro_batch_size``)."""
    max_tokens: int | None = None
    """Token budget per micro-batch (``trainer.max_tokens_per_micro_batch``); overrides ``rows``."""
    packed: bool = False
    """Trajectories end to end in one row (``trainer.packing``)."""

    @classmethod
    def of(cls, trainer: Any) -> MicroBatching:
        """From a ``TrainerConfig``."""
        return cls(trainer.micro_batch_size, trainer.max_tokens_per_micro_batch, trainer.packing)

    def cost(self, lengths: Sequence[int]) -> int:
        """Token positions a micro-batch of rows with ``lengths`` computes."""
        if not lengths:
            return 0
        return sum(lengths) if self.packed else len(lengths) * max(lengths)

    def plan(self, lengths: Sequence[int], rows: Sequence[int] | None = None) -> list[list[int]]:
        """Micro-batches of ``rows`` (default: all), each a sorted list of row indexes.

        Without a budget: consecutive chunks of :attr:`rows`. With one: longest rows first, each
        placed in the first micro-batch it fits (packed: the lengths add up; padded: a micro-batch
        is as wide as its first, longest row); a row longer than the budget runs alone."""
        chosen = list(range(len(lengths))) if rows is None else list(rows)
        if self.max_tokens is None:
            return [chosen[i : i + self.rows] for i in range(0, len(chosen), self.rows)]
        budget = self.max_tokens
        bins: list[list[int]] = []
        loads: list[int] = []
        for row in sorted(chosen, key=lambda r: (-lengths[r], r)):
            size = lengths[row]
            for i, members in enumerate(bins):
                grown = loads[i] + size if self.packed else (len(members) + 1) * lengths[members[0]]
                if grown <= budget:
                    members.append(row)
                    loads[i] = grown
                    break
            else:
                bins.append([row])
                loads.append(size)
        return [sorted(members) for members in bins]


def equalize(plan: list[list[int]], count: int, cost: Callable[[list[int]], int]) -> list[list[int]]:
    """``plan`` grown to ``count`` micro-batches (every process of a data-parallel run must run as
    many: sharded parameters are gathered for every pass, and gradients are reduced at the last):
    the costliest micro-batch of several rows is split in two until there are enough; where every
    micro-batch holds one row, empty ones are added (the caller runs them as loss-free passes)."""
    plan = [list(rows) for rows in plan]
    while len(plan) < count:
        splittable = [i for i, rows in enumerate(plan) if len(rows) > 1]
        if not splittable:
            plan.append([])
            continue
        index = max(splittable, key=lambda i: cost(plan[i]))
        rows = plan.pop(index)
        half = len(rows) // 2
        plan[index:index] = [rows[:half], rows[half:]]
    return plan


@dataclass
class Packed:
    """A micro-batch's rows laid end to end in one row, from column ``prefix`` on (the columns
    before it come from a shared prefix's KV cache)."""

    input_ids: torch.Tensor  # [1, N]
    position_ids: torch.Tensor  # [1, N], restarting at 0 (or at the prefix's length) per row
    token_rows: torch.Tensor  # [N] each packed token's row in the micro-batch
    token_columns: torch.Tensor  # [N] and its column
    segments: torch.Tensor  # [N] ordinal of its row among the packed ones
    target_rows: torch.Tensor  # [M] rows of the scored tokens
    target_columns: torch.Tensor  # [M] their columns
    keep: torch.Tensor  # [M] the packed index whose logits predict each scored token
    prefix: int

    def __len__(self) -> int:
        return int(self.input_ids.shape[1])


def pack(micro: TrainBatch, prefix: int = 0) -> Packed:
    """Pack ``micro``'s rows (columns ``prefix ..`` of each); the scored tokens are each row's from
    its first policy token on (a row without one scores nothing). Index arithmetic runs on the
    host from the batch's host-side lengths: nothing waits for the device."""
    width = micro.input_ids.shape[1]
    rows_: list[np.ndarray] = []
    columns: list[np.ndarray] = []
    segments: list[np.ndarray] = []
    target_rows: list[np.ndarray] = []
    target_columns: list[np.ndarray] = []
    keep: list[np.ndarray] = []
    offset = 0
    for row, (length, first) in enumerate(zip(micro.lengths, micro.first_policy, strict=True)):
        span = max(length - prefix, 0)
        rows_.append(np.full(span, row))
        columns.append(np.arange(prefix, prefix + span))
        segments.append(np.full(span, len(segments)))
        if first >= 0 and length > 1:
            begin = max(first, prefix + 1, 1)
            scored = np.arange(begin, length)
            target_rows.append(np.full(len(scored), row))
            target_columns.append(scored)
            keep.append(offset + scored - 1 - prefix)
        offset += span
    device = micro.input_ids.device

    def as_tensor(parts: list[np.ndarray]) -> torch.Tensor:
        joined = np.concatenate(parts) if parts else np.zeros(0)
        return torch.from_numpy(joined.astype(np.int64)).to(device)

    token_rows, token_columns = as_tensor(rows_), as_tensor(columns)
    flat = token_rows * width + token_columns
    return Packed(
        input_ids=micro.input_ids.reshape(-1)[flat][None],
        position_ids=token_columns[None],
        token_rows=token_rows,
        token_columns=token_columns,
        segments=as_tensor(segments),
        target_rows=as_tensor(target_rows),
        target_columns=as_tensor(target_columns),
        keep=as_tensor(keep),
        prefix=prefix,
    )


def attention_implementation(model: torch.nn.Module) -> str:
    """The attention implementation ``model`` (possibly wrapped: DDP, PEFT) runs with."""
    for module in model.modules():
        config = getattr(module, "config", None)
        implementation = getattr(config, "_attn_implementation", None)
        if isinstance(implementation, str):
            return implementation
    return "unknown"


def prefix_supported(model: torch.nn.Module) -> bool:
    """Whether a packed row can read a shared prefix's cache (a custom 4-D mask)."""
    return attention_implementation(model) in PREFIX_ATTENTION


def _prefix_mask(model: torch.nn.Module, packed: Packed, dtype: torch.dtype) -> torch.Tensor:
    """``[1, 1, N, P + N]``: every packed token sees the whole prefix and, causally, its own row."""
    local = torch.arange(len(packed), device=packed.segments.device)
    own = (packed.segments[:, None] == packed.segments[None, :]) & (local[None, :] <= local[:, None])
    seen = torch.cat([own.new_ones((len(packed), packed.prefix)), own], dim=1)[None, None]
    if attention_implementation(model) == "sdpa":
        return seen  # boolean: True attends
    return torch.zeros(seen.shape, dtype=dtype, device=seen.device).masked_fill(~seen, torch.finfo(dtype).min)


def _model_dtype(model: torch.nn.Module) -> torch.dtype:
    return next(p.dtype for p in model.parameters() if p.is_floating_point())


def packed_forward(
    model: torch.nn.Module,
    micro: TrainBatch,
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
    entropy_grad: bool = True,
    with_hidden: bool = False,
    share_prefix: int = 32,
    step_prefix: Any = None,
) -> ForwardOut:
    """:func:`~agent_r1.engine.learner.batch.policy_forward` on ``micro`` packed into one row: the
    same ``[B, T]`` log-probabilities (each row's from its first policy token on; 0 elsewhere),
    entropies and ``[B, T, H]`` hidden states, computed without padding. A prefix that every row
    shares (``step_prefix``, or one of at least ``share_prefix`` tokens found here) runs once when
    the attention implementation takes a custom mask (:func:`prefix_supported`)."""
    prefix, past, prefix_hidden = _packed_prefix(model, micro, share_prefix, step_prefix, with_hidden)
    packed = pack(micro, prefix)
    extra: dict[str, Any] = {"use_cache": False}
    if past is not None:
        extra = {**with_cache(model, past), "use_cache": True}
        if attention_implementation(model) != VARLEN_ATTENTION:  # it reads the prefix by itself
            extra["attention_mask"] = _prefix_mask(model, packed, _model_dtype(model))
    outputs = model(
        input_ids=packed.input_ids,
        position_ids=packed.position_ids,
        logits_to_keep=packed.keep,
        output_hidden_states=with_hidden,
        **extra,
    )
    logits = outputs.logits[0].float()  # [M, V]
    if temperature not in (0.0, 1.0):
        logits = logits / temperature
    targets = micro.input_ids[packed.target_rows, packed.target_columns]  # [M]
    log_norm = torch.logsumexp(logits, dim=-1)  # [M]
    picked = logits.gather(-1, targets[:, None]).squeeze(-1) - log_norm
    where = (packed.target_rows, packed.target_columns)
    logprobs = torch.zeros(micro.input_ids.shape, dtype=picked.dtype, device=picked.device)
    logprobs = logprobs.index_put(where, picked)
    entropy = None
    if with_entropy:
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            token_entropy = log_norm - (torch.softmax(logits, dim=-1) * logits).sum(-1)  # [M]
        entropy = torch.zeros_like(logprobs).index_put(where, token_entropy)
    hidden = None
    if with_hidden:
        states = outputs.hidden_states[-1][0]  # [N, H]
        hidden = states.new_zeros((*micro.input_ids.shape, states.shape[-1]))
        hidden = hidden.index_put((packed.token_rows, packed.token_columns), states)
        if prefix_hidden is not None:
            hidden = torch.cat([prefix_hidden.expand(len(micro), -1, -1), hidden[:, prefix:]], dim=1)
    return ForwardOut(logprobs=logprobs, entropy=entropy, hidden=hidden)


def micro_forward(model: torch.nn.Module, micro: TrainBatch, packed: bool, **options: Any) -> ForwardOut:
    """The policy's forward pass over one micro-batch, padded or packed (same results, same
    options as :func:`~agent_r1.engine.learner.batch.policy_forward`)."""
    if packed:
        return packed_forward(model, micro, **options)
    return policy_forward(
        model, micro.input_ids, micro.attention_mask, start=micro.first_policy_position(), **options
    )


def no_grad_logprobs(
    model: torch.nn.Module, batch: TrainBatch, temperature: float, batching: MicroBatching | int
) -> torch.Tensor:
    """``log pi(token t | tokens < t)`` ``[B, T]`` under ``model``, micro-batch by micro-batch
    (``batching``, or an int: that many rows each), without gradients (old-policy and reference
    passes). Exact at every row's tokens from its first policy token on."""
    if isinstance(batching, int):
        batching = MicroBatching(rows=batching)
    out = torch.zeros_like(batch.rollout_logprobs)
    model.eval()
    with torch.no_grad():
        for rows in batching.plan(batch.lengths):
            micro = batch.select(rows)
            lp = micro_forward(model, micro, batching.packed, temperature=temperature)
            out[rows, : lp.logprobs.shape[1]] = lp.logprobs
    return out


def _packed_prefix(
    model: torch.nn.Module, micro: TrainBatch, share_prefix: int, step_prefix: Any, with_hidden: bool
) -> tuple[int, Any, torch.Tensor | None]:
    """``(length, KV cache for one row, its hidden states [1, P, H] when asked)`` of the prefix the
    packed row reads, or ``(0, None, None)``."""
    if step_prefix is not None:
        if with_hidden or not prefix_supported(model):
            raise ValueError(
                "packed_forward: a step prefix needs sdpa or eager attention and no hidden states"
            )
        return len(step_prefix), step_prefix.cache(1), None
    if not share_prefix or len(micro) < 2 or not prefix_supported(model):
        return 0, None, None
    start = micro.first_policy_position()
    prefix = min(shared_prefix_length(micro.input_ids, micro.attention_mask), start - 1)
    if prefix < max(share_prefix, 1):
        return 0, None, None
    from transformers import DynamicCache

    past = DynamicCache()
    head = model(
        input_ids=micro.input_ids[:1, :prefix],
        **with_cache(model, past),
        use_cache=True,
        logits_to_keep=1,
        output_hidden_states=with_hidden,
    )
    return prefix, past, head.hidden_states[-1] if with_hidden else None


def packed_values(value_head: torch.nn.Module, backbone: torch.nn.Module, micro: TrainBatch) -> torch.Tensor:
    """:func:`~agent_r1.engine.learner.critic.critic_values` of ``micro`` packed into one row:
    ``V(s_t)`` ``[B, T]`` read from the hidden state at ``t - 1`` of the same trajectory."""
    packed = pack(micro)
    outputs = backbone(
        input_ids=packed.input_ids,
        position_ids=packed.position_ids,
        output_hidden_states=True,
        use_cache=False,
        logits_to_keep=1,
    )
    after = value_head(outputs.hidden_states[-1])[0]  # [N]: the value of the state after each token
    lengths = torch.as_tensor(micro.lengths, device=after.device)
    inside = packed.token_columns + 1 < lengths[packed.token_rows]  # a next token in the same row
    values = torch.zeros(micro.input_ids.shape, dtype=after.dtype, device=after.device)
    where = (packed.token_rows[inside], packed.token_columns[inside] + 1)
    return values.index_put(where, after[inside])


def prepare_packing(model: torch.nn.Module) -> str:
    """Make ``model`` ready for packed passes and check it keeps trajectories apart; returns its
    attention implementation. ``sdpa`` becomes ``sdpa_varlen``
    (:mod:`agent_r1.models.attention`: each trajectory attended alone, no ``tokens x tokens``
    mask); other implementations are kept (``flash_attention_2`` handles packing natively)."""
    use_varlen_attention(model)
    check_packing(model)
    return attention_implementation(model)


def check_packing(model: torch.nn.Module) -> None:
    """Refuse a model that does not keep packed trajectories apart: the last hidden states of two
    short sequences packed into one row must be those of each run alone (a model whose attention
    ignores restarting positions lets the second read the first, which moves them far beyond
    rounding). Costs two forward passes of 24 tokens."""
    device = next(model.parameters()).device
    vocab = int(getattr(getattr(model, "config", None), "vocab_size", 0) or 64)
    generator = torch.Generator().manual_seed(0)
    first = torch.randint(0, vocab, (1, 12), generator=generator).to(device)
    second = torch.randint(0, vocab, (1, 12), generator=generator).to(device)
    with torch.no_grad():
        alone = model(input_ids=second, use_cache=False, output_hidden_states=True, logits_to_keep=1)
        positions = torch.arange(12, device=device).repeat(2)[None]
        both = model(
            input_ids=torch.cat([first, second], dim=1),
            position_ids=positions,
            use_cache=False,
            output_hidden_states=True,
            logits_to_keep=1,
        )
    expected = alone.hidden_states[-1][0].float()
    got = both.hidden_states[-1][0, 12:].float()
    error = float((got - expected).norm() / expected.norm().clamp(min=1e-12))
    tolerance = 1e-3 if _model_dtype(model) == torch.float32 else 5e-2
    if error > tolerance:
        raise AgentR1Error(
            f"trainer.packing: the model ({type(model).__name__}, attention "
            f"{attention_implementation(model)!r}) lets packed trajectories attend to each other "
            f"(hidden states differ by {error:.2g} relative from running them apart). Use "
            "model.attn_implementation: sdpa (or flash_attention_2 on a GPU), or trainer.packing: false."
        )
