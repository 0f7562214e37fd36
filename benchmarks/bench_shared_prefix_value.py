"""Time the PPO training forward/backward with a value head on the policy's backbone, with and
without the shared-prefix forward.

A micro-batch of the main task's shape (the G samples of one calculator task: the same prompt,
system message and few-shot turns included, then different actions and observations) goes through
``policy_forward(..., with_hidden=True)``, a value head reads the hidden states, and a PPO-shaped
loss (policy term, entropy, squared value error) is backpropagated. ``shared`` runs the common
prompt once with batch size 1 and expands its KV cache and hidden states; ``plain`` runs every row
whole (what PPO with a shared backbone did before). Both must give the same gradients; the script
reports the largest relative gradient gap, the best and median wall and CPU time of each mode
(alternating) and their ratio.

    .venv/bin/python benchmarks/bench_shared_prefix_value.py --tiny     # smoke: tiny random model
    .venv/bin/python benchmarks/bench_shared_prefix_value.py            # SmolLM2-135M-Instruct
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Sequence
from typing import Any

import torch
from _ab import max_relative_gap, time_alternating, write_results

MODES = {"shared": 32, "plain": 0}  # policy_forward's share_prefix


def load(tiny: bool) -> tuple[Any, Any]:
    if tiny:
        from agent_r1.testing.models import tiny_model, tiny_tokenizer

        tokenizer = tiny_tokenizer()
        return tiny_model(tokenizer, tie_word_embeddings=False, seed=0), tokenizer
    from transformers import AutoModelForCausalLM

    from agent_r1.models.loading import load_tokenizer
    from agent_r1.models.paths import resolve_model_path

    directory = resolve_model_path("smollm2-135m-instruct")
    model = AutoModelForCausalLM.from_pretrained(str(directory), dtype=torch.float32)
    return model, load_tokenizer(directory)


def micro_batch(
    tokenizer: Any, rows: int, action_tokens: int, seed: int
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """``rows`` trajectories of one calculator task: its rendered prompt, then random actions and a
    tool result each; returns right-padded ``input_ids`` and ``attention_mask`` ``[B, T]`` and the
    position of the first action token."""
    from agent_r1.builtins.calculator import ArithmeticDataset, CalculatorEnv
    from agent_r1.rollout.chat import ChatRenderer

    task = ArithmeticDataset({}).load("train")[0]
    start = asyncio.run(CalculatorEnv({}).reset(task))
    prompt = ChatRenderer(tokenizer).render_prompt(start.messages, start.tools)
    observation = tokenizer.encode(
        "<|im_end|>\n<|im_start|>user\n<result>10063</result><|im_end|>\n<|im_start|>assistant\n",
        add_special_tokens=False,
    )
    generator = torch.Generator().manual_seed(seed)
    sequences = []
    for row in range(rows):
        first = torch.randint(100, len(tokenizer) - 1, (action_tokens - 3 * row,), generator=generator)
        second = torch.randint(100, len(tokenizer) - 1, (action_tokens // 2 + row,), generator=generator)
        sequences.append(prompt + first.tolist() + list(observation) + second.tolist())
    width = max(len(s) for s in sequences)
    ids = torch.zeros((rows, width), dtype=torch.long)
    mask = torch.zeros((rows, width), dtype=torch.bool)
    for row, tokens in enumerate(sequences):
        ids[row, : len(tokens)] = torch.tensor(tokens)
        mask[row, : len(tokens)] = True
    return ids, mask, len(prompt)


def step(
    model: Any, head: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor, start: int, share: int
) -> dict[str, torch.Tensor]:
    """One forward/backward of the PPO-shaped loss; returns every gradient."""
    from agent_r1.engine.learner.batch import policy_forward

    model.zero_grad(set_to_none=True)
    head.zero_grad(set_to_none=True)
    out = policy_forward(
        model, ids, mask, with_entropy=True, with_hidden=True, start=start, share_prefix=share
    )
    assert out.hidden is not None and out.entropy is not None
    values = head(out.hidden).squeeze(-1)  # [B, T]
    weight = mask.float()
    weight[:, :start] = 0
    loss = (-(out.logprobs * weight) - 0.01 * out.entropy * weight + 0.5 * (values * weight) ** 2).sum()
    (loss / weight.sum()).backward()
    named = [*model.named_parameters(), *(("head." + n, p) for n, p in head.named_parameters())]
    return {name: p.grad.detach().clone() for name, p in named if p.grad is not None}


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="tiny random model: a smoke run")
    parser.add_argument("--rows", type=int, default=4, help="rows per micro-batch (the demo: 4)")
    parser.add_argument("--action-tokens", type=int, default=32, help="tokens of the first action")
    parser.add_argument("--repeats", type=int, default=5, help="timed steps per mode (alternating)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument(
        "--out", default=None, help="where results.json goes (default runs/bench_shared_prefix_value/<time>)"
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    model, tokenizer = load(args.tiny)
    model.train()
    head = torch.nn.Linear(model.config.hidden_size, 1)
    ids, mask, start = micro_batch(tokenizer, args.rows, args.action_tokens, seed=0)
    print(
        f"{args.rows} rows of {int(mask.sum(1).min())}-{ids.shape[1]} tokens, shared prompt {start} tokens; "
        f"{torch.get_num_threads()} thread(s)",
        flush=True,
    )
    grads = {mode: step(model, head, ids, mask, start, share) for mode, share in MODES.items()}  # warm-up
    gap = max_relative_gap(grads["shared"], grads["plain"])
    results: dict[str, Any] = {
        "rows": args.rows,
        "tokens": int(mask.sum()),
        "shared_prompt_tokens": start,
        "max_relative_grad_gap": gap,
        "threads": torch.get_num_threads(),
    }

    def run(mode: str) -> None:
        step(model, head, ids, mask, start, MODES[mode])

    results.update(time_alternating(run, list(MODES), args.repeats))
    results["speedup_median"] = results["plain"]["median_s"] / results["shared"]["median_s"]
    results["cpu_speedup_median"] = results["plain"]["cpu_median_s"] / results["shared"]["cpu_median_s"]
    print(
        f"speed-up (plain / shared): median {results['speedup_median']:.2f}x  CPU median "
        f"{results['cpu_speedup_median']:.2f}x; largest relative gradient gap {gap:.1e}"
    )
    write_results(results, args.out, "bench_shared_prefix_value")
    return 0 if gap < 1e-4 else 1


if __name__ == "__main__":
    raise SystemExit(main())
