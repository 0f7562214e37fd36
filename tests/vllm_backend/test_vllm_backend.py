"""The ``vllm`` rollout backend against the ``hf`` backend and the trainer, on SmolLM2-135M-Instruct
(float32, CPU): same greedy tokens for the same multi-turn episodes, the same stop conventions, sampled
log-probabilities equal to the trainer's recomputation, and in-place weight sync (full weights)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from agent_r1.builtins.hf_backend import HFBackend
from agent_r1.contracts import ComponentConfig, Environment, EpisodeStart, SamplingParams
from agent_r1.engine.learner.batch import collate
from agent_r1.engine.learner.loss_utils import mismatch_kl
from agent_r1.engine.learner.packing import no_grad_logprobs
from agent_r1.engine.learner.rollout_correction import ratio_stats
from agent_r1.mdp import Action, Observation, Task
from agent_r1.rollout.loop import RolloutEngine

LOGPROB_TOLERANCE = 2e-4
"""Largest |vLLM - trainer| per-token log-probability accepted in float32 on CPU (measured: ~1e-5)."""

QUESTIONS = ["What is 2+3?", "Name a colour.", "Say hi in French.", "Count to three."]


class FollowUpEnv(Environment):
    """Three turns: after each answer the user asks a follow-up question, so every episode has
    environment tokens between policy turns (the chat template's closure and headers included)."""

    name = "follow_up"

    class Config(ComponentConfig):
        turns: int = 3

    async def reset(self, task: Task) -> EpisodeStart:
        return EpisodeStart(messages=list(task.messages))

    async def step(self, action: Action, turn: int) -> Observation:
        if turn + 1 >= self.config.turns:
            return Observation(done=True, termination="answer", answer=action.text)
        return Observation(messages=[{"role": "user", "content": f"Why? Answer in one line ({turn})."}])


def _tasks() -> list[Task]:
    return [Task(id=f"q{i}", messages=[{"role": "user", "content": q}]) for i, q in enumerate(QUESTIONS)]


def _engine(backend: Any, tokenizer: Any, temperature: float, max_new_tokens: int = 16) -> RolloutEngine:
    return RolloutEngine(
        backend,
        tokenizer,
        FollowUpEnv,
        max_turns=3,
        max_new_tokens=max_new_tokens,
        max_context=1024,
        sampling=SamplingParams(temperature=temperature, max_new_tokens=max_new_tokens),
    )


def _greedy(backend: Any, prompts: list[list[int]], **kwargs: Any) -> list[Any]:
    return backend.generate(prompts, SamplingParams(temperature=0, max_new_tokens=16), **kwargs)


def _prompts(tokenizer: Any) -> list[list[int]]:
    return [
        list(
            tokenizer.apply_chat_template(
                [{"role": "user", "content": q}], add_generation_prompt=True, return_dict=False
            )
        )
        for q in QUESTIONS
    ]


def test_greedy_multi_turn_episodes_match_hf(smollm2: tuple[Any, Any], vllm_backend: Any) -> None:
    model, tokenizer = smollm2
    hf = HFBackend({}, model=model, tokenizer=tokenizer)
    with_hf = _engine(hf, tokenizer, 0.0).collect(_tasks(), seed=0, group_salt="s")
    with_vllm = _engine(vllm_backend, tokenizer, 0.0).collect(_tasks(), seed=0, group_salt="s")
    assert len(with_hf) == len(with_vllm) == 4
    turns = 0
    for a, b in zip(with_hf, with_vllm, strict=True):
        assert a.token_ids == b.token_ids, (tokenizer.decode(a.token_ids), tokenizer.decode(b.token_ids))
        assert a.loss_mask == b.loss_mask
        assert [s.action.finish_reason for s in a.steps] == [s.action.finish_reason for s in b.steps]
        lp_a = torch.tensor(a.logprobs)
        lp_b = torch.tensor(b.logprobs)
        assert (lp_a - lp_b).abs().max() < LOGPROB_TOLERANCE
        turns += len(b.steps)
    assert turns == 4 * 3, "every episode should have run its three turns"
    finishes = {s.action.finish_reason for t in with_vllm for s in t.steps}
    assert "eos" in finishes, f"no episode ended a turn on its own: {finishes}"


def test_finish_reasons_budgets_and_stop_strings_match_hf(
    smollm2: tuple[Any, Any], vllm_backend: Any
) -> None:
    model, tokenizer = smollm2
    hf = HFBackend({}, model=model, tokenizer=tokenizer)
    prompts = _prompts(tokenizer)
    budgets = [16, 3, 0, 16]
    for stop in ([], ["."], [" the", "!"]):
        sampling = SamplingParams(temperature=0, max_new_tokens=16, stop=stop)
        expected = hf.generate(prompts, sampling, max_new_tokens=budgets)
        got = vllm_backend.generate(prompts, sampling, max_new_tokens=budgets)
        for e, g in zip(expected, got, strict=True):
            assert (g.token_ids, g.finish_reason, g.stop_sequence) == (
                e.token_ids,
                e.finish_reason,
                e.stop_sequence,
            )
    assert got[1].finish_reason == "length" and len(got[1].token_ids) == 3
    assert got[2].token_ids == [] and got[2].finish_reason == "length"


def test_end_of_turn_token_is_kept_as_last_token(smollm2: tuple[Any, Any], vllm_backend: Any) -> None:
    _, tokenizer = smollm2
    out = vllm_backend.generate(_prompts(tokenizer)[:1], SamplingParams(temperature=0, max_new_tokens=64))[0]
    assert out.finish_reason == "eos"
    assert out.token_ids[-1] in vllm_backend.stop_token_ids
    assert len(out.logprobs) == len(out.token_ids)


def test_same_seed_same_samples(smollm2: tuple[Any, Any], vllm_backend: Any) -> None:
    _, tokenizer = smollm2
    prompts = _prompts(tokenizer) * 2
    sampling = SamplingParams(temperature=1.0, max_new_tokens=12, seed=7)
    first = [g.token_ids for g in vllm_backend.generate(prompts, sampling)]
    again = [g.token_ids for g in vllm_backend.generate(prompts, sampling)]
    other = [g.token_ids for g in vllm_backend.generate(prompts, sampling.model_copy(update={"seed": 8}))]
    assert first == again
    assert first != other
    assert first[0] != first[4] or first[1] != first[5], "rows with the same prompt should differ"


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampled_logprobs_match_the_trainers_recomputation(
    temperature: float, smollm2: tuple[Any, Any], vllm_backend: Any
) -> None:
    model, tokenizer = smollm2
    trajectories = _engine(vllm_backend, tokenizer, temperature).collect(
        _tasks(), group_size=2, seed=3, group_salt="s"
    )
    batch = collate(trajectories, tokenizer.pad_token_id or 0)
    trainer = no_grad_logprobs(model, batch, temperature, 8)  # [B, T]
    mask = batch.loss_mask
    difference = (trainer - batch.rollout_logprobs).abs()[mask]
    assert mask.sum() > 40
    assert difference.max() < LOGPROB_TOLERANCE, float(difference.max())
    mismatch = mismatch_kl(trainer, batch.rollout_logprobs, mask)
    stats = ratio_stats(trainer, batch.rollout_logprobs, mask)
    assert abs(mismatch["mismatch/kl_k1"]) < 1e-5 and mismatch["mismatch/kl_k3"] < 1e-8
    assert stats["mismatch/ratio_max"] < 1.001 and stats["mismatch/masked_frac"] == 0.0
    print(
        f"T={temperature}: {int(mask.sum())} tokens, max |dlogp| {float(difference.max()):.2e}, "
        f"kl_k3 {mismatch['mismatch/kl_k3']:.2e}"
    )


def test_top_k_logprobs_are_renormalised_and_the_mismatch_metric_shows_it(
    smollm2: tuple[Any, Any], vllm_backend: Any
) -> None:
    """With a top-k filter vLLM's processed log-probabilities are those of the truncated
    distribution (>= the trainer's): the documented gap, which the mismatch metrics reveal."""
    model, tokenizer = smollm2
    engine = _engine(vllm_backend, tokenizer, 1.0, max_new_tokens=16)
    engine.sampling = engine.sampling.model_copy(update={"top_k": 5})
    trajectories = engine.collect(_tasks(), group_size=2, seed=3, group_salt="s")
    batch = collate(trajectories, tokenizer.pad_token_id or 0)
    trainer = no_grad_logprobs(model, batch, 1.0, 8)
    mask = batch.loss_mask
    assert bool((batch.rollout_logprobs[mask] >= trainer[mask] - LOGPROB_TOLERANCE).all())
    assert mismatch_kl(trainer, batch.rollout_logprobs, mask)["mismatch/kl_k1"] > 1e-3


def test_sync_loads_changed_weights_in_place(
    smollm2: tuple[Any, Any], fresh_smollm2: Any, vllm_backend: Any
) -> None:
    original, tokenizer = smollm2
    prompts = _prompts(tokenizer)
    before = [g.token_ids for g in _greedy(vllm_backend, prompts)]
    changed = fresh_smollm2
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in changed.named_parameters():
            if ".mlp." in name or "self_attn.o_proj" in name:
                param.add_(torch.randn(param.shape, generator=generator) * 0.02)
    engine_id = id(vllm_backend.llm)
    try:
        vllm_backend.sync_weights(changed, 7)
        assert id(vllm_backend.llm) == engine_id and vllm_backend.policy_version == 7
        after = [g.token_ids for g in _greedy(vllm_backend, prompts)]
        expected = [g.token_ids for g in _greedy(HFBackend({}, model=changed, tokenizer=tokenizer), prompts)]
        assert after == expected
        assert after != before
        trajectories = _engine(vllm_backend, tokenizer, 0.0).collect(
            _tasks()[:1], policy_version=vllm_backend.policy_version
        )
        assert trajectories[0].policy_version == 7
    finally:
        vllm_backend.sync_weights(original, 0)
    assert [g.token_ids for g in _greedy(vllm_backend, prompts)] == before
    metrics = vllm_backend.step_metrics()
    assert metrics["backend/policy_version"] == 0.0 and metrics["backend/sync_tensors"] > 100


def test_sleep_is_skipped_on_cpu(vllm_backend: Any) -> None:
    vllm_backend.sleep()
    assert not vllm_backend._asleep
    assert "backend/sleep_freed_gib" not in vllm_backend.step_metrics()


def test_a_prompt_longer_than_the_engine_is_a_clear_error(
    smollm2: tuple[Any, Any], vllm_backend: Any
) -> None:
    from agent_r1.errors import AgentR1Error

    with pytest.raises(AgentR1Error, match="max_model_len"):
        vllm_backend.generate([[1] * 2048], SamplingParams(temperature=0, max_new_tokens=4))
