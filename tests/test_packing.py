"""Token-budget micro-batches and padding-free packing: the plan, exactness against the padded
path (log-probabilities, entropies, hidden states, values, gradients, whole updates), the guard
that refuses a model whose attention crosses trajectories, and the layout metrics."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
import torch
from trainer_helpers import fixed_trajectories, toy_config

from agent_r1.config import RunConfig, validate_components
from agent_r1.engine.learner.batch import collate, policy_forward
from agent_r1.engine.learner.critic import ValueHead, critic_values
from agent_r1.engine.learner.packing import (
    MicroBatching,
    check_packing,
    equalize,
    no_grad_logprobs,
    packed_forward,
)
from agent_r1.engine.update import update
from agent_r1.errors import AgentR1Error
from agent_r1.mdp import RewardSignal, TokenSource, Trajectory
from agent_r1.models.attention import use_varlen_attention
from agent_r1.testing.models import tiny_model

# ---------------------------------------------------------------------------------------------
# The plan
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("packed", [False, True])
def test_token_budget_plan_covers_every_row_once_within_budget(packed: bool) -> None:
    rng = random.Random(7)
    for trial in range(200):
        lengths = [int(rng.lognormvariate(5, 1)) + 1 for _ in range(rng.randint(1, 40))]
        budget = rng.randint(50, 3000)
        batching = MicroBatching(rows=4, max_tokens=budget, packed=packed)
        rows = sorted(rng.sample(range(len(lengths)), rng.randint(1, len(lengths))))
        plan = batching.plan(lengths, rows)
        assert sorted(r for chunk in plan for r in chunk) == rows, trial
        for chunk in plan:
            assert chunk == sorted(chunk) and chunk
            cost = batching.cost([lengths[r] for r in chunk])
            assert cost <= budget or len(chunk) == 1, (trial, chunk, cost, budget)
        # no two micro-batches could have been one
        if not packed:
            continue
        loads = sorted(sum(lengths[r] for r in chunk) for chunk in plan)
        assert len(loads) < 2 or loads[0] + loads[1] > budget or max(lengths) > budget


def test_plan_without_budget_is_consecutive_chunks() -> None:
    plan = MicroBatching(rows=3).plan([5, 1, 9, 9, 2, 7, 3], [0, 2, 3, 4, 5, 6])
    assert plan == [[0, 2, 3], [4, 5, 6]]


def test_padded_budget_groups_similar_lengths() -> None:
    lengths = [1000, 10, 990, 12, 11, 980]
    plan = MicroBatching(max_tokens=3000).plan(lengths)
    assert plan == [[0, 2, 5], [1, 3, 4]]  # the long ones together, the short ones together


def test_equalize_splits_the_costliest_then_adds_loss_free_passes() -> None:
    lengths = [100, 90, 10, 5]
    batching = MicroBatching(max_tokens=1000, packed=True)
    cost = lambda chunk: batching.cost([lengths[r] for r in chunk])  # noqa: E731
    plan = batching.plan(lengths)
    assert plan == [[0, 1, 2, 3]]
    grown = equalize(plan, 3, cost)
    assert len(grown) == 3 and sorted(r for c in grown for r in c) == [0, 1, 2, 3]
    assert equalize([[0], [1]], 4, cost) == [[0], [1], [], []]


# ---------------------------------------------------------------------------------------------
# Exactness of the packed forward pass
# ---------------------------------------------------------------------------------------------


def _single_turn(tokenizer: Any, count: int = 6) -> list[Trajectory]:
    generator = torch.Generator().manual_seed(3)
    out = []
    for i in range(count):
        trajectory = Trajectory(id=f"s{i}", task_id="t", group_id=f"g{i // 3}", sample_index=i % 3)
        prompt = torch.randint(5, len(tokenizer), (8 + 5 * i,), generator=generator).tolist()
        action = torch.randint(5, len(tokenizer), (2 + 7 * (i % 3),), generator=generator).tolist()
        trajectory.append(TokenSource.PROMPT, 0, prompt)
        trajectory.append(TokenSource.POLICY, 0, action, [-1.0] * len(action))
        trajectory.rewards.append(RewardSignal(name="r", value=float(i % 2)))
        out.append(trajectory)
    return out


EXACT = 2e-5  # float32 rounding of the same sums taken in another order (sdpa); eager is bit-exact


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("attention", ["sdpa_varlen", "sdpa", "eager"])
@pytest.mark.parametrize("episodes", ["single-turn", "multi-turn", "shared-prompt"])
def test_packed_forward_equals_padded(arch: str, attention: str, episodes: str, tiny_tokenizer: Any) -> None:
    """``sdpa_varlen``: each packed trajectory attended alone (what packing uses by default);
    ``sdpa`` and ``eager``: transformers' block-diagonal mask. The padded reference runs on the
    same model (``sdpa_varlen`` hands padded rows to ``sdpa``)."""
    model = tiny_model(tiny_tokenizer, arch=arch, seed=1)
    if attention == "sdpa_varlen":
        assert use_varlen_attention(model)
    else:
        model.config._attn_implementation = attention
    trajectories = {
        "single-turn": lambda: _single_turn(tiny_tokenizer),
        "multi-turn": lambda: fixed_trajectories(tiny_tokenizer),
        "shared-prompt": lambda: fixed_trajectories(tiny_tokenizer, shared_prompt=40),
    }[episodes]()
    batch = collate(trajectories, tiny_tokenizer.pad_token_id)
    mask = batch.loss_mask
    head = ValueHead(model.config.hidden_size)
    torch.nn.init.normal_(head.proj.weight, std=0.5)

    def run(packed: bool) -> tuple[Any, torch.Tensor, list[torch.Tensor]]:
        model.zero_grad(set_to_none=True)
        if packed:
            out = packed_forward(model, batch, with_entropy=True, with_hidden=True, share_prefix=32)
        else:
            out = policy_forward(
                model,
                batch.input_ids,
                batch.attention_mask,
                with_entropy=True,
                with_hidden=True,
                start=batch.first_policy_position(),
                share_prefix=0,
            )
        values = critic_values(head, model, batch, packed=packed)
        weights = torch.linspace(-1, 1, mask.shape[1])
        objective = (out.logprobs * weights)[mask].sum() + out.entropy[mask].sum() + values[mask].sum()
        objective.backward()
        grads = [p.grad.clone() for p in model.parameters()]
        return out, values.detach(), grads

    padded, padded_values, padded_grads = run(False)
    packed, packed_values_, packed_grads = run(True)
    assert (padded.logprobs - packed.logprobs)[mask].abs().max() < EXACT
    assert (padded.entropy - packed.entropy)[mask].abs().max() < EXACT
    assert (padded.hidden - packed.hidden)[batch.attention_mask].abs().max() < EXACT
    assert (padded_values - packed_values_)[mask].abs().max() < 10 * EXACT
    for a, b in zip(padded_grads, packed_grads, strict=True):  # float32 sums of ~100 terms of ~50
        assert float((a - b).abs().max()) <= 1e-5 * float(a.abs().max()) + 1e-6
    assert max(float(g.abs().max()) for g in padded_grads) > 1e-3  # the comparison has something to compare


@pytest.mark.parametrize("varlen", [True, False])
def test_a_shared_prompt_runs_once_when_packed(
    varlen: bool, tiny_tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The prefix every row shares reaches the model once (batch 1) and the packed row reads its
    cache; the packed row itself holds only the rows' own tokens."""
    model = tiny_model(tiny_tokenizer, seed=2)
    assert use_varlen_attention(model) if varlen else True
    batch = collate(fixed_trajectories(tiny_tokenizer, shared_prompt=40), tiny_tokenizer.pad_token_id)
    widths: list[int] = []
    original = model.forward

    def counted(*args: Any, **kwargs: Any) -> Any:
        widths.append(int(kwargs["input_ids"].shape[1]))
        return original(*args, **kwargs)

    monkeypatch.setattr(model, "forward", counted)
    packed_forward(model, batch, share_prefix=32)
    assert len(widths) == 2 and widths[0] >= 40
    assert widths[1] == sum(batch.lengths) - len(batch) * widths[0]


@pytest.mark.parametrize("attention", ["sdpa_varlen", "sdpa"])
def test_crossing_the_trajectory_boundary_is_detected(
    attention: str, tiny_tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the boundaries lost (``sdpa_varlen`` reading one segment; transformers' packed-sequence
    detection switched off for ``sdpa``), attention runs across the packed trajectories: the
    equality with the padded path breaks, and check_packing refuses the model."""
    import transformers.masking_utils as masking

    import agent_r1.models.attention as varlen

    model = tiny_model(tiny_tokenizer, arch="qwen2", seed=1)
    if attention == "sdpa_varlen":
        assert use_varlen_attention(model)
    check_packing(model)  # the real thing passes
    batch = collate(fixed_trajectories(tiny_tokenizer), tiny_tokenizer.pad_token_id)
    monkeypatch.setattr(masking, "find_packed_sequence_indices", lambda position_ids: None)
    monkeypatch.setattr(varlen, "segments", lambda position_ids: [(0, int(position_ids.shape[1]))])
    padded = policy_forward(model, batch.input_ids, batch.attention_mask, start=batch.first_policy_position())
    leaky = packed_forward(model, batch)
    later_rows = batch.loss_mask.clone()
    later_rows[0] = False  # the first packed row sees nothing before it either way
    assert (padded.logprobs - leaky.logprobs)[later_rows].abs().max() > 100 * EXACT
    with pytest.raises(AgentR1Error, match="attend to each other"):
        check_packing(model)


def test_varlen_attention_leaves_generation_unchanged(tiny_tokenizer: Any) -> None:
    """The rollout backend samples from the same model: with ``sdpa_varlen`` in place, generation
    (left-padded rows with a KV cache, and a single row without a mask) gives sdpa's tokens."""
    prompts = [[5, 9, 13, 40, 41], [7, 8]]
    outputs = []
    for varlen_on in (False, True):
        model = tiny_model(tiny_tokenizer, seed=5)
        if varlen_on:
            assert use_varlen_attention(model)
        ids = torch.full((2, 5), tiny_tokenizer.pad_token_id)
        mask = torch.zeros((2, 5), dtype=torch.long)
        for row, prompt in enumerate(prompts):
            ids[row, 5 - len(prompt) :] = torch.tensor(prompt)
            mask[row, 5 - len(prompt) :] = 1
        kwargs = {"max_new_tokens": 12, "do_sample": False, "pad_token_id": tiny_tokenizer.pad_token_id}
        both = model.generate(input_ids=ids, attention_mask=mask, **kwargs)
        alone = model.generate(input_ids=torch.tensor([prompts[0]]), **kwargs)
        outputs.append((both.tolist(), alone.tolist()))
    assert outputs[0] == outputs[1]


def test_varlen_attention_is_used_only_where_it_is_exact(tiny_tokenizer: Any) -> None:
    assert use_varlen_attention(tiny_model(tiny_tokenizer))
    eager = tiny_model(tiny_tokenizer)
    eager.config._attn_implementation = "eager"
    assert not use_varlen_attention(eager)  # another implementation: left alone
    windowed = tiny_model(tiny_tokenizer, arch="qwen2")
    windowed.config.use_sliding_window, windowed.config.sliding_window = True, 16
    assert not use_varlen_attention(windowed)  # a band it would not apply


def test_packing_with_gradient_checkpointing_gives_the_padded_gradient(tiny_tokenizer: Any) -> None:
    """The recomputation of a checkpointed layer runs the packed attention again (sdpa_varlen
    reads the same boundaries), so the gradient is the padded path's."""
    from agent_r1.engine.learner.packing import prepare_packing

    model = tiny_model(tiny_tokenizer, seed=3)
    assert prepare_packing(model) == "sdpa_varlen"
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    batch = collate(fixed_trajectories(tiny_tokenizer), tiny_tokenizer.pad_token_id)

    def gradient(packed: bool) -> torch.Tensor:
        model.zero_grad(set_to_none=True)
        if packed:
            out = packed_forward(model, batch)
        else:
            start = batch.first_policy_position()
            out = policy_forward(model, batch.input_ids, batch.attention_mask, start=start, share_prefix=0)
        out.logprobs[batch.loss_mask].sum().backward()
        return torch.cat([p.grad.flatten() for p in model.parameters()])

    padded, packed = gradient(False), gradient(True)
    assert padded.abs().max() > 1.0
    assert (padded - packed).abs().max() <= 1e-5 * padded.abs().max()


def test_no_grad_logprobs_agree_across_layouts(tiny_tokenizer: Any) -> None:
    model = tiny_model(tiny_tokenizer, seed=4)
    batch = collate(
        fixed_trajectories(tiny_tokenizer) + _single_turn(tiny_tokenizer), tiny_tokenizer.pad_token_id
    )
    base = no_grad_logprobs(model, batch, 0.7, 16)
    for batching in (
        MicroBatching(rows=3, packed=True),
        MicroBatching(max_tokens=90),
        MicroBatching(max_tokens=90, packed=True),
    ):
        other = no_grad_logprobs(model, batch, 0.7, batching)
        assert (base - other)[batch.loss_mask].abs().max() < EXACT, batching


# ---------------------------------------------------------------------------------------------
# Whole updates
# ---------------------------------------------------------------------------------------------


def _session(config: dict[str, Any], registry: Any) -> Any:
    from agent_r1.engine import build_session

    run = RunConfig.model_validate(config)
    return build_session(run, validate_components(run, registry), Path(run.output_dir), registry=registry)


LAYOUTS = [
    {"micro_batch_size": 8},
    {"micro_batch_size": 8, "max_tokens_per_micro_batch": 90},
    {"micro_batch_size": 3, "packing": True},
    {"micro_batch_size": 8, "max_tokens_per_micro_batch": 90, "packing": True},
]


@pytest.mark.parametrize(
    ("name", "algorithm", "model"),
    [
        ("grpo-token-mean", {"name": "grpo", "aggregation": "token-mean"}, {}),
        ("grpo-seq-mean", {"name": "grpo", "aggregation": "seq-mean-token-mean"}, {}),
        ("dr-grpo-kl-2-epochs", {"name": "grpo", "aggregation": "seq-mean-token-sum-norm",
                                 "kl": {"coef": 0.1, "estimator": "k3"}}, {}),
        ("ppo-value-head", {"name": "ppo", "critic": {"kind": "value_head", "lr": 1e-3}}, {}),
        ("grpo-lora", {"name": "grpo"},
         {"lora": {"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]}}),
    ],
)  # fmt: skip
def test_update_is_the_same_in_every_layout(
    name: str,
    algorithm: dict[str, Any],
    model: dict[str, Any],
    registry: Any,
    model_dir: Path,
    tmp_path: Path,
) -> None:
    """The gradient an update stepped with (left in ``.grad``) and its logged losses do not depend
    on the layout: fixed rows, token budget, packed, both."""
    epochs = 2 if "epochs" in name else 1
    results, metrics = [], []
    for i, layout in enumerate(LAYOUTS):
        config = toy_config(
            model_dir,
            tmp_path / f"run{i}",
            algorithm=algorithm,
            model={"path": str(model_dir), **model},
            trainer={
                "steps": 1,
                "tasks_per_step": 2,
                "lr": 1e-2,
                "grad_clip": None,
                "epochs": epochs,
                **layout,
            },
        )
        session = _session(config, registry)
        metrics.append(update(session, fixed_trajectories(session.tokenizer, shared_prompt=36)))
        grads = [p.grad.flatten() for p in session.unwrapped.parameters() if p.grad is not None]
        if session.value_head is not None:
            grads += [p.grad.flatten() for p in session.value_head.parameters() if p.grad is not None]
        results.append(torch.cat(grads))
    assert results[0].abs().max() > 1e-4
    for layout, grads, logged in zip(LAYOUTS[1:], results[1:], metrics[1:], strict=True):
        assert torch.allclose(results[0], grads, atol=1e-6, rtol=1e-4), (name, layout)
        for key in ("actor/pg_loss", "actor/loss", "critic/value_loss"):  # the loss shares
            if key in metrics[0]:
                assert logged[key] == pytest.approx(metrics[0][key], abs=1e-6, rel=1e-4), (key, layout)
    assert metrics[0]["batch/micro_batches"] == epochs  # one micro-batch of 8 per optimizer step
    assert metrics[1]["batch/micro_batches"] > epochs and metrics[1]["batch/max_micro_tokens"] <= 90
    assert metrics[0]["batch/padding_share"] > 0.0  # lengths 43-46: a little padding
    assert metrics[2]["batch/padding_share"] == 0.0 and metrics[3]["batch/padding_share"] == 0.0
    assert all(m["memory/peak_gib"] > 0 for m in metrics)


def test_a_row_over_the_budget_runs_alone_and_is_counted(
    registry: Any, model_dir: Path, tmp_path: Path
) -> None:
    config = toy_config(
        model_dir,
        tmp_path / "run",
        trainer={
            "steps": 1,
            "tasks_per_step": 2,
            "max_tokens_per_micro_batch": 15,  # rows of 19-22 tokens
            "packing": True,
            "skip_idle_rows": False,
        },
    )
    session = _session(config, registry)
    trajectories = fixed_trajectories(session.tokenizer)
    metrics = update(session, trajectories)
    assert metrics["batch/over_budget_rows"] == len(trajectories)
    assert metrics["batch/micro_batches"] == len(trajectories)


# ---------------------------------------------------------------------------------------------
# Memory you can predict
# ---------------------------------------------------------------------------------------------


def _estimate(model_dir: Path, tmp_path: Path, world: int = 1, **sections: Any) -> Any:
    from transformers import AutoConfig

    from agent_r1.models.memory import estimate_training_memory

    config = RunConfig.model_validate(toy_config(model_dir, tmp_path / "run", **sections))
    hf_config = AutoConfig.from_pretrained(model_dir)
    return estimate_training_memory(config, hf_config, parameters=1_000_000, world=world)


def test_memory_estimate_follows_the_config(model_dir: Path, tmp_path: Path) -> None:
    base = _estimate(model_dir, tmp_path)  # 8 rows x max_context 256, float32
    assert base.tokens == 8 * 256
    assert (base.weights, base.gradients, base.optimizer) == (4_000_000, 4_000_000, 8_000_000)
    assert base.reference == base.critic == 0
    budget = _estimate(model_dir, tmp_path, trainer={"max_tokens_per_micro_batch": 512})
    assert budget.tokens == 512 and budget.activations * 4 == base.activations
    assert budget.logits * 4 == base.logits
    checkpointed = _estimate(
        model_dir, tmp_path, model={"path": str(model_dir), "gradient_checkpointing": True}
    )
    assert checkpointed.activations < base.activations and checkpointed.weights == base.weights
    sharded = _estimate(model_dir, tmp_path, world=4, trainer={"sharding": "fsdp2"})
    assert sharded.weights * 4 == base.weights and sharded.optimizer * 4 == base.optimizer
    assert sharded.activations == base.activations  # activations are per process either way
    kl = _estimate(model_dir, tmp_path, algorithm={"name": "grpo", "kl": {"coef": 0.1}})
    assert kl.reference == base.weights and kl.total == base.total + base.weights
    half = _estimate(model_dir, tmp_path, model={"path": str(model_dir), "dtype": "bfloat16"})
    assert half.weights * 2 == base.weights and half.activations * 2 == base.activations


def test_check_warns_when_training_would_not_fit_and_refuses_unknown_packing_attention(
    registry: Any, model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from agent_r1.run.preflight import preflight

    def report(**sections: Any) -> Any:
        config = RunConfig.model_validate(toy_config(model_dir, tmp_path / "run", **sections))
        checks = preflight(config, validate_components(config, registry)).checks
        return {(c.status, c.message) for c in checks if c.name == "memory"}

    ok = report()
    assert len(ok) == 1 and next(iter(ok))[0] == "ok" and "2048 tokens per micro-batch" in next(iter(ok))[1]
    # a machine smaller than the estimate (this one is not: its size is what is replaced)
    monkeypatch.setattr("agent_r1.models.memory.machine_memory_bytes", lambda device: 2**20)
    ((status, message),) = report()
    assert status == "warn" and "may run out of memory" in message
    assert "trainer.max_tokens_per_micro_batch" in message and "gradient_checkpointing" in message
    monkeypatch.undo()
    below = report(trainer={"max_tokens_per_micro_batch": 100})
    assert any(s == "warn" and "below rollout.max_context=256" in m for s, m in below)
    refused = report(
        model={"path": str(model_dir), "attn_implementation": "sdpa_paged"}, trainer={"packing": True}
    )
    assert any(s == "fail" and "sdpa_paged" in m and "trainer.packing: false" in m for s, m in refused)
