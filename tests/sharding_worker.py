"""Worker of tests/test_sharding.py, run alone or under ``torch.distributed.run`` (gloo, CPU).

Usage: python sharding_worker.py MODEL_DIR OUT_DIR SCENARIOS SHARDING [--break HOW] [--save-after K]
[--resume STATE]

SCENARIOS: one scenario, or several separated by commas (each ``name`` or ``name:sharding``), run
one after another in the same launch, each writing to ``OUT_DIR/<name>-<sharding>``.

Runs a few agent-r1 updates on fixed trajectories (the same 8 every step, shared out across the
processes) with ``trainer.sharding: SHARDING`` and writes, from rank 0, ``result.pt``: each step's
loss and gradient norm, the final weights gathered from every process (through
``Session.exportable``, the export path), and the bytes of parameters, gradients and optimizer state
this process held. SCENARIO: ``grpo`` (3 steps, clipped), ``ppo`` (3 steps, a value head on the
policy and KL to a reference model), ``critic`` (3 steps, a separate critic model), ``lora`` (2
steps), ``rpp`` (2 steps of REINFORCE++: advantages whitened over the whole batch of every process),
``uneven`` (2 GRPO steps on 6 trajectories: the processes hold different numbers of rows),
``packed`` (2 GRPO steps on 5 trajectories packed within a 45-token budget: the processes plan
different numbers of micro-batches and even them out).
``--break`` (tests only): ``unsharded_rank1`` leaves rank 1's policy unsharded, ``local_norm`` clips
with this process's shard norm instead of the whole gradient's. ``--save-after K`` writes the
session's checkpoint state after K steps (``state.pt``, from rank 0) and stops; ``--resume STATE``
starts from such a state (written by any number of processes) and runs the remaining steps.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).parent))

from trainer_helpers import fixed_trajectories, toy_config, toy_registry

from agent_r1.config import RunConfig, validate_components
from agent_r1.engine.learner import sharding
from agent_r1.engine.session import build_session
from agent_r1.engine.update import update

SCENARIOS: dict[str, tuple[int, dict[str, Any]]] = {
    "grpo": (3, {"algorithm": {"name": "grpo"}, "trainer": {"grad_clip": 0.05}}),
    "ppo": (
        3,
        {
            "algorithm": {"name": "ppo", "kl": {"coef": 0.05, "placement": "loss"}},
            "trainer": {"grad_clip": 1.0, "mini_batches": 2},
        },
    ),
    "critic": (
        3,
        {"algorithm": {"name": "ppo", "critic": {"kind": "separate"}}, "trainer": {"grad_clip": 1.0}},
    ),
    "lora": (2, {"model": {"lora": {"r": 4, "alpha": 8}}, "trainer": {"grad_clip": 1.0}}),
    "rpp": (2, {"algorithm": {"name": "reinforce_pp"}, "trainer": {"grad_clip": None}}),
    "uneven": (2, {"algorithm": {"name": "grpo"}}),
    "packed": (
        2,
        {"algorithm": {"name": "grpo"}, "trainer": {"max_tokens_per_micro_batch": 45, "packing": True}},
    ),
}
UNEVEN_DROP = 2
"""``uneven`` trains on the first 6 trajectories only: on 2 processes the second holds 2 rows (one
micro-batch) against the first's 4 (two), as when failed episodes were set aside."""


def _break(how: str) -> None:
    """Sabotage one piece of the sharded path, to show the tests notice."""
    if how == "unsharded_rank1" and int(os.environ.get("RANK", "0")) == 1:
        sharding.shard_module = lambda module, *args, **kwargs: module  # type: ignore[assignment]
    if how == "local_norm":

        def local_norm(params: Any, max_norm: float | None) -> torch.Tensor:
            grads = [p.grad.to_local() for p in params if p.grad is not None]
            total = torch.nn.utils.get_total_norm(grads)
            if max_norm is not None:
                torch.nn.utils.clip_grads_with_norm_([p.grad.to_local() for p in params], max_norm, total)
            return total

        sharding.clip_grad_norm = local_norm  # type: ignore[assignment]


def run(model_dir: Path, out: Path, scenario: str, mode: str, args: argparse.Namespace) -> None:
    """One scenario's session and updates; its result (or state) under ``out``."""
    steps, sections = SCENARIOS[scenario]
    sections = dict(sections)
    trainer = {"steps": steps, "tasks_per_step": 4, "micro_batch_size": 2, "lr": 1e-2, "sharding": mode}
    trainer.update(sections.pop("trainer", {}))
    config = toy_config(model_dir, out / "run", trainer=trainer, **sections)
    registry = toy_registry()
    run = RunConfig.model_validate(config)
    session = build_session(run, validate_components(run, registry), Path(run.output_dir), registry=registry)
    if args.resume:
        session.load_state_dict(torch.load(args.resume, weights_only=False), source=args.resume)
    trajectories = fixed_trajectories(session.tokenizer, count=8)
    chunk = len(trajectories) // (session.world * run.trainer.mini_batches)
    if scenario in ("uneven", "packed"):
        trajectories = trajectories[: -UNEVEN_DROP - (scenario == "packed")]
    # Rows i of the one-process batch go to the process that puts them in the same mini-batch.
    local = [t for i, t in enumerate(trajectories) if (i // chunk) % session.world == session.rank]
    history = []
    while session.step < (args.save_after or steps):
        metrics = update(session, local)
        history.append({k: metrics[k] for k in ("actor/pg_loss", "actor/grad_norm") if k in metrics})
    out.mkdir(parents=True, exist_ok=True)
    if args.save_after is not None:
        state = session.state_dict()  # sharded: every process takes part
        if session.is_main:
            torch.save(state, out / "state.pt")
    else:
        held = sharding.local_bytes(sharding.sharded_modules(session), session.optimizer)
        policy, critic = session.exportable()
        if session.is_main:
            result = {
                "history": history,
                "policy": {k: v.detach().cpu() for k, v in policy.state_dict().items()},
                "value_head": critic[0] if critic else None,
                "bytes": held,
            }
            torch.save(result, out / "result.pt")
    if session.world > 1:
        torch.distributed.barrier()


def main() -> None:
    parser = argparse.ArgumentParser()
    for name in ("model_dir", "out", "scenarios", "mode"):
        parser.add_argument(name)
    parser.add_argument("--break", dest="sabotage", default="")
    parser.add_argument("--save-after", type=int, default=None)
    parser.add_argument("--resume", default=None)
    args = parser.parse_args()
    _break(args.sabotage)
    out = Path(args.out)
    plan = [item.partition(":") for item in args.scenarios.split(",")]
    if len(plan) == 1:  # one scenario: its files right under OUT_DIR
        run(Path(args.model_dir), out, plan[0][0], plan[0][2] or args.mode, args)
        return
    for scenario, _, mode in plan:  # several, one launch: OUT_DIR/<scenario>-<mode>
        mode = mode or args.mode
        run(Path(args.model_dir), out / f"{scenario}-{mode}", scenario, mode, args)


if __name__ == "__main__":
    main()
