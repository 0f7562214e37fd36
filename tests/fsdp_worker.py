"""Worker of tests/test_fsdp.py, run alone or under ``torch.distributed.run`` on CPU (gloo).

Usage: python fsdp_worker.py MODEL_DIR OUT_DIR. Writes, from rank 0, ``facts.json`` (what
accelerate and torch do with FSDP on CPU), ``fsdp2_grads.pt`` (the tiny model's gradients under
torch's ``fully_shard``, gathered) and ``export/`` (the run's final model after one agent-r1 update
under accelerate, exported with ``export_final``) plus ``trained.pt`` (the weights it should hold).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))

from trainer_helpers import fixed_trajectories, toy_config, toy_registry

from agent_r1.config import RunConfig, validate_components


def accelerate_routing() -> dict[str, str]:
    """Which distributed type accelerate picks on CPU when given an FSDP plugin."""
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState
    from accelerate.utils import FullyShardedDataParallelPlugin

    accelerator = Accelerator(cpu=True, fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=2))
    routed = str(accelerator.distributed_type.value)
    AcceleratorState._reset_state(reset_partial_state=False)  # agent-r1's session builds its own
    return {"accelerate_cpu_with_fsdp_plugin": routed}


def fsdp1_refusal(model: torch.nn.Module) -> str:
    from torch.distributed.fsdp import FullyShardedDataParallel

    try:
        FullyShardedDataParallel(model)
    except RuntimeError as exc:
        return str(exc)
    return "accepted"


def fsdp2_grads(model_dir: Path, rank: int, world: int) -> dict[str, torch.Tensor]:
    """The language-model loss gradient of the tiny model on a fixed batch split over the ranks."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    batch = torch.randint(5, model.config.vocab_size, (4, 12), generator=torch.Generator().manual_seed(0))
    if world > 1:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (world,))
        for layer in model.model.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        share = len(batch) // world
        batch = batch[rank * share : (rank + 1) * share]
    model(input_ids=batch, labels=batch).loss.backward()  # FSDP2 averages over the ranks
    grads = {}
    for name, param in model.named_parameters():
        grad = param.grad
        grads[name] = (grad.full_tensor() if hasattr(grad, "full_tensor") else grad).detach().clone()
    return grads


def ddp_update_and_export(model_dir: Path, out: Path) -> tuple[dict[str, torch.Tensor], Path | None]:
    from agent_r1.engine.artifacts.export import export_final
    from agent_r1.engine.session import build_session
    from agent_r1.engine.update import update

    registry = toy_registry()
    config = toy_config(
        model_dir,
        out / "run",
        trainer={"steps": 1, "tasks_per_step": 2, "micro_batch_size": 2, "lr": 1e-2, "grad_clip": None},
    )
    run = RunConfig.model_validate(config)
    session = build_session(run, validate_components(run, registry), Path(run.output_dir), registry=registry)
    trajectories = fixed_trajectories(session.tokenizer, count=8)
    share = len(trajectories) // session.world
    update(session, trajectories[session.rank * share : (session.rank + 1) * share])
    trained = {k: v.detach().cpu().clone() for k, v in session.unwrapped.state_dict().items()}
    exported = None
    if session.is_main:
        exported = export_final(out / "run", session.unwrapped, session.tokenizer, run.model, step=1)
    session.accelerator.wait_for_everyone()
    return trained, exported


def main() -> None:
    import os

    model_dir, out = Path(sys.argv[1]), Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    facts = accelerate_routing() if world > 1 else {}
    rank = int(os.environ.get("RANK", "0"))
    if world > 1:
        from transformers import AutoModelForCausalLM

        facts["fsdp1_on_cpu"] = fsdp1_refusal(AutoModelForCausalLM.from_pretrained(model_dir))
    grads = fsdp2_grads(model_dir, rank, world)
    trained, exported = ddp_update_and_export(model_dir, out)
    if rank == 0:
        facts["export"] = str(exported)
        (out / "facts.json").write_text(json.dumps(facts), encoding="utf-8")
        torch.save(grads, out / "fsdp2_grads.pt")
        torch.save(trained, out / "trained.pt")


if __name__ == "__main__":
    main()
