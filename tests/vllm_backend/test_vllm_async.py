"""The ``vllm`` backend under ``rollout.mode: async`` (:meth:`VLLMBackend.async_replica`), on a tiny
random Llama: a short asynchronous training run within its staleness bound; a push staged between
two calls is what the next call samples from, while the trainer's ``sync_weights`` never loads
weights into a running call; a push during a long call splits it at an engine step, the tokens
after the split coming from the new weights (mid-call swap).

Log-probabilities are checked against the Hugging Face model's recomputation in float32 on CPU
within ``LOGPROB_TOLERANCE``, the tolerance of the other vLLM tests (measured there: ~1e-5). The
two policies compared are unrelated random initialisations, whose log-probabilities differ by far
more (``DISTINCT``), so a check against the wrong weights cannot pass."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from trainer_helpers import toy_config, toy_registry

from agent_r1.config import RunConfig, validate_components
from agent_r1.contracts import Generation, SamplingParams
from agent_r1.registry import reset_registry

LOGPROB_TOLERANCE = 2e-4
"""Largest |vLLM - HF| per-token log-probability accepted (float32, CPU), as in test_vllm_backend."""

DISTINCT = 0.05
"""Smallest largest-gap between the two policies' log-probabilities of a checked span."""

TEXTS = ["hello there", "write digits", "a b c", "the answer is"]

_versions = itertools.count(1)


@pytest.fixture(scope="module")
def engine(tiny_vllm_dir: Path) -> Iterator[SimpleNamespace]:
    """One async-mode engine for this module's unit tests, with an ``old`` and a ``new`` policy
    (each test loads what it starts from)."""
    from transformers import AutoModelForCausalLM

    from agent_r1.builtins.vllm_backend import VLLMBackend
    from agent_r1.models.loading import load_tokenizer
    from agent_r1.testing.models import tiny_model

    tokenizer = load_tokenizer(tiny_vllm_dir)
    old = AutoModelForCausalLM.from_pretrained(tiny_vllm_dir, dtype=torch.float32).eval()
    new = tiny_model(tokenizer, hidden=64, heads=2, seed=1)
    backend = VLLMBackend({"max_model_len": 256, "kv_cache_gb": 0.25}, model=old, tokenizer=tokenizer)
    replica, guard = backend.async_replica(0)
    assert replica is backend and backend.async_replica(0)[1] is guard
    yield SimpleNamespace(
        backend=backend,
        guard=guard,
        old=old,
        new=new,
        tokenizer=tokenizer,
        prompts=[tokenizer.encode(text) for text in TEXTS],
    )
    backend.close()


def _serve(guard: Any, model: Any) -> int:
    """Push ``model`` as a new version and load it; returns the version. (Every push of this
    module takes a version of ``_versions``: a version pushed again is skipped, as the trainer's
    second push of an update is.)"""
    version = next(_versions)
    guard.push(model, version)
    with guard.generating():
        pass
    assert guard.version == version
    return version


def _recomputed(model: Any, prompt: list[int], tokens: list[int]) -> torch.Tensor:
    """``log_softmax(logits)`` at each sampled token under ``model`` (temperature 1)."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1 : -1]  # [T, V]
    return torch.log_softmax(logits.float(), -1).gather(-1, torch.tensor(tokens)[:, None])[:, 0]  # [T]


def _check_span(
    model: Any, other: Any, prompt: list[int], generation: Generation, span: slice
) -> tuple[float, float]:
    """The largest |sampled - recomputed| of ``span`` under ``model`` and under ``other``."""
    sampled = torch.tensor(generation.logprobs)[span]
    under_model = _recomputed(model, prompt, generation.token_ids)[span]
    under_other = _recomputed(other, prompt, generation.token_ids)[span]
    return float((sampled - under_model).abs().max()), float((sampled - under_other).abs().max())


def _sampled_from(model: Any, other: Any, prompts: list[list[int]], generations: list[Generation]) -> None:
    for prompt, generation in zip(prompts, generations, strict=True):
        assert generation.token_ids
        mine, theirs = _check_span(model, other, prompt, generation, slice(None))
        assert mine < LOGPROB_TOLERANCE, mine
        assert theirs > DISTINCT, theirs


class _Watch:
    """The engine's steps and weight loads: how many steps ran, whether two ever overlapped, and
    for each load its thread and whether a step was running. ``after_step(count)`` runs in the
    generating thread after each step."""

    def __init__(
        self, backend: Any, monkeypatch: pytest.MonkeyPatch, after_step: Callable[[int], None] | None = None
    ) -> None:
        engine, load = backend.llm.llm_engine, backend._load
        step = engine.step
        self.steps = 0
        self.running = 0
        self.overlapped = False
        self.loads: list[tuple[str, bool]] = []
        lock = threading.Lock()

        def watched_step() -> Any:
            with lock:
                self.running += 1
                self.overlapped |= self.running > 1
            try:
                return step()
            finally:
                with lock:
                    self.running -= 1
                    self.steps += 1
                    count = self.steps
                if after_step is not None:
                    after_step(count)

        def watched_load(weights: Any) -> int:
            self.loads.append((threading.current_thread().name, self.running > 0))
            return load(weights)  # type: ignore[no-any-return]

        monkeypatch.setattr(engine, "step", watched_step)
        monkeypatch.setattr(backend, "_load", watched_load)


def _in_thread(target: Callable[[], Any], name: str) -> tuple[threading.Thread, dict[str, Any]]:
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["result"] = target()
        except BaseException as exc:  # handed to the test, which raises it
            out["error"] = exc

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    return thread, out


def _joined(thread: threading.Thread, out: dict[str, Any]) -> Any:
    thread.join(timeout=60)
    assert not thread.is_alive(), "the generating thread did not finish"
    if "error" in out:
        raise out["error"]
    return out["result"]


# ---------------------------------------------------------------------------------------------
# Swaps between calls
# ---------------------------------------------------------------------------------------------


def test_a_push_is_sampled_from_by_the_next_call_that_may_swap(engine: SimpleNamespace) -> None:
    backend, guard, old, new = engine.backend, engine.guard, engine.old, engine.new
    base = _serve(guard, old)
    sampling = SamplingParams(temperature=1.0, max_new_tokens=12, seed=3)
    pushed = next(_versions)
    guard.push(new, pushed)
    assert guard.pending() and guard.version == base  # staged, not loaded
    with guard.generating(swap=False) as version:  # a call that continues a turn keeps its weights
        held = backend.generate(engine.prompts, sampling)
    assert version == base
    _sampled_from(old, new, engine.prompts, held)
    with guard.generating() as version:
        swapped = backend.generate(engine.prompts, sampling)
    assert version == guard.version == pushed and not guard.pending()
    _sampled_from(new, old, engine.prompts, swapped)
    # the staging buffers are reused by the next push: the engine must hold copies of its own
    guard.push(old, next(_versions))
    with guard.generating(swap=False):
        again = backend.generate(engine.prompts, sampling)
    _sampled_from(new, old, engine.prompts, again)
    assert guard.applied >= 2


def test_the_trainers_sync_weights_is_staged_while_the_rollout_thread_generates(
    engine: SimpleNamespace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The update's ``backend.sync_weights`` runs in the trainer's thread while the rollout thread
    generates: it stages the weights and returns; the rollout thread loads them at its next call,
    between steps, and an evaluation call (outside the guard) loads the newest push too."""
    backend, guard, old, new = engine.backend, engine.guard, engine.old, engine.new
    base = _serve(guard, old)
    update = next(_versions)
    midway, synced = threading.Event(), threading.Event()

    def after_step(count: int) -> None:
        if count == 3:
            midway.set()
            assert synced.wait(30)

    watch = _Watch(backend, monkeypatch, after_step)
    sampling = SamplingParams(temperature=1.0, max_new_tokens=16, seed=4)

    def rollout_call() -> list[Generation]:
        with guard.generating(swap=False):
            return backend.generate(engine.prompts, sampling)

    thread, out = _in_thread(rollout_call, "rollouts")
    assert midway.wait(30)
    backend.sync_weights(new, update)  # the trainer's thread, mid-call
    assert watch.loads == [] and guard.pending() and thread.is_alive()
    synced.set()
    _sampled_from(old, new, engine.prompts, _joined(thread, out))
    assert guard.version == base
    rollout_call()  # another call that continues a turn: still the old weights
    assert guard.version == base and watch.loads == []
    evaluation = backend.generate(engine.prompts, sampling)  # outside the guard: the newest weights
    assert guard.version == update
    _sampled_from(new, old, engine.prompts, evaluation)
    assert watch.loads == [(threading.current_thread().name, False)] and not watch.overlapped
    backend.sync_weights(new, update)  # AsyncRollouts.pushed after the same update: skipped
    assert not guard.pending()


# ---------------------------------------------------------------------------------------------
# Swaps inside a call
# ---------------------------------------------------------------------------------------------


def test_a_push_during_a_long_call_splits_it_at_an_engine_step(
    engine: SimpleNamespace, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend, guard, old, new = engine.backend, engine.guard, engine.old, engine.new
    base = _serve(guard, old)
    backend.step_metrics()  # reported: start counting from here
    split = 4  # tokens sampled by the old weights: the push lands after the 4th engine step
    midway, pushed = threading.Event(), threading.Event()

    def after_step(count: int) -> None:
        if count == split:
            midway.set()
            assert pushed.wait(30)

    watch = _Watch(backend, monkeypatch, after_step)

    sampling = SamplingParams(temperature=1.0, max_new_tokens=20, seed=5)

    def rollout_call() -> tuple[int, list[Generation]]:
        with guard.generating() as version:
            return version, backend.generate(engine.prompts, sampling)

    thread, out = _in_thread(rollout_call, "rollouts")
    assert midway.wait(30)
    update = next(_versions)
    backend.sync_weights(new, update)  # the trainer's update, while the call runs
    pushed.set()
    version, generations = _joined(thread, out)
    assert version == base  # the turn is recorded with the version its call started with
    assert guard.version == update
    assert backend.step_metrics()["backend/mid_call_swaps"] == 1.0
    assert watch.loads == [("rollouts", False)] and not watch.overlapped
    continued = [g for g in generations if len(g.token_ids) > split]
    assert len(continued) >= 2, [len(g.token_ids) for g in generations]
    for prompt, generation in zip(engine.prompts, generations, strict=True):
        before, _ = _check_span(old, new, prompt, generation, slice(None, split))
        assert before < LOGPROB_TOLERANCE, before
        if len(generation.token_ids) > split:  # sampled, with their log-probabilities, by the new weights
            after, under_old = _check_span(new, old, prompt, generation, slice(split, None))
            assert after < LOGPROB_TOLERANCE and under_old > DISTINCT, (after, under_old)


def test_a_split_with_the_same_weights_continues_the_rows_and_finds_a_stop_across_it(
    engine: SimpleNamespace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A push of the same weights splits a call without a trace: greedy rows go on with the
    tokens and log-probabilities of an uninterrupted call. And a stop string that begins before
    the split and ends after it still ends its row there: vLLM matches stop strings within a
    request's own output only, so the backend looks across the split itself."""
    backend, guard, old, tokenizer = engine.backend, engine.guard, engine.old, engine.tokenizer
    base = _serve(guard, old)
    split = 5
    push_at = [0]

    def after_step(count: int) -> None:
        if count == push_at[0]:
            guard.push(old, next(_versions))

    watch = _Watch(backend, monkeypatch, after_step)

    def split_call(sampling: SamplingParams) -> list[Generation]:
        push_at[0] = watch.steps + split
        with guard.generating():
            generations = backend.generate(engine.prompts, sampling)
        assert backend.step_metrics()["backend/mid_call_swaps"] == 1.0
        return generations

    backend.step_metrics()
    greedy = SamplingParams(temperature=0.0, max_new_tokens=16)
    plain = backend.generate(engine.prompts, greedy)  # outside the guard: one LLM.generate call
    for got, want in zip(split_call(greedy), plain, strict=True):
        assert (got.token_ids, got.finish_reason) == (want.token_ids, want.finish_reason)
        assert got.logprobs == pytest.approx(want.logprobs, abs=LOGPROB_TOLERANCE)

    sampling = SamplingParams(temperature=1.0, max_new_tokens=16, seed=8)
    unstopped = split_call(sampling)

    def straddling(tokens: list[int]) -> str | None:
        """A stop string completed by the second token after the split, and not before."""
        text = tokenizer.decode(tokens[split - 2 : split + 2])
        return text if len(tokens) == 16 and text not in tokenizer.decode(tokens[: split + 1]) else None

    row, stop = next((i, straddling(g.token_ids)) for i, g in enumerate(unstopped) if straddling(g.token_ids))
    assert stop is not None
    stopped = split_call(sampling.model_copy(update={"stop": [stop]}))[row]
    assert stopped.finish_reason == "stop" and stopped.stop_sequence == stop
    assert stopped.token_ids == unstopped[row].token_ids[: split + 2]
    assert stopped.logprobs == pytest.approx(unstopped[row].logprobs[: split + 2], abs=LOGPROB_TOLERANCE)
    assert guard.version > base


def test_a_call_that_runs_step_by_step_samples_what_one_generate_call_samples(
    engine: SimpleNamespace,
) -> None:
    """Without a push, a guarded call (stepped, each step's tokens streamed back) returns what the
    plain ``LLM.generate`` path returns for the same seeds: tokens, log-probabilities, stops."""
    backend, guard = engine.backend, engine.guard
    _serve(guard, engine.old)
    sampling = SamplingParams(temperature=1.0, max_new_tokens=14, seed=11, stop=["e"])
    plain = backend.generate(engine.prompts, sampling, max_new_tokens=[14, 3, 14, 0])
    with guard.generating():
        stepped = backend.generate(engine.prompts, sampling, max_new_tokens=[14, 3, 14, 0])
    assert [(g.token_ids, g.finish_reason, g.stop_sequence) for g in stepped] == [
        (g.token_ids, g.finish_reason, g.stop_sequence) for g in plain
    ]
    assert {g.finish_reason for g in plain} >= {"stop", "length"}
    for got, want in zip(stepped, plain, strict=True):
        assert got.logprobs == pytest.approx(want.logprobs, abs=LOGPROB_TOLERANCE)


# ---------------------------------------------------------------------------------------------
# A training run
# ---------------------------------------------------------------------------------------------


def test_async_training_on_the_vllm_backend_stays_within_its_staleness_bound(
    tiny_vllm_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three steps at ``max_staleness: 1`` with the rollouts in a thread on the session's own
    engine, and an evaluation from the trainer's thread in between, while the rollout thread
    generates: never two engine steps at once, no weight load during a step."""
    from agent_r1.engine import build_session, train_step
    from agent_r1.run.commands import run_eval

    registry = toy_registry()
    backend_options = {"name": "vllm", "max_model_len": 256, "kv_cache_gb": 0.25}
    config = toy_config(
        tiny_vllm_dir,
        tmp_path / "run",
        rollout={"mode": "async", "max_staleness": 1, "backend": backend_options},
        trainer={"steps": 3, "checkpoint_every": 0},
        eval={"num_tasks": 2, "samples": 1, "before_training": False},
    )
    run = RunConfig.model_validate(config)
    session = build_session(run, validate_components(run, registry), tmp_path / "run", registry=registry)
    backend = session.backend
    try:
        watch = _Watch(backend, monkeypatch)
        results = [train_step(session)]
        run_eval(session, session.dataset.load("eval")[:2], label="mid")  # the rollout thread is busy
        assert backend.policy_version == session.step == 1  # evaluation used the newest push
        results += [train_step(session) for _ in range(2)]
        producer = session.async_rollouts
        assert producer.backend is backend  # no second engine
        for update, result in enumerate(results):
            assert result.metrics["async/staleness_max"] <= 1
            for trajectory in result.trajectories:
                assert trajectory.turn_versions
                assert all(update - 1 <= v <= update for v in trajectory.versions())
        assert any(result.metrics.get("backend/weight_loads", 0.0) > 0 for result in results)
        assert "backend/policy_version" not in results[-1].metrics
        assert producer.weights.pushes == 3 and producer.weights.applied >= 1
        assert not watch.overlapped and not any(during_step for _, during_step in watch.loads)
    finally:
        session.close()
        backend.close()
        reset_registry()
