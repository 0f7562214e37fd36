"""The TRL arm of ``benchmarks/bench.py``'s side-by-side section: ``trl.GRPOTrainer`` on CPU.

``python benchmarks/bench_trl.py SPEC.json OUT.json`` (run with an interpreter that has trl 1.16,
such as ``.venv-integrations/bin/python``; ``bench.py`` starts it) trains the arm ``SPEC.json``
describes (the same fields as the agent-r1 arm: task, model, steps, tasks per step, group size,
token budgets, learning rate) and writes its per-step records to ``OUT.json``.

How the settings map (agent-r1 | TRL):

* group size G | ``num_generations``; tasks per step x G | ``per_device_train_batch_size`` (one
  gradient-accumulation step, one generation per optimizer step);
* GRPO with the group std (+1e-4) | ``scale_rewards="group"``; token-mean aggregation |
  ``loss_type="dapo"`` (one process, one micro-batch: the same denominator); clip 0.2 without dual
  clipping | ``epsilon=0.2``; one optimizer step per batch | ``num_iterations=1``; no KL | ``beta=0``;
* constant learning rate, no warm-up, no weight decay, gradient norm clipped at 1.0;
* sampling at temperature 1 with ``top_p=1``, ``top_k=0``; ``max_new_tokens`` per action |
  ``generation_kwargs={"max_new_tokens": ...}``; the trajectory's budget after the prompt |
  ``max_completion_length``; ``max_turns`` actions | ``max_tool_calling_iterations = max_turns - 1``;
* the prompts in list order | ``shuffle_dataset=False``.

The single-turn task's reward is :func:`bench.text_reward` on the completion; the tool task's is
:meth:`bench.CodeBook.get_reward`, which TRL adds by itself for an ``environment_factory`` class.
Measured per step: wall time (between the ends of consecutive optimizer steps), the time in
``_generate_single_turn`` (every generation call, tool turns included), policy-sampled tokens
(``completion_mask`` x ``tool_mask``), the mean reward TRL logged, and the tool calls' wall time.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench  # the shared tasks, rewards and CodeBook (after the path is set)

TRL_LOG_KEYS = (
    "step",
    "loss",
    "grad_norm",
    "reward",
    "reward_std",
    "frac_reward_zero_std",
    "completions/mean_length",
    "completions/clipped_ratio",
    "tools/call_frequency",
    "tools/failure_frequency",
)
"""What is kept of TRL's per-step log (its own figures, next to ours)."""


def completion_text(completion: Any) -> str:
    """The assistant's text in a TRL completion (a string, or a list of messages)."""
    if isinstance(completion, str):
        return completion
    return "".join(str(m.get("content") or "") for m in completion if m.get("role") == "assistant")


def text_reward(completions: list[Any], answer: list[Any], **_: Any) -> list[float]:
    """:func:`bench.text_reward` as a TRL reward function."""
    return [bench.text_reward(completion_text(c), a) for c, a in zip(completions, answer, strict=True)]


def _set_response_parser(tokenizer: Any) -> None:
    """Hermes tool-call parsing for a ChatML template TRL does not recognise: the response
    template on transformers >= 5.13, the legacy schema (jmespath) below."""
    from trl import chat_template_utils as ctu

    if ctu._SUPPORTS_RESPONSE_TEMPLATE:
        tokenizer.response_template = ctu.qwen3_template
    else:
        tokenizer.response_schema = ctu.qwen3_schema


def run_trl_arm(spec: dict[str, Any]) -> dict[str, Any]:
    """Train the TRL arm of ``spec`` and return its per-step records (see the module docstring)."""
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    import torch

    torch.set_num_threads(int(spec.get("threads", 1)))
    started = time.perf_counter()
    rss_start = bench._rss_mib()
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    model_info = spec["model"]
    tools_task = spec["task"] == "tools"
    tokenizer = AutoTokenizer.from_pretrained(model_info["dir"])
    model = AutoModelForCausalLM.from_pretrained(model_info["dir"], dtype=torch.float32)
    if tools_task:
        if model_info.get("tools_template"):
            tokenizer.chat_template = model_info["tools_template"]
        _set_response_parser(tokenizer)
    tasks = bench.make_tasks(
        spec["task"], spec["num_tasks"], spec.get("seed", 0), prompt_words=spec.get("prompt_words", 0)
    )
    dataset = Dataset.from_list(
        [{"prompt": t["messages"], "answer": t["answer"], **t["metadata"]} for t in tasks]
    )

    class TimedGRPOTrainer(GRPOTrainer):  # type: ignore[misc]
        """GRPOTrainer that counts generation time and policy tokens (measurement only)."""

        bench_generation_s = 0.0
        bench_tokens = 0.0
        bench_trajectories = 0.0
        bench_prompt_tokens: list[float] = []

        def _generate_single_turn(self, *args: Any, **kwargs: Any) -> Any:
            begun = time.perf_counter()
            try:
                return super()._generate_single_turn(*args, **kwargs)
            finally:
                self.bench_generation_s += time.perf_counter() - begun

        def _generate_and_score_completions(self, inputs: Any) -> Any:
            output = super()._generate_and_score_completions(inputs)
            mask = output["completion_mask"]
            if output.get("tool_mask") is not None:
                mask = mask * output["tool_mask"]
            self.bench_tokens += float(mask.sum())
            self.bench_trajectories += float(mask.shape[0])
            self.bench_prompt_tokens.append(float(output["prompt_mask"].sum(dim=1).float().mean()))
            return output

    steps: list[dict[str, float]] = []

    class StepClock(TrainerCallback):  # type: ignore[misc]
        """One record per optimizer step, taken at its end."""

        last = 0.0

        def on_train_begin(self, *_: Any, **__: Any) -> None:
            StepClock.last = time.perf_counter()
            bench.CALLS.clear()

        def on_step_end(self, *_: Any, **__: Any) -> None:
            now = time.perf_counter()
            steps.append(
                {
                    "wall_s": now - StepClock.last,
                    "generation_s": trainer.bench_generation_s,
                    "generated_tokens": trainer.bench_tokens,
                    "trajectories": trainer.bench_trajectories,
                    "prompt_tokens_mean": trainer.bench_prompt_tokens[-1]
                    if trainer.bench_prompt_tokens
                    else float("nan"),
                    "tool_calls": float(len(bench.CALLS)),
                    "tool_wall_s": bench.interval_union(bench.CALLS),
                }
            )
            trainer.bench_generation_s = trainer.bench_tokens = trainer.bench_trajectories = 0.0
            bench.CALLS.clear()
            StepClock.last = time.perf_counter()

    batch = spec["tasks_per_step"] * spec["group_size"]
    options: dict[str, Any] = {
        "output_dir": tempfile.mkdtemp(prefix="bench-trl-"),
        "per_device_train_batch_size": batch,
        "gradient_accumulation_steps": 1,
        "num_generations": spec["group_size"],
        "max_completion_length": spec["max_completion"],
        "max_steps": spec["steps"],
        "learning_rate": spec["lr"],
        "lr_scheduler_type": "constant",
        "warmup_steps": 0,
        "weight_decay": 0.0,
        "max_grad_norm": 1.0,
        "beta": 0.0,
        "epsilon": 0.2,
        "loss_type": "dapo",
        "scale_rewards": "group",
        "num_iterations": 1,
        "temperature": spec.get("temperature", 1.0),
        "top_p": 1.0,
        "top_k": 0,
        "shuffle_dataset": False,
        "logging_steps": 1,
        "report_to": "none",
        "disable_tqdm": True,
        "use_cpu": True,
        "bf16": False,
        "save_strategy": "no",
        "seed": spec.get("seed", 0),
        "dataloader_num_workers": 0,
    }
    if tools_task:
        options["generation_kwargs"] = {"max_new_tokens": spec["max_new_tokens"]}
        options["max_tool_calling_iterations"] = spec.get("max_turns", 1) - 1
    trainer = TimedGRPOTrainer(
        model=model,
        processing_class=tokenizer,
        reward_funcs=None if tools_task else [text_reward],
        args=GRPOConfig(**options),
        train_dataset=dataset,
        callbacks=[StepClock()],
        environment_factory=functools.partial(bench.CodeBook, spec.get("tool_latency_s", 0.0))
        if tools_task
        else None,
    )
    load_s = time.perf_counter() - started
    rss_loaded = bench._rss_mib()
    trainer.train()
    logged = [entry for entry in trainer.state.log_history if "reward" in entry]
    for record, entry in zip(steps, logged, strict=False):
        record["reward_mean"] = float(entry["reward"])
        record["zero_variance_groups"] = float(entry.get("frac_reward_zero_std", float("nan")))
    for record in steps:
        record.setdefault("reward_mean", float("nan"))
        record.setdefault("zero_variance_groups", float("nan"))
    return {
        "arm": "trl",
        "load_s": load_s,
        "steps": steps,
        "rss_start_mib": rss_start,
        "rss_loaded_mib": rss_loaded,
        "peak_rss_mib": bench.peak_rss_mib(),
        "versions": bench.library_versions(),
        "optimizer": type(trainer.optimizer).__name__,
        "optim": str(trainer.args.optim),
        "trl_log": [{k: v for k, v in entry.items() if k in TRL_LOG_KEYS} for entry in logged],
    }


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("error: usage: bench_trl.py SPEC.json OUT.json (bench.py writes SPEC.json)", file=sys.stderr)
        return 2
    try:
        import trl  # noqa: F401
    except ImportError:
        print(
            f"error: trl is not installed for {sys.executable}; run it with .venv-integrations/bin/python "
            "(`make venv-integrations`)",
            file=sys.stderr,
        )
        return 2
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    spec = json.loads(Path(argv[0]).read_text(encoding="utf-8"))
    result = run_trl_arm(spec)
    Path(argv[1]).write_text(json.dumps(bench._jsonable(result), indent=1, default=str), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
