"""The trainer's shared-prefix forward (agent_r1.engine.learner.batch.policy_forward) with a value head on
the shared backbone: hidden states, log-probabilities, entropies and every gradient equal those of
the plain forward pass, and the prefix really runs once (batch size 1)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent_r1.engine.learner.batch import StepPrefix, policy_forward


@pytest.fixture(autouse=True, scope="module")
def _one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def model() -> Any:
    from agent_r1.testing.models import tiny_model, tiny_tokenizer

    return tiny_model(tiny_tokenizer(), layers=2, seed=3, tie_word_embeddings=False)


@pytest.fixture(scope="module")
def model64(model: Any) -> Any:
    """The tiny model in float64: the equality test then sees no float32 rounding."""
    import copy

    return copy.deepcopy(model).double()


def batch(prefix: list[int], suffixes: list[list[int]], pad: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows ``prefix + suffix``, right-padded (as the trainer collates them)."""
    width = len(prefix) + max(len(s) for s in suffixes)
    ids = torch.full((len(suffixes), width), pad, dtype=torch.long)  # [B, T]
    mask = torch.zeros((len(suffixes), width), dtype=torch.bool)  # [B, T]
    for row, suffix in enumerate(suffixes):
        tokens = prefix + suffix
        ids[row, : len(tokens)] = torch.tensor(tokens)
        mask[row, : len(tokens)] = True
    return ids, mask


def losses_and_grads(
    model: Any, head: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor, start: int, share: int
) -> tuple[Any, dict[str, torch.Tensor]]:
    """A PPO-shaped loss (policy term, entropy, value term on the same hidden state) and the
    gradient of every parameter of the model and the value head."""
    model.zero_grad(set_to_none=True)
    head.zero_grad(set_to_none=True)
    out = policy_forward(
        model, ids, mask, with_entropy=True, with_hidden=True, start=start, share_prefix=share
    )
    assert out.hidden is not None and out.entropy is not None
    values = head(out.hidden).squeeze(-1)  # [B, T]
    weight = mask.float()
    weight[:, :start] = 0
    loss = (
        -(out.logprobs * weight).sum()
        - 0.01 * (out.entropy * weight).sum()
        + ((values - 1) ** 2 * weight).sum()
    )
    loss.backward()
    named = list(model.named_parameters()) + [(f"head.{n}", p) for n, p in head.named_parameters()]
    grads = {name: p.grad.detach().clone() for name, p in named if p.grad is not None}
    return out, grads


def prefix_batch_sizes(model: Any) -> tuple[list[int], Any]:
    """Record the (batch, length) of every forward through the embedding."""
    seen: list[int] = []
    handle = model.get_input_embeddings().register_forward_hook(
        lambda _m, args, _o: seen.append(args[0].shape)
    )
    return seen, handle


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    prefix_length=st.integers(33, 60),
    suffix_lengths=st.lists(st.integers(1, 12), min_size=2, max_size=4),
    seed=st.integers(0, 1000),
)
def test_shared_prefix_with_hidden_states_equals_the_plain_pass(
    model64: Any, prefix_length: int, suffix_lengths: list[int], seed: int
) -> None:
    model = model64
    generator = torch.Generator().manual_seed(seed)
    vocab = model.config.vocab_size
    prefix = torch.randint(5, vocab, (prefix_length,), generator=generator).tolist()
    suffixes = [torch.randint(5, vocab, (n,), generator=generator).tolist() for n in suffix_lengths]
    ids, mask = batch(prefix, suffixes)
    start = prefix_length  # the first policy token right after the shared prompt
    head = torch.nn.Linear(model.config.hidden_size, 1, dtype=torch.float64)
    with torch.no_grad():  # every value from the example's seed: a failure reproduces
        head.weight.copy_(torch.randn(head.weight.shape, generator=generator, dtype=torch.float64))
        head.bias.copy_(torch.randn(head.bias.shape, generator=generator, dtype=torch.float64))

    seen, handle = prefix_batch_sizes(model)
    try:
        shared, shared_grads = losses_and_grads(model, head, ids, mask, start, share=32)
    finally:
        handle.remove()
    assert seen[0] == (1, start - 1)  # the prefix ran once, with batch size 1
    plain, plain_grads = losses_and_grads(model, head, ids, mask, start, share=0)

    assert shared.hidden is not None and plain.hidden is not None
    assert shared.hidden.shape == plain.hidden.shape == (*ids.shape, model.config.hidden_size)
    real = mask[..., None].expand_as(plain.hidden)
    assert torch.allclose(shared.hidden[real], plain.hidden[real], atol=1e-5)
    assert torch.allclose(shared.logprobs, plain.logprobs, atol=1e-5)
    assert shared.entropy is not None and plain.entropy is not None
    assert torch.allclose(shared.entropy, plain.entropy, atol=1e-5)
    assert shared_grads.keys() == plain_grads.keys()
    # With the model in float64 the passes differ only by summation order and by the log-softmax,
    # which policy_forward takes in float32 (gaps up to ~2e-8 of the largest entry were seen), 50x
    # tighter than float32 weights allowed; a wrong cache or mask gives gaps of the order of the
    # gradient itself.
    for name, grad in plain_grads.items():
        gap = (shared_grads[name] - grad).abs().max()
        assert gap <= 1e-6 * grad.abs().max() + 1e-9, (name, float(gap), float(grad.abs().max()))


def test_without_a_long_enough_prefix_the_plain_pass_runs(model: Any) -> None:
    ids, mask = batch(list(range(5, 15)), [[20, 21], [22, 23, 24]])
    seen, handle = prefix_batch_sizes(model)
    try:
        out = policy_forward(model, ids, mask, with_hidden=True, start=10)
    finally:
        handle.remove()
    assert seen == [tuple(ids.shape)] and out.hidden is not None
    assert out.hidden.shape[:2] == ids.shape


def test_a_step_prefix_run_once_gives_the_gradients_of_the_plain_pass(model: Any) -> None:
    """The trainer's step-wide prefix (StepPrefix): the shared prompt runs once at batch size 1 for
    all micro-batches of an optimizer step; summed over micro-batches, then carried through the
    prefix with backward(), the gradients equal those of one plain pass over all rows."""
    generator = torch.Generator().manual_seed(11)
    vocab = model.config.vocab_size
    prefix = torch.randint(5, vocab, (40,), generator=generator).tolist()
    # Two tasks: each micro-batch's rows share more than the step's prefix (their question).
    questions = [torch.randint(5, vocab, (6,), generator=generator).tolist() for _ in range(2)]
    suffixes = [
        questions[row // 2] + torch.randint(5, vocab, (3 + row,), generator=generator).tolist()
        for row in range(4)
    ]
    ids, mask = batch(prefix, suffixes)
    start = len(prefix) + 6  # policy tokens follow each task's question
    weight = mask.float()
    weight[:, :start] = 0

    def loss_of(out: Any, rows: list[int]) -> torch.Tensor:
        assert out.entropy is not None
        w = weight[rows, : out.logprobs.shape[1]]
        return -(out.logprobs * w).sum() - 0.01 * (out.entropy * w).sum()

    def grads() -> dict[str, torch.Tensor]:
        return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}

    model.zero_grad(set_to_none=True)
    whole = policy_forward(model, ids, mask, with_entropy=True, start=start, share_prefix=0)
    loss_of(whole, [0, 1, 2, 3]).backward()
    plain = grads()

    model.zero_grad(set_to_none=True)
    seen, handle = prefix_batch_sizes(model)
    try:
        step = StepPrefix(model, ids[:1, : len(prefix)])
        assert len(step) == len(prefix)
        for rows in ([0, 1], [2, 3]):
            out = policy_forward(
                model, ids[rows], mask[rows], with_entropy=True, start=start, step_prefix=step
            )
            loss_of(out, rows).backward()
        step.backward()
    finally:
        handle.remove()
    shared = grads()
    # one prefix pass at batch size 1, then each micro-batch runs its rows after the prefix only
    assert seen[0] == (1, len(prefix))
    assert [s[1] for s in seen[1:]] == [ids.shape[1] - len(prefix)] * 2
    assert shared.keys() == plain.keys()
    for name, grad in plain.items():
        gap = (shared[name] - grad).abs().max()
        assert gap <= 5e-5 * grad.abs().max() + 1e-7, (name, float(gap), float(grad.abs().max()))
    assert step.leaves == []  # the graph is let go after backward


def test_a_step_prefix_that_does_not_fit_a_row_is_refused(model: Any) -> None:
    ids, mask = batch(list(range(5, 45)), [[50, 51, 52], [60, 61]])
    step = StepPrefix(model, ids[:1, :40])
    with pytest.raises(ValueError, match="step_prefix"):
        policy_forward(model, ids, mask, start=30, step_prefix=step)  # scores inside the prefix
    other = ids.clone()
    other[1, 3] = 7
    with pytest.raises(ValueError, match="step_prefix"):
        policy_forward(model, other, mask, start=41, step_prefix=step)  # row 1 differs
    step.release()


def test_entropy_as_a_metric_keeps_nothing_for_backward(model: Any) -> None:
    """``entropy_grad=False`` (the trainer's choice when ``entropy_coef`` is 0): the same entropy
    values, detached, and the same log-probability gradients as with the entropy in the graph."""
    ids, mask = batch([5, 9, 14, 3], [[7, 8, 21, 30, 2], [11, 2], [40, 41, 42]])
    grads = []
    outs = []
    for entropy_grad in (True, False):
        model.zero_grad(set_to_none=True)
        out = policy_forward(model, ids, mask, with_entropy=True, entropy_grad=entropy_grad, start=4)
        (-(out.logprobs * mask).sum()).backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]))
        outs.append(out)
    assert outs[0].entropy is not None and outs[1].entropy is not None
    assert outs[0].entropy.requires_grad and not outs[1].entropy.requires_grad
    assert torch.equal(outs[0].entropy.detach(), outs[1].entropy)
    assert float(outs[1].entropy[:, 4:].abs().sum()) > 0
    assert torch.equal(grads[0], grads[1])
