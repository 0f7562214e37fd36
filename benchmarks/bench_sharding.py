"""Sharded training (``trainer.sharding: fsdp2``) against DDP: memory per process and step time.

Each arm is ``torchrun --nproc_per_node N`` of this script in worker mode: it builds a training
session on the model (default: the bundled SmolLM2-135M-Instruct in float32), runs a few agent-r1
updates on fixed synthetic trajectories (the same batch every step, shared out across the
processes) and reports, from every process, the bytes it holds for parameters, gradients and AdamW
state (its shards only, when sharded), its peak resident memory, and the mean time of the timed
updates. The driver runs FSDP2 at 1, 2 and 4 processes and DDP at 2, then writes a table with
the share of world 1's memory each process holds, the step-time ratio FSDP2 / DDP at 2 processes,
and the largest model whose parameters, gradients and optimizer state fit a given budget per
process at each world size (from the measured bytes per parameter).

    .venv/bin/python benchmarks/bench_sharding.py                      # about 5 min on 2 cores
    .venv/bin/python benchmarks/bench_sharding.py --smoke              # the tiny model, seconds
    .venv/bin/python benchmarks/bench_sharding.py --budget-gib 80      # the fit column at 80 GiB

On a CPU the processes share the cores, so the step-time ratio says what sharding's collectives
cost relative to DDP's, not how fast either would be on GPUs.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).with_name("results")


def _trajectories(tokenizer: Any, count: int, length: int) -> list[Any]:
    import torch

    from agent_r1.mdp import RewardSignal, TokenSource, Trajectory

    generator = torch.Generator().manual_seed(0)
    vocab = len(tokenizer)
    out = []
    for i in range(count):
        trajectory = Trajectory(
            id=f"t{i}", task_id=f"task{i // 4}", group_id=f"g{i // 4}", sample_index=i % 4
        )
        trajectory.append(
            TokenSource.PROMPT, 0, torch.randint(5, vocab, (length,), generator=generator).tolist()
        )
        action = torch.randint(5, vocab, (length // 2,), generator=generator).tolist()
        trajectory.append(TokenSource.POLICY, 0, action, [-1.0] * len(action))
        trajectory.rewards.append(RewardSignal(name="answer_match", value=float(i % 3 == 0)))
        out.append(trajectory)
    return out


def worker(args: argparse.Namespace) -> None:
    import torch

    from agent_r1.config import RunConfig, validate_components
    from agent_r1.engine.learner import sharding
    from agent_r1.engine.session import build_session
    from agent_r1.engine.update import update

    config = {
        "seed": 0,
        "output_dir": str(Path(args.out) / "run"),
        "model": {"path": args.model, "dtype": "float32"},
        "data": {"name": "arithmetic"},
        "environment": {"name": "calculator"},
        "rewards": [{"name": "answer_match"}],
        "algorithm": {"name": "grpo"},
        "trainer": {
            "steps": args.steps,
            "tasks_per_step": 4,
            "micro_batch_size": 2,
            "lr": 1e-5,
            "sharding": args.sharding,
        },
        "trackers": [],
    }
    run = RunConfig.model_validate(config)
    session = build_session(run, validate_components(run), run.output_dir)
    batch = _trajectories(session.tokenizer, args.rows, args.length)
    share = len(batch) // session.world
    local = batch[session.rank * share : (session.rank + 1) * share]
    times = []
    for step in range(args.steps):
        started = time.perf_counter()
        update(session, local)
        if step > 0:  # the first step builds the optimizer state
            times.append(time.perf_counter() - started)
    held = sharding.local_bytes(sharding.sharded_modules(session), session.optimizer)
    params = sum(p.numel() for p in session.unwrapped.parameters())  # global counts, sharded or not
    mine = {
        **held,
        "rss_peak": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "step_s": sum(times) / max(len(times), 1),
        "model_parameters": params,
    }
    everyone = [mine]
    if session.world > 1:
        everyone = [None] * session.world
        torch.distributed.all_gather_object(everyone, mine)
    if session.is_main:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "result.json").write_text(json.dumps(everyone), encoding="utf-8")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _arm(args: argparse.Namespace, world: int, mode: str) -> list[dict[str, float]]:
    out = Path(args.work) / f"{mode}-{world}"
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc_per_node={world}",
        "--master_addr=127.0.0.1",
        f"--master_port={_free_port()}",
        __file__,
        "--worker",
        "--out",
        str(out),
        "--sharding",
        mode,
        "--model",
        args.model,
        "--steps",
        str(args.steps),
        "--rows",
        str(args.rows),
        "--length",
        str(args.length),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    print(f"{mode} on {world} process(es)...", flush=True)
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"error: the {mode} arm on {world} processes failed:\n{done.stderr[-3000:]}")
    result: list[dict[str, float]] = json.loads((out / "result.json").read_text(encoding="utf-8"))
    return result


def _gib(value: float) -> str:
    return f"{value / 2**30:.3f}"


def report(arms: dict[tuple[str, int], list[dict[str, float]]], budget_gib: float) -> str:
    base = arms[("fsdp2", 1)][0]
    base_state = base["parameters"] + base["gradients"] + base["optimizer"]
    params = base["model_parameters"]
    lines = [
        f"Model: {params / 1e6:.1f}M parameters (float32). Per process: bytes it holds "
        "(largest process), peak resident memory, mean update time.",
        "",
        "| arm | processes | parameters GiB | gradients GiB | AdamW state GiB | params + grads + AdamW "
        f"vs world 1 | peak RSS GiB | step s | fits in {budget_gib:g} GiB |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for (mode, world), ranks in sorted(arms.items(), key=lambda item: (item[0][0] != "fsdp2", item[0][1])):
        worst = max(ranks, key=lambda r: r["parameters"] + r["gradients"] + r["optimizer"])
        state = worst["parameters"] + worst["gradients"] + worst["optimizer"]
        fits = budget_gib * 2**30 / (state / params)  # parameters whose state fits the budget
        lines.append(
            f"| {'FSDP2' if mode == 'fsdp2' else 'DDP'} | {world} | {_gib(worst['parameters'])} | "
            f"{_gib(worst['gradients'])} | {_gib(worst['optimizer'])} | {state / base_state:.0%} | "
            f"{_gib(max(r['rss_peak'] for r in ranks))} | {max(r['step_s'] for r in ranks):.2f} | "
            f"{fits / 1e9:.1f}B |"
        )
    if ("none", 2) in arms and ("fsdp2", 2) in arms:
        ratio = max(r["step_s"] for r in arms[("fsdp2", 2)]) / max(r["step_s"] for r in arms[("none", 2)])
        lines += ["", f"Step time FSDP2 / DDP at 2 processes: {ratio:.2f}x."]
    lines += [
        "",
        f"'fits in {budget_gib:g} GiB': the largest model whose parameters, gradients and AdamW state "
        "(at the measured bytes per parameter of that arm) fit the budget per process; activations, "
        "logits and the rollout engine come on top.",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", default="runs/bench-sharding", help="where to write the results")
    parser.add_argument("--sharding", default="fsdp2", help=argparse.SUPPRESS)
    parser.add_argument("--model", default="smollm2-135m-instruct", help="model path or bundled name")
    parser.add_argument("--steps", type=int, default=3, help="updates per arm (the first is not timed)")
    parser.add_argument("--rows", type=int, default=8, help="trajectories per update (all processes)")
    parser.add_argument("--length", type=int, default=64, help="prompt tokens per trajectory")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per process")
    parser.add_argument(
        "--budget-gib", type=float, default=80.0, help="memory per process, for the fit column"
    )
    parser.add_argument(
        "--smoke", action="store_true", help="the tiny test model, 2 steps: checks that it runs"
    )
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    args.work = str(Path(args.out) / "work")
    if args.smoke:
        from agent_r1.testing.models import save_tiny_model, tiny_model, tiny_tokenizer

        tokenizer = tiny_tokenizer()
        args.model = str(save_tiny_model(Path(args.out) / "tiny", tiny_model(tokenizer), tokenizer))
        args.steps, args.length = 2, 16
    arms = {
        (mode, world): _arm(args, world, mode)
        for mode, world in (("fsdp2", 1), ("fsdp2", 2), ("fsdp2", 4), ("none", 2))
    }
    text = report(arms, args.budget_gib)
    print(text)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench_sharding.md").write_text(text + "\n", encoding="utf-8")
    (out / "bench_sharding.json").write_text(
        json.dumps({f"{mode}-{world}": ranks for (mode, world), ranks in arms.items()}, indent=2),
        encoding="utf-8",
    )
    if not args.smoke:
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / "bench_sharding.md").write_text(text + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
