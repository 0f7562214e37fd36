"""Time one optimizer step's forward/backward over several micro-batches, with the prompt prefix
that every row shares run once per step (``StepPrefix``) or once per micro-batch.

The rows have the main task's shape: ``--tasks`` calculator tasks x ``--group`` samples, each the
rendered prompt (system message and the worked examples, which all tasks share, then the task's
question), a random action, a tool result and a second action. They are split into micro-batches of
``--micro`` rows as the trainer splits them (a micro-batch holds several tasks, so within it only
the worked examples are shared). ``step`` runs the worked examples once for the step and sums their
cache's gradient over the micro-batches; ``micro`` runs them in every micro-batch (the trainer
before). Both must give the same gradients; the script reports the largest relative gradient gap,
the best and median wall and CPU time of each mode (alternating) and their ratio.

    .venv/bin/python benchmarks/bench_step_prefix.py --tiny     # smoke: tiny random model
    .venv/bin/python benchmarks/bench_step_prefix.py            # SmolLM2-135M-Instruct, the demo's shape
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Sequence
from typing import Any

import torch
from _ab import max_relative_gap, time_alternating, write_results

MODES = ("step", "micro")


def load(tiny: bool) -> tuple[Any, Any]:
    if tiny:
        from agent_r1.testing.models import tiny_model, tiny_tokenizer

        tokenizer = tiny_tokenizer()
        return tiny_model(tokenizer, seed=0), tokenizer
    from transformers import AutoModelForCausalLM

    from agent_r1.models.loading import load_tokenizer
    from agent_r1.models.paths import resolve_model_path

    directory = resolve_model_path("smollm2-135m-instruct")
    model = AutoModelForCausalLM.from_pretrained(str(directory), dtype=torch.float32)
    model.get_input_embeddings().weight.requires_grad_(False)  # as the demo (freeze_embeddings)
    return model, load_tokenizer(directory)


def rows(
    tokenizer: Any, tasks: int, group: int, action_tokens: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``tasks x group`` right-padded rows ``[B, T]`` of the demo's calculator task with its four
    worked examples: input ids, attention mask, and the policy tokens (the two actions)."""
    from agent_r1.builtins.calculator import ArithmeticDataset, CalculatorEnv
    from agent_r1.rollout.chat import ChatRenderer

    env = CalculatorEnv({"few_shot": ["multiply", "subtract", "divide", "two_step"]})
    renderer = ChatRenderer(tokenizer)
    observation = tokenizer.encode(
        "<|im_end|>\n<|im_start|>user\n<result>10063</result><|im_end|>\n<|im_start|>assistant\n",
        add_special_tokens=False,
    )
    generator = torch.Generator().manual_seed(0)
    sequences, actions = [], []
    for task in ArithmeticDataset({}).load("train")[:tasks]:
        start = asyncio.run(env.reset(task))
        prompt = renderer.render_prompt(start.messages, start.tools)
        for sample in range(group):
            first = torch.randint(100, len(tokenizer) - 1, (action_tokens - 2 * sample,), generator=generator)
            second = torch.randint(100, len(tokenizer) - 1, (action_tokens // 2,), generator=generator)
            sequences.append(prompt + first.tolist() + list(observation) + second.tolist())
            actions.append((len(prompt), len(first), len(observation)))
    width = max(len(s) for s in sequences)
    ids = torch.zeros((len(sequences), width), dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.bool)
    policy = torch.zeros((len(sequences), width), dtype=torch.bool)
    for row, tokens in enumerate(sequences):
        ids[row, : len(tokens)] = torch.tensor(tokens)
        mask[row, : len(tokens)] = True
        prompt_length, first_length, observation_length = actions[row]
        policy[row, prompt_length : len(tokens)] = True
        policy[row, prompt_length + first_length : prompt_length + first_length + observation_length] = False
    return ids, mask, policy


def step(
    model: Any, ids: torch.Tensor, mask: torch.Tensor, policy: torch.Tensor, micro: int, mode: str
) -> dict[str, torch.Tensor]:
    """One optimizer step's forward/backward (a token-mean policy loss with an entropy term, summed
    over micro-batches); returns every gradient."""
    from agent_r1.engine.learner.batch import (
        StepPrefix,
        first_policy_position,
        policy_forward,
        shared_prefix_length,
    )

    model.zero_grad(set_to_none=True)
    total = float(policy.sum())
    prefix = None
    if mode == "step":
        length = min(shared_prefix_length(ids, mask), first_policy_position(policy) - 1)
        prefix = StepPrefix(model, ids[:1, :length])
    for chunk in range(0, len(ids), micro):
        part = slice(chunk, chunk + micro)
        weight = policy[part].float()
        out = policy_forward(
            model,
            ids[part],
            mask[part],
            with_entropy=True,
            start=first_policy_position(policy[part]),
            step_prefix=prefix,
        )
        assert out.entropy is not None
        loss = (-(out.logprobs * weight) - 0.01 * out.entropy * weight).sum() / total
        loss.backward()
    if prefix is not None:
        prefix.backward()
    return {name: p.grad.detach().clone() for name, p in model.named_parameters() if p.grad is not None}


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="tiny random model: a smoke run")
    parser.add_argument("--tasks", type=int, default=4, help="tasks per step (the demo: 4)")
    parser.add_argument("--group", type=int, default=4, help="samples per task (the demo: 4)")
    parser.add_argument("--micro", type=int, default=8, help="rows per micro-batch (the demo: 8)")
    parser.add_argument("--action-tokens", type=int, default=24, help="tokens of the first action")
    parser.add_argument("--repeats", type=int, default=3, help="timed steps per mode (alternating)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument(
        "--out", default=None, help="where results.json goes (default runs/bench_step_prefix/<time>)"
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    model, tokenizer = load(args.tiny)
    model.train()
    ids, mask, policy = rows(tokenizer, args.tasks, args.group, args.action_tokens)
    print(
        f"{len(ids)} rows of {int(mask.sum(1).min())}-{ids.shape[1]} tokens, micro-batches of {args.micro}, "
        f"shared by all: {int((ids == ids[:1]).all(0).int().cumprod(0).sum())} tokens; "
        f"{torch.get_num_threads()} thread(s)",
        flush=True,
    )
    grads = {mode: step(model, ids, mask, policy, args.micro, mode) for mode in MODES}  # warm-up
    gap = max_relative_gap(grads["step"], grads["micro"])
    results: dict[str, Any] = {
        "rows": len(ids),
        "micro_batch_size": args.micro,
        "tokens": int(mask.sum()),
        "max_relative_grad_gap": gap,
        "threads": torch.get_num_threads(),
    }
    results.update(
        time_alternating(lambda mode: step(model, ids, mask, policy, args.micro, mode), MODES, args.repeats)
    )
    results["speedup_median"] = results["micro"]["median_s"] / results["step"]["median_s"]
    print(
        f"speed-up (prefix per micro-batch / per step): median {results['speedup_median']:.2f}x; "
        f"largest relative gradient gap {gap:.1e}"
    )
    write_results(results, args.out, "bench_step_prefix")
    return 0 if gap < 1e-4 else 1


if __name__ == "__main__":
    raise SystemExit(main())
