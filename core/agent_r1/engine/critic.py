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

import torch
from torch import nn

from agent_r1.engine.batch import TrainBatch, micro_rows

__all__ = ["ValueHead", "critic_values", "no_grad_values", "state_values"]


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


def critic_values(value_head: nn.Module, backbone: nn.Module, micro: TrainBatch) -> torch.Tensor:
    """``V(s_t)`` ``[B, T]`` of a micro-batch from ``backbone``'s last hidden state (the policy's, or
    a separate critic model), read from the state before each token."""
    outputs = backbone(
        input_ids=micro.input_ids,
        attention_mask=micro.attention_mask.long(),
        output_hidden_states=True,
        use_cache=False,
        logits_to_keep=1,
    )
    return state_values(value_head, outputs.hidden_states[-1])


def no_grad_values(
    value_head: nn.Module, backbone: nn.Module, batch: TrainBatch, micro_batch_size: int
) -> torch.Tensor:
    """:func:`critic_values` over the whole batch, without gradients (the values GAE uses)."""
    out = torch.zeros_like(batch.rollout_logprobs)
    with torch.no_grad():
        for rows in micro_rows(len(batch), micro_batch_size):
            values = critic_values(value_head, backbone, batch.select(rows))
            out[rows, : values.shape[1]] = values.float()
    return out
