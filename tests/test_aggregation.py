"""Loss aggregation does not depend on micro-batch size or gradient accumulation, and the masked
statistics behind whitening match their definitions (``ALGORITHMS.md``)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from agent_r1.builtins.losses import PPOClip
from agent_r1.contracts import LossInput
from agent_r1.engine.learner.loss_utils import (
    AGGREGATION_MODES,
    Normalizer,
    aggregate,
    entropy_from_logits,
    kl_penalty,
    masked_mean,
    masked_sum,
    masked_var,
    masked_whiten,
    token_logprobs,
)

F64 = torch.float64
HIDDEN, VOCAB = 4, 7


def make_batch(seed: int, batch_size: int, length: int) -> dict[str, torch.Tensor]:
    """Random features, tokens, rollout log-probs and advantages; masks with a prompt, observation
    gaps, right padding, and sometimes a row without any policy token."""
    generator = torch.Generator().manual_seed(seed)
    mask = torch.rand(batch_size, length, generator=generator) < 0.6  # [B, T] with gaps
    mask[:, 0] = False  # prompt token
    lengths = torch.randint(1, length + 1, (batch_size,), generator=generator)
    mask &= torch.arange(length) < lengths.unsqueeze(1)  # right padding
    if seed % 3 == 0:
        mask[0] = False  # a trajectory masked out of the loss entirely
    return {
        "features": torch.randn(batch_size, length, HIDDEN, generator=generator, dtype=F64),
        "tokens": torch.randint(0, VOCAB, (batch_size, length), generator=generator),
        "old_logprobs": -torch.rand(batch_size, length, generator=generator, dtype=F64) * 3,
        "ref_logprobs": -torch.rand(batch_size, length, generator=generator, dtype=F64) * 3,
        "advantages": torch.randn(batch_size, length, generator=generator, dtype=F64),
        "mask": mask,
    }


def trim(batch: dict[str, torch.Tensor], rows: list[int]) -> dict[str, torch.Tensor]:
    """A micro-batch with dynamic padding: cut to its own last policy token, as a trainer that pads
    per micro-batch would."""
    part = {key: value[rows] for key, value in batch.items()}
    positions = part["mask"].nonzero()
    width = int(positions[:, 1].max()) + 1 if len(positions) else 1
    return {key: value[:, :width] for key, value in part.items()}


def micro_batch_loss(model: nn.Module, part: dict[str, torch.Tensor], mode: str, normalizer: Normalizer):
    """Policy loss + KL + entropy bonus, each aggregated by the framework."""
    logits = model(part["features"])  # [b, t, V]
    logprobs = token_logprobs(logits, part["tokens"])  # [b, t]
    mask = part["mask"]
    policy, _ = PPOClip().token_loss(LossInput(logprobs, part["old_logprobs"], part["advantages"], mask))
    kl = kl_penalty(logprobs, part["ref_logprobs"], "k3")
    entropy = entropy_from_logits(logits)
    return (
        aggregate(policy, mask, mode, normalizer=normalizer)
        + 0.1 * aggregate(kl, mask, mode, normalizer=normalizer)
        - 0.01 * aggregate(entropy, mask, mode, normalizer=normalizer)
    )


def gradients(model: nn.Module, batch, mode: str, micro_size: int, max_len: int):
    """Accumulate one backward per micro-batch; return (summed loss, flat gradient)."""
    model.zero_grad()
    size = batch["mask"].shape[0]
    parts = [
        trim(batch, list(range(start, min(start + micro_size, size)))) for start in range(0, size, micro_size)
    ]
    normalizer = Normalizer.from_masks([part["mask"] for part in parts], mode, max_len=max_len)
    total = torch.zeros((), dtype=F64)
    for part in parts:
        loss = micro_batch_loss(model, part, mode, normalizer)
        loss.backward()
        total = total + loss.detach()
    return total, torch.cat([p.grad.flatten() for p in model.parameters()])


def tiny_model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Linear(HIDDEN, VOCAB).to(F64)


@settings(max_examples=30, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    batch_size=st.integers(2, 6),
    length=st.integers(2, 9),
    mode=st.sampled_from(AGGREGATION_MODES),
)
def test_micro_batching_does_not_change_loss_or_gradient(
    seed: int, batch_size: int, length: int, mode: str
) -> None:
    batch = make_batch(seed, batch_size, length)
    model = tiny_model(seed)
    full_loss, full_grad = gradients(model, batch, mode, micro_size=batch_size, max_len=length)
    for micro_size in (1, 2):
        loss, grad = gradients(model, batch, mode, micro_size=micro_size, max_len=length)
        torch.testing.assert_close(loss, full_loss, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(grad, full_grad, rtol=1e-10, atol=1e-12)


def test_per_micro_batch_normalisation_would_differ() -> None:
    """The property above has teeth: normalising each micro-batch by its own token count (the bug
    peers shipped) changes the gradient when micro-batches hold different numbers of tokens."""
    batch = make_batch(1, 4, 8)
    batch["mask"][0, 1:] = True
    batch["mask"][1:, 2:] = False
    model = tiny_model(1)
    _, full_grad = gradients(model, batch, "token-mean", micro_size=4, max_len=8)
    model.zero_grad()
    for start in range(4):
        part = trim(batch, [start])
        own = Normalizer.from_masks(part["mask"], "token-mean")
        (micro_batch_loss(model, part, "token-mean", own) / 4).backward()
    wrong = torch.cat([p.grad.flatten() for p in model.parameters()])
    assert not torch.allclose(wrong, full_grad, rtol=1e-6, atol=1e-9)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), batch_size=st.integers(1, 5), length=st.integers(1, 8))
def test_full_batch_values_match_definitions(seed: int, batch_size: int, length: int) -> None:
    batch = make_batch(seed, batch_size, length)
    values = batch["advantages"]  # any per-token quantity
    mask = batch["mask"]
    rows = [
        [v for v, m in zip(vr, mr, strict=True) if m]
        for vr, mr in zip(values.tolist(), mask.tolist(), strict=True)
    ]
    nonempty = [row for row in rows if row]
    tokens = sum(len(row) for row in rows)
    expected = {
        "token-mean": sum(map(sum, rows)) / tokens if tokens else 0.0,
        "seq-mean-token-mean": sum(sum(r) / len(r) for r in nonempty) / len(nonempty) if nonempty else 0.0,
        "seq-mean-token-sum": sum(map(sum, nonempty)) / len(nonempty) if nonempty else 0.0,
        "seq-mean-token-sum-norm": sum(map(sum, nonempty)) / (len(nonempty) * 16) if nonempty else 0.0,
    }
    for mode, value in expected.items():
        normalizer = Normalizer.from_masks(mask, mode, max_len=16)
        assert aggregate(values, mask, mode, normalizer=normalizer).item() == pytest.approx(value, abs=1e-12)


def test_normalizer_counts() -> None:
    mask = torch.tensor([[False, True, True], [False, False, False], [True, False, True]])
    full = Normalizer.from_masks(mask, "token-mean")
    assert (full.num_tokens, full.num_sequences) == (4, 2)
    assert full.denominator == 4.0
    parts = Normalizer.from_masks([mask[:1], mask[1:2, :1], mask[2:]], "seq-mean-token-mean")
    assert (parts.num_tokens, parts.num_sequences) == (4, 2)
    assert parts.denominator == 2.0
    assert Normalizer.from_masks(mask, "seq-mean-token-sum-norm", max_len=10).denominator == 20.0
    empty = Normalizer.from_masks(torch.zeros(2, 3, dtype=torch.bool), "token-mean")
    assert (
        aggregate(torch.ones(2, 3), torch.zeros(2, 3, dtype=torch.bool), "token-mean", normalizer=empty) == 0
    )


def test_normalizer_errors_say_what_to_do() -> None:
    mask = torch.ones(1, 2, dtype=torch.bool)
    with pytest.raises(ValueError, match="pass max_len"):
        Normalizer.from_masks(mask, "seq-mean-token-sum-norm")
    with pytest.raises(ValueError, match="choose one of"):
        Normalizer.from_masks(mask, "sum")
    with pytest.raises(TypeError, match="bool"):
        Normalizer.from_masks(mask.float(), "token-mean")
    normalizer = Normalizer.from_masks(mask, "token-mean")
    with pytest.raises(ValueError, match="does not match"):
        aggregate(torch.ones(1, 2), mask, "seq-mean-token-mean", normalizer=normalizer)
    with pytest.raises(TypeError, match="bool"):
        aggregate(torch.ones(1, 2), mask.float(), "token-mean", normalizer=normalizer)


# --------------------------------------------------------------------------------------------
# Masked statistics
# --------------------------------------------------------------------------------------------


@st.composite
def masked_values(draw: st.DrawFn) -> tuple[torch.Tensor, torch.Tensor]:
    rows, cols = draw(st.integers(1, 4)), draw(st.integers(1, 6))
    values = [[draw(st.floats(-100, 100, width=32)) for _ in range(cols)] for _ in range(rows)]
    mask = [[draw(st.booleans()) for _ in range(cols)] for _ in range(rows)]
    return torch.tensor(values, dtype=F64), torch.tensor(mask)


@settings(max_examples=60, deadline=None)
@given(masked_values())
def test_masked_statistics_match_definitions(data: tuple[torch.Tensor, torch.Tensor]) -> None:
    values, mask = data
    selected = values[mask].tolist()
    n = len(selected)
    mean = sum(selected) / n if n else 0.0
    var = sum((v - mean) ** 2 for v in selected) / (n - 1) if n > 1 else 0.0
    assert masked_sum(values, mask).item() == pytest.approx(sum(selected), abs=1e-9)
    assert masked_mean(values, mask).item() == pytest.approx(mean, abs=1e-9)
    assert masked_var(values, mask).item() == pytest.approx(var, rel=1e-9, abs=1e-9)
    whitened = masked_whiten(values, mask)
    expected = torch.tensor(
        [
            [(v - mean) / math.sqrt(var + 1e-8) if m else 0.0 for v, m in zip(vr, mr, strict=True)]
            for vr, mr in zip(values.tolist(), mask.tolist(), strict=True)
        ],
        dtype=F64,
    )
    torch.testing.assert_close(whitened, expected, rtol=1e-9, atol=1e-9)
    unshifted = masked_whiten(values, mask, shift_mean=False)
    torch.testing.assert_close(unshifted, torch.where(mask, expected + mean, 0.0), rtol=1e-9, atol=1e-9)
    row_means = masked_mean(values, mask, dim=-1)
    for row, (vr, mr) in enumerate(zip(values.tolist(), mask.tolist(), strict=True)):
        chosen = [v for v, m in zip(vr, mr, strict=True) if m]
        assert row_means[row].item() == pytest.approx(sum(chosen) / len(chosen) if chosen else 0.0, abs=1e-9)


def test_masked_sum_ignores_non_finite_padding() -> None:
    values = torch.tensor([[1.0, float("nan"), float("-inf")]], requires_grad=True)
    mask = torch.tensor([[True, False, False]])
    total = masked_sum(values, mask)
    total.backward()
    assert total.item() == 1.0
    assert values.grad.tolist() == [[1.0, 0.0, 0.0]]
