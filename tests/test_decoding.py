"""Decoding strategies (agent_r1.engine.experimental.decoding): value-guided decoding keeps the candidate the
critic values highest at its last token, K = 1 is plain sampling token for token, the kept
candidate's tokens and log-probabilities are the policy's, best-of-K follows its verifier, the
critic travels with checkpoints and exports, and ``agent-r1 eval`` runs it end to end."""

from __future__ import annotations

import json
import math
import sys
import textwrap
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent_r1.builtins.hf_backend import HFBackend
from agent_r1.config import DecodingConfig, RunConfig, load_config
from agent_r1.contracts import ComponentConfig, Environment, EpisodeStart, Generation, SamplingParams
from agent_r1.engine.experimental.decoding import (
    BestOfK,
    ValueGuided,
    check_decoding,
    format_verifier,
    load_verifier,
)
from agent_r1.engine.learner.batch import collate, policy_forward
from agent_r1.engine.learner.critic import ValueHead, critic_values, shared_prefix_values
from agent_r1.errors import AgentR1Error, ConfigError
from agent_r1.mdp import Action, Observation, Task, TokenSource
from agent_r1.rollout.loop import RolloutEngine
from agent_r1.testing.scripted import ScriptedBackend


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


@pytest.fixture(scope="module")
def model(tokenizer: Any) -> Any:
    from agent_r1.testing.models import tiny_model

    # untied embeddings: the output head is free to carry a feature of our choosing
    return tiny_model(tokenizer, tie_word_embeddings=False, seed=0).eval()


class RecordingBackend(HFBackend):
    """The real ``hf`` backend, keeping every batch it was fed and what it returned."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.calls: list[tuple[list[list[int]], list[Generation]]] = []

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        sampling: SamplingParams,
        *,
        max_new_tokens: Sequence[int] | None = None,
    ) -> list[Generation]:
        generations = super().generate(prompts, sampling, max_new_tokens=max_new_tokens)
        self.calls.append(([list(p) for p in prompts], generations))
        return generations


class TalkEnv(Environment):
    """Answers each action with a short tool message; ends after ``turns`` actions."""

    name = "talk_env"

    class Config(ComponentConfig):
        turns: int = 3

    async def reset(self, task: Task) -> EpisodeStart:
        return EpisodeStart(messages=list(task.messages))

    async def step(self, action: Action, turn: int) -> Observation:
        if turn + 1 >= self.config.turns:
            return Observation(done=True, termination="answer")
        return Observation(messages=[{"role": "tool", "content": f"turn {turn}: {len(action.token_ids)}"}])


def _tasks(count: int) -> list[Task]:
    questions = ["What is 2 + 3?", "Hi", "Write only digits (4)."]
    return [
        Task(id=f"t{i}", messages=[{"role": "user", "content": questions[i % len(questions)]}])
        for i in range(count)
    ]


def _engine(backend: Any, tokenizer: Any, decoder: Any = None, **kwargs: Any) -> RolloutEngine:
    return RolloutEngine(
        backend,
        tokenizer,
        kwargs.pop("env_factory", TalkEnv),
        max_turns=kwargs.pop("max_turns", 3),
        max_new_tokens=kwargs.pop("max_new_tokens", 8),
        max_context=kwargs.pop("max_context", 512),
        sampling=SamplingParams(temperature=1.0),
        decoder=decoder,
        **kwargs,
    )


def _logit_head(model: Any, token_id: int) -> ValueHead:
    """A value head reading the policy's logit of ``token_id``: V(s_t) = logit of that token at
    position t. Its preference among candidates is known from the model's logits alone."""
    head = ValueHead(int(model.config.hidden_size))
    with torch.no_grad():
        head.proj.weight.copy_(model.lm_head.weight[token_id][None])
    return head


# --------------------------------------------------------------------------------------------
# The critic read at a sequence's end
# --------------------------------------------------------------------------------------------


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    prefix_length=st.integers(0, 20),
    suffix_lengths=st.lists(st.integers(0, 12), min_size=1, max_size=7),
    batch_size=st.integers(1, 4),
    seed=st.integers(0, 2**16),
)
def test_shared_prefix_values_equal_the_critic_read_before_the_next_token(
    model: Any, prefix_length: int, suffix_lengths: list[int], batch_size: int, seed: int
) -> None:
    """V(s_n) at the end of prefix + suffix (n tokens), computed with the prefix's cache shared,
    is what ``critic_values`` gives token n of any continuation, computed here one sequence at a
    time, whole and unpadded (the naive reference)."""
    generator = torch.Generator().manual_seed(seed)
    head = ValueHead(int(model.config.hidden_size))
    with torch.no_grad():
        head.proj.weight.copy_(torch.randn(head.proj.weight.shape, generator=generator))
        head.proj.bias.fill_(0.3)
    prefix = torch.randint(5, 700, (prefix_length,), generator=generator).tolist()
    if prefix_length == 0:  # no prefix: every suffix needs a token of its own
        suffix_lengths = [max(n, 1) for n in suffix_lengths]
    suffixes = [torch.randint(5, 700, (n,), generator=generator).tolist() for n in suffix_lengths]
    got = shared_prefix_values(head, model, prefix, suffixes, pad_id=0, batch_size=batch_size)
    for suffix, value in zip(suffixes, got, strict=True):
        sequence = [*prefix, *suffix]
        extended = torch.tensor([[*sequence, 9]])  # any next token: V(s_n) must not see it
        with torch.no_grad():
            reference = critic_values(head, model, _one_row(extended))[0, len(sequence)]
        assert value == pytest.approx(float(reference), abs=1e-4)


def _one_row(input_ids: torch.Tensor) -> Any:
    """A one-row micro-batch with the fields ``critic_values`` reads."""
    from types import SimpleNamespace

    # critic_values reads only input_ids and attention_mask of its TrainBatch argument
    return SimpleNamespace(input_ids=input_ids, attention_mask=torch.ones_like(input_ids, dtype=torch.bool))


# --------------------------------------------------------------------------------------------
# Value-guided decoding
# --------------------------------------------------------------------------------------------


def test_value_guided_keeps_the_candidate_the_critic_prefers(model: Any, tokenizer: Any) -> None:
    target = tokenizer.convert_tokens_to_ids("<|im_end|>")
    backend = RecordingBackend(model=model, tokenizer=tokenizer)
    k = 4
    decoder = ValueGuided(k, _logit_head(model, target), model, pad_id=tokenizer.pad_token_id)
    engine = _engine(backend, tokenizer, decoder)
    trajectories = engine.collect(_tasks(3), group_size=2, seed=11)

    kept_other = 0
    episodes_per_call = [len(prompts) // k for prompts, _ in backend.calls]
    assert all(len(prompts) % k == 0 for prompts, _ in backend.calls)
    by_turn: dict[int, list[Any]] = {}
    for turn, (prompts, generations) in enumerate(backend.calls):
        by_turn[turn] = []
        for e in range(episodes_per_call[turn]):
            prompt = prompts[e * k]
            assert all(p == prompt for p in prompts[e * k : (e + 1) * k]), (
                "K copies of one prompt per episode"
            )
            candidates = generations[e * k : (e + 1) * k]
            scores = []
            for candidate in candidates:
                # the known preference: the model's own logit of <|im_end|> at the candidate's last token
                ids = torch.tensor([[*prompt, *candidate.token_ids]])
                with torch.no_grad():
                    logits = model(ids).logits[0]  # [T, V]
                last = len(prompt) + len(candidate.token_ids) - 1
                scores.append(float(logits[last - 1, target]))
            best = max(range(k), key=lambda j, s=scores: (s[j], -j))  # type: ignore[misc]
            kept_other += best != 0
            by_turn[turn].append((prompt, candidates[best]))
    assert kept_other > 0, "every pick was the first candidate: the test cannot tell argmax from first"

    # each episode's trajectory holds, turn after turn, exactly the argmax candidate's tokens (the
    # episodes active at a turn are those that reached it, in order)
    for turn, picks in by_turn.items():
        active = [t for t in trajectories if len(t.steps) > turn]
        assert len(active) == len(picks)
        for trajectory, (prompt, chosen) in zip(active, picks, strict=True):
            assert _prefix_before(trajectory, turn) == prompt
            assert trajectory.steps[turn].action.token_ids == chosen.token_ids
            assert trajectory.steps[turn].action.logprobs == chosen.logprobs
    n_candidates = sum(len(p) for p, _ in backend.calls)
    assert engine.last_metrics["decoding/candidates"] == n_candidates
    assert engine.last_metrics["decoding/generated_tokens"] == sum(
        len(g.token_ids) for _, gs in backend.calls for g in gs
    )
    assert engine.last_metrics["decoding/picked_other"] == kept_other
    assert sum(t.metrics["decoding_candidates"] for t in trajectories) == n_candidates
    assert all(t.metrics["decoding_generated_tokens"] >= t.num_policy_tokens for t in trajectories)


def _prefix_before(trajectory: Any, turn: int) -> list[int]:
    """The trajectory's tokens before its turn-``turn`` action (what the backend was fed)."""
    out: list[int] = []
    for segment in trajectory.segments:
        if segment.source is TokenSource.POLICY and segment.turn == turn:
            return out
        out += segment.token_ids
    raise AssertionError(f"no action at turn {turn}")


def test_ties_go_to_the_first_candidate(model: Any, tokenizer: Any) -> None:
    """The untrained value head outputs 0 everywhere: every pick is the first candidate."""
    backend = RecordingBackend(model=model, tokenizer=tokenizer)
    decoder = ValueGuided(3, ValueHead(int(model.config.hidden_size)), model, pad_id=tokenizer.pad_token_id)
    engine = _engine(backend, tokenizer, decoder)
    trajectories = engine.collect(_tasks(2), group_size=1, seed=5)
    _, generations = backend.calls[0]
    for e, trajectory in enumerate(trajectories):
        assert trajectory.steps[0].action.token_ids == generations[3 * e].token_ids
    assert engine.last_metrics["decoding/picked_other"] == 0


@pytest.mark.parametrize("decoder_kind", ["value_guided", "best_of_k"])
def test_one_candidate_is_plain_sampling_token_for_token(
    decoder_kind: str, model: Any, tokenizer: Any
) -> None:
    plain = _engine(HFBackend(model=model, tokenizer=tokenizer), tokenizer).collect(
        _tasks(3), group_size=2, seed=21
    )
    decoder: Any
    if decoder_kind == "value_guided":
        head = _logit_head(model, 7)
        decoder = ValueGuided(1, head, model, pad_id=tokenizer.pad_token_id)
    else:
        decoder = BestOfK(1, lambda action, messages, env: float(len(action.token_ids)))
    guided = _engine(HFBackend(model=model, tokenizer=tokenizer), tokenizer, decoder).collect(
        _tasks(3), group_size=2, seed=21
    )
    assert [t.token_ids for t in guided] == [t.token_ids for t in plain]
    assert [t.logprobs for t in guided] == [t.logprobs for t in plain]
    assert [t.sources for t in guided] == [t.sources for t in plain]
    assert any(t.num_policy_tokens > 1 for t in plain)


def test_the_kept_candidate_is_token_faithful(model: Any, tokenizer: Any) -> None:
    """The stored log-probabilities of the kept candidates are the policy's for the stored tokens:
    one forward pass over each whole multi-turn trajectory recomputes them."""
    decoder = ValueGuided(4, _logit_head(model, 11), model, pad_id=tokenizer.pad_token_id, batch_size=5)
    trajectories = _engine(HFBackend(model=model, tokenizer=tokenizer), tokenizer, decoder).collect(
        _tasks(3), group_size=2, seed=2
    )
    assert max(len(t.steps) for t in trajectories) > 1
    batch = collate(trajectories, tokenizer.pad_token_id)
    with torch.no_grad():
        logprobs = policy_forward(model, batch.input_ids, batch.attention_mask).logprobs  # [B, T]
    gap = (logprobs - batch.rollout_logprobs).abs()[batch.loss_mask]
    assert float(gap.max()) < 1e-4
    for trajectory in trajectories:
        assert trajectory.loss_mask == [int(s is TokenSource.POLICY) for s in trajectory.sources]


def test_a_non_finite_critic_value_is_an_error(model: Any, tokenizer: Any) -> None:
    head = ValueHead(int(model.config.hidden_size))
    with torch.no_grad():
        head.proj.bias.fill_(math.nan)
    decoder = ValueGuided(2, head, model, pad_id=tokenizer.pad_token_id)
    with pytest.raises(AgentR1Error, match="non-finite score"):
        _engine(HFBackend(model=model, tokenizer=tokenizer), tokenizer, decoder).collect(_tasks(1), seed=0)


# --------------------------------------------------------------------------------------------
# Best-of-K and its verifiers
# --------------------------------------------------------------------------------------------


class CandidateBackend(ScriptedBackend):
    """Says ``texts[j]`` as the j-th of each episode's K candidates (a scripted policy: the texts
    the test needs, through the real tokenizer and stopping rules)."""

    def __init__(self, texts: list[str], k: int, **kwargs: Any) -> None:
        super().__init__(responses=texts, **kwargs)
        self.texts, self.k = texts, k

    def generate(
        self, prompts: Sequence[Sequence[int]], sampling: SamplingParams, *, max_new_tokens: Any = None
    ) -> list[Generation]:
        out = []
        for row in range(len(prompts)):
            budget = min(sampling.max_new_tokens, int(max_new_tokens[row]) if max_new_tokens else 1 << 30)
            out.append(self._say(self.texts[row % self.k], sampling.stop, budget))
        return out


def test_best_of_k_with_the_format_verifier_keeps_the_well_formed_tool_call(tokenizer: Any) -> None:
    from agent_r1.builtins.calculator import CalculatorEnv

    texts = ["The answer is five.", "<calc>2+3", "<calc>2+3</calc>", "<answer>5</answer>"]
    backend = CandidateBackend(texts, 4, tokenizer=tokenizer)
    engine = _engine(
        backend,
        tokenizer,
        BestOfK(4, format_verifier),
        env_factory=CalculatorEnv,
        max_turns=1,
        max_new_tokens=32,
    )
    task = Task(id="q", messages=[{"role": "user", "content": "What is 2 + 3?"}], answer="5")
    [trajectory] = engine.collect([task], seed=0)
    action = trajectory.steps[0].action
    assert action.text.startswith("<calc>2+3</calc>"), "the first well-formed candidate is kept"
    assert [call.name for call in action.tool_calls] == ["calculator"]
    assert trajectory.metrics["decoding_picked_other"] == 1


def test_format_verifier_scores_parses(tokenizer: Any) -> None:
    from agent_r1.builtins.calculator import CalculatorEnv

    env = CalculatorEnv()

    def action(text: str, finish: str = "stop") -> Action:
        return Action(token_ids=tokenizer.encode(text), text=text, finish_reason=finish)  # type: ignore[arg-type]

    assert format_verifier(action("<calc>12*3</calc>"), [], env) == 1.0
    assert format_verifier(action("<answer>36</answer>"), [], env) == 1.0
    assert format_verifier(action("I believe it is 36"), [], env) == 0.0
    assert format_verifier(action("<calc>12*3", "eos"), [], env) == 0.0  # an unclosed call
    with pytest.raises(AgentR1Error, match="parse\\(action\\)"):
        format_verifier(action("x"), [], TalkEnv())


def test_a_python_path_verifier_is_loaded_and_called(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "my_verifier.py").write_text(
        textwrap.dedent(
            """
            def shortest(action, messages):
                return -len(action.token_ids) + 0.0 * len(messages)
            """
        ),
        encoding="utf-8",
    )
    monkeypatch.chdir(tmp_path)  # a verifier file next to the run config is found there
    monkeypatch.setattr(sys, "path", list(sys.path))  # the loader may append the working directory
    verify = load_verifier("my_verifier:shortest")
    short = Action(token_ids=[1, 2], text="ab", finish_reason="eos")
    assert verify(short, [{"role": "user", "content": "q"}], TalkEnv()) == -2.0
    with pytest.raises(ConfigError, match="has no 'nothing'"):
        load_verifier("my_verifier:nothing")
    with pytest.raises(
        ConfigError, match=r"cannot import 'no_such_module_here'|no module 'no_such_module_here'"
    ):
        load_verifier("no_such_module_here:fn")
    with pytest.raises(ConfigError, match="expected 'format' or a Python path"):
        load_verifier("formats")


# --------------------------------------------------------------------------------------------
# Configuration and errors (no model is loaded for any of these)
# --------------------------------------------------------------------------------------------


def test_several_candidates_at_temperature_zero_are_refused() -> None:
    with pytest.raises(
        ConfigError, match=r"eval\.decoding\.kind=value_guided with 4 candidates at eval\.temperature=0"
    ):
        load_config(None, ["eval.decoding.kind=value_guided", "eval.temperature=0"])
    with pytest.raises(ConfigError, match=r"rollout\.decoding\.kind=best_of_k"):
        load_config(None, ["rollout.decoding.kind=best_of_k", "rollout.temperature=0"])
    config = load_config(
        None, ["eval.decoding.kind=value_guided", "eval.decoding.candidates=8", "eval.temperature=1"]
    )
    assert config.eval.decoding == DecodingConfig(kind="value_guided", candidates=8)


def test_value_guided_training_without_a_critic_is_refused_before_loading() -> None:
    config = RunConfig.model_validate({"rollout": {"decoding": {"kind": "value_guided"}}})
    with pytest.raises(ConfigError, match="trains none") as raised:
        check_decoding(config, has_critic=False)
    assert raised.value.path == "rollout.decoding.kind"
    check_decoding(config, has_critic=True)
    bad = RunConfig.model_validate(
        {"eval": {"temperature": 1.0, "decoding": {"kind": "best_of_k", "verifier": "nope:fn"}}}
    )
    with pytest.raises(ConfigError, match=r"eval\.decoding\.verifier"):
        check_decoding(bad, has_critic=True)
    check_decoding(config, has_critic=None)  # eval / rollout commands: the critic is looked for later


def test_find_critic_says_what_it_searched(tmp_path: Path) -> None:
    from agent_r1.engine.artifacts.critic_files import find_critic

    config = RunConfig.model_validate({"model": {"path": str(tmp_path / "model")}})
    decoding = DecodingConfig(kind="value_guided")
    with pytest.raises(
        AgentR1Error, match=r"no --checkpoint was given and model\.path=.* has no critic/critic\.json"
    ):
        find_critic(decoding, config)
    with pytest.raises(AgentR1Error, match="holds no trained critic"):
        find_critic(decoding, config, checkpoint=tmp_path / "ckpt", state={"model": {}})
    with pytest.raises(AgentR1Error, match=r"eval\.decoding\.critic=.* does not exist"):
        find_critic(DecodingConfig(kind="value_guided", critic=str(tmp_path / "gone")), config)
    (tmp_path / "empty").mkdir()
    with pytest.raises(AgentR1Error, match="holds no critic"):
        find_critic(DecodingConfig(kind="value_guided", critic=str(tmp_path / "empty")), config)


def test_an_exported_critic_loads_back_exactly(model: Any, tokenizer: Any, tmp_path: Path) -> None:
    from types import SimpleNamespace

    from agent_r1.engine.artifacts.critic_files import attach_critic, find_critic, write_critic
    from agent_r1.testing.models import save_tiny_model, tiny_model

    head = ValueHead(int(model.config.hidden_size))
    with torch.no_grad():
        head.proj.weight.normal_()
    policy_dir = save_tiny_model(tmp_path / "policy", model, tokenizer)
    write_critic(policy_dir, head.state_dict(), step=3)
    separate = tiny_model(tokenizer, seed=1)
    write_critic(tmp_path / "separate", head.state_dict(), separate, step=3)
    assert json.loads((tmp_path / "separate" / "critic" / "critic.json").read_text())["kind"] == "separate"

    config = RunConfig.model_validate({"model": {"path": str(policy_dir), "device": "cpu"}})
    # the parts of a session attach_critic touches: the run config, the policy and its device
    session = SimpleNamespace(config=config, unwrapped=model, device=torch.device("cpu"), value_head=None)
    attach_critic(session, find_critic(DecodingConfig(kind="value_guided"), config))
    assert session.critic_model is None
    assert torch.equal(session.value_head.proj.weight, head.proj.weight)

    other = DecodingConfig(kind="value_guided", critic=str(tmp_path / "separate"))
    attach_critic(session, find_critic(other, config))
    for name, tensor in separate.state_dict().items():
        assert torch.equal(session.critic_model.state_dict()[name], tensor), name

    wrong = ValueHead(8)
    write_critic(tmp_path / "wrong", wrong.state_dict(), step=None)
    misfit = DecodingConfig(kind="value_guided", critic=str(tmp_path / "wrong"))
    with pytest.raises(AgentR1Error, match="does not fit the model it reads"):
        attach_critic(session, find_critic(misfit, config))


# --------------------------------------------------------------------------------------------
# End to end: train with a critic, evaluate with value-guided decoding, from the command line
# --------------------------------------------------------------------------------------------


def test_value_guided_decoding_from_the_command_line(tmp_path: Path) -> None:
    from foundation_helpers import run_cli
    from trainer_helpers import toy_config, write_config, write_tiny_checkpoint

    from agent_r1.mdp import load_trajectories
    from agent_r1.testing import write_plugin_distribution

    site = tmp_path / "site"
    write_plugin_distribution(
        site, "agent-r1-toy-plugin", files={}, entry_points={"toy": "agent_r1.testing.toy"}
    )
    env = {"AGENT_R1_DISABLE_PLUGINS": "search", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}

    def agent_r1(*args: str) -> Any:
        return run_cli(list(args), sites=[site], env=env, isolate=False)

    model_dir = write_tiny_checkpoint(tmp_path / "tiny")
    run_dir = tmp_path / "run"
    config = write_config(
        tmp_path / "run.yaml",
        toy_config(
            model_dir,
            run_dir,
            algorithm={"name": "ppo", "critic": {"lr": 1e-3}},
            rollout={"decoding": {"kind": "value_guided", "candidates": 2}},
            trainer={"steps": 2, "checkpoint_every": 1},
            eval={"num_tasks": 2, "temperature": 1.0, "before_training": False},
        ),
    )
    trained = agent_r1("train", str(config))
    assert trained.returncode == 0, trained.stderr
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert all(m["decoding/candidates"] == 2.0 for m in metrics), "a training rollout picked among 2"
    assert all(m["decoding/generated_tokens"] >= m["response/length_mean"] for m in metrics)
    record = json.loads((run_dir / "final" / "critic" / "critic.json").read_text())
    assert record == {"kind": "value_head", "hidden_size": 64, "step": 2}

    out = tmp_path / "eval"
    evaluated = agent_r1(
        "eval",
        str(config),
        "--checkpoint",
        str(run_dir),
        "--out",
        str(out),
        "--decoding",
        "value_guided",
        "--candidates",
        "2",
    )
    assert evaluated.returncode == 0, evaluated.stderr
    report = json.loads((out / "eval.json").read_text())
    decoding = report["decoding"]
    assert (decoding["kind"], decoding["candidates"], decoding["episodes"]) == ("value_guided", 2, 2)
    trajectories = load_trajectories(out / "eval_eval.jsonl")
    generated = sum(t.metrics["decoding_generated_tokens"] for t in trajectories) / 2
    assert decoding["generated_tokens_mean"] == pytest.approx(generated)
    assert decoding["scored_tokens_mean"] > 0 and decoding["wall_s"] > 0
    assert all(t.metrics["decoding_candidates"] == 2 * len(t.steps) for t in trajectories)
    assert "## Decoding" in evaluated.stdout and "value_guided, K = 2" in evaluated.stdout

    # the exported model carries the critic: model.path=RUN (its final/) works without --checkpoint
    again = write_config(
        tmp_path / "again.yaml",
        toy_config(run_dir, tmp_path / "again", eval={"num_tasks": 1, "temperature": 1.0}),
    )
    from_export = agent_r1("eval", str(again), "--out", str(tmp_path / "ev2"), "--decoding", "value_guided")
    assert from_export.returncode == 0, from_export.stderr

    # a model without a critic is refused with what to do
    plain = write_config(
        tmp_path / "plain.yaml", toy_config(model_dir, tmp_path / "x", eval={"temperature": 1.0})
    )
    refused = agent_r1("eval", str(plain), "--out", str(tmp_path / "ev3"), "--decoding", "value_guided")
    assert refused.returncode == 2
    assert "needs the trained critic, but none was found" in refused.stderr
    assert "--checkpoint RUN" in refused.stderr
    assert not (tmp_path / "ev3").exists(), "refused before anything was written"
