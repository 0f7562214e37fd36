"""Sharded training with torch's FSDP2 (``trainer.sharding: fsdp2``), one code path for CPU and GPU.

Every trained module (the policy, with or without LoRA; a separate critic; the value head) and the
reference model are split across the data-parallel processes with
:func:`torch.distributed.fsdp.fully_shard` on a one-dimensional device mesh of the launched process
group (gloo on CPU, NCCL on GPUs; ``accelerate launch`` or ``torchrun`` start the processes). Each
process keeps 1/N of every parameter, gradient and AdamW moment; a module's full parameters exist
only while it runs (``reshard_after_forward``). This is what accelerate's FSDP2 plugin does on GPUs
(it calls ``fully_shard`` too); agent-r1 applies it itself so that the same code runs on a CPU,
where accelerate turns an FSDP plugin into DDP.

What sharding changes, and where it is handled:

* **wrapping** (:func:`shard_module`): each block class of ``trainer.fsdp.wrap`` (default: the
  model's ``_no_split_modules``, its decoder layers) and, when they are not tied, the input and
  output embeddings get their own unit; the root takes the rest;
* **equal work**: every forward and backward pass all-gathers parameters, so every process must run
  the same passes in the same order. The update pads a process's batch with rows that carry no
  loss (copies of a real row, masked) up to the largest process's size; generation, whose number of
  forward passes differs between processes, runs on parameters gathered once per step
  (:func:`gathered`);
* **gradient accumulation**: :func:`gradient_sync` turns the reduce-scatter off for all but the
  last micro-batch (DDP's ``no_sync``);
* **clipping**: :func:`clip_grad_norm` computes the norm of the whole gradient (a sum over every
  shard), equal to the unsharded one;
* **state**: :func:`full_model_state` and :func:`full_optimizer_state` gather the unsharded state
  (one parameter at a time, onto the CPU, kept by rank 0) for checkpoints and exports, and
  :func:`load_full_state` scatters it back, so that a checkpoint is independent of the number of
  processes that wrote it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from agent_r1.errors import AgentR1Error, ConfigError

if TYPE_CHECKING:
    from agent_r1.config import ShardingConfig
    from agent_r1.engine.session import Session

__all__ = [
    "check_agreement",
    "clip_grad_norm",
    "full_model_state",
    "full_optimizer_state",
    "gathered",
    "gradient_sync",
    "is_sharded",
    "load_full_state",
    "load_optimizer_state",
    "local_bytes",
    "make_mesh",
    "plain_copy",
    "shard_module",
    "wrap_classes",
]


def make_mesh(device: torch.device, world: int) -> Any:
    """The one-dimensional device mesh of the launched process group (``world`` processes)."""
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh(device.type, (world,))


def wrap_classes(model: nn.Module, configured: Sequence[str]) -> set[str]:
    """The class names of the blocks that get their own FSDP unit: ``configured``, or the model's
    ``_no_split_modules`` (Hugging Face's list of blocks that must not be split)."""
    names = set(configured)
    if not names:
        base = _base_model(model)
        names = set(getattr(base, "_no_split_modules", None) or [])
    return names


def shard_module(
    module: nn.Module,
    mesh: Any,
    options: ShardingConfig,
    *,
    wrap: set[str] | None = None,
) -> nn.Module:
    """Shard ``module`` in place (and return it): one unit per block of ``wrap``, the input and the
    untied output embeddings, then the root. ``options`` are ``trainer.fsdp``."""
    from torch.distributed.fsdp import fully_shard

    kwargs = _shard_kwargs(mesh, options)
    base: Any = _base_model(module)
    blocks = [m for m in module.modules() if type(m).__name__ in (wrap or set())]
    if wrap and not blocks:
        raise ConfigError(
            f"trainer.fsdp.wrap={sorted(wrap)}: no module of {type(base).__name__} has one of these "
            "classes; name its block classes (e.g. LlamaDecoderLayer) or leave wrap empty",
            path="trainer.fsdp.wrap",
        )
    for block in blocks:
        fully_shard(block, **kwargs)
    inputs = base.get_input_embeddings() if hasattr(base, "get_input_embeddings") else None
    outputs = base.get_output_embeddings() if hasattr(base, "get_output_embeddings") else None
    tied = outputs is not None and inputs is not None and outputs.weight is inputs.weight
    if not tied:  # tied embeddings stay in the root's unit (a parameter belongs to one unit)
        for embedding in (inputs, outputs):
            if embedding is not None and any(p.requires_grad for p in embedding.parameters()):
                fully_shard(embedding, **kwargs)
    fully_shard(module, **kwargs)
    return module


def check_agreement(modules: Sequence[nn.Module | None], world: int) -> None:
    """Raise on every process when the processes did not shard the same modules the same way
    (a process left unsharded would hang the first collective instead)."""
    if world == 1:
        return
    import torch.distributed as dist

    mine = [(type(m).__name__, is_sharded(m), len(_units(m))) if m is not None else None for m in modules]
    everyone: list[Any] = [None] * world
    dist.all_gather_object(everyone, mine)
    if any(theirs != everyone[0] for theirs in everyone):
        lines = "; ".join(f"process {rank}: {theirs}" for rank, theirs in enumerate(everyone))
        raise AgentR1Error(
            f"the processes sharded their models differently ({lines}): every process of a run must "
            "use the same config (trainer.sharding) and agent-r1 version"
        )


def _shard_kwargs(mesh: Any, options: ShardingConfig) -> dict[str, Any]:
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy

    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
    precision = MixedPrecisionPolicy(
        param_dtype=dtypes[options.param_dtype] if options.param_dtype else None,
        reduce_dtype=dtypes[options.reduce_dtype] if options.reduce_dtype else None,
    )
    return {
        "mesh": mesh,
        "reshard_after_forward": options.reshard_after_forward,
        "mp_policy": precision,
        "offload_policy": CPUOffloadPolicy() if options.cpu_offload else OffloadPolicy(),
    }


def _base_model(model: nn.Module) -> nn.Module:
    """The transformers model under a PEFT wrapper (or ``model`` itself)."""
    get_base = getattr(model, "get_base_model", None)
    return get_base() if callable(get_base) else model


def is_sharded(module: nn.Module | None) -> bool:
    """Whether ``module`` was sharded with ``fully_shard``."""
    from torch.distributed.fsdp import FSDPModule

    return isinstance(module, FSDPModule)


def _units(module: nn.Module) -> list[Any]:
    from torch.distributed.fsdp import FSDPModule

    return [m for m in module.modules() if isinstance(m, FSDPModule)]


@contextmanager
def gradient_sync(modules: Sequence[nn.Module | None], enabled: bool) -> Iterator[None]:
    """Inside the block, backward passes through the sharded ``modules`` reduce-scatter their
    gradients only when ``enabled`` (off: they accumulate locally, for all but the last
    micro-batch)."""
    sharded = [m for m in modules if m is not None and is_sharded(m)]
    for module in sharded:
        module.set_requires_gradient_sync(enabled)  # type: ignore[operator]
    try:
        yield
    finally:
        for module in sharded:
            module.set_requires_gradient_sync(True)  # type: ignore[operator]


@contextmanager
def gathered(module: nn.Module, reshard_after_forward: bool) -> Iterator[None]:
    """Inside the block, ``module``'s full parameters stay gathered (one all-gather per unit on
    entry, none per forward pass), so that each process may run as many forward passes as it
    needs (generation). ``reshard_after_forward``: the setting restored on exit."""
    units = _units(module)
    for unit in units:
        unit.set_reshard_after_forward(False, recurse=False)
        unit.unshard()
    try:
        yield
    finally:
        for unit in units:
            unit.reshard()
            unit.set_reshard_after_forward(reshard_after_forward, recurse=False)


def clip_grad_norm(params: Sequence[nn.Parameter], max_norm: float | None) -> torch.Tensor:
    """The norm of the whole gradient of ``params`` (every shard of every process: the unsharded
    norm), clipping the gradients to ``max_norm`` when given. Returns a plain 0-dim tensor."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return torch.zeros(())
    total = torch.nn.utils.get_total_norm(grads, norm_type=2.0)
    total = _full(total)
    if max_norm is not None:
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, total)
    return total


def _full(tensor: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def full_model_state(module: nn.Module) -> dict[str, Any]:
    """``module``'s unsharded state dict on the CPU, gathered one parameter at a time; complete on
    rank 0 (empty elsewhere). Every process must call it."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    state: dict[str, Any] = get_model_state_dict(module, options=options)
    return state


def plain_copy(model: nn.Module, state: dict[str, Any]) -> nn.Module:
    """A new, unsharded module of ``model``'s architecture (a transformers model, or a PEFT model
    over one) on the CPU, holding ``state`` (:func:`full_model_state`'s output): what an export
    writes. Built from the model's config, its weights never initialised, then loaded."""
    from torch.distributed.fsdp import FSDPModule

    try:
        from transformers.initialization import no_init_weights
    except ImportError:  # transformers < 5
        from transformers.modeling_utils import no_init_weights  # type: ignore[attr-defined,no-redef]

    base = _base_model(model)
    cls: Any = next(c for c in type(base).__mro__ if not issubclass(c, FSDPModule))
    with no_init_weights():
        plain: Any = cls(base.config)
    plain.to(dtype=next(iter(state.values())).dtype)
    if base is not model:  # LoRA: the same adapter layout over the copy
        from peft import get_peft_model

        peft_model: Any = model
        plain = get_peft_model(plain, peft_model.peft_config[peft_model.active_adapter])
    plain.load_state_dict(state)
    copy: nn.Module = plain.eval()
    return copy


def full_optimizer_state(modules: Sequence[nn.Module], optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The optimizer's unsharded state dict (keyed by parameter name), complete on rank 0."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return get_optimizer_state_dict(_container(modules), optimizer, options=options)


def load_full_state(module: nn.Module, state: dict[str, Any]) -> None:
    """Scatter an unsharded model state into the sharded ``module``: each process keeps its shard
    of the full state it loaded."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    set_model_state_dict(module, state, options=StateDictOptions(full_state_dict=True))


def load_optimizer_state(
    modules: Sequence[nn.Module], optimizer: torch.optim.Optimizer, state: dict[str, Any]
) -> None:
    """Load :func:`full_optimizer_state`'s output into ``optimizer`` over ``modules`` (sharded or
    not: the state is keyed by parameter name, and split to each process's shards)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    options = StateDictOptions(full_state_dict=True)
    set_optimizer_state_dict(_container(modules), optimizer, state, options=options)


def _container(modules: Sequence[nn.Module]) -> nn.Module:
    """One module holding ``modules`` (the optimizer's parameters may span several), so that the
    optimizer state is keyed by stable names."""
    if len(modules) == 1:
        return modules[0]
    return nn.ModuleList(modules)


def local_bytes(
    modules: Sequence[nn.Module | None], optimizer: torch.optim.Optimizer | None
) -> dict[str, int]:
    """Bytes this process holds for the parameters, gradients and optimizer state of ``modules``
    (its shards only, when sharded)."""
    from torch.distributed.tensor import DTensor

    def local(tensor: torch.Tensor) -> torch.Tensor:
        return tensor.to_local() if isinstance(tensor, DTensor) else tensor

    params = [p for m in modules if m is not None for p in m.parameters()]
    unique = list({id(p): p for p in params}.values())
    out = {
        "parameters": sum(local(p).numel() * p.element_size() for p in unique),
        "gradients": sum(local(p.grad).numel() * p.grad.element_size() for p in unique if p.grad is not None),
        "optimizer": 0,
    }
    if optimizer is not None:
        for state in optimizer.state.values():
            for value in state.values():
                if isinstance(value, torch.Tensor) and value.dim() > 0:
                    out["optimizer"] += local(value).numel() * value.element_size()
    return out


def sharded_modules(session: Session) -> list[nn.Module]:
    """The session's trained modules, policy first (those the optimizer holds)."""
    return [m for m in (session.model, session.critic_model, session.value_head) if m is not None]
