"""Value-guided decoding with a PPO-trained critic on the calculator task: success and compute of
greedy decoding, plain sampling, value-guided K = 4 / 8, best-of-K by the format verifier, and the
oracle best-of-K (pass@K over K sampled episodes) as the ceiling.

1. Train the demo setup (SmolLM2-135M-Instruct, calculator task) with PPO for ``--steps`` steps
   (skipped with ``--run DIR``, which reuses a trained run).
2. Evaluate its last checkpoint on the first ``--eval-tasks`` held-out problems, once per row and
   sampling seed (``seed=S`` moves the evaluation's sampling seed): greedy (deterministic, one
   run); sampling at T = 1 with ``max(K)`` samples per task, whose mean success is the sampling
   row and whose pass@K is the oracle; value-guided K at T = 1; best-of-K (``--best-of-k``).

Every evaluation goes through ``agent_r1.run.commands.evaluate``, the code behind ``agent-r1
eval``. Results accumulate in ``--out``/results.json (a rerun skips evaluations already there),
rendered into results.md: success as mean ± sd over seeds, and per episode the tokens generated
(discarded candidates included), the critic's tokens and the wall time.

    python benchmarks/value_guided.py --steps 24 --eval-tasks 64 --seeds 0 1 2 --out runs/value_guided
    python benchmarks/value_guided.py --tiny --out runs/vg   # smoke mode: tiny model, toy task
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

PPO = ["algorithm.name=ppo", "algorithm.critic.lr=1.0e-4"]
"""The PPO setup of benchmarks/ppo_vs_grpo.py: the value head starts at 0 and needs a higher
learning rate to fit within a short run."""


def rows(candidates: list[int], best_of_k: list[int]) -> dict[str, list[str]]:
    """Evaluation rows: name -> eval overrides."""
    sampled = ["eval.temperature=1.0", "eval.samples=1"]
    out: dict[str, list[str]] = {
        "greedy": ["eval.temperature=0.0", "eval.samples=1", "eval.decoding.kind=sample"],
        "sampling": [
            "eval.temperature=1.0",
            f"eval.samples={max(candidates)}",
            f"eval.pass_k=[1,{','.join(str(k) for k in sorted(candidates))}]",
            "eval.decoding.kind=sample",
        ],
    }
    for k in candidates:
        out[f"value_guided_k{k}"] = [
            *sampled,
            "eval.decoding.kind=value_guided",
            f"eval.decoding.candidates={k}",
        ]
    for k in best_of_k:
        out[f"best_of_k{k}_format"] = [
            *sampled,
            "eval.decoding.kind=best_of_k",
            f"eval.decoding.candidates={k}",
            "eval.decoding.verifier=format",
        ]
    return out


def train(config: str, overrides: list[str], run_dir: Path) -> dict[str, Any]:
    """Train with PPO into ``run_dir``; returns the steps, the wall time and the reward curve."""
    from agent_r1.run.training import train as run_train

    started = time.perf_counter()
    run_train(config, [*overrides, *PPO, f"output_dir={run_dir}"])
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {
        "run_dir": str(run_dir),
        "steps": len(metrics),
        "wall_s": time.perf_counter() - started,
        "train_reward": [m.get("reward/answer_match", m.get("reward/target_char", 0.0)) for m in metrics],
        "value_loss": [m.get("critic/value_loss") for m in metrics],
    }


def evaluate(config: str, overrides: list[str], run_dir: Path, out: Path) -> dict[str, Any]:
    """One evaluation of the run's last checkpoint; returns its summary."""
    from agent_r1.run.commands import evaluate as run_eval

    report = run_eval(config, overrides, checkpoint=run_dir, out=out)
    summary: dict[str, Any] = report["summary"]
    return {
        "success": summary["success"],
        "pass_at_k": summary["pass_at_k"],
        "decoding": summary["decoding"],
        "num_tasks": summary["num_tasks"],
        "num_trajectories": summary["num_trajectories"],
    }


def _auc(positives: list[float], negatives: list[float]) -> float | None:
    """P(a positive scores above a negative), ties counting one half (Mann-Whitney)."""
    if not positives or not negatives:
        return None
    wins = sum((p > n) + 0.5 * (p == n) for p in positives for n in negatives)
    return wins / (len(positives) * len(negatives))


def diagnose(run_dir: Path, trajectories_path: Path, success_signal: str) -> dict[str, Any]:
    """How well the trained critic tells successful episodes from failed ones, on the sampled
    evaluation episodes: the AUC of V(s_L) at the last token of an episode's first and of its last
    action against success, over all episodes and within tasks (the selection value-guided decoding
    needs: among samples of one task), and the mean value of successes and failures."""

    from agent_r1.config import ModelConfig
    from agent_r1.engine.artifacts import checkpoint as ckpt
    from agent_r1.engine.learner.batch import collate
    from agent_r1.engine.learner.critic import ValueHead, no_grad_values
    from agent_r1.mdp import TokenSource, load_trajectories
    from agent_r1.models.loading import load_policy

    checkpoint = ckpt.resolve_checkpoint(run_dir)
    state = ckpt.load_checkpoint(checkpoint)
    section = ckpt.recorded_config(checkpoint)["model"]
    model, tokenizer = load_policy(ModelConfig(**{**section, "device": "cpu"}), device="cpu")
    ckpt.load_model_state(model, state["model"], source=str(checkpoint))
    head = ValueHead(int(model.config.hidden_size))
    head.load_state_dict(state["value_head"])
    trajectories = load_trajectories(trajectories_path)
    values = no_grad_values(head, model.eval(), collate(trajectories, tokenizer.pad_token_id), 8)  # [B, T]
    rows = []
    for b, trajectory in enumerate(trajectories):
        last_of_turn: dict[int, int] = {}
        position = 0
        for segment in trajectory.segments:
            position += len(segment.token_ids)
            if segment.source is TokenSource.POLICY:
                last_of_turn[segment.turn] = position - 1
        turns = sorted(last_of_turn)
        success = trajectory.reward_by_name().get(success_signal, 0.0) >= 1.0
        first, last = float(values[b, last_of_turn[turns[0]]]), float(values[b, last_of_turn[turns[-1]]])
        rows.append((trajectory.task_id, success, first, last))
    out: dict[str, Any] = {"episodes": len(rows), "successes": sum(r[1] for r in rows)}
    for name, index in (("first_action", 2), ("last_action", 3)):
        good = [r[index] for r in rows if r[1]]
        bad = [r[index] for r in rows if not r[1]]
        within = []
        for task in {r[0] for r in rows}:
            mine = [r for r in rows if r[0] == task]
            auc = _auc([r[index] for r in mine if r[1]], [r[index] for r in mine if not r[1]])
            if auc is not None:
                within.append(auc)
        out[name] = {
            "auc": _auc(good, bad),
            "auc_within_task": statistics.mean(within) if within else None,
            "mixed_tasks": len(within),
            "value_success_mean": statistics.mean(good) if good else None,
            "value_failure_mean": statistics.mean(bad) if bad else None,
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=24, help="PPO training steps")
    parser.add_argument("--run", type=Path, default=None, help="reuse this trained run (skip training)")
    parser.add_argument("--eval-tasks", type=int, default=64)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="sampling seeds")
    parser.add_argument("--candidates", type=int, nargs="+", default=[4, 8], help="K of value-guided")
    parser.add_argument("--best-of-k", type=int, nargs="*", default=[4], help="K of best-of-K (format)")
    parser.add_argument("--rows", nargs="*", default=None, help="evaluate only these rows")
    parser.add_argument("--out", type=Path, default=Path("runs/value_guided"))
    parser.add_argument("--config", default="demo")
    parser.add_argument("--tiny", action="store_true", help="smoke mode: a tiny model on the toy task")
    parser.add_argument(
        "--diagnose",
        action="store_true",
        help="also measure how well the critic separates successes from failures (sampling episodes)",
    )
    args = parser.parse_args()

    if args.tiny:
        args.steps, args.eval_tasks = min(args.steps, 2), min(args.eval_tasks, 4)
        args.best_of_k = []  # the toy environment has no parser for the format verifier
    config, common = args.config, [f"eval.num_tasks={args.eval_tasks}"]
    train_overrides = [
        f"trainer.steps={args.steps}",
        "trainer.checkpoint_every=0",
        "eval.before_training=false",
    ]
    train_overrides.append("eval.num_tasks=8")  # the run's own greedy after-evaluation, kept short
    if args.tiny:
        config = _tiny_setup(args.out)
    args.out.mkdir(parents=True, exist_ok=True)
    results_path = args.out / "results.json"
    results: dict[str, Any] = (
        json.loads(results_path.read_text(encoding="utf-8")) if results_path.exists() else {"evals": {}}
    )

    def save() -> None:
        results_path.write_text(json.dumps(results, indent=2), encoding="utf-8")
        (args.out / "results.md").write_text(markdown(results), encoding="utf-8")

    if args.run is not None:
        run_dir = args.run
        results.setdefault("training", {"run_dir": str(run_dir)})
    elif "training" in results:
        run_dir = Path(results["training"]["run_dir"])
    else:
        run_dir = args.out / "ppo-run"
        print(f"== training PPO for {args.steps} steps into {run_dir}", flush=True)
        results["training"] = train(config, train_overrides, run_dir)
        save()
    results["setup"] = {
        "config": config,
        "eval_tasks": args.eval_tasks,
        "seeds": args.seeds,
        "candidates": args.candidates,
        "best_of_k": args.best_of_k,
    }
    # seed by seed, so that an interrupted measurement has every row for its first seeds
    for seed in args.seeds:
        for name, overrides in rows(args.candidates, args.best_of_k).items():
            key = f"{name}/seed{seed}"
            skip = args.rows is not None and name not in args.rows
            if skip or key in results["evals"] or (name == "greedy" and seed != args.seeds[0]):
                continue
            print(f"== {key}", flush=True)
            out = args.out / "evals" / name / f"seed{seed}"
            results["evals"][key] = evaluate(config, [*common, *overrides, f"seed={seed}"], run_dir, out)
            save()
    if args.diagnose and "diagnostics" not in results:
        print("== critic diagnostics", flush=True)
        sampled = args.out / "evals" / "sampling" / f"seed{args.seeds[0]}" / "eval_eval.jsonl"
        signal = "target_char" if args.tiny else "answer_match"
        results["diagnostics"] = diagnose(run_dir, sampled, signal)
    save()
    print(markdown(results))


def _mean_sd(values: list[float]) -> str:
    if not values:
        return "–"
    mean = 100 * statistics.mean(values)
    if len(values) < 2:
        return f"{mean:.1f}%"
    return f"{mean:.1f}% ± {100 * statistics.stdev(values):.1f}"


def _per_seed(results: dict[str, Any], name: str) -> list[dict[str, Any]]:
    return [v for k, v in sorted(results["evals"].items()) if k.split("/")[0] == name]


def markdown(results: dict[str, Any]) -> str:
    """The table of results.md: one row per decoding, success mean ± sd over seeds, compute per
    episode (oracle rows: K sampled episodes per task)."""
    setup = results.get("setup", {})
    training = results.get("training", {})
    lines = [
        f"PPO run: {training.get('steps', '?')} steps ({training.get('wall_s', 0) / 60:.0f} min); "
        f"{setup.get('eval_tasks', '?')} held-out tasks; sampling seeds {setup.get('seeds', '?')}.",
        "",
        "| decoding | success (mean ± sd over seeds) | per seed | generated tokens / episode "
        "| critic tokens / episode | wall s / episode | turns picking another candidate |",
        "|---|---|---|---|---|---|---|",
    ]
    names = list(rows(setup.get("candidates", [4, 8]), setup.get("best_of_k", [])))
    for name in names:
        runs = _per_seed(results, name)
        if not runs:
            continue
        successes = [r["success"] for r in runs]
        decoding = [r["decoding"] for r in runs]
        mean = {
            key: statistics.mean(d[key] for d in decoding) for key in decoding[0] if key.endswith("_mean")
        }
        wall = statistics.mean(d["wall_s_per_episode"] for d in decoding)
        picked = statistics.mean(d["picked_other_rate"] for d in decoding)
        label = {"greedy": "greedy (T = 0)", "sampling": "sampling (T = 1)"}.get(name, name)
        lines.append(
            f"| {label} | {_mean_sd(successes)} | {', '.join(f'{100 * s:.1f}%' for s in successes)} | "
            f"{mean['generated_tokens_mean']:.1f} | {mean['scored_tokens_mean']:.0f} | {wall:.3f} | "
            f"{'–' if name in ('greedy', 'sampling') else f'{100 * picked:.0f}%'} |"
        )
        if name == "sampling":
            for k in sorted(setup.get("candidates", [4, 8])):
                oracle = [r["pass_at_k"].get(f"pass@{k}") for r in runs]
                if any(v is None for v in oracle):
                    continue
                lines.append(
                    f"| oracle best-of-{k} (pass@{k}) | {_mean_sd(oracle)} | "
                    f"{', '.join(f'{100 * v:.1f}%' for v in oracle)} | "
                    f"{k * mean['generated_tokens_mean']:.1f} | 0 | {k * wall:.3f} | – |"
                )
    diagnostics = results.get("diagnostics")
    if diagnostics:
        lines += [
            "",
            f"Critic diagnostics on {diagnostics['episodes']} sampled episodes "
            f"({diagnostics['successes']} successes): V(s_L) at the last token of an action, "
            "against the episode's success.",
            "",
            "| action | AUC (all episodes) | AUC within a task (mixed tasks) | mean V, successes | "
            "mean V, failures |",
            "|---|---|---|---|---|",
        ]
        for name in ("first_action", "last_action"):
            d = diagnostics[name]
            lines.append(
                f"| {name.replace('_', ' ')} | {_num(d['auc'])} | {_num(d['auc_within_task'])} "
                f"({d['mixed_tasks']}) | {_num(d['value_success_mean'])} | {_num(d['value_failure_mean'])} |"
            )
    return "\n".join(lines) + "\n"


def _num(value: float | None) -> str:
    return "–" if value is None else f"{value:.3f}"


def _tiny_setup(out: Path) -> str:
    """The toy task on a tiny random model, for the smoke test (registers the toy plugin)."""
    import yaml

    import agent_r1.testing.toy as toy
    from agent_r1.registry import get_registry
    from agent_r1.testing.models import save_tiny_model, tiny_model, tiny_tokenizer

    get_registry().register_plugin(toy, "toy", distribution="agent-r1-tests")
    tokenizer = tiny_tokenizer()
    model_dir = out / "tiny-model"
    if not model_dir.exists():
        save_tiny_model(model_dir, tiny_model(tokenizer), tokenizer)
    config = {
        "model": {"path": str(model_dir), "device": "cpu"},
        "data": {"name": "toy_target", "num_train": 8, "num_eval": 4},
        "environment": {"name": "toy_single_turn"},
        "rollout": {"group_size": 4, "max_turns": 1, "max_new_tokens": 4, "max_context": 256},
        "rewards": [{"name": "target_char"}],
        "trainer": {"tasks_per_step": 2, "micro_batch_size": 8, "lr": 3e-2},
        "eval": {"success_signal": "target_char"},
    }
    path = out / "tiny.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return str(path)


if __name__ == "__main__":
    main()
