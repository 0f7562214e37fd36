"""The ``hf`` rollout backend (agent_r1.builtins.hf_backend) on tiny random Llama and Qwen2 models:
log-probabilities against a fresh forward pass, stopping rules, batching, prefix sharing (identical
prompts and a common token prefix) and seeding."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from agent_r1.builtins.hf_backend import HFBackend, sample_tokens
from agent_r1.contracts import SamplingParams


@pytest.fixture(autouse=True, scope="module")
def _one_thread() -> Iterator[None]:
    """Tiny matrices run fastest on one thread (and the CI machine's cores are shared)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def model(tiny_tokenizer: Any) -> Any:
    """A tiny random Llama with untied embeddings: with tied ones, greedy decoding of a random model
    just repeats the last prompt token, which would make the greedy comparisons below vacuous."""
    from agent_r1.testing.models import tiny_model

    return tiny_model(tiny_tokenizer, tie_word_embeddings=False, seed=0)


def chat_prompt(tokenizer: Any, question: str) -> list[int]:
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": question}], add_generation_prompt=True, tokenize=False
    )
    return list(tokenizer.encode(text, add_special_tokens=False))


@pytest.fixture
def prompts(tiny_tokenizer: Any) -> list[list[int]]:
    """Three prompts of different lengths."""
    questions = ["What is 2 + 3?", "Hi", "Search the documents for the title of the film, then answer."]
    return [chat_prompt(tiny_tokenizer, q) for q in questions]


def reference_logprobs(model: Any, prompt: list[int], tokens: list[int], temperature: float) -> list[float]:
    """log_softmax(logits / T) of ``tokens`` after ``prompt``: one plain forward pass, no cache."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + tokens])).logits[0].float()  # [T, V]
    logp = torch.log_softmax(logits / (temperature or 1.0), dim=-1)
    return [logp[len(prompt) - 1 + i, t].item() for i, t in enumerate(tokens)]


@pytest.mark.parametrize(
    ("temperature", "top_k", "top_p"), [(1.0, 0, 1.0), (0.7, 20, 1.0), (1.3, 0, 0.9), (0.0, 0, 1.0)]
)
def test_logprobs_match_a_fresh_forward_pass(
    model: Any, tiny_tokenizer: Any, prompts: list[list[int]], temperature: float, top_k: int, top_p: float
) -> None:
    backend = HFBackend({}, model=model, tokenizer=tiny_tokenizer)
    sampling = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, max_new_tokens=12, seed=3)
    generations = backend.generate(prompts, sampling)
    for prompt, generation in zip(prompts, generations, strict=True):
        assert len(generation.logprobs) == len(generation.token_ids) > 0
        expected = reference_logprobs(model, prompt, generation.token_ids, temperature)
        assert generation.logprobs == pytest.approx(expected, abs=1e-4)


def test_same_seed_same_tokens_and_another_seed_differs(
    model: Any, tiny_tokenizer: Any, prompts: list[list[int]]
) -> None:
    backend = HFBackend({}, model=model, tokenizer=tiny_tokenizer)

    def run(seed: int) -> list[list[int]]:
        sampling = SamplingParams(temperature=1.0, max_new_tokens=16, seed=seed)
        return [g.token_ids for g in backend.generate(prompts * 2, sampling)]

    first = run(7)
    assert run(7) == first
    assert run(8) != first
    assert first[0] != first[3]  # copies of one prompt draw different samples


def test_greedy_batch_of_different_lengths_equals_one_by_one(
    model: Any, tiny_tokenizer: Any, prompts: list[list[int]]
) -> None:
    backend = HFBackend({}, model=model, tokenizer=tiny_tokenizer)
    sampling = SamplingParams(temperature=0.0, max_new_tokens=10)
    batched = backend.generate(prompts, sampling)
    for prompt, together in zip(prompts, batched, strict=True):
        [alone] = backend.generate([prompt], sampling)
        assert alone.token_ids == together.token_ids
        assert alone.logprobs == pytest.approx(together.logprobs, abs=1e-5)
    small = HFBackend({"max_batch_size": 2}, model=model, tokenizer=tiny_tokenizer)
    split = small.generate(prompts, sampling)  # split into chunks of 2 and 1 rows
    assert [g.token_ids for g in split] == [g.token_ids for g in batched]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_prefix_sharing_gives_the_same_results_as_no_sharing(
    model: Any, tiny_tokenizer: Any, prompts: list[list[int]], temperature: float
) -> None:
    group = [prompts[0]] * 4 + [prompts[1]] + [prompts[0]] * 2 + [prompts[2]] * 3
    sampling = SamplingParams(temperature=temperature, max_new_tokens=12, seed=11)
    shared = HFBackend({}, model=model, tokenizer=tiny_tokenizer)
    separate = HFBackend({"prefix_sharing": False}, model=model, tokenizer=tiny_tokenizer)
    with_sharing = shared.generate(group, sampling)
    without = separate.generate(group, sampling)
    assert shared.last_stats["prefill_rows"] == 3 and separate.last_stats["prefill_rows"] == len(group)
    for a, b in zip(with_sharing, without, strict=True):
        assert a.token_ids == b.token_ids
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)
        assert a.finish_reason == b.finish_reason


# -- common-prefix sharing --------------------------------------------------------------------

SYSTEM = "You are a careful assistant. Search the documents when you need facts, then answer briefly."
FEW_SHOT = [
    ("What is 12 + 30?", "<tool_call>12 + 30</tool_call>"),
    ("Thanks. And the title of the film?", "The title of the film is in the documents."),
]


def few_shot_prompt(tokenizer: Any, question: str) -> list[int]:
    """A system prompt and few-shot turns common to every question (the main job's prompt shape)."""
    messages = [{"role": "system", "content": SYSTEM}]
    for user, assistant in FEW_SHOT:
        messages += [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]
    messages.append({"role": "user", "content": question})
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return list(tokenizer.encode(text, add_special_tokens=False))


def naive_common_prefix(prompts: list[list[int]]) -> int:
    length = 0
    while all(len(p) > length for p in prompts) and len({p[length] for p in prompts}) == 1:
        length += 1
    return length


@pytest.fixture
def few_shot_prompts(tiny_tokenizer: Any) -> list[list[int]]:
    """Four prompts that share a long prefix and end with remainders of different lengths."""
    questions = ["Hi", "What is 2 + 3?", "Add 17 and 25, then multiply the sum by 3.", "Search it"]
    return [few_shot_prompt(tiny_tokenizer, q) for q in questions]


def compare_with_and_without_sharing(
    model: Any, tokenizer: Any, batch: list[list[int]], sampling: SamplingParams, **kwargs: Any
) -> tuple[HFBackend, HFBackend]:
    """Generate ``batch`` with and without sharing; assert equal tokens and log-probabilities."""
    shared = HFBackend({"min_shared_prefix": 16}, model=model, tokenizer=tokenizer)
    separate = HFBackend({"prefix_sharing": False}, model=model, tokenizer=tokenizer)
    with_sharing = shared.generate(batch, sampling, **kwargs)
    without = separate.generate(batch, sampling, **kwargs)
    for a, b in zip(with_sharing, without, strict=True):
        assert a.token_ids == b.token_ids
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)
        assert a.finish_reason == b.finish_reason
    assert separate.last_stats["shared_prefix_tokens"] == 0
    assert separate.last_stats["prefill_tokens"] == sum(len(p) for p in batch)
    return shared, separate


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("duplicates", [False, True])
def test_common_prefix_is_prefilled_once_with_the_same_results(
    tiny_tokenizer: Any, few_shot_prompts: list[list[int]], arch: str, duplicates: bool
) -> None:
    from agent_r1.testing.models import tiny_model

    model = tiny_model(tiny_tokenizer, arch=arch, tie_word_embeddings=False, seed=0)
    order = [1, 0, 1, 2, 3, 1, 2] if duplicates else [0, 1, 2, 3]
    batch = [few_shot_prompts[i] for i in order]
    budgets = [12, 4, 9, 12, 1, 7, 12][: len(batch)]  # rows leave the batch at different steps
    sampling = SamplingParams(temperature=0.0, max_new_tokens=12)
    shared, separate = compare_with_and_without_sharing(
        model, tiny_tokenizer, batch, sampling, max_new_tokens=budgets
    )
    prefix = naive_common_prefix(few_shot_prompts)
    assert prefix >= 40  # system prompt and few-shot turns
    assert shared.last_stats["shared_prefix_tokens"] == prefix
    assert shared.last_stats["prefill_rows"] == len(few_shot_prompts)
    assert shared.last_stats["prefill_tokens"] == prefix + sum(len(p) - prefix for p in few_shot_prompts)
    # One more forward pass (the prefix alone), the same decoding steps.
    assert shared.last_stats["forward_passes"] == separate.last_stats["forward_passes"] + 1
    # And the same as a fresh forward pass over each whole sequence.
    generations = shared.generate(batch, sampling, max_new_tokens=budgets)
    for prompt, generation in zip(batch, generations, strict=True):
        expected = reference_logprobs(model, prompt, generation.token_ids, 0.0)
        assert generation.logprobs == pytest.approx(expected, abs=1e-4)


def test_a_prompt_that_is_the_common_prefix_keeps_its_last_token(
    model: Any, tiny_tokenizer: Any, few_shot_prompts: list[list[int]]
) -> None:
    base = few_shot_prompts[0]
    batch = [base + few_shot_prompts[1][-5:], base, base + few_shot_prompts[2][-9:]]
    sampling = SamplingParams(temperature=0.0, max_new_tokens=8)
    shared, _ = compare_with_and_without_sharing(model, tiny_tokenizer, batch, sampling)
    assert shared.last_stats["shared_prefix_tokens"] == len(base) - 1


def test_batches_without_a_long_common_prefix_prefill_whole_prompts(
    model: Any, tiny_tokenizer: Any, prompts: list[list[int]]
) -> None:
    plain = [list(tiny_tokenizer.encode(text)) for text in ["Hi there", "What is 2 + 3?", "Search"]]
    assert naive_common_prefix(plain) == 0
    sampling = SamplingParams(temperature=0.0, max_new_tokens=8)
    shared, _ = compare_with_and_without_sharing(model, tiny_tokenizer, [*plain, plain[1]], sampling)
    assert shared.last_stats["shared_prefix_tokens"] == 0 and shared.last_stats["prefill_rows"] == 3
    # Chat prompts share a few tokens ("<|im_start|>user\n"): below min_shared_prefix, not split off...
    assert 0 < naive_common_prefix(prompts) < 16
    shared, _ = compare_with_and_without_sharing(model, tiny_tokenizer, prompts, sampling)
    assert shared.last_stats["shared_prefix_tokens"] == 0
    # ...unless asked to, with the same results.
    eager = HFBackend({"min_shared_prefix": 1}, model=model, tokenizer=tiny_tokenizer)
    generations = eager.generate(prompts, sampling)
    assert eager.last_stats["shared_prefix_tokens"] == naive_common_prefix(prompts)
    for prompt, generation in zip(prompts, generations, strict=True):
        [alone] = eager.generate([prompt], sampling)  # a lone prompt is prefilled whole
        assert eager.last_stats["shared_prefix_tokens"] == 0
        assert alone.token_ids == generation.token_ids
        assert alone.logprobs == pytest.approx(generation.logprobs, abs=1e-5)


def test_sampling_with_a_shared_prefix_is_reproducible(
    model: Any, tiny_tokenizer: Any, few_shot_prompts: list[list[int]]
) -> None:
    batch = [few_shot_prompts[i] for i in [0, 2, 0, 1, 3, 3]]
    backend = HFBackend({}, model=model, tokenizer=tiny_tokenizer)

    def run(seed: int) -> list[list[int]]:
        sampling = SamplingParams(temperature=1.0, top_p=0.95, max_new_tokens=16, seed=seed)
        return [g.token_ids for g in backend.generate(batch, sampling)]

    first = run(7)
    assert backend.last_stats["shared_prefix_tokens"] > 0
    assert run(7) == first
    assert run(8) != first
    assert first[0] != first[2]  # copies of one prompt draw different samples
    sampling = SamplingParams(temperature=1.0, top_p=0.95, max_new_tokens=16, seed=7)
    compare_with_and_without_sharing(model, tiny_tokenizer, batch, sampling)


@pytest.fixture(scope="module")
def prefix_backend() -> HFBackend:
    from agent_r1.testing.models import tiny_model, tiny_tokenizer

    tokenizer = tiny_tokenizer()
    return HFBackend({"min_shared_prefix": 3}, model=tiny_model(tokenizer, layers=1), tokenizer=tokenizer)


@settings(max_examples=80, deadline=None)
@given(st.lists(st.lists(st.integers(0, 2), min_size=1, max_size=8).map(tuple), min_size=1, max_size=5))
def test_shared_prefix_length_against_a_naive_reference(
    prefix_backend: HFBackend, distinct: list[tuple[int, ...]]
) -> None:
    """The shared prefix is the longest common prefix, leaving every prompt at least one token,
    shared only among two or more prompts and only when at least ``min_shared_prefix`` long."""
    common = naive_common_prefix([list(p) for p in distinct])
    expected = min(common, min(len(p) for p in distinct) - 1) if len(distinct) > 1 else 0
    assert prefix_backend._shared_prefix_length(distinct) == (expected if expected >= 3 else 0)


def test_stop_sequence_ends_right_after_the_token_that_completes_it(
    model: Any, tiny_tokenizer: Any, prompts: list[list[int]]
) -> None:
    backend = HFBackend({}, model=model, tokenizer=tiny_tokenizer)
    [free] = backend.generate([prompts[2]], SamplingParams(temperature=1.0, max_new_tokens=24, seed=5))
    assert free.finish_reason == "length"
    # A stop string that the free run completes at its 6th token, spanning tokens 5-6.
    piece = tiny_tokenizer.decode(free.token_ids[4:6])
    stop = piece[-2:] if len(piece) >= 2 else piece
    first_hit = next(
        n
        for n in range(1, 25)
        if stop in tiny_tokenizer.decode(free.token_ids[:n], skip_special_tokens=False)
    )
    sampling = SamplingParams(temperature=1.0, max_new_tokens=24, seed=5, stop=["never-there", stop])
    [stopped] = backend.generate([prompts[2]], sampling)
    assert stopped.finish_reason == "stop" and stopped.stop_sequence == stop
    assert stopped.token_ids == free.token_ids[:first_hit]  # the sampled tokens, exactly
    assert stopped.logprobs == pytest.approx(free.logprobs[:first_hit], abs=1e-6)


def test_stop_sequences_are_searched_in_new_tokens_only(
    model: Any, tiny_tokenizer: Any, prompts: list[list[int]]
) -> None:
    backend = HFBackend({}, model=model, tokenizer=tiny_tokenizer)
    sampling = SamplingParams(temperature=0.0, max_new_tokens=5, stop=["<|im_start|>assistant"])
    [generation] = backend.generate([prompts[0]], sampling)  # the prompt ends with the stop string
    assert generation.finish_reason == "length" and len(generation.token_ids) == 5


def test_max_new_tokens_per_call_and_per_row(
    model: Any, tiny_tokenizer: Any, prompts: list[list[int]]
) -> None:
    backend = HFBackend({}, model=model, tokenizer=tiny_tokenizer)
    sampling = SamplingParams(temperature=0.0, max_new_tokens=7)
    full = backend.generate(prompts, sampling)
    assert [len(g.token_ids) for g in full] == [7, 7, 7] and {g.finish_reason for g in full} == {"length"}
    capped = backend.generate(prompts, sampling, max_new_tokens=[3, 0, 50])
    assert [len(g.token_ids) for g in capped] == [3, 0, 7]
    assert [g.finish_reason for g in capped] == ["length", "length", "length"]
    assert capped[0].token_ids == full[0].token_ids[:3] and capped[2].token_ids == full[2].token_ids
    with pytest.raises(ValueError, match="3 prompts"):
        backend.generate(prompts, sampling, max_new_tokens=[1])


def test_eos_and_end_of_turn_tokens_stop_generation(
    model: Any, tiny_tokenizer: Any, prompts: list[list[int]]
) -> None:
    im_end = tiny_tokenizer.convert_tokens_to_ids("<|im_end|>")
    backend = HFBackend({}, model=model, tokenizer=tiny_tokenizer)
    assert im_end in backend.stop_token_ids
    sampling = SamplingParams(temperature=1.0, max_new_tokens=20, seed=2)
    [free] = backend.generate([prompts[1]], sampling)
    third = free.token_ids[2]
    assert third not in free.token_ids[:2]
    ends_early = HFBackend({"stop_token_ids": [third]}, model=model, tokenizer=tiny_tokenizer)
    [stopped] = ends_early.generate([prompts[1]], sampling)
    assert stopped.finish_reason == "eos" and stopped.token_ids == free.token_ids[:3]
    assert stopped.stop_sequence is None


def test_finished_rows_leave_the_batch(model: Any, tiny_tokenizer: Any, prompts: list[list[int]]) -> None:
    backend = HFBackend({}, model=model, tokenizer=tiny_tokenizer)
    sampling = SamplingParams(temperature=0.0, max_new_tokens=30)
    generations = backend.generate(prompts, sampling, max_new_tokens=[2, 30, 5])
    assert [len(g.token_ids) for g in generations] == [2, 30, 5]
    # One row was sampled per active row and step: rows that finished were not decoded further.
    assert backend.last_stats["generated_tokens"] == 37
    assert backend.last_stats["forward_passes"] == 30  # one prefill + 29 decoding steps


def test_sample_tokens_filters_without_renormalising_logprobs() -> None:
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]])).repeat(2000, 1)  # [2000, 4]
    generator = torch.Generator().manual_seed(0)
    expected = torch.log_softmax(logits[0] / 0.5, dim=-1)

    tokens, logprobs = sample_tokens(logits, SamplingParams(temperature=0.5, top_k=2), generator)
    assert set(tokens.tolist()) == {0, 1}
    assert torch.allclose(logprobs, expected[tokens])

    # p at T=1: [0.5, 0.3, 0.15, 0.05]; top_p=0.7 keeps the tokens whose preceding mass is < 0.7.
    tokens, logprobs = sample_tokens(logits, SamplingParams(temperature=1.0, top_p=0.7), generator)
    assert set(tokens.tolist()) == {0, 1}
    tokens, _ = sample_tokens(logits, SamplingParams(temperature=1.0, top_p=0.85), generator)
    assert set(tokens.tolist()) == {0, 1, 2}
    share = (tokens == 0).float().mean().item()
    assert 0.5 / 0.95 - 0.05 < share < 0.5 / 0.95 + 0.05  # drawn from the renormalised filter

    tokens, logprobs = sample_tokens(logits[:1] * 3, SamplingParams(temperature=0.0))
    assert tokens.tolist() == [0]
    assert logprobs.item() == pytest.approx(torch.log_softmax(logits[0] * 3, dim=-1)[0].item())


def test_sync_weights_records_the_version_and_swaps_the_model(
    model: Any, tiny_tokenizer: Any, prompts: list[list[int]]
) -> None:
    from agent_r1.testing.models import tiny_model

    backend = HFBackend({}, model=model, tokenizer=tiny_tokenizer)
    sampling = SamplingParams(temperature=0.0, max_new_tokens=6)
    before = backend.generate(prompts, sampling)
    backend.sync_weights(model, 3)
    assert backend.policy_version == 3 and backend.model is model
    other = tiny_model(tiny_tokenizer, tie_word_embeddings=False, seed=1)
    backend.sync_weights(other, 4)
    assert backend.model is other and backend.policy_version == 4
    assert [g.token_ids for g in backend.generate(prompts, sampling)] != [g.token_ids for g in before]


def test_training_mode_is_restored(model: Any, tiny_tokenizer: Any, prompts: list[list[int]]) -> None:
    backend = HFBackend({}, model=model, tokenizer=tiny_tokenizer)
    model.train()
    backend.generate(prompts[:1], SamplingParams(max_new_tokens=2, seed=0))
    assert model.training


def test_registered_as_hf_and_needs_model_and_tokenizer(tiny_tokenizer: Any) -> None:
    from agent_r1.errors import AgentR1Error
    from agent_r1.registry import Registry

    assert Registry().get("rollout_backends", "hf") is HFBackend
    with pytest.raises(AgentR1Error, match="needs the policy model and its tokenizer"):
        HFBackend({}, tokenizer=tiny_tokenizer)
    with pytest.raises(Exception, match="max_batch_size"):
        HFBackend({"max_batch_size": 0})
