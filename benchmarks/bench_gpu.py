"""Rollout and training throughput on a GPU, with MFU: agent-r1 against plain transformers.

The model is random-initialised with Qwen2.5-0.5B's shape (24 layers, hidden 896, 14 query and 2
key/value heads, MLP 4864, vocabulary 151,936, tied embeddings), in bfloat16 on the GPU, with
transformers' default attention (sdpa). Two comparisons, each in this one process, the two arms
alternating so that clock and thermal drift hit both:

* **Rollout**: ``tasks x group`` rows (GRPO groups: each prompt of ``--prompt`` random tokens is
  sampled ``group`` times), ``--new`` tokens each, temperature 1, no top-k/top-p. agent-r1's ``hf``
  backend (``HFBackend.generate``, one forward pass per row batch, each distinct prompt prefilled
  once) against ``model.generate`` on the same rows. Generated tokens per second.
* **Training**: one optimizer step on those rows (prompt plus action, the action's tokens carrying
  loss). agent-r1's ``update`` (GRPO advantages from a random 0/1 reward, token-mean clipped
  policy loss, micro-batches of ``--micro`` rows, AdamW, gradient clipping) against a plain step
  written the way one would without a framework (full-vocabulary logits at every position,
  log-softmax, gather, the same loss and AdamW). Tokens (prompt plus action) per second.

MFU (model FLOPs utilisation, after PaLM, arXiv 2204.02311, appendix B) divides the FLOPs the
model needs for the work by the time taken and the chip's peak dense bf16 rate: per token,
``2 x (weights of every linear layer, the output head included)`` plus ``4 x layers x attended
positions x (heads x head size)`` for attention, forward only for generation (each row's prompt
once, then every generated token at its position) and three times that for a training step. Both
arms are charged the same FLOPs for the same work, so sharing a prompt's prefill across its group
shows as a higher MFU. The peak is NVIDIA's datasheet figure for the chip (989.4 TFLOP/s for
H100 SXM and H200, without sparsity) or ``--peak-tflops``.

* **Sharding** (``--sections sharding``): agent-r1's ``update`` with ``trainer.sharding: fsdp2``
  (one process: FSDP2 units, gathers and the sharded optimizer, nothing split) against the same
  update unsharded, each on its own copy of the model; then, on the sharded session, the
  checkpoint state gathered (``Session.state_dict``), the export copy (``Session.exportable``)
  and one ``hf`` rollout of every row from the gathered policy. Tokens per second and peak memory.

* **Packing** (``--sections packing``): one update on a long-tailed batch of multi-turn
  trajectories (``benchmarks/bench_packing.py``'s: 16 rows of 200 to 8,000 tokens) padded in
  micro-batches of 2 rows, grouped by a token budget of 8,192, and packed within that budget
  (``sdpa_varlen``, and transformers' block-diagonal ``sdpa`` mask); then padded in micro-batches
  of 4 on its own (it may not fit). Tokens per second, peak memory, padding share; and the largest
  difference between the packed and padded log-probabilities of the same rows (bf16, and the
  same check on a small float32 model).

    python benchmarks/bench_gpu.py                 # the Qwen2.5-0.5B shape, bf16, on the GPU
    python benchmarks/bench_gpu.py --sections sharding   # the FSDP2 check alone
    python benchmarks/bench_gpu.py --smoke         # a tiny shape in fp32 on the CPU (the tests run it)

Writes ``results.json`` and ``results.md`` to ``--out`` (default ``runs/bench_gpu/<time>``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

QWEN25_05B = {
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "vocab_size": 151936,
    "max_position_embeddings": 32768,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
}
TINY = {**QWEN25_05B, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2}
TINY.update(num_attention_heads=4, num_key_value_heads=2, vocab_size=1024, max_position_embeddings=2048)

PEAK_BF16_TFLOPS = {"H200": 989.4, "H100 80GB HBM3": 989.4, "H100 SXM": 989.4, "H100 PCIe": 756.0}
"""Dense bf16 tensor-core peaks from NVIDIA's H100/H200 datasheets (TFLOP/s, no sparsity)."""


# --------------------------------------------------------------------------------------------
# Model, rows and FLOPs
# --------------------------------------------------------------------------------------------


def build_model(shape: dict[str, Any], device: torch.device, dtype: torch.dtype, seed: int) -> Any:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(**shape)
    with torch.device(device):
        model = Qwen2ForCausalLM(config).to(dtype)
    model.generation_config.eos_token_id = None  # random weights: let every row run its length
    return model.eval()


def linear_weights(model: Any) -> int:
    """Weights of every linear layer, the output head included (tied or not)."""
    return sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))


def forward_flops(model: Any, start: int, stop: int) -> float:
    """FLOPs of one forward pass over positions ``start .. stop - 1`` of a row (each position
    attending to itself and every earlier one)."""
    config = model.config
    width = config.num_attention_heads * (config.hidden_size // config.num_attention_heads)
    tokens = stop - start
    attended = (start + 1 + stop) * tokens / 2  # sum of (position + 1) over the positions
    return 2.0 * linear_weights(model) * tokens + 4.0 * config.num_hidden_layers * width * attended


def make_prompts(tasks: int, group: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    distinct = torch.randint(3, vocab, (tasks, length), generator=generator).tolist()
    return [prompt for prompt in distinct for _ in range(group)]


def peak_tflops(device: torch.device, override: float | None) -> tuple[float | None, str]:
    if override:
        return override, "--peak-tflops option"
    if device.type != "cuda":
        return None, "no GPU: no MFU"
    name = torch.cuda.get_device_name(device)
    for key, value in PEAK_BF16_TFLOPS.items():
        if key in name:
            return value, f"datasheet of the {name}"
    return None, f"unknown chip {name!r}: pass --peak-tflops"


# --------------------------------------------------------------------------------------------
# Timing
# --------------------------------------------------------------------------------------------


def bench_registry() -> Any:
    """The process's registry with agent-r1's builtins (registered by hand when agent-r1 is
    imported from a source tree, not installed) and the toy plugin, each once."""
    import agent_r1.builtins
    import agent_r1.testing.toy as toy
    from agent_r1.registry import get_registry

    registry = get_registry()
    registry.load()
    loaded = {p.name for p in registry.plugins() if p.status != "broken"}
    if "builtins" not in loaded:
        registry.register_plugin(agent_r1.builtins, "builtins", distribution="agent-r1")
    if "toy" not in loaded:
        registry.register_plugin(toy, "toy", distribution="agent-r1-bench")
    return registry


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@contextlib.contextmanager
def peak_memory(device: torch.device, into: dict[str, float]) -> Iterator[None]:
    """Peak GPU memory allocated inside the block (GiB), the running maximum kept in ``into``."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    yield
    if device.type == "cuda":
        peak = torch.cuda.max_memory_allocated(device) / 2**30
        into["peak_gib"] = max(into.get("peak_gib", 0.0), peak)


def alternate(
    arms: dict[str, Callable[[], float]], repeats: int, device: torch.device
) -> dict[str, dict[str, Any]]:
    """Run each arm once untimed, then ``repeats`` times alternating (order reversed every other
    round); each call returns the work units it did (tokens). Median seconds and units/s per arm."""
    names = list(arms)
    times: dict[str, list[float]] = {name: [] for name in names}
    units: dict[str, list[float]] = {name: [] for name in names}
    memory: dict[str, dict[str, float]] = {name: {} for name in names}
    for name in names:  # warm-up: kernels, allocator, autotuning
        arms[name]()
    for repeat in range(repeats):
        for name in names if repeat % 2 == 0 else names[::-1]:
            sync(device)
            with peak_memory(device, memory[name]):
                started = time.perf_counter()
                done = arms[name]()
                sync(device)
                times[name].append(time.perf_counter() - started)
            units[name].append(done)
    results: dict[str, dict[str, Any]] = {}
    for name in names:
        seconds = statistics.median(times[name])
        results[name] = {
            "median_s": seconds,
            "times_s": times[name],
            "units": statistics.median(units[name]),
            "units_per_s": statistics.median(u / t for u, t in zip(units[name], times[name], strict=True)),
            **memory[name],
        }
    return results


# --------------------------------------------------------------------------------------------
# Rollout arms
# --------------------------------------------------------------------------------------------


def rollout_section(
    model: Any, tokenizer: Any, args: argparse.Namespace, device: torch.device
) -> dict[str, Any]:
    from agent_r1.builtins.hf_backend import HFBackend
    from agent_r1.contracts import SamplingParams

    prompts = make_prompts(args.tasks, args.group, args.prompt, model.config.vocab_size, args.seed)
    rows = len(prompts)
    backend = HFBackend({"max_batch_size": rows}, model=model, tokenizer=tokenizer)
    sampling = SamplingParams(temperature=1.0, max_new_tokens=args.new, seed=args.seed)
    ids = torch.tensor(prompts, device=device)  # [B, P]: every prompt has the same length
    mask = torch.ones_like(ids)
    pad = int(tokenizer.pad_token_id or 0)

    def agent_r1() -> float:
        generations = backend.generate(prompts, sampling)
        backend.end_rollout()
        return float(sum(len(g.token_ids) for g in generations))

    def plain() -> float:
        with torch.no_grad():
            out = model.generate(
                input_ids=ids,
                attention_mask=mask,
                do_sample=True,
                temperature=1.0,
                top_k=0,
                top_p=1.0,
                max_new_tokens=args.new,
                pad_token_id=pad,
            )
        return float((out.shape[1] - ids.shape[1]) * rows)

    results = alternate({"agent-r1 hf backend": agent_r1, "model.generate": plain}, args.repeats, device)
    flops = rows * forward_flops(model, 0, args.prompt + args.new)  # each row: its prompt, then its tokens
    peak, _ = peak_tflops(device, args.peak_tflops)
    for arm in results.values():
        arm["tokens_per_s"] = arm.pop("units_per_s")
        arm["generated_tokens"] = arm.pop("units")
        arm["mfu"] = flops / arm["median_s"] / (peak * 1e12) if peak else None
    results["speedup"] = results["model.generate"]["median_s"] / results["agent-r1 hf backend"]["median_s"]
    results["rows"] = rows
    results["model_tflop_per_rollout"] = flops / 1e12
    return results


# --------------------------------------------------------------------------------------------
# Training arms
# --------------------------------------------------------------------------------------------


def trajectories(prompts: Sequence[list[int]], args: argparse.Namespace, vocab: int) -> list[Any]:
    from agent_r1.mdp import RewardSignal, TokenSource, Trajectory

    generator = torch.Generator().manual_seed(args.seed + 1)
    out = []
    for i, prompt in enumerate(prompts):
        task = i // args.group
        trajectory = Trajectory(
            id=f"t{i}", task_id=f"task{task}", group_id=f"g{task}", sample_index=i % args.group
        )
        action = torch.randint(3, vocab, (args.new,), generator=generator).tolist()
        trajectory.append(TokenSource.PROMPT, 0, prompt)
        trajectory.append(TokenSource.POLICY, 0, action, [-1.0] * len(action))
        trajectory.rewards.append(
            RewardSignal(name="answer_match", value=float(torch.rand((), generator=generator) < 0.5))
        )
        out.append(trajectory)
    return out


def run_config(args: argparse.Namespace, run_dir: Path, device: torch.device) -> dict[str, Any]:
    return {
        "seed": args.seed,
        "output_dir": str(run_dir),
        "model": {"path": str(run_dir / "unused-model"), "device": str(device)},
        "data": {"name": "toy_target", "num_train": args.tasks, "num_eval": 1},
        "environment": {"name": "toy_single_turn"},
        "rollout": {
            "group_size": args.group,
            "max_turns": 1,
            "max_new_tokens": args.new,
            "max_context": args.prompt + args.new + 8,
            "temperature": 1.0,
        },
        "rewards": [{"name": "target_char", "weight": 1.0}],
        "algorithm": {"name": "grpo"},
        "trainer": {"steps": 1, "tasks_per_step": args.tasks, "micro_batch_size": args.micro, "lr": 1e-6},
        "eval": {"num_tasks": 1, "before_training": False},
        "trackers": [],
    }


def training_section(
    model: Any, tokenizer: Any, args: argparse.Namespace, device: torch.device
) -> dict[str, Any]:
    import agent_r1.builtins
    from agent_r1.config import RunConfig, validate_components
    from agent_r1.engine import build_session
    from agent_r1.engine.update import update
    from agent_r1.registry import Registry, reset_registry

    registry = bench_registry()
    run_dir = Path(args.out) / "session"
    run = RunConfig.model_validate(run_config(args, run_dir, device))
    session = build_session(
        run, validate_components(run, registry), run_dir, registry=registry, model=model, tokenizer=tokenizer
    )
    vocab = model.config.vocab_size
    prompts = make_prompts(args.tasks, args.group, args.prompt, vocab, args.seed)
    last: dict[str, float] = {}
    runs = args.repeats + 1 + int(args.profile)
    batches = [trajectories(prompts, args, vocab) for _ in range(runs)]  # built untimed

    def agent_r1() -> float:
        batch = batches.pop()
        metrics = update(session, batch)
        last.update({k: float(v) for k, v in metrics.items() if k.startswith("time/")})
        return float(sum(len(t) for t in batch))

    # the plain step's tensors, collated once outside the timed region (its collation is free)
    rows = trajectories(prompts, args, vocab)
    ids = torch.tensor([t.token_ids for t in rows], device=device)  # [B, T]: equal lengths, no padding
    loss_mask = torch.zeros_like(ids, dtype=torch.bool)
    loss_mask[:, args.prompt :] = True
    rewards = torch.tensor([t.rewards[0].value for t in rows], device=device).view(args.tasks, args.group)
    advantages = ((rewards - rewards.mean(1, keepdim=True)) / (rewards.std(1, keepdim=True) + 1e-6)).view(-1)
    t = run.trainer
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=t.lr, betas=t.betas, weight_decay=t.weight_decay)

    def plain() -> float:
        model.train()
        optimizer.zero_grad(set_to_none=True)
        total = loss_mask[:, 1:].sum()
        for start in range(0, len(ids), args.micro):
            part = slice(start, start + args.micro)
            logits = model(input_ids=ids[part]).logits[:, :-1].float()  # [b, T-1, V]
            logprobs = torch.log_softmax(logits, -1).gather(-1, ids[part, 1:, None]).squeeze(-1)
            weight = loss_mask[part, 1:] * advantages[part, None]
            loss = -(logprobs * weight).sum() / total  # on-policy: the clipped ratio is 1
            loss.backward()
        torch.nn.utils.clip_grad_norm_(params, t.grad_clip)
        optimizer.step()
        model.eval()
        return float(ids.numel())

    arms = {"agent-r1 update": agent_r1, "plain step": plain}
    results: dict[str, Any] = alternate(arms, args.repeats, device)
    if args.profile:
        for name, arm in arms.items():
            write_profile(arm, device, Path(args.out) / f"profile_{name.split()[0]}.txt")
    flops = 3 * len(prompts) * forward_flops(model, 0, args.prompt + args.new)
    peak, _ = peak_tflops(device, args.peak_tflops)
    for arm in results.values():
        arm["tokens_per_s"] = arm.pop("units_per_s")
        arm["tokens"] = arm.pop("units")
        arm["mfu"] = flops / arm["median_s"] / (peak * 1e12) if peak else None
    results["agent-r1 update"]["split_s"] = last
    results["speedup"] = results["plain step"]["median_s"] / results["agent-r1 update"]["median_s"]
    results["rows"] = len(prompts)
    results["model_tflop_per_step"] = flops / 1e12
    session.close()
    reset_registry(Registry())
    return results


def write_profile(arm: Callable[[], float], device: torch.device, path: Path) -> None:
    """One more run of ``arm`` under torch's profiler; its operators by own device (or CPU) time."""
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as profiler:
        started = time.perf_counter()
        arm()
        sync(device)
        wall = time.perf_counter() - started
    averages = profiler.key_averages()
    kernels = [e for e in averages if e.device_type == torch.autograd.DeviceType.CUDA]  # not their ops
    busy = sum(e.self_device_time_total for e in kernels) / 1e6
    syncs = sum(e.count for e in averages if e.key in ("aten::item", "aten::_local_scalar_dense"))
    header = (
        f"wall {wall:.3f} s (under the profiler); device kernels {busy:.3f} s; aten::item calls {syncs}\n"
    )
    table = averages.table(
        sort_by="self_cuda_time_total" if cuda else "self_cpu_time_total",
        row_limit=30,
        max_name_column_width=60,
    )
    path.write_text(header + table, encoding="utf-8")
    print(header.strip())
    print(f"wrote {path}")


# --------------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------------


def markdown(results: dict[str, Any]) -> str:
    setup = results["setup"]
    lines = [
        f"Device: {setup['device_name']}; torch {setup['torch']}, transformers {setup['transformers']}; "
        f"{setup['shape']} ({setup['parameters'] / 1e6:.0f} M parameters), {setup['dtype']}; "
        f"{setup['rows']} rows ({setup['tasks']} prompts x {setup['group']}), prompt {setup['prompt']} "
        f"+ {setup['new']} new tokens; training micro-batches of {setup['micro']} rows; peak "
        f"{setup['peak_tflops'] or '-'} TFLOP/s, from the {setup['peak_source']}; median of "
        f"{setup['repeats']} alternating runs after one warm-up.",
        "",
        "| section | arm | median s | tokens/s | MFU | peak GPU memory GiB |",
        "| --- | --- | ---: | ---: | ---: | ---: |",
    ]
    for section in ("rollout", "training", "sharding", "packing"):
        for arm, row in results.get(section, {}).items():
            if not isinstance(row, dict) or "median_s" not in row:
                continue
            mfu = f"{100 * row['mfu']:.1f}%" if row.get("mfu") is not None else "-"
            memory = f"{row['peak_gib']:.1f}" if "peak_gib" in row else "-"
            speed = f"{row['tokens_per_s']:,.0f}"
            lines.append(f"| {section} | {arm} | {row['median_s']:.3f} | {speed} | {mfu} | {memory} |")
    lines += [
        "",
        f"Rollout: agent-r1 / model.generate speed-up {results['rollout']['speedup']:.2f}x; "
        f"training: agent-r1 / plain step speed-up {results['training']['speedup']:.2f}x.",
    ]
    if "sharding" in results:
        sharding = results["sharding"]
        session = sharding["sharded session"]
        lines.append(
            f"Sharding (FSDP2, one process): update {sharding['step_time_ratio']:.2f}x the unsharded "
            f"update's time ({sharding['update, sharding fsdp2']['tokens_per_s']:,.0f} vs "
            f"{sharding['update, unsharded']['tokens_per_s']:,.0f} tokens/s); checkpoint gather "
            f"{session['checkpoint_gather_s']:.2f} s, export copy {session['export_copy_s']:.2f} s, "
            f"hf rollout {session['rollout_tokens_per_s']:,.0f} tokens/s."
        )
    if "packing" in results and "packed, sdpa_varlen" in results["packing"]:
        packing = results["packing"]
        padded, packed = packing["padded, 2 rows"], packing["packed, sdpa_varlen"]
        four = packing.get("padded, 4 rows", {})
        lengths = packing["lengths"]
        speed = packed["tokens_per_s"] / padded["tokens_per_s"]
        memory = packed.get("peak_gib", 0) / max(padded.get("peak_gib", 1e-9), 1e-9)
        four_text = four.get("error") or f"{four.get('peak_gib', 0):.1f} GiB"
        exact = ", ".join(f"{k} {v:.1e}" for k, v in packing["exactness"].items())
        lines.append(
            f"Packing ({len(lengths)} rows of {min(lengths)}-{max(lengths)} tokens): packed {speed:.2f}x "
            f"the tokens/s of padded micro-batches of 2 at {memory:.0%} of its peak memory; padding share "
            f"{padded['padding_share']:.0%} -> {packed['padding_share']:.0%}; padded micro-batches of 4: "
            f"{four_text}; largest |packed - padded| log-probability: {exact}."
        )
    if "async" in results and "speedup" in results["async"]:
        sync_row, async_row = results["async"]["sync"], results["async"]["async"]
        lines.append(
            f"Asynchronous rollouts (max_staleness 1, multi-turn toy task with tool waits): "
            f"{results['async']['speedup']:.2f}x the speed of sync ({async_row['step_s']:.2f} vs "
            f"{sync_row['step_s']:.2f} s per step); trainer idle {async_row['trainer_idle_share']:.0%}."
        )
    split = results["training"]["agent-r1 update"].get("split_s", {})
    if split:
        lines.append(
            "agent-r1 update, last step: "
            + ", ".join(
                f"{k.removeprefix('time/').removesuffix('_s')} {v:.3f} s" for k, v in sorted(split.items())
            )
        )
    return "\n".join(lines) + "\n"


def sharding_section(
    shape: dict[str, Any], tokenizer: Any, args: argparse.Namespace, device: torch.device, dtype: torch.dtype
) -> dict[str, Any]:
    """The update with ``trainer.sharding: fsdp2`` against the unsharded update, then the sharded
    session's checkpoint gather, export copy and one rollout (see the module docstring)."""
    from agent_r1.config import RunConfig, validate_components
    from agent_r1.contracts import SamplingParams
    from agent_r1.engine import build_session
    from agent_r1.engine.update import update
    from agent_r1.registry import Registry, reset_registry

    registry = bench_registry()
    vocab = int(shape["vocab_size"])
    prompts = make_prompts(args.tasks, args.group, args.prompt, vocab, args.seed)
    sessions = {}
    for mode in ("fsdp2", "none"):
        run_dir = Path(args.out) / f"session-{mode}"
        raw = run_config(args, run_dir, device)
        raw["trainer"]["sharding"] = mode
        raw["model"]["dtype"] = str(dtype).removeprefix("torch.")
        run = RunConfig.model_validate(raw)
        model = build_model(shape, device, dtype, args.seed)
        sessions[mode] = build_session(
            run,
            validate_components(run, registry),
            run_dir,
            registry=registry,
            model=model,
            tokenizer=tokenizer,
        )

    def arm(mode: str) -> Callable[[], float]:
        def step() -> float:
            batch = trajectories(prompts, args, vocab)
            update(sessions[mode], batch)
            return float(sum(len(t) for t in batch))

        return step

    results: dict[str, Any] = alternate(
        {"update, sharding fsdp2": arm("fsdp2"), "update, unsharded": arm("none")}, args.repeats, device
    )
    for row in results.values():
        row["tokens_per_s"] = row.pop("units_per_s")
        row["tokens"] = row.pop("units")
    sharded = sessions["fsdp2"]
    timings: dict[str, float] = {}
    memory: dict[str, float] = {}
    with peak_memory(device, memory):
        for name, call in (
            ("checkpoint_gather_s", sharded.state_dict),
            ("export_copy_s", sharded.exportable),
        ):
            sync(device)
            started = time.perf_counter()
            call()
            sync(device)
            timings[name] = time.perf_counter() - started
        sampling = SamplingParams(temperature=1.0, max_new_tokens=args.new, seed=args.seed)
        started = time.perf_counter()
        with sharded.rollout_weights(), torch.no_grad():
            generations = sharded.backend.generate(prompts, sampling)
        sync(device)
        timings["rollout_s"] = time.perf_counter() - started
    timings["rollout_tokens_per_s"] = sum(len(g.token_ids) for g in generations) / timings["rollout_s"]
    results["sharded session"] = {**timings, **memory}
    results["step_time_ratio"] = (
        results["update, sharding fsdp2"]["median_s"] / results["update, unsharded"]["median_s"]
    )
    for session in sessions.values():
        session.close()
    reset_registry(Registry())
    return results


def packing_section(
    shape: dict[str, Any], tokenizer: Any, args: argparse.Namespace, device: torch.device, dtype: torch.dtype
) -> dict[str, Any]:
    """Padded, token-budget and packed updates on a long-tailed multi-turn batch (see the module
    docstring), then the exactness of the packed forward pass on this device."""
    from bench_packing import long_tailed_lengths
    from bench_packing import trajectories as long_trajectories

    from agent_r1.config import RunConfig, validate_components
    from agent_r1.engine import build_session
    from agent_r1.engine.update import update
    from agent_r1.registry import Registry, reset_registry

    registry = bench_registry()
    shortest, longest = (20, 200) if args.smoke else (200, 8000)
    lengths = long_tailed_lengths(16, shortest, longest)
    budget = 8192 if not args.smoke else 256
    layouts = {
        "padded, 2 rows": {"micro_batch_size": 2},
        "token budget": {"max_tokens_per_micro_batch": budget},
        "packed, sdpa_varlen": {"max_tokens_per_micro_batch": budget, "packing": True},
        "packed, sdpa block mask": {"max_tokens_per_micro_batch": budget, "packing": True},
        "padded, 4 rows": {"micro_batch_size": 4},
    }

    def session_for(name: str) -> Any:
        run_dir = Path(args.out) / f"session-{name.replace(' ', '').replace(',', '-')}"
        raw = run_config(args, run_dir, device)
        raw["model"]["dtype"] = str(dtype).removeprefix("torch.")
        raw["rollout"]["max_context"] = max(lengths)
        raw["trainer"] = {**raw["trainer"], "tasks_per_step": 4, "skip_idle_rows": False, **layouts[name]}
        run = RunConfig.model_validate(raw)
        model = build_model(shape, device, dtype, args.seed)
        session = build_session(
            run,
            validate_components(run, registry),
            run_dir,
            registry=registry,
            model=model,
            tokenizer=tokenizer,
        )
        if name.endswith("block mask"):  # transformers' own packed-sequence mask instead
            for module in session.unwrapped.modules():
                config = getattr(module, "config", None)
                if getattr(config, "_attn_implementation", None) == "sdpa_varlen":
                    config._attn_implementation = "sdpa"
        return session

    results: dict[str, Any] = {"lengths": lengths}
    results["exactness"] = packing_exactness(shape, tokenizer, lengths, device, dtype, args.seed)
    print(json.dumps({"packing exactness": results["exactness"]}), flush=True)
    shares: dict[str, float] = {}
    for name in layouts:  # one session at a time: an arm that runs out of memory is recorded
        try:
            session = session_for(name)

            def step(session: Any = session, name: str = name) -> float:
                metrics = update(session, long_trajectories(tokenizer, lengths))
                shares[name] = metrics["batch/padding_share"]
                return float(sum(lengths))

            row = alternate({name: step}, args.repeats, device)[name]
            row["tokens_per_s"], row["tokens"] = row.pop("units_per_s"), row.pop("units")
            row["padding_share"] = shares[name]
            session.close()
            del session
        except torch.OutOfMemoryError as exc:
            row = {"error": f"out of memory: {str(exc).splitlines()[0][:200]}"}
        results[name] = row
        print(json.dumps({name: row}, default=str), flush=True)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    reset_registry(Registry())
    return results


def packing_exactness(
    shape: dict[str, Any],
    tokenizer: Any,
    lengths: list[int],
    device: torch.device,
    dtype: torch.dtype,
    seed: int,
) -> dict[str, float]:
    """The largest |packed - padded| log-probability over the policy tokens of the batch: padded
    in micro-batches of 2 rows against packed within a budget of 8,192 tokens (no-grad passes), on
    the benchmark's model in its dtype and on a small float32 model."""
    from bench_packing import trajectories as long_trajectories

    from agent_r1.engine.learner.batch import collate
    from agent_r1.engine.learner.packing import MicroBatching, no_grad_logprobs, prepare_packing

    out: dict[str, float] = {}
    small = {**shape, "hidden_size": 128, "intermediate_size": 512, "num_hidden_layers": 2,
             "num_attention_heads": 4, "num_key_value_heads": 2}  # fmt: skip
    batch = collate(long_trajectories(tokenizer, lengths), int(tokenizer.pad_token_id)).to(device)
    for name, model_shape, model_dtype in (("model", shape, dtype), ("small_fp32", small, torch.float32)):
        model = build_model(model_shape, device, model_dtype, seed)
        attention = prepare_packing(model)
        padded = no_grad_logprobs(model, batch, 1.0, MicroBatching(rows=2))
        packed = no_grad_logprobs(
            model, batch, 1.0, MicroBatching(max_tokens=max(8192, max(lengths)), packed=True)
        )
        out[f"{name}_{attention}_max_abs_diff"] = float((packed - padded)[batch.loss_mask].abs().max())
        del model
    return out


def async_section(
    shape: dict[str, Any], tokenizer: Any, args: argparse.Namespace, device: torch.device, dtype: torch.dtype
) -> dict[str, Any]:
    """Sync against ``rollout.mode: async`` (max_staleness 1): training steps on the multi-turn toy
    task (3 turns, log-normal tool waits of median 0.3 s), the ``hf`` backend; wall time per step,
    generated tokens per second over the whole loop, and idle shares."""
    import math

    from agent_r1.config import RunConfig, validate_components
    from agent_r1.engine import build_session, train_step
    from agent_r1.registry import Registry, reset_registry

    registry = bench_registry()
    steps = 2 if args.smoke else 5
    latency = 0.0 if args.smoke else 0.3
    results: dict[str, Any] = {}
    for mode, staleness in (("sync", 0), ("async", 1)):
        run_dir = Path(args.out) / f"session-async-{mode}"
        raw = run_config(args, run_dir, device)
        raw["model"]["dtype"] = str(dtype).removeprefix("torch.")
        raw["environment"] = {"name": "toy_multi_turn", "turns": 3, "latency_s": latency,
                              "latency_sigma": math.log(10) / 2.326}  # fmt: skip
        raw["rollout"].update(
            max_turns=3, mode=mode, max_staleness=staleness, max_context=512, max_new_tokens=64
        )
        raw["trainer"].update(steps=steps, tasks_per_step=min(args.tasks, 8))
        run = RunConfig.model_validate(raw)
        session = build_session(
            run, validate_components(run, registry), run_dir, registry=registry,
            model=build_model(shape, device, dtype, args.seed), tokenizer=tokenizer,
        )  # fmt: skip
        sync(device)
        started = time.perf_counter()
        metrics = [train_step(session).metrics for _ in range(steps)]
        sync(device)
        wall = time.perf_counter() - started
        session.close()
        generated = sum(m.get("rollout/generated_tokens", 0.0) for m in metrics)
        results[mode] = {
            "wall_s": wall,
            "step_s": wall / steps,
            "generated_tokens_per_s": generated / wall,
            "trainer_idle_share": sum(m.get("async/trainer_idle_share", 0.0) for m in metrics) / steps,
            "rollout_idle_share": sum(m.get("async/rollout_idle_share", 0.0) for m in metrics) / steps,
            "staleness_max": max(m.get("async/staleness_max", 0.0) for m in metrics),
            "partial_share": sum(m.get("async/partial_share", 0.0) for m in metrics) / steps,
        }
        print(json.dumps({f"async section, {mode}": results[mode]}), flush=True)
        del session
        if device.type == "cuda":
            torch.cuda.empty_cache()
    results["speedup"] = results["sync"]["wall_s"] / results["async"]["wall_s"]
    reset_registry(Registry())
    return results


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny shape, fp32, CPU, few tokens")
    parser.add_argument("--tasks", type=int, default=16, help="distinct prompts")
    parser.add_argument("--group", type=int, default=8, help="samples per prompt")
    parser.add_argument("--prompt", type=int, default=512, help="prompt tokens")
    parser.add_argument("--new", type=int, default=512, help="generated (action) tokens per row")
    parser.add_argument("--micro", type=int, default=16, help="rows per training micro-batch")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per arm, alternating")
    parser.add_argument(
        "--sections", default="rollout,training,sharding,packing,async", help="comma-separated"
    )
    parser.add_argument("--peak-tflops", type=float, default=None, help="the chip's peak, for MFU")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--profile", action="store_true", help="profile one more step of each training arm")
    parser.add_argument(
        "--from-json", default=None, help="rewrite the Markdown of a results.json (beside it)"
    )
    parser.add_argument("--out", default=None, help="results folder (default runs/bench_gpu/<time>)")
    args = parser.parse_args(argv)
    if args.smoke:
        args.tasks, args.group, args.prompt, args.new, args.micro, args.repeats = 2, 2, 12, 6, 2, 1
    args.out = args.out or f"runs/bench_gpu/{time.strftime('%Y%m%d-%H%M%S')}"
    return args


def main(argv: Sequence[str] | None = None) -> int:
    import transformers

    from agent_r1.testing.models import tiny_tokenizer

    args = parse_args(argv)
    if args.from_json:
        source = Path(args.from_json)
        report = source.with_suffix(".md")
        report.write_text(markdown(json.loads(source.read_text(encoding="utf-8"))), encoding="utf-8")
        print(f"wrote {report}")
        return 0
    device = torch.device("cpu" if args.smoke or not torch.cuda.is_available() else "cuda")
    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    shape = TINY if args.smoke else QWEN25_05B
    model = build_model(shape, device, dtype, args.seed)
    tokenizer = tiny_tokenizer()  # token ids are random: only the pad and stop ids are read
    peak, source = peak_tflops(device, args.peak_tflops)
    results: dict[str, Any] = {
        "setup": {
            "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU",
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "shape": "tiny Qwen2" if args.smoke else "Qwen2.5-0.5B shape, random weights",
            "parameters": sum(p.numel() for p in model.parameters()),
            "dtype": str(dtype).removeprefix("torch."),
            "rows": args.tasks * args.group,
            **{k: getattr(args, k) for k in ("tasks", "group", "prompt", "new", "micro", "repeats")},
            "peak_tflops": peak,
            "peak_source": source,
        }
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    sections = {s.strip() for s in args.sections.split(",") if s.strip()}
    if "rollout" in sections:
        results["rollout"] = rollout_section(model, tokenizer, args, device)
        print(json.dumps(results["rollout"], default=str), flush=True)
    if "training" in sections:
        results["training"] = training_section(model, tokenizer, args, device)
        print(json.dumps(results["training"], default=str), flush=True)
    for name, section in (
        ("packing", packing_section),
        ("sharding", sharding_section),
        ("async", async_section),
    ):
        if name in sections:
            try:
                results[name] = section(shape, tokenizer, args, device, dtype)
            except Exception as exc:  # one section's failure is reported, the others' results kept
                results[name] = {"error": f"{type(exc).__name__}: {exc}"}
            print(json.dumps(results[name], default=str), flush=True)
            (out / "results.json").write_text(json.dumps(results, indent=2), encoding="utf-8")
    (out / "results.json").write_text(json.dumps(results, indent=2), encoding="utf-8")
    if {"rollout", "training"} <= sections:
        (out / "results.md").write_text(markdown(results), encoding="utf-8")
        print(markdown(results))
    print(f"wrote {out / 'results.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
