"""``sdpa_varlen``: scaled dot-product attention that runs packed trajectories one at a time.

transformers keeps packed sequences apart for ``sdpa`` and ``eager`` by building a block-diagonal
``tokens x tokens`` mask; with a mask, torch's CPU kernel (and ``eager`` everywhere) materialises
the whole ``tokens x tokens`` score matrix, so a packed row of 8k tokens holds gigabytes that the
padded rows never needed. flash-attention's variable-length kernel avoids that on GPUs, but it is
not installed everywhere.

This implementation is registered with transformers' attention interfaces under
:data:`VARLEN_ATTENTION`. On a call with one row and no 2-D attention mask (what a packed
forward pass sends) it reads the trajectories' boundaries from the restarting ``position_ids``
and runs torch's ``scaled_dot_product_attention`` on each trajectory alone, causal, attending also
to every key before the row (a shared prompt's KV cache); compute and memory then grow with the
sum of the squared lengths, as in the padded path, not with the square of their sum. Every other
call (padded rows, generation with a KV cache and a mask) goes to transformers' own ``sdpa``
unchanged, so the same model serves rollouts and packed training. Exact: each trajectory's
attention is the same kernel over the same keys as when it runs alone.
"""

from __future__ import annotations

import itertools
from typing import Any

import torch

__all__ = ["VARLEN_ATTENTION", "register", "segments", "use_varlen_attention"]

VARLEN_ATTENTION = "sdpa_varlen"
_registered = False
_last: tuple[Any, list[tuple[int, int]]] = (None, [])
"""The last position_ids seen and their segments (every layer asks): one tuple, replaced whole, so
that a rollout thread and the trainer never read one's tensor with the other's segments."""


def segments(position_ids: torch.Tensor) -> list[tuple[int, int]]:
    """``(start, end)`` of each run of consecutive positions in ``position_ids`` ``[1, N]``: a new
    trajectory starts wherever the position does not follow the previous one. Read once per
    forward pass (one transfer from the device), not once per layer."""
    global _last
    seen, found = _last
    if seen is position_ids:
        return found
    positions = position_ids[0]
    breaks = (positions[1:] != positions[:-1] + 1).nonzero().flatten() + 1
    edges = [0, *breaks.tolist(), int(positions.shape[0])]
    found = list(itertools.pairwise(edges))
    _last = (position_ids, found)
    return found


def _attention(
    module: torch.nn.Module,
    query: torch.Tensor,  # [B, H, Q, D]
    key: torch.Tensor,  # [B, KV, K, D]
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    position_ids = kwargs.get("position_ids")
    if attention_mask is not None or position_ids is None or query.shape[0] != 1:
        return sdpa_attention_forward(  # type: ignore[no-any-return]
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    prefix = key.shape[2] - query.shape[2]  # keys before the row: a cache every trajectory reads
    gqa = query.shape[1] != key.shape[1]
    outputs = []
    for start, end in segments(position_ids):
        q = query[:, :, start:end]
        if prefix == 0:
            k, v = key[:, :, start:end], value[:, :, start:end]
            out = torch.nn.functional.scaled_dot_product_attention(
                q, k, v, is_causal=True, scale=scaling, enable_gqa=gqa, dropout_p=dropout
            )
        else:
            k = torch.cat([key[:, :, :prefix], key[:, :, prefix + start : prefix + end]], dim=2)
            v = torch.cat([value[:, :, :prefix], value[:, :, prefix + start : prefix + end]], dim=2)
            length = end - start
            seen = torch.ones(length, prefix + length, dtype=torch.bool, device=q.device).tril(prefix)
            out = torch.nn.functional.scaled_dot_product_attention(
                q, k, v, attn_mask=seen, scale=scaling, enable_gqa=gqa, dropout_p=dropout
            )
        outputs.append(out)
    return torch.cat(outputs, dim=2).transpose(1, 2).contiguous(), None  # [1, Q, H, D]


def _mask(
    batch_size: int,
    q_length: int,
    kv_length: int,
    q_offset: Any = 0,
    kv_offset: Any = 0,
    mask_function: Any = None,
    attention_mask: torch.Tensor | None = None,
    **kwargs: Any,
) -> torch.Tensor | None:
    """No mask for one row without a 2-D mask (the attention reads the boundaries itself);
    ``sdpa``'s mask for everything else."""
    from transformers.masking_utils import causal_mask_function, sdpa_mask

    if batch_size == 1 and attention_mask is None:
        return None
    return sdpa_mask(  # type: ignore[no-any-return]
        batch_size,
        q_length,
        kv_length,
        q_offset,
        kv_offset,
        mask_function or causal_mask_function,
        attention_mask,
        **kwargs,
    )


def register() -> None:
    """Make :data:`VARLEN_ATTENTION` known to transformers (idempotent)."""
    global _registered
    if _registered:
        return
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(VARLEN_ATTENTION, _attention)
    AttentionMaskInterface.register(VARLEN_ATTENTION, _mask)
    _registered = True


def use_varlen_attention(model: torch.nn.Module) -> bool:
    """Switch ``model`` (and its sub-models' configs) from ``sdpa`` to :data:`VARLEN_ATTENTION`;
    ``False``, changing nothing, when it runs another implementation or a sliding window (whose
    band this implementation would not apply)."""
    configs = [
        m.config for m in model.modules() if hasattr(getattr(m, "config", None), "_attn_implementation")
    ]
    if not configs or any(c._attn_implementation != "sdpa" for c in configs):
        return False
    if any(getattr(c, "sliding_window", None) and getattr(c, "use_sliding_window", True) for c in configs):
        return False
    register()
    for config in configs:
        config._attn_implementation = VARLEN_ATTENTION
    return True
