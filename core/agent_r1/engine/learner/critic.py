"""The critic: V(s_t) for every token ``t``, read from the state *before* token ``t``.

Index convention (the same as the policy's log-probabilities)::

    position      0    1    2   ...  t-1   t   ...
    tokens       x_0  x_1  x_2  ... x_t-1 x_t  ...
    hidden h_j   sees x_0..x_j
    log p(x_t)   from the logits at t-1          (the state before the action)
    V(s_t)       from the hidden state at t-1    (the state before the action)

So the value of policy token ``t`` never sees ``x_t`` itself: two trajectories that differ only in
the token sampled at ``t`` have the same value at ``t``, and GAE's
``delta_t = r_t + gamma * V(s_{t+1}) - V(s_t)`` compares the state before the action with the state
after it. The first policy token after an observation is valued from the state that includes the
observation (the last template token before it). Position 0 has no earlier state and gets value 0;
it is never a policy token.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from agent_r1.engine.learner.batch import TrainBatch
from agent_r1.engine.learner.packing import MicroBatching, packed_values
from agent_r1.models.kv import output_cache, with_cache

__all__ = ["ValueHead", "critic_values", "no_grad_values", "shared_prefix_values", "state_values"]


class ValueHead(nn.Module):
    """A scalar head on a transformer's last hidden state, initialised to output 0."""

    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.proj = nn.Linear(hidden_size, 1)
        nn.init.zeros_(self.proj.weight)
        nn.init.zeros_(self.proj.bias)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:  # [B, T, H] -> [B, T]
        return self.proj(hidden.float()).squeeze(-1)


def state_values(value_head: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    """``V(s_t)`` for every token ``t`` of ``hidden`` ``[B, T, H]`` (the backbone's last hidden
    state), read from position ``t - 1``; ``[B, T]`` with 0 at ``t = 0``."""
    after = value_head(hidden)  # [B, T]: the value of the state after token j
    return torch.nn.functional.pad(after[:, :-1], (1, 0))  # shift right by one, 0 at t = 0


def critic_values(
    value_head: nn.Module, backbone: nn.Module, micro: TrainBatch, *, packed: bool = False
) -> torch.Tensor:
    """``V(s_t)`` ``[B, T]`` of a micro-batch from ``backbone``'s last hidden state (the policy's, or
    a separate critic model), read from the state before each token; ``packed`` runs the rows end
    to end in one row (:func:`~agent_r1.engine.learner.packing.packed_values`)."""
    if packed:
        return packed_values(value_head, backbone, micro)
    outputs = backbone(
        input_ids=micro.input_ids,
        attention_mask=micro.attention_mask.long(),
        output_hidden_states=True,
        use_cache=False,
        logits_to_keep=1,
    )
    return state_values(value_head, outputs.hidden_states[-1])


def no_grad_values(
    value_head: nn.Module, backbone: nn.Module, batch: TrainBatch, batching: MicroBatching | int
) -> torch.Tensor:
    """:func:`critic_values` over the whole batch, without gradients (the values GAE uses), in the
    micro-batches of ``batching`` (an int: that many rows each)."""
    if isinstance(batching, int):
        batching = MicroBatching(rows=batching)
    out = torch.zeros_like(batch.rollout_logprobs)
    with torch.no_grad():
        for rows in batching.plan(batch.lengths):
            values = critic_values(value_head, backbone, batch.select(rows), packed=batching.packed)
            out[rows, : values.shape[1]] = values.float()
    return out


def shared_prefix_values(
    value_head: nn.Module,
    backbone: nn.Module,
    prefix: Sequence[int],
    suffixes: Sequence[Sequence[int]],
    *,
    pad_id: int,
    batch_size: int = 16,
) -> list[float]:
    """The value of the state each ``prefix + suffix`` ends in, without gradients: for ``n``
    tokens, ``V(s_n)`` (the value before a token at position ``n``), read from the hidden state of
    the last token. The prefix goes through the backbone once and its KV cache is repeated for the
    suffixes, ``batch_size`` at a time, shortest first, right-padded (padding sits after every real
    token, so it changes no real position); an empty suffix is valued at the prefix's last token.
    ``prefix`` may be empty when every suffix has a token."""
    import copy

    device = next(backbone.parameters()).device
    values = [0.0] * len(suffixes)
    rows = sorted((i for i, suffix in enumerate(suffixes) if suffix), key=lambda i: len(suffixes[i]))
    cache = None
    with torch.no_grad():
        if prefix:
            outputs = backbone(
                input_ids=torch.tensor([list(prefix)], dtype=torch.long, device=device),
                use_cache=True,
                output_hidden_states=True,
                logits_to_keep=1,
            )
            cache = output_cache(outputs)
            at_prefix = float(value_head(outputs.hidden_states[-1][:, -1:, :])[0, 0])
            for i, suffix in enumerate(suffixes):
                if not suffix:
                    values[i] = at_prefix
        elif len(rows) != len(suffixes):
            raise ValueError("shared_prefix_values: an empty suffix needs a non-empty prefix")
        for begin in range(0, len(rows), batch_size):
            chunk = rows[begin : begin + batch_size]
            lengths = [len(suffixes[i]) for i in chunk]
            width = max(lengths)
            input_ids = torch.full((len(chunk), width), pad_id, dtype=torch.long)  # [B, L]
            own_mask = torch.zeros((len(chunk), width), dtype=torch.long)  # [B, L]: 1 on real tokens
            for b, i in enumerate(chunk):
                input_ids[b, : lengths[b]] = torch.tensor(list(suffixes[i]), dtype=torch.long)
                own_mask[b, : lengths[b]] = 1
            attention_mask = torch.cat([own_mask.new_ones((len(chunk), len(prefix))), own_mask], dim=-1)
            positions = len(prefix) + torch.arange(width)[None].expand(len(chunk), width)  # [B, L]
            extra: dict[str, object] = {}
            if cache is not None:
                repeated = copy.deepcopy(cache)  # the forward appends to it; the prefix's stays clean
                repeated.batch_repeat_interleave(len(chunk))
                extra.update(with_cache(backbone, repeated))
            outputs = backbone(
                input_ids=input_ids.to(device),
                attention_mask=attention_mask.to(device),
                position_ids=positions.to(device),
                use_cache=cache is not None,
                output_hidden_states=True,
                logits_to_keep=1,
                **extra,
            )
            last = torch.tensor(lengths, device=device) - 1  # [B]
            hidden = outputs.hidden_states[-1][torch.arange(len(chunk), device=device), last]  # [B, H]
            after = value_head(hidden[:, None, :])[:, 0]  # [B]
            for b, i in enumerate(chunk):
                values[i] = float(after[b])
    return values
