"""PPO (critic, GAE) against GRPO on the bundled calculator task: held-out success after a short run.

Each (algorithm, seed) pair trains the demo's SmolLM2-135M-Instruct setup for ``--steps`` steps and
evaluates greedy success on the first ``--eval-tasks`` held-out problems; the untrained policy's
success is measured once (it does not depend on the algorithm). Runs alternate between the two
algorithms so that machine noise hits both. Writes ``results.json`` and ``results.md`` into
``--out``.

    python benchmarks/ppo_vs_grpo.py --steps 12 --seeds 0 1 2 --out benchmarks/results/ppo_vs_grpo
    python benchmarks/ppo_vs_grpo.py --tiny   # smoke mode: tiny model, toy task, 2 steps
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

ALGORITHMS: dict[str, list[str]] = {
    "grpo": ["algorithm.name=grpo"],
    # The value head starts at 0; a higher critic learning rate lets it fit within a short run.
    "ppo": ["algorithm.name=ppo", "algorithm.critic.lr=1.0e-4"],
}


def _run(config: str, overrides: list[str], out: Path) -> dict[str, Any]:
    from agent_r1.run.training import train

    started = time.perf_counter()
    summary = train(config, [*overrides, f"output_dir={out}"])
    curve = [
        json.loads(line).get("reward/answer_match", 0.0)
        for line in (out / "metrics.jsonl").read_text().splitlines()
    ]
    return {
        "success_after": float(summary["after"]["success"]) if "after" in summary else None,
        "success_before": float(summary["before"]["success"]) if "before" in summary else None,
        "train_reward": curve,
        "wall_s": time.perf_counter() - started,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--eval-tasks", type=int, default=64)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/ppo_vs_grpo"))
    parser.add_argument("--tiny", action="store_true", help="smoke mode: a tiny model on the toy task")
    parser.add_argument("--config", default="demo")
    args = parser.parse_args()

    common = [
        f"trainer.steps={args.steps}",
        f"eval.num_tasks={args.eval_tasks}",
        "trainer.checkpoint_every=0",
    ]
    config = args.config
    if args.tiny:
        config, common = _tiny_setup(args.out)
    results: dict[str, Any] = {"steps": args.steps, "seeds": args.seeds, "runs": {}}
    for seed in args.seeds:
        for name, overrides in ALGORITHMS.items():
            before = (
                ["eval.before_training=true"]
                if seed == args.seeds[0] and name == "grpo"
                else ["eval.before_training=false"]
            )
            run_dir = args.out / "runs" / f"{name}-seed{seed}"
            print(f"== {name} seed {seed}", flush=True)
            results["runs"][f"{name}-seed{seed}"] = _run(
                config, [*common, *overrides, *before, f"seed={seed}"], run_dir
            )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=2), encoding="utf-8")
    (args.out / "results.md").write_text(_markdown(results), encoding="utf-8")
    print(_markdown(results))


def _markdown(results: dict[str, Any]) -> str:
    runs = results["runs"]
    before = next((r["success_before"] for r in runs.values() if r["success_before"] is not None), None)
    lines = [
        f"Held-out greedy success after {results['steps']} steps (untrained: "
        f"{'–' if before is None else f'{100 * before:.1f}%'}).",
        "",
        "| algorithm | "
        + " | ".join(f"seed {s}" for s in results["seeds"])
        + " | mean | last-3 train reward |",
        "|---|" + "---|" * (len(results["seeds"]) + 2),
    ]
    for name in ALGORITHMS:
        after = [runs[f"{name}-seed{s}"]["success_after"] or 0.0 for s in results["seeds"]]
        tail = [statistics.mean(runs[f"{name}-seed{s}"]["train_reward"][-3:]) for s in results["seeds"]]
        cells = " | ".join(f"{100 * a:.1f}%" for a in after)
        lines.append(
            f"| {name} | {cells} | {100 * statistics.mean(after):.1f}% | {statistics.mean(tail):.3f} |"
        )
    return "\n".join(lines) + "\n"


def _tiny_setup(out: Path) -> tuple[str, list[str]]:
    """The toy task on a tiny random model, for the smoke test (registers the toy plugin)."""
    import yaml

    import agent_r1.testing.toy as toy
    from agent_r1.registry import get_registry
    from agent_r1.testing.models import save_tiny_model, tiny_model, tiny_tokenizer

    get_registry().register_plugin(toy, "toy", distribution="agent-r1-tests")
    tokenizer = tiny_tokenizer()
    model_dir = save_tiny_model(out / "tiny-model", tiny_model(tokenizer), tokenizer)
    config = {
        "model": {"path": str(model_dir)},
        "data": {"name": "toy_target", "num_train": 8, "num_eval": 4},
        "environment": {"name": "toy_single_turn"},
        "rollout": {"group_size": 4, "max_turns": 1, "max_new_tokens": 6, "max_context": 256},
        "rewards": [{"name": "target_char"}],
        "trainer": {"tasks_per_step": 2, "micro_batch_size": 8, "lr": 3e-2},
        "eval": {"num_tasks": 4},
    }
    path = out / "tiny.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return str(path), ["trainer.steps=2", "eval.num_tasks=4", "trainer.checkpoint_every=0"]


if __name__ == "__main__":
    main()
