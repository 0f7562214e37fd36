"""KV-cache reuse across turns in the ``hf`` backend (agent_r1.builtins.hf_backend): a prompt that
continues a row of the previous call prefills only its new tokens. Checked against the same backend
with reuse off (identical tokens, log-probabilities within 1e-4) through the real rollout engine,
with mixed continuations and new prompts, episodes ending at different turns, chunked batches,
after weight changes (never a stale cache), under a memory cap, on a model whose cache cannot be
kept, and in a real training step (the step metrics)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent_r1.builtins.hf_backend import STEP_METRICS, HFBackend
from agent_r1.contracts import ComponentConfig, Environment, EpisodeStart, Generation, SamplingParams
from agent_r1.mdp import Action, Observation, Task, Trajectory
from agent_r1.rollout.loop import RolloutEngine


@pytest.fixture(autouse=True, scope="module")
def _one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    from agent_r1.testing.models import tiny_tokenizer

    return tiny_tokenizer()


def untied_model(tokenizer: Any, arch: str = "llama", seed: int = 0, layers: int = 2) -> Any:
    """Untied embeddings: with tied ones, greedy decoding of a random model just repeats the last
    prompt token, which would make the greedy comparisons vacuous."""
    from agent_r1.testing.models import tiny_model

    return tiny_model(tokenizer, arch=arch, tie_word_embeddings=False, seed=seed, layers=layers)


def backends(model: Any, tokenizer: Any, **options: Any) -> tuple[HFBackend, HFBackend]:
    reuse = HFBackend({**options}, model=model, tokenizer=tokenizer)
    plain = HFBackend({**options, "reuse_kv_across_turns": False}, model=model, tokenizer=tokenizer)
    return reuse, plain


def assert_same(reused: list[Generation], plain: list[Generation]) -> None:
    for a, b in zip(reused, plain, strict=True):
        assert a.token_ids == b.token_ids
        assert a.finish_reason == b.finish_reason
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)


def chat(tokenizer: Any, text: str) -> list[int]:
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
    )
    return list(tokenizer.encode(rendered, add_special_tokens=False))


def observation(tokenizer: Any, text: str) -> list[int]:
    """Closure, a tool message and the next assistant header, as the engine appends them."""
    rendered = f"<|im_end|>\n<|im_start|>tool\n{text}<|im_end|>\n<|im_start|>assistant\n"
    return list(tokenizer.encode(rendered, add_special_tokens=False))


def reference_logprobs(model: Any, prompt: list[int], tokens: list[int]) -> list[float]:
    """Greedy log-probabilities (temperature 1) of ``tokens`` after ``prompt``: one forward pass,
    no cache."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + tokens])).logits[0].float()  # [T, V]
    logp = torch.log_softmax(logits, dim=-1)
    return [logp[len(prompt) - 1 + i, t].item() for i, t in enumerate(tokens)]


# --------------------------------------------------------------------------------------------
# Multi-turn rollouts through the real engine
# --------------------------------------------------------------------------------------------


class TurnsEnv(Environment):
    """Answers each action with a tool message naming the turn and the action's length; ends after
    the task's ``metadata["turns"]`` actions, so episodes of one batch end at different turns."""

    name = "turns_env"

    class Config(ComponentConfig):
        pass

    async def reset(self, task: Task) -> EpisodeStart:
        self.turns = int(task.metadata["turns"])
        return EpisodeStart(messages=list(task.messages))

    async def step(self, action: Action, turn: int) -> Observation:
        if turn + 1 >= self.turns:
            return Observation(done=True, termination="answer")
        text = f"turn {turn}: {len(action.token_ids)} tokens read." * (1 + turn % 2)
        return Observation(messages=[{"role": "tool", "content": text}])


def turn_tasks() -> list[Task]:
    questions = ["What is 2 + 3?", "Hi", "Search the documents for the title of the film.", "Add 7 and 9."]
    return [
        Task(id=f"t{i}", messages=[{"role": "user", "content": q}], metadata={"turns": 1 + (i * 2) % 5})
        for i, q in enumerate(questions)
    ]


def rollout(backend: HFBackend, tokenizer: Any, temperature: float, **engine: Any) -> list[Trajectory]:
    options = {"max_turns": 5, "max_new_tokens": 8, "max_context": 400, **engine}
    runner = RolloutEngine(
        backend,
        tokenizer,
        lambda: TurnsEnv(),
        sampling=SamplingParams(temperature=temperature, top_p=0.95 if temperature else 1.0),
        **options,
    )
    return runner.collect(turn_tasks(), group_size=2, seed=5, group_salt="s")


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_rollout_with_reuse_equals_rollout_without(tokenizer: Any, arch: str, temperature: float) -> None:
    model = untied_model(tokenizer, arch)
    reuse, plain = backends(model, tokenizer)
    with_reuse = rollout(reuse, tokenizer, temperature)
    reused_tokens = reuse.step_metrics()
    assert reuse._kept == {} and reuse._kept_bytes == 0  # freed when the batch of episodes ended
    without = rollout(plain, tokenizer, temperature)
    plain_tokens = plain.step_metrics()
    assert sorted({len(t.steps) for t in with_reuse}) == [1, 2, 3, 5]  # episodes end at different turns
    for a, b in zip(with_reuse, without, strict=True):
        assert a.token_ids == b.token_ids
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)
    # Later turns prefilled far less (every prompt token is prefilled or reused; without reuse a
    # turn's prompts may still share a prefix, so the sum is at least the plain prefill).
    assert plain_tokens["rollout/reused_prefix_tokens"] == 0
    assert (
        reused_tokens["rollout/prefill_tokens"] + reused_tokens["rollout/reused_prefix_tokens"]
        >= plain_tokens["rollout/prefill_tokens"]
    )
    assert reused_tokens["rollout/prefill_tokens"] < 0.6 * plain_tokens["rollout/prefill_tokens"]
    if temperature == 0.0:  # and both equal a fresh forward pass over each whole trajectory
        for trajectory in with_reuse:
            ids, mask = trajectory.token_ids, trajectory.loss_mask
            first = mask.index(1)
            expected = reference_logprobs(model, ids[:first], ids[first:])
            got = [lp for lp, m in zip(trajectory.logprobs, mask, strict=True) if m]
            assert got == pytest.approx(
                [e for e, m in zip(expected, mask[first:], strict=True) if m], abs=1e-4
            )


def test_rollout_in_chunks_and_without_prefix_sharing(tokenizer: Any) -> None:
    """Chunks of 3 rows: a turn's continuations are split across forward passes."""
    model = untied_model(tokenizer, seed=2)
    reuse, plain = backends(model, tokenizer, max_batch_size=3, prefix_sharing=False)
    with_reuse = rollout(reuse, tokenizer, 1.0)
    without = rollout(plain, tokenizer, 1.0)
    assert [t.token_ids for t in with_reuse] == [t.token_ids for t in without]
    for a, b in zip(with_reuse, without, strict=True):
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)
    assert reuse.step_metrics()["rollout/reused_prefix_tokens"] > 0


# --------------------------------------------------------------------------------------------
# Batches that mix continuations, duplicates and new prompts
# --------------------------------------------------------------------------------------------

SYSTEM = "You are a careful assistant. Search the documents when you need facts, then answer briefly."


def few_shot(tokenizer: Any, question: str) -> list[int]:
    messages = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "What is 12 + 30?"},
        {"role": "assistant", "content": "<tool_call>12 + 30</tool_call>"},
        {"role": "user", "content": question},
    ]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return list(tokenizer.encode(text, add_special_tokens=False))


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_mixed_batches_of_continuations_duplicates_and_new_prompts(tokenizer: Any, arch: str) -> None:
    model = untied_model(tokenizer, arch, seed=1)
    reuse, plain = backends(model, tokenizer)
    sampling = SamplingParams(temperature=0.0, max_new_tokens=8)
    first = [chat(tokenizer, q) for q in ["What is 2 + 3?", "Hi", "Search the documents, then answer."]]
    first.append(first[0])  # a duplicate: greedy copies keep one cache between them
    a = reuse.generate(first, sampling, max_new_tokens=[8, 3, 6, 8])
    b = plain.generate(first, sampling, max_new_tokens=[8, 3, 6, 8])
    assert_same(a, b)
    assert reuse.last_stats["kept_rows"] == 3 and reuse.last_stats["reused_rows"] == 0

    # Turn 2: rows 0, 2 and 3 continue (row 3 twice; 0 and 3 from the cache they share), 1 ended; two new
    # few-shot prompts share a long prefix between them, prefilled once beside the continuations.
    news = [few_shot(tokenizer, "Hi"), few_shot(tokenizer, "Add 17 and 25, then multiply the sum by 3.")]
    second = [
        first[0] + a[0].token_ids + observation(tokenizer, "5"),
        news[0],
        first[2] + a[2].token_ids + observation(tokenizer, "nothing found, try again later"),
        first[3] + a[3].token_ids + observation(tokenizer, "5, as before"),
        news[1],
        first[3] + a[3].token_ids + observation(tokenizer, "5, as before"),
    ]
    budgets = [8, 2, 8, 5, 8, 8]  # rows leave the batch at different steps
    a2 = reuse.generate(second, sampling, max_new_tokens=budgets)
    b2 = plain.generate(second, sampling, max_new_tokens=budgets)
    assert_same(a2, b2)
    stats = reuse.last_stats
    assert stats["reused_rows"] == 3  # distinct continuations (rows 3 and 5 are one prompt)
    cached = [len(first[i]) + len(a[i].token_ids) - 1 for i in (0, 2, 3)]
    assert stats["reused_prefix_tokens"] == sum(cached)
    common = next(i for i, (x, y) in enumerate(zip(*news, strict=False)) if x != y)
    assert stats["shared_prefix_tokens"] == common >= 16
    distinct = [second[i] for i in (0, 1, 2, 3, 4)]
    # Every distinct prompt token is prefilled or reused, the shared prefix prefilled once for two.
    assert stats["prefill_tokens"] + stats["reused_prefix_tokens"] == sum(map(len, distinct)) - common
    for prompt, generation in zip(second, a2, strict=True):
        expected = reference_logprobs(model, prompt, generation.token_ids)
        assert generation.logprobs == pytest.approx(expected, abs=1e-4)

    # Turn 3: only new prompts, so nothing kept is continued and the old caches are gone.
    third = [chat(tokenizer, "Hello again"), chat(tokenizer, "What is 4 * 4?")]
    a3 = reuse.generate(third, sampling)
    assert_same(a3, plain.generate(third, sampling))
    assert reuse.last_stats["reused_rows"] == 0
    assert set(reuse._kept) == {tuple(p + g.token_ids[:-1]) for p, g in zip(third, a3, strict=True)}


def test_a_prompt_equal_to_a_kept_row_plus_its_last_token(tokenizer: Any) -> None:
    """The shortest continuation: the kept cache lacks only the last sampled token."""
    model = untied_model(tokenizer)
    reuse, plain = backends(model, tokenizer)
    sampling = SamplingParams(temperature=0.0, max_new_tokens=5)
    prompt = chat(tokenizer, "What is 2 + 3?")
    [first] = reuse.generate([prompt], sampling)
    following = [prompt + first.token_ids, prompt + first.token_ids[:-1]]  # the second is no continuation
    assert_same(reuse.generate(following, sampling), plain.generate(following, sampling))
    assert reuse.last_stats["reused_rows"] == 1
    assert reuse.last_stats["prefill_tokens"] == 1 + len(following[1])


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_random_call_sequences_match_reuse_off(data: st.DataObject, tokenizer: Any) -> None:
    """Random sequences of calls: each row continues a row of the previous call (with random
    observation tokens) or starts afresh; random budgets, chunk sizes and sampling."""
    model = untied_model(tokenizer, layers=1, seed=data.draw(st.integers(0, 3)))
    options = {
        "max_batch_size": data.draw(st.integers(1, 5)),
        "prefix_sharing": data.draw(st.booleans()),
        "min_shared_prefix": data.draw(st.integers(1, 8)),
    }
    reuse, plain = backends(model, tokenizer, **options)
    temperature = data.draw(st.sampled_from([0.0, 1.0]))
    vocab = st.integers(5, len(tokenizer) - 1)
    previous: list[list[int]] = []
    for call in range(data.draw(st.integers(2, 4))):
        prompts = []
        for _ in range(data.draw(st.integers(1, 5))):
            if previous and data.draw(st.booleans()):
                prompts.append(data.draw(st.sampled_from(previous)) + data.draw(st.lists(vocab, max_size=6)))
            else:
                prompts.append(data.draw(st.lists(vocab, min_size=1, max_size=12)))
        budgets = data.draw(st.lists(st.integers(0, 6), min_size=len(prompts), max_size=len(prompts)))
        sampling = SamplingParams(temperature=temperature, max_new_tokens=6, seed=call)
        a = reuse.generate(prompts, sampling, max_new_tokens=budgets)
        assert_same(a, plain.generate(prompts, sampling, max_new_tokens=budgets))
        assert reuse.last_stats["prefill_tokens"] <= plain.last_stats["prefill_tokens"]
        previous = [p + g.token_ids for p, g in zip(prompts, a, strict=True) if g.token_ids]


@settings(max_examples=200, deadline=None)
@given(
    kept=st.lists(st.lists(st.integers(0, 2), min_size=1, max_size=6).map(tuple), max_size=6),
    prompt=st.lists(st.integers(0, 2), min_size=1, max_size=8).map(tuple),
)
def test_finding_a_kept_cache_against_a_naive_reference(
    tokenizer: Any, kept: list[tuple[int, ...]], prompt: tuple[int, ...]
) -> None:
    """The cache a prompt continues is the longest kept token sequence that is a proper prefix of
    it (the prompt keeps a token of its own)."""
    backend = HFBackend({}, model=_shared_tiny_model(tokenizer), tokenizer=tokenizer)
    for tokens in kept:
        backend._store(tokens, [], 0)
    candidates = [k for k in kept if len(k) < len(prompt) and prompt[: len(k)] == k]
    found = backend._find_kept(prompt)
    if not candidates:
        assert found is None
    else:
        assert found is not None and found.tokens == max(candidates, key=len)


_MODELS: dict[int, Any] = {}


def _shared_tiny_model(tokenizer: Any) -> Any:
    if id(tokenizer) not in _MODELS:
        _MODELS[id(tokenizer)] = untied_model(tokenizer, layers=1)
    return _MODELS[id(tokenizer)]


# --------------------------------------------------------------------------------------------
# Never a stale cache; memory cap; models whose cache cannot be kept
# --------------------------------------------------------------------------------------------


def two_turns(backend: HFBackend, tokenizer: Any, change: Any) -> tuple[list[Generation], list[list[int]]]:
    """Generate a turn, let ``change`` act on the backend, then generate the continuations."""
    sampling = SamplingParams(temperature=0.0, max_new_tokens=6)
    prompts = [chat(tokenizer, q) for q in ["What is 2 + 3?", "Search the documents, then answer."]]
    firsts = backend.generate(prompts, sampling)
    change(backend)
    following = [p + g.token_ids + observation(tokenizer, "42") for p, g in zip(prompts, firsts, strict=True)]
    return backend.generate(following, sampling), following


def perturb(model: Any) -> None:
    """An in-place update of every weight, as an optimizer step makes."""
    with torch.no_grad(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.2)


@pytest.mark.parametrize("how", ["sync_weights", "in_place_without_sync", "optimizer_step", "new_model"])
def test_caches_are_not_reused_after_the_weights_change(tokenizer: Any, how: str) -> None:
    model = untied_model(tokenizer)
    other = untied_model(tokenizer, seed=7)

    def change(backend: HFBackend) -> None:
        if how == "sync_weights":
            perturb(model)
            backend.sync_weights(model, 1)
        elif how == "in_place_without_sync":
            perturb(model)
        elif how == "optimizer_step":
            optimizer = torch.optim.AdamW(model.parameters(), lr=0.05)
            ids = torch.tensor([chat(tokenizer, "Hi")])
            model(ids, labels=ids).loss.backward()
            optimizer.step()
        else:
            backend.sync_weights(other, 1)

    backend = HFBackend({}, model=model, tokenizer=tokenizer)
    after, following = two_turns(backend, tokenizer, change)
    assert backend.last_stats["reused_rows"] == 0
    current = backend.model
    fresh = HFBackend({"reuse_kv_across_turns": False}, model=current, tokenizer=tokenizer)
    assert_same(after, fresh.generate(following, SamplingParams(temperature=0.0, max_new_tokens=6)))
    for prompt, generation in zip(following, after, strict=True):  # the new weights' numbers
        assert generation.logprobs == pytest.approx(
            reference_logprobs(current, prompt, generation.token_ids), abs=1e-4
        )


def test_a_stale_cache_would_show(tokenizer: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The control for the test above: with the weight check disabled, the old cache is reused and
    the log-probabilities move away from the new weights' (so that test can fail)."""
    model = untied_model(tokenizer)
    backend = HFBackend({}, model=model, tokenizer=tokenizer)
    monkeypatch.setattr(backend, "_weights_key", lambda: ())
    after, following = two_turns(backend, tokenizer, lambda _: perturb(model))
    assert backend.last_stats["reused_rows"] == 2
    gaps = [
        max(abs(x - y) for x, y in zip(g.logprobs, reference_logprobs(model, p, g.token_ids), strict=True))
        for p, g in zip(following, after, strict=True)
    ]
    assert max(gaps) > 1e-3


def test_memory_cap_keeps_what_fits(tokenizer: Any) -> None:
    model = untied_model(tokenizer)
    sampling = SamplingParams(temperature=0.0, max_new_tokens=6)
    prompts = [chat(tokenizer, q) for q in ["What is 2 + 3?", "Hi", "Search the documents, then answer."]]
    probe = HFBackend({}, model=model, tokenizer=tokenizer)
    firsts = probe.generate(prompts, sampling)
    sizes = {tokens: kept.nbytes for tokens, kept in probe._kept.items()}
    assert len(sizes) == 3 and probe.last_stats["kept_gib"] == pytest.approx(sum(sizes.values()) / 2**30)
    following = [p + g.token_ids + observation(tokenizer, "7") for p, g in zip(prompts, firsts, strict=True)]
    for cap_bytes, kept_rows in [(0, 0), (max(sizes.values()), 1), (sum(sizes.values()), 3)]:
        reuse, plain = backends(model, tokenizer, reuse_kv_max_gib=cap_bytes / 2**30)
        reuse.generate(prompts, sampling)
        assert reuse.last_stats["kept_rows"] == kept_rows
        assert reuse.last_stats["kv_cap_skipped_rows"] == 3 - kept_rows
        assert_same(reuse.generate(following, sampling), plain.generate(following, sampling))
        assert reuse.last_stats["reused_rows"] == kept_rows
        assert reuse.step_metrics()["rollout/kv_cap_skipped_rows"] >= 3 - kept_rows


def test_a_sliding_window_cache_is_not_kept_and_says_so(tokenizer: Any) -> None:
    from transformers import AutoModelForCausalLM, Qwen2Config

    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        use_sliding_window=True,
        sliding_window=8,
        max_window_layers=0,
        tie_word_embeddings=False,
        pad_token_id=tokenizer.pad_token_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    reuse, plain = backends(model, tokenizer)
    sampling = SamplingParams(temperature=0.0, max_new_tokens=4)
    prompt = chat(tokenizer, "Search the documents, then answer.")
    with pytest.warns(UserWarning, match="DynamicSlidingWindowLayer.*reuse_kv_across_turns: false"):
        [first] = reuse.generate([prompt], sampling)
    assert reuse.last_stats["kept_rows"] == 0
    following = [prompt + first.token_ids + observation(tokenizer, "3")]
    assert_same(reuse.generate(following, sampling), plain.generate(following, sampling))
    assert reuse.last_stats["reused_rows"] == 0


# --------------------------------------------------------------------------------------------
# Step metrics in a real training step
# --------------------------------------------------------------------------------------------


def test_step_metrics_are_documented() -> None:
    text = (Path(__file__).parents[1] / "docs" / "metrics.md").read_text(encoding="utf-8")
    for key in STEP_METRICS:
        assert f"`{key}`" in text, key


def test_a_multi_turn_training_step_logs_prefill_and_decode(tmp_path: Path, builtin_registry: Any) -> None:
    from agent_r1.config import RunConfig, validate_components
    from agent_r1.engine import build_session, train_step
    from agent_r1.testing.models import save_tiny_model, tiny_tokenizer

    tokenizer = tiny_tokenizer()
    model_dir = save_tiny_model(tmp_path / "model", untied_model(tokenizer), tokenizer)
    config = RunConfig.model_validate(
        {
            "seed": 0,
            "output_dir": str(tmp_path / "run"),
            "model": {"path": str(model_dir)},
            "data": {"name": "arithmetic"},
            # A random model writes no calls: it is told so and goes on, for three turns.
            "environment": {"name": "calculator", "end_on_no_tool_call": False, "few_shot": 1},
            "rollout": {"group_size": 2, "max_turns": 3, "max_new_tokens": 6, "max_context": 600},
            "rewards": [{"name": "answer_match"}],
            "algorithm": {"name": "grpo"},
            "trainer": {"steps": 2, "tasks_per_step": 2, "micro_batch_size": 4, "lr": 1e-3},
            "trackers": [],
        }
    )
    session = build_session(
        config, validate_components(config, builtin_registry), tmp_path / "run", registry=builtin_registry
    )
    metrics = train_step(session).metrics
    assert set(STEP_METRICS) <= set(metrics)
    assert metrics["time/generate_prefill_s"] > 0 and metrics["time/generate_decode_s"] > 0
    assert metrics["rollout/reused_prefix_tokens"] > metrics["rollout/prefill_tokens"] > 0
    assert metrics["rollout/shared_prefix_tokens"] > 0  # the first turn's system prompt and example
    assert session.backend._kept == {}  # the update synced new weights: the caches went with the old
    second = train_step(session).metrics
    assert second["rollout/reused_prefix_tokens"] > 0
