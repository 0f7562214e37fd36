"""Peak training memory of a run, estimated from its config and the model's shape (no weights).

Per process, in bytes (``w``: bytes per weight of ``model.dtype``; ``P``: parameters; ``T``:
trained parameters, all of them or a LoRA adapter's; ``S``: processes sharing the state with
``trainer.sharding: fsdp2``, else 1):

* weights ``P w / S``; gradients ``T w / S``; AdamW's two moments ``2 T w / S`` (torch keeps them
  in the parameter's dtype); a reference model ``P w / S`` when ``algorithm.kl.coef > 0``; a
  separate critic as large as the policy, trained (weights, gradients, moments);
* activations kept for backward, per token of a micro-batch and per decoder layer, for a
  pre-norm block with a gated MLP: ``8 h + 4 kv + 4 f`` values (normalised inputs, queries, keys
  and values before and after rotary embedding, the attention output, the residual, the MLP's
  gate, up, activated and product tensors; ``h`` hidden size, ``kv`` key/value width, ``f`` MLP
  width). With gradient checkpointing a layer keeps only its input (``h``) and one layer at a
  time is recomputed in full. Attention is taken as memory-efficient (sdpa's or flash kernels:
  no ``tokens x tokens`` matrix);
* logits at the scored positions: ``tokens x vocabulary x (w + 8)`` bytes (the model's logits,
  their float32 copy, and its gradient or softmax).

A micro-batch computes ``trainer.max_tokens_per_micro_batch`` tokens when a budget is set, else
``micro_batch_size x rollout.max_context`` at worst. Allocator fragmentation, CUDA context
(~0.5 GiB) and the rollout backend's KV cache come on top; the estimate is meant to say which
side of the machine's memory a config falls, not to the megabyte. ``benchmarks/bench_packing.py``
compares it with measured peaks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["MemoryEstimate", "estimate_training_memory", "machine_memory_bytes"]

GIB = 2**30
_WIDTH = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True)
class MemoryEstimate:
    """The parts of a training step's peak memory on one process, in bytes."""

    weights: int
    gradients: int
    optimizer: int
    reference: int
    critic: int
    activations: int
    logits: int
    tokens: int
    """Token positions one micro-batch computes."""

    @property
    def total(self) -> int:
        parts = (self.weights, self.gradients, self.optimizer, self.reference, self.critic)
        return sum(parts) + self.activations + self.logits

    def summary(self) -> str:
        parts = [
            ("weights", self.weights),
            ("gradients", self.gradients),
            ("AdamW", self.optimizer),
            ("reference", self.reference),
            ("critic", self.critic),
            ("activations", self.activations),
            ("logits", self.logits),
        ]
        shown = ", ".join(f"{name} {value / GIB:.2f}" for name, value in parts if value)
        return f"~{self.total / GIB:.2f} GiB per process ({shown} GiB; {self.tokens} tokens per micro-batch)"


def activation_bytes_per_token(hf_config: Any, width: int, *, checkpointing: bool) -> int:
    """Bytes kept for backward per token of a micro-batch (all layers), see the module's text."""
    hidden = int(hf_config.hidden_size)
    layers = int(hf_config.num_hidden_layers)
    heads = int(getattr(hf_config, "num_attention_heads", 1) or 1)
    kv_heads = int(getattr(hf_config, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(hf_config, "head_dim", None) or hidden // heads)
    mlp = int(getattr(hf_config, "intermediate_size", None) or 4 * hidden)
    block = 8 * hidden + 4 * kv_heads * head_dim + 4 * mlp  # values one layer keeps per token
    kept = layers * hidden + block if checkpointing else layers * block
    return kept * width


def estimate_training_memory(
    config: Any, hf_config: Any, parameters: int, trainable: int | None = None, *, world: int = 1
) -> MemoryEstimate:
    """The estimate for ``config`` (a ``RunConfig``) on a model of ``hf_config``'s shape with
    ``parameters`` weights, of which ``trainable`` are trained (default: all), on ``world``
    processes."""
    width = _WIDTH[config.model.dtype]
    trained = parameters if trainable is None else trainable
    share = max(world, 1) if config.trainer.sharding == "fsdp2" else 1
    trainer = config.trainer
    tokens = trainer.max_tokens_per_micro_batch or trainer.micro_batch_size * config.rollout.max_context
    critic_kind = config.algorithm.critic.kind
    separate_critic = critic_kind == "separate"
    return MemoryEstimate(
        weights=parameters * width // share,
        gradients=trained * width // share,
        optimizer=2 * trained * width // share,
        reference=parameters * width // share if config.algorithm.kl.coef > 0 else 0,
        critic=4 * parameters * width // share if separate_critic else 0,
        activations=tokens
        * activation_bytes_per_token(hf_config, width, checkpointing=config.model.gradient_checkpointing),
        logits=tokens * int(hf_config.vocab_size) * (width + 8),
        tokens=tokens,
    )


def machine_memory_bytes(device: Any) -> int:
    """Memory of the device the model trains on: the GPU's, or the machine's RAM."""
    if getattr(device, "type", "cpu") == "cuda":
        import torch

        return int(torch.cuda.get_device_properties(device).total_memory)
    import os

    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
