"""Time ``HFBackend.generate`` with and without prefix sharing on prompts that share a long prefix.

The prompts have the main job's shape: a system prompt and few-shot turns (about ``--prefix-tokens``
tokens, the same in every prompt), then a short task of its own. Each mode generates the same
greedy continuations; the script reports the best of ``--repeats`` timings of each and their ratio.

    .venv/bin/python benchmarks/bench_prefix_sharing.py                      # tiny random model
    .venv/bin/python benchmarks/bench_prefix_sharing.py --model smollm2-135m-instruct

``--model`` takes a checkpoint directory or a bundled model name (see
``agent_r1.models.paths.resolve_model_path``). Runs on one CPU thread unless ``--threads`` says
otherwise.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import torch

from agent_r1.builtins.hf_backend import HFBackend
from agent_r1.contracts import Generation, SamplingParams

SYSTEM = (
    "You are a careful assistant that solves arithmetic and lookup tasks. Think step by step, call "
    "the calculator tool for every computation, and give the final answer on its own line as "
    "'Answer: <number>'. Never guess: if a tool fails, say so and stop."
)
EXAMPLES = [
    ("What is 17 * 23?", "<tool_call>17 * 23</tool_call>\nThe tool says 391.\nAnswer: 391"),
    ("Add 1250 and 3775, then halve it.", "<tool_call>(1250 + 3775) / 2</tool_call>\nAnswer: 2512.5"),
    ("How many minutes are in 7 hours?", "<tool_call>7 * 60</tool_call>\nAnswer: 420"),
    ("A box holds 12 eggs. How many in 45 boxes?", "<tool_call>12 * 45</tool_call>\nAnswer: 540"),
    ("What is 2 to the power 10?", "<tool_call>2 ** 10</tool_call>\nAnswer: 1024"),
    ("Subtract 999 from 10000.", "<tool_call>10000 - 999</tool_call>\nAnswer: 9001"),
    ("What is 15% of 880?", "<tool_call>0.15 * 880</tool_call>\nAnswer: 132"),
    ("Divide 7.5 by 0.25.", "<tool_call>7.5 / 0.25</tool_call>\nAnswer: 30"),
]
ITEMS = ["apples", "tickets", "bolts", "books", "chairs", "lamps", "coins", "stamps"]


def build_prompts(tokenizer: Any, prefix_tokens: int, batch: int) -> tuple[list[list[int]], int]:
    """``batch`` distinct prompts sharing about ``prefix_tokens`` tokens; returns them and the length
    of their common prefix."""

    def render(examples: int, task: str) -> list[int]:
        messages = [{"role": "system", "content": SYSTEM}]
        for k in range(examples):
            question, answer = EXAMPLES[k % len(EXAMPLES)]
            messages += [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
        messages.append({"role": "user", "content": task})
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return list(tokenizer.encode(text, add_special_tokens=False))

    tasks = [
        f"A shop sells {3 + 7 * i} {ITEMS[i % len(ITEMS)]} a day"
        + " and restocks twice a week" * (i % 4)
        + f". How many {ITEMS[i % len(ITEMS)]} does it sell in {i + 2} weeks?"
        for i in range(batch)
    ]
    examples = 1
    while len(render(examples, "")) < prefix_tokens and examples < 64:
        examples += 1
    prompts = [render(examples, task) for task in tasks]
    common = 0
    while all(len(p) > common for p in prompts) and len({p[common] for p in prompts}) == 1:
        common += 1
    return prompts, common


def load(model_path: str | None) -> tuple[Any, Any, str]:
    if model_path is None:
        from agent_r1.testing.models import tiny_model, tiny_tokenizer

        tokenizer = tiny_tokenizer()
        return tiny_model(tokenizer, tie_word_embeddings=False, seed=0), tokenizer, "tiny random llama"
    from transformers import AutoModelForCausalLM

    from agent_r1.models.loading import load_tokenizer
    from agent_r1.models.paths import resolve_model_path

    directory = resolve_model_path(model_path)
    model = AutoModelForCausalLM.from_pretrained(str(directory), dtype=torch.float32).eval()
    return model, load_tokenizer(directory), str(directory)


def time_generate(
    backend: HFBackend, prompts: list[list[int]], sampling: SamplingParams
) -> tuple[float, list[Generation]]:
    started = time.perf_counter()
    generations = backend.generate(prompts, sampling)
    return time.perf_counter() - started, generations


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="checkpoint directory or bundled name (default: tiny random model)")
    parser.add_argument("--batch", type=int, default=16, help="distinct prompts per generate() call")
    parser.add_argument("--new-tokens", type=int, default=24, help="max new tokens per prompt")
    parser.add_argument("--prefix-tokens", type=int, default=300, help="approximate shared prefix length")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per mode (best is reported)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    model, tokenizer, name = load(args.model)
    prompts, common = build_prompts(tokenizer, args.prefix_tokens, args.batch)
    lengths = [len(p) for p in prompts]
    print(f"model: {name}")
    print(
        f"{len(prompts)} prompts of {min(lengths)}-{max(lengths)} tokens, common prefix {common} tokens; "
        f"{args.new_tokens} new tokens; {args.threads} thread(s)"
    )
    sampling = SamplingParams(temperature=0.0, max_new_tokens=args.new_tokens)
    backends = {
        "sharing": HFBackend({}, model=model, tokenizer=tokenizer),
        "no sharing": HFBackend({"prefix_sharing": False}, model=model, tokenizer=tokenizer),
    }
    times: dict[str, list[float]] = {mode: [] for mode in backends}
    results: dict[str, list[Generation]] = {}
    for backend in backends.values():  # warm-up
        time_generate(backend, prompts[:2], sampling)
    for _ in range(args.repeats):
        for mode, backend in backends.items():  # interleaved, so drifts in machine load hit both
            seconds, results[mode] = time_generate(backend, prompts, sampling)
            times[mode].append(seconds)
    for mode, backend in backends.items():
        stats = backend.last_stats
        print(
            f"{mode:>10}: best {min(times[mode]):7.3f} s  median {statistics.median(times[mode]):7.3f} s  "
            f"prefill tokens {stats['prefill_tokens']:6.0f}  generated {stats['generated_tokens']:4.0f}  "
            f"forward passes {stats['forward_passes']:3.0f}"
        )
    same, drift = 0, 0.0
    for shared, separate in zip(results["sharing"], results["no sharing"], strict=True):
        same += shared.token_ids == separate.token_ids
        for a, b, x, y in zip(
            shared.token_ids, separate.token_ids, shared.logprobs, separate.logprobs, strict=False
        ):
            drift = max(drift, abs(x - y))
            if a != b:  # continuations diverge (a near-tie): later logprobs are not comparable
                break
    print(f"identical continuations: {same}/{len(prompts)}; max |logprob difference| {drift:.2e}")
    ratio = min(times["no sharing"]) / min(times["sharing"])
    print(f"speed-up (no sharing / sharing, best times): {ratio:.2f}x")


if __name__ == "__main__":
    main()
