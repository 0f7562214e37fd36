"""Worker of tests/test_distributed.py: one update on fixed trajectories, split across processes.

Usage: python distributed_worker.py MODEL_DIR OUT.pt ESTIMATOR (under torch.distributed.run or alone).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))

from trainer_helpers import fixed_trajectories, toy_config, toy_registry

from agent_r1.config import RunConfig, validate_components
from agent_r1.engine.session import build_session
from agent_r1.engine.update import update


def main() -> None:
    model_dir, out, estimator = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
    registry = toy_registry()
    config = toy_config(
        model_dir,
        out.parent / "run",
        algorithm={"name": estimator},
        trainer={"steps": 1, "tasks_per_step": 2, "micro_batch_size": 2, "lr": 1e-2, "grad_clip": None},
    )
    run = RunConfig.model_validate(config)
    session = build_session(run, validate_components(run, registry), Path(run.output_dir), registry=registry)
    initial = {k: v.detach().clone() for k, v in session.unwrapped.state_dict().items()}
    trajectories = fixed_trajectories(session.tokenizer, count=8)
    share = len(trajectories) // session.world
    local = trajectories[session.rank * share : (session.rank + 1) * share]
    update(session, local)
    if session.is_main:
        # The gradient the optimizer stepped with stays in .grad (synchronised across processes).
        grads = {
            n: p.grad.detach().cpu() for n, p in session.unwrapped.named_parameters() if p.grad is not None
        }
        torch.save(grads, out)
        params = {k: v.detach().cpu() for k, v in session.unwrapped.state_dict().items()}
        torch.save({"initial": initial, "final": params}, f"{out}.params")
    session.accelerator.wait_for_everyone()


if __name__ == "__main__":
    main()
