"""The agent loop (agent_r1.rollout.loop): token fidelity against what the backend was fed, log-
probabilities against a fresh forward pass over whole multi-turn trajectories, budgets and
truncation, reproducibility, and the real ToolEnv with real (slow, failing, hanging, flooding)
tools driven by a scripted policy."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ConfigDict

from agent_r1 import hookimpl
from agent_r1.builtins.hf_backend import HFBackend
from agent_r1.contracts import (
    ComponentConfig,
    Environment,
    EpisodeStart,
    Generation,
    SamplingParams,
    Tool,
)
from agent_r1.engine.learner.turns import anchor_keys
from agent_r1.errors import AgentR1Error, ConfigError
from agent_r1.mdp import Action, Observation, RewardSignal, Task, TokenSource, Trajectory
from agent_r1.registry import Registry, get_registry, reset_registry
from agent_r1.rollout.chat import TRUNCATION_MARKER, ChatRenderer
from agent_r1.rollout.loop import TRAJECTORY_METRICS, RolloutEngine
from agent_r1.testing.scripted import ScriptedBackend


@pytest.fixture(autouse=True, scope="module")
def _one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# --------------------------------------------------------------------------------------------
# A tiny model that ends its turns, a recording backend and a deterministic environment
# --------------------------------------------------------------------------------------------


def turn_ending_model(tokenizer: Any, strength: float = 5.0) -> Any:
    """A tiny random Llama (untied embeddings, so that it does not just echo its input) whose
    ``<|im_end|>`` output row points along the mean final hidden state: it samples ``<|im_end|>``
    often, so rollouts exercise the policy-sampled end-of-turn path as well as stops and cuts."""
    from agent_r1.testing.models import tiny_model

    model = tiny_model(tokenizer, tie_word_embeddings=False, seed=0)
    probe = tokenizer.encode("<|im_start|>user\nWhat is the answer?<|im_end|>\n", add_special_tokens=False)
    with torch.no_grad():
        hidden = model(torch.tensor([probe]), output_hidden_states=True).hidden_states[-1][0]  # [T, H]
        direction = hidden.mean(0)  # [H]
        model.lm_head.weight[tokenizer.convert_tokens_to_ids("<|im_end|>")] = (
            strength * direction / direction.norm() ** 2
        )
    return model


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    from agent_r1.testing.models import tiny_tokenizer

    return tiny_tokenizer()


@pytest.fixture(scope="module")
def model(tokenizer: Any) -> Any:
    return turn_ending_model(tokenizer)


@dataclass
class Call:
    prompts: list[list[int]]
    sampling: SamplingParams
    budgets: list[int]
    generations: list[Generation]


class RecordingBackend(HFBackend):
    """The real ``hf`` backend, keeping every batch it was fed and what it returned."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.calls: list[Call] = []

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        sampling: SamplingParams,
        *,
        max_new_tokens: Sequence[int] | None = None,
    ) -> list[Generation]:
        generations = super().generate(prompts, sampling, max_new_tokens=max_new_tokens)
        self.calls.append(Call([list(p) for p in prompts], sampling, list(max_new_tokens or []), generations))
        return generations


class EchoEnv(Environment):
    """Answers every action with one message (role ``role``) quoting the turn and the action's
    length ``repeat`` times; ends after ``done_after`` actions with termination ``answer``;
    optional process reward per turn."""

    name = "echo_env"

    class Config(ComponentConfig):
        done_after: int = 3
        role: str = "tool"
        repeat: int = 1
        reward: float = 0.0
        stop: list[str] = []
        start_key: str | None = None

    @property
    def stop_sequences(self) -> list[str]:
        return list(self.config.stop)

    async def reset(self, task: Task) -> EpisodeStart:
        info = {"state_key": self.config.start_key} if self.config.start_key else {}
        return EpisodeStart(messages=list(task.messages), info=info)

    async def step(self, action: Action, turn: int) -> Observation:
        rewards = []
        if self.config.reward:
            rewards.append(RewardSignal(name="echo", value=self.config.reward, kind="process", turn=turn))
        if turn + 1 >= self.config.done_after:
            return Observation(done=True, termination="answer", rewards=rewards)
        content = f"turn {turn}: you wrote {len(action.token_ids)} tokens. " * self.config.repeat
        return Observation(messages=[{"role": self.config.role, "content": content}], rewards=rewards)


def tasks(count: int) -> list[Task]:
    questions = ["What is 2 + 3?", "Hi", "Search the documents for the title of the film."]
    return [
        Task(id=f"t{i}", messages=[{"role": "user", "content": questions[i % len(questions)]}])
        for i in range(count)
    ]


# --------------------------------------------------------------------------------------------
# Token fidelity (property test)
# --------------------------------------------------------------------------------------------


def check_against_backend(
    trajectories: list[Trajectory], calls: list[Call], renderer: ChatRenderer, engine: RolloutEngine
) -> None:
    """Every trajectory is exactly what the backend was fed at each turn plus what it returned,
    with the documented segment structure, loss mask and budgets."""
    tokenizer = renderer.tokenizer
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    newline = renderer.encode("\n")
    header = renderer.encode("<|im_start|>assistant\n")
    for turn, call in enumerate(calls):  # the active trajectories of a turn, in order
        active = [t for t in trajectories if len(t.steps) > turn]
        assert len(active) == len(call.prompts) == len(call.generations)
        for row, trajectory in enumerate(active):
            prompt, generation = call.prompts[row], call.generations[row]
            ids = trajectory.token_ids
            assert ids[: len(prompt)] == prompt
            assert ids[len(prompt) : len(prompt) + len(generation.token_ids)] == generation.token_ids
            assert call.budgets[row] == min(engine.max_new_tokens, engine.max_context - len(prompt))
            action = trajectory.steps[turn].action
            assert action.token_ids == generation.token_ids and action.logprobs == generation.logprobs
            expected_finish = generation.finish_reason
            if expected_finish == "length" and call.budgets[row] < engine.max_new_tokens:
                expected_finish = "context"
            assert action.finish_reason == expected_finish
            if turn == len(trajectory.steps) - 1:  # the trajectory ends with its last action
                assert ids == prompt + generation.token_ids

    for trajectory in trajectories:
        assert len(trajectory) <= engine.max_context
        assert set(trajectory.metrics) == set(TRAJECTORY_METRICS)
        actions = [step.action for step in trajectory.steps]
        # The loss mask covers exactly the sampled tokens, turn by turn, with their logprobs.
        policy = [s for s in trajectory.segments if s.source is TokenSource.POLICY]
        assert [s.turn for s in policy] == list(range(len(actions)))
        assert [s.token_ids for s in policy] == [a.token_ids for a in actions]
        assert sum(trajectory.loss_mask) == sum(len(a.token_ids) for a in actions)
        sampled = [lp for a in actions for lp in (a.logprobs or [])]
        assert [lp for lp, m in zip(trajectory.logprobs, trajectory.loss_mask, strict=True) if m] == sampled
        # Between actions: closure (template, turn t), observation (env, turn t), header (turn t+1).
        segments = trajectory.segments
        for i, segment in enumerate(segments):
            if segment.source is not TokenSource.POLICY or i == len(segments) - 1:
                continue
            turn = segment.turn
            closure, env, opening = segments[i + 1], segments[i + 2], segments[i + 3]
            assert (closure.source, closure.turn) == (TokenSource.TEMPLATE, turn)
            if actions[turn].finish_reason == "eos" and segment.token_ids[-1] == im_end:
                assert closure.token_ids == newline  # the policy sampled <|im_end|> itself
            else:
                assert closure.token_ids == [im_end, *newline]
            assert (env.source, env.turn) == (TokenSource.ENV, turn)
            assert tokenizer.decode(env.token_ids).startswith("<|im_start|>")
            assert (opening.source, opening.turn, opening.token_ids) == (
                TokenSource.TEMPLATE,
                turn + 1,
                header,
            )
        # Truncation is flagged whenever a budget ended the episode or cut its last action.
        if trajectory.termination in ("max_turns", "max_tokens"):
            assert trajectory.truncated
        elif actions:
            assert trajectory.truncated == (actions[-1].finish_reason in ("length", "context"))
        if trajectory.termination == "max_turns":
            assert len(actions) == engine.max_turns


@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_trajectories_are_exactly_what_the_backend_saw(
    data: st.DataObject, tokenizer: Any, model: Any
) -> None:
    backend = RecordingBackend(
        {"max_batch_size": data.draw(st.sampled_from([2, 64]))}, model=model, tokenizer=tokenizer
    )
    renderer = ChatRenderer(tokenizer)
    config = EchoEnv.Config(
        done_after=data.draw(st.integers(1, 4)),
        role=data.draw(st.sampled_from(["tool", "user"])),
        repeat=data.draw(st.integers(1, 12)),
        stop=data.draw(st.sampled_from([[], ["a"], ["e", " the"]])),
    )
    engine = RolloutEngine(
        backend,
        tokenizer,
        lambda: EchoEnv(config),
        max_turns=data.draw(st.integers(1, 4)),
        max_new_tokens=data.draw(st.integers(1, 12)),
        max_context=data.draw(st.integers(24, 160)),
        sampling=SamplingParams(temperature=data.draw(st.sampled_from([0.0, 0.8, 1.0]))),
        renderer=renderer,
    )
    batch = tasks(data.draw(st.integers(1, 3)))
    group_size = data.draw(st.integers(1, 3))
    trajectories = engine.collect(batch, group_size, seed=data.draw(st.integers(0, 1000)), group_salt="s1")
    assert len(trajectories) == len(batch) * group_size
    assert len({t.id for t in trajectories}) == len(trajectories)
    check_against_backend(trajectories, backend.calls, renderer, engine)


def test_the_property_test_reaches_every_path(tokenizer: Any, model: Any) -> None:
    """One fixed configuration where end-of-turn sampling, stop strings, length cuts, context cuts,
    observation cuts and turn limits all occur (so the property test above is not vacuous)."""
    backend = RecordingBackend({}, model=model, tokenizer=tokenizer)
    renderer = ChatRenderer(tokenizer)
    config = EchoEnv.Config(done_after=4, role="tool", repeat=2, stop=["a"])
    engine = RolloutEngine(
        backend,
        tokenizer,
        lambda: EchoEnv(config),
        max_turns=3,
        max_new_tokens=6,
        max_context=120,
        renderer=renderer,
    )
    trajectories = engine.collect(tasks(3), 6, seed=4, group_salt="s")
    check_against_backend(trajectories, backend.calls, renderer, engine)
    finishes = {step.action.finish_reason for t in trajectories for step in t.steps}
    assert finishes == {"eos", "stop", "length", "context"}
    assert {t.termination for t in trajectories} == {"max_turns", "max_tokens"}
    assert sum(t.metrics["observation_cuts"] for t in trajectories) > 0
    assert any(
        TRUNCATION_MARKER.strip() in tokenizer.decode(s.token_ids)
        for t in trajectories
        for s in t.segments
        if s.source is TokenSource.ENV
    )


# --------------------------------------------------------------------------------------------
# Log-probabilities over whole multi-turn trajectories
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("temperature", "top_k"), [(1.0, 0), (0.6, 40)])
def test_rollout_logprobs_match_a_fresh_forward_pass(
    tokenizer: Any, model: Any, temperature: float, top_k: int
) -> None:
    backend = HFBackend({}, model=model, tokenizer=tokenizer)
    engine = RolloutEngine(
        backend,
        tokenizer,
        lambda: EchoEnv(EchoEnv.Config(done_after=4, repeat=2, stop=[" the"])),
        max_turns=4,
        max_new_tokens=10,
        max_context=400,
        sampling=SamplingParams(temperature=temperature, top_k=top_k),
    )
    trajectories = engine.collect(tasks(2), 3, seed=0)
    assert max(len(t.steps) for t in trajectories) >= 3  # several turns with observations between
    checked = 0
    for trajectory in trajectories:
        ids = trajectory.token_ids
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0].float()  # [T, V]
        logp = torch.log_softmax(logits / temperature, dim=-1)  # [T, V]
        recomputed = [logp[i - 1, ids[i]].item() for i in range(1, len(ids))]  # [T - 1]
        mask = trajectory.loss_mask[1:]
        rollout = trajectory.logprobs[1:]
        pairs = [(r, c) for r, c, m in zip(rollout, recomputed, mask, strict=True) if m]
        assert pairs and [r for r, _ in pairs] == pytest.approx([c for _, c in pairs], abs=1e-4)
        checked += len(pairs)
    assert checked == sum(t.num_policy_tokens for t in trajectories)


# --------------------------------------------------------------------------------------------
# Reproducibility, ids, rewards, budgets
# --------------------------------------------------------------------------------------------


def test_same_seed_same_trajectories(tokenizer: Any, model: Any) -> None:
    def run(seed: int) -> list[Trajectory]:
        backend = HFBackend({}, model=model, tokenizer=tokenizer)
        engine = RolloutEngine(
            backend, tokenizer, lambda: EchoEnv(EchoEnv.Config(done_after=3)), max_turns=3, max_new_tokens=8
        )
        return engine.collect(tasks(2), 3, seed=seed, group_salt="x")

    first, again, other = run(5), run(5), run(6)
    assert [t.segments for t in first] == [t.segments for t in again]
    assert [t.token_ids for t in first] != [t.token_ids for t in other]


def test_ids_groups_versions_rewards_and_metrics(tokenizer: Any, model: Any) -> None:
    backend = HFBackend({}, model=model, tokenizer=tokenizer)
    engine = RolloutEngine(
        backend,
        tokenizer,
        lambda: EchoEnv(EchoEnv.Config(done_after=2, reward=0.25)),
        max_turns=2,
        max_new_tokens=4,
    )
    batch = [*tasks(2), tasks(1)[0]]  # the first task twice: two groups
    trajectories = engine.collect(batch, 2, seed=1, policy_version=7, group_salt="step3")
    assert [t.group_id for t in trajectories] == ["t0@step3"] * 2 + ["t1@step3"] * 2 + ["t0@step3#1"] * 2
    assert [t.sample_index for t in trajectories] == [0, 1] * 3
    assert len({t.id for t in trajectories}) == 6
    assert {t.policy_version for t in trajectories} == {7}
    for trajectory in trajectories:
        assert [r.turn for r in trajectory.rewards] == list(range(len(trajectory.steps)))
        assert {r.source for r in trajectory.rewards} == {"echo_env"}
        assert trajectory.metrics["num_turns"] == len(trajectory.steps)
        assert trajectory.metrics["policy_tokens"] == trajectory.num_policy_tokens
        assert trajectory.metrics["generation_s"] > 0
    assert engine.last_metrics["rollout/generated_tokens"] == sum(t.num_policy_tokens for t in trajectories)
    assert engine.last_metrics["rollout/backend_calls"] == max(len(t.steps) for t in trajectories)
    random_salt = engine.collect(tasks(1), 1, seed=1)[0].group_id
    assert random_salt.startswith("t0@") and random_salt != "t0@step3"


def test_the_environment_names_the_initial_state(tokenizer: Any, model: Any) -> None:
    """``EpisodeStart.info`` is recorded on the trajectory, and its ``state_key`` keys turn 0 for
    GiGPO's step groups (otherwise the prompt's token digest does)."""
    backend = HFBackend({}, model=model, tokenizer=tokenizer)
    named = RolloutEngine(
        backend, tokenizer, lambda: EchoEnv(EchoEnv.Config(start_key="lobby")), max_new_tokens=4
    )
    [trajectory] = named.collect(tasks(1), 1, seed=0)
    assert trajectory.start_info == {"state_key": "lobby"}
    assert anchor_keys(trajectory)[0] == "env:lobby"
    plain = RolloutEngine(backend, tokenizer, lambda: EchoEnv(), max_new_tokens=4)
    [trajectory] = plain.collect(tasks(1), 1, seed=0)
    assert trajectory.start_info == {} and anchor_keys(trajectory)[0].startswith("tok:")


def test_a_prompt_longer_than_the_context_ends_before_acting(tokenizer: Any, model: Any) -> None:
    backend = HFBackend({}, model=model, tokenizer=tokenizer)
    engine = RolloutEngine(backend, tokenizer, lambda: EchoEnv(), max_new_tokens=4, max_context=16)
    with pytest.warns(UserWarning, match="leaves no room in max_context=16"):
        [trajectory] = engine.collect(tasks(3)[2:], 1, seed=0)
    assert trajectory.termination == "max_tokens" and trajectory.truncated
    assert trajectory.steps == [] and trajectory.num_policy_tokens == 0


class NoBudgetBackend(ScriptedBackend):
    """A third-party-style backend whose ``generate`` takes no per-prompt budgets."""

    def generate(self, prompts: Sequence[Sequence[int]], sampling: SamplingParams) -> list[Generation]:  # type: ignore[override]
        return super().generate(prompts, sampling)


def test_backends_without_per_prompt_budgets_are_cut_to_the_context(tokenizer: Any) -> None:
    backend = NoBudgetBackend(tokenizer=tokenizer, responses=["word " * 40])
    with pytest.warns(DeprecationWarning, match="takes no max_new_tokens"):
        engine = RolloutEngine(backend, tokenizer, lambda: EchoEnv(), max_new_tokens=30, max_context=40)
    [trajectory] = engine.collect(tasks(1), 1, seed=0)
    assert len(trajectory) == 40
    assert trajectory.steps[0].action.finish_reason == "context"
    assert trajectory.termination == "max_tokens" and trajectory.truncated


def test_collect_works_inside_a_running_event_loop(tokenizer: Any) -> None:
    backend = ScriptedBackend(tokenizer=tokenizer, responses=["hello"])
    engine = RolloutEngine(backend, tokenizer, lambda: EchoEnv(EchoEnv.Config(done_after=1)))

    async def main() -> list[Trajectory]:
        return engine.collect(tasks(1), 2, seed=0)

    trajectories = asyncio.run(main())
    assert [t.termination for t in trajectories] == ["answer", "answer"]


class BrokenEnv(EchoEnv):
    name = "broken_env"

    async def step(self, action: Action, turn: int) -> Observation:
        raise RuntimeError("the environment fell over")


def test_an_environment_that_raises_aborts_or_ends_the_episode(tokenizer: Any) -> None:
    backend = ScriptedBackend(tokenizer=tokenizer, responses=["hello"] * 3)
    engine = RolloutEngine(backend, tokenizer, BrokenEnv)
    with pytest.raises(AgentR1Error, match=r"'broken_env' raised in step \(task 't0', turn 0\).*fell over"):
        engine.collect(tasks(1), 1, seed=0)
    engine = RolloutEngine(backend, tokenizer, BrokenEnv, on_env_error="end")
    [trajectory] = engine.collect(tasks(1), 1, seed=0)
    assert trajectory.termination == "env_error" and trajectory.metrics["env_errors"] == 1
    assert "fell over" in trajectory.steps[0].observation.info["error"]


class FailingResetEnv(EchoEnv):
    """Fails to start on tasks whose id ends in 1 (a game server that refused the episode)."""

    name = "failing_reset"

    async def reset(self, task: Task) -> EpisodeStart:
        if task.id.endswith("1"):
            raise ConnectionError(f"no episode for {task.id}")
        return await super().reset(task)


def test_an_environment_whose_reset_raises_fails_that_episode_only(tokenizer: Any) -> None:
    backend = ScriptedBackend(tokenizer=tokenizer, responses=["hello"] * 3)
    engine = RolloutEngine(backend, tokenizer, FailingResetEnv)
    with pytest.raises(AgentR1Error, match=r"'failing_reset' raised in reset \(task 't1'\).*no episode"):
        engine.collect(tasks(2), 1, seed=0)
    engine = RolloutEngine(backend, tokenizer, FailingResetEnv, on_env_error="end")
    good, bad = engine.collect(tasks(2), 1, seed=0)
    assert good.errors == [] and good.steps and good.termination != "env_error"
    assert bad.termination == "env_error" and len(bad) == 0 and bad.steps == []
    assert bad.metrics["env_errors"] == 1 and "ConnectionError: no episode for t1" in bad.errors[0]
    assert backend.prompts[0] == [good.token_ids[: len(backend.prompts[0][0])]]  # only t0 was sampled


class RefusingResetEnv(EchoEnv):
    name = "refusing_reset"

    async def reset(self, task: Task) -> EpisodeStart:
        raise ConfigError("this task's prompt is longer than the trainer allows")


def test_agent_r1s_own_error_in_reset_always_stops_the_rollout(tokenizer: Any) -> None:
    backend = ScriptedBackend(tokenizer=tokenizer, responses=["hello"])
    engine = RolloutEngine(backend, tokenizer, RefusingResetEnv, on_env_error="end")
    with pytest.raises(ConfigError, match="longer than the trainer allows"):
        engine.collect(tasks(2), 1, seed=0)


class ClosingEnv(EchoEnv):
    """Records its aclose() calls; ``fail_close`` makes aclose raise."""

    name = "closing_env"
    closed: list[str] = []

    class Config(EchoEnv.Config):
        fail_close: bool = False

    async def reset(self, task: Task) -> EpisodeStart:
        self.task_id = task.id
        return await super().reset(task)

    async def aclose(self) -> None:
        type(self).closed.append(self.task_id)
        if self.config.fail_close:
            raise OSError("the sandbox was already gone")


def test_every_episode_is_closed_whatever_ended_it(tokenizer: Any) -> None:
    """aclose() runs once per episode: ended by the environment, by the engine's max_turns, by an
    environment error; a failing aclose is counted and noted, and the batch still comes back."""

    def backend() -> ScriptedBackend:
        return ScriptedBackend(tokenizer=tokenizer, responses=["hello"] * 3)

    ClosingEnv.closed = []
    engine = RolloutEngine(backend(), tokenizer, lambda: ClosingEnv({"done_after": 1}), max_turns=4)
    engine.collect(tasks(2), 2, seed=0)
    engine = RolloutEngine(backend(), tokenizer, lambda: ClosingEnv({"done_after": 9}), max_turns=2)
    [capped] = engine.collect(tasks(1), 1, seed=0)
    assert capped.termination == "max_turns"  # the engine's budget ended it, not the environment
    assert sorted(ClosingEnv.closed) == ["t0", "t0", "t0", "t1", "t1"]
    assert capped.metrics["env_close_errors"] == 0

    ClosingEnv.closed = []
    engine = RolloutEngine(backend(), tokenizer, lambda: ClosingEnv({"fail_close": True}), max_turns=2)
    with pytest.warns(RuntimeWarning, match=r"2 of 2 episodes failed to close; first: .*already gone"):
        trajectories = engine.collect(tasks(2), 1, seed=0)
    assert ClosingEnv.closed == ["t0", "t1"]
    for trajectory in trajectories:
        assert trajectory.metrics["env_close_errors"] == 1
        assert not trajectory.errors  # the episode is intact: kept for training
    assert len(engine.last_close_errors) == 2 and "raised in aclose" in engine.last_close_errors[0]


class MeasuringEnv(EchoEnv):
    """Reports its own figures per step: a latency, and a retry on every second turn."""

    name = "measuring_env"

    async def step(self, action: Action, turn: int) -> Observation:
        observation = await super().step(action, turn)
        observation.metrics = {"lookup_ms": 10.0 * (turn + 1), **({"retries": 1.0} if turn % 2 else {})}
        return observation


def test_environment_figures_are_summed_per_episode_and_averaged_per_step(tokenizer: Any) -> None:
    from agent_r1.engine.reports.stats import batch_metrics

    backend = ScriptedBackend(tokenizer=tokenizer, responses=["hello"] * 3)
    engine = RolloutEngine(backend, tokenizer, lambda: MeasuringEnv({"done_after": 3}), max_turns=3)
    episodes = engine.collect(tasks(2), 1, seed=0)
    for trajectory in episodes:  # turns 0, 1, 2: 10 + 20 + 30 ms, one retry (turn 1)
        assert trajectory.metrics["env/lookup_ms"] == 60.0 and trajectory.metrics["env/retries"] == 1.0
    short = RolloutEngine(
        ScriptedBackend(tokenizer=tokenizer, responses=["hello"]),
        tokenizer,
        lambda: MeasuringEnv({"done_after": 1}),
    ).collect(tasks(1), 1, seed=0)
    assert "env/retries" not in short[0].metrics  # never reported in that episode
    metrics = batch_metrics([*episodes, *short], success_signal="answer_match")
    assert metrics["env/lookup_ms"] == pytest.approx((60 + 60 + 10) / 3)
    assert metrics["env/retries"] == pytest.approx(2 / 3)  # an episode without it counts as 0
    with pytest.raises(ValueError, match="metrics"):
        Observation(metrics={"lookup_ms": "slow"})


class BrokenClosingEnv(ClosingEnv):
    async def step(self, action: Action, turn: int) -> Observation:
        raise RuntimeError("the environment fell over")


def test_episodes_are_closed_when_the_run_aborts(tokenizer: Any) -> None:
    backend = ScriptedBackend(tokenizer=tokenizer, responses=["hello"] * 3)
    ClosingEnv.closed = []
    engine = RolloutEngine(backend, tokenizer, BrokenClosingEnv)
    with pytest.raises(AgentR1Error, match="fell over"):
        engine.collect(tasks(2), 1, seed=0)
    assert sorted(ClosingEnv.closed) == ["t0", "t1"]


# --------------------------------------------------------------------------------------------
# The real ToolEnv and calculator, driven by a scripted policy
# --------------------------------------------------------------------------------------------


class _Text(BaseModel):
    model_config = ConfigDict(extra="forbid")
    text: str


class Nap(Tool):
    name = "nap"
    description = "Sleep 0.2 s, then echo the text."
    Arguments = _Text

    async def run(self, arguments: _Text) -> str:
        await asyncio.sleep(0.2)
        return f"rested {arguments.text}"


class Hang(Tool):
    name = "hang"
    description = "Never answers in time."
    Arguments = _Text

    async def run(self, arguments: _Text) -> str:
        await asyncio.sleep(30)
        return "too late"


class Boom(Tool):
    name = "boom"
    description = "Always raises."
    Arguments = _Text

    def run(self, arguments: _Text) -> str:
        raise RuntimeError("kaboom")


class Flood(Tool):
    name = "flood"
    description = "Returns a long text."
    Arguments = _Text

    def run(self, arguments: _Text) -> str:
        return "flood " * int(arguments.text)


class RolloutTools:
    @hookimpl
    def register_tools(self) -> list[type[Tool]]:
        return [Nap, Hang, Boom, Flood]


@pytest.fixture
def registry(monkeypatch: pytest.MonkeyPatch) -> Iterator[Registry]:
    monkeypatch.setenv("AGENT_R1_LOAD_PLUGINS", "builtins")
    previous = get_registry()
    registry = Registry(entry_points=True)
    registry.register_plugin(RolloutTools(), "rollout_test_tools")
    reset_registry(registry)
    registry.load()
    yield registry
    reset_registry(previous)


def tool_env_factory(**options: Any) -> Any:
    options.setdefault("tools", ["nap", "hang", "boom", "flood", "calculator"])
    options.setdefault("format", {"name": "tags", "tool_tags": {"calculator": "calc"}})
    options.setdefault("call_timeout_s", 0.3)
    options.setdefault("max_result_chars", None)

    def factory() -> Environment:
        return get_registry().build("environments", "tool_env", options)

    return factory


def by_turn(*turns: str) -> Any:
    """A scripted policy that says ``turns[k]`` at its k-th action (counted from the prompt)."""

    def say(prompt: str) -> str:
        return turns[min(prompt.count("<|im_start|>assistant") - 1, len(turns) - 1)]

    return say


def test_calculator_episode_end_to_end(registry: Registry, tokenizer: Any) -> None:
    from agent_r1.builtins.calculator import CalculatorEnv

    backend = ScriptedBackend(
        tokenizer=tokenizer, responses=["I will compute. <calc>23*41</calc>", "<answer>943</answer>"]
    )
    engine = RolloutEngine(
        backend, tokenizer, CalculatorEnv, max_turns=4, max_new_tokens=32, max_context=1024
    )
    [trajectory] = engine.collect(
        [Task(id="m", messages=[{"role": "user", "content": "23 * 41?"}])], 1, seed=0
    )
    assert trajectory.termination == "answer" and not trajectory.truncated
    first, second = trajectory.steps
    assert first.action.finish_reason == "stop" and [c.name for c in first.action.tool_calls] == [
        "calculator"
    ]
    assert first.observation.tool_results[0].content == "943"
    assert second.action.answer == "943"
    assert trajectory.metrics["tool_calls"] == 1 and trajectory.metrics["tool_errors"] == 0
    assert trajectory.metrics["template_drift_tokens"] == 0
    env_text = "".join(
        tokenizer.decode(s.token_ids) for s in trajectory.segments if s.source is TokenSource.ENV
    )
    assert env_text == "<|im_start|>user\n<result>943</result><|im_end|>\n"


def test_tool_failures_never_stop_the_run(registry: Registry, tokenizer: Any) -> None:
    scripts = {
        "malformed": by_turn("<calc>2+3", "<answer>5</answer>"),
        "unknown": by_turn("<search>rivers</search>", "<answer>Nile</answer>"),
        "raises": by_turn("<boom>now</boom>", "<answer>?</answer>"),
        "hangs": by_turn("<hang>forever</hang>", "<answer>?</answer>"),
        "floods": by_turn("<flood>100</flood>", "<answer>?</answer>"),
        "loops": by_turn("<calc>1+1</calc>"),
    }

    def say(prompt: str) -> str:
        name = next(name for name in scripts if f"case {name}" in prompt)
        return scripts[name](prompt)

    backend = ScriptedBackend(tokenizer=tokenizer, responses=say)
    engine = RolloutEngine(
        backend, tokenizer, tool_env_factory(max_turns=10), max_turns=3, max_new_tokens=32, max_context=400
    )
    batch = [Task(id=name, messages=[{"role": "user", "content": f"case {name}"}]) for name in scripts]
    result = {t.task_id: t for t in engine.collect(batch, 1, seed=0)}

    malformed = result["malformed"]
    assert malformed.termination == "answer" and malformed.metrics["format_errors"] >= 1
    assert "Error" in tokenizer.decode(malformed.segments[3].token_ids)  # the agent is told why
    assert result["unknown"].termination == "answer" and result["unknown"].metrics["format_errors"] >= 1
    for name, kind in (("raises", "exception"), ("hangs", "timeout")):
        trajectory = result[name]
        [failed] = trajectory.steps[0].observation.tool_results
        assert (failed.ok, failed.error) == (False, kind)
        assert trajectory.metrics["tool_errors"] == 1 and trajectory.termination == "answer"
    assert result["hangs"].steps[0].tool_s < 5  # the timeout, not the tool, ended the wait

    floods = result["floods"]
    assert floods.metrics["observation_cuts"] == 1 and len(floods) <= 400
    assert floods.termination == "answer" and len(floods.steps) == 2  # it could still answer
    loops = result["loops"]
    assert loops.termination == "max_turns" and loops.truncated and len(loops.steps) == 3


def test_context_budget_ends_a_tool_episode(registry: Registry, tokenizer: Any) -> None:
    backend = ScriptedBackend(tokenizer=tokenizer, responses=by_turn("<calc>1+1</calc>", "word " * 200))
    factory = tool_env_factory(end_on_no_tool_call=False)  # the environment would go on
    engine = RolloutEngine(backend, tokenizer, factory, max_turns=4, max_new_tokens=200, max_context=340)
    [trajectory] = engine.collect([Task(id="c", messages=[{"role": "user", "content": "go"}])], 1, seed=0)
    assert len(trajectory) == 340
    assert trajectory.steps[-1].action.finish_reason == "context"
    assert trajectory.termination == "max_tokens" and trajectory.truncated


def test_tool_calls_of_different_trajectories_overlap_in_time(registry: Registry, tokenizer: Any) -> None:
    backend = ScriptedBackend(
        tokenizer=tokenizer, responses=by_turn("<nap>zz</nap>", "<answer>done</answer>")
    )
    engine = RolloutEngine(
        backend, tokenizer, tool_env_factory(), max_turns=3, max_new_tokens=16, max_context=600
    )
    trajectories = engine.collect(tasks(2), 2, seed=0)
    calls = [r for t in trajectories for r in t.steps[0].observation.tool_results]
    assert len(calls) == 4 and all(r.ok and r.duration_s >= 0.2 for r in calls)
    assert all(r.started_at is not None and r.finished_at is not None for r in calls)
    # Every call started before any call finished: the four 0.2 s naps ran at the same time.
    assert max(r.started_at for r in calls) < min(r.finished_at for r in calls)  # type: ignore[type-var]


def test_hermes_tool_calls_with_the_qwen25_tokenizer(registry: Registry, qwen_tokenizer: Any) -> None:
    call = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "6*7"}}\n</tool_call>'
    backend = ScriptedBackend(tokenizer=qwen_tokenizer, responses=by_turn(call, "<answer>42</answer>"))
    factory = tool_env_factory(tools=["calculator"], format={"name": "hermes", "stop_on_call_end": True})
    engine = RolloutEngine(backend, qwen_tokenizer, factory, max_turns=3, max_new_tokens=64, max_context=2048)
    [trajectory] = engine.collect([Task(id="q", messages=[{"role": "user", "content": "6 * 7?"}])], 1, seed=0)
    prompt = qwen_tokenizer.decode(trajectory.segments[0].token_ids)
    assert '"name": "calculator"' in prompt  # the schema went through the template's tools=
    assert trajectory.steps[0].observation.tool_results[0].content == "42"
    assert trajectory.termination == "answer"
    env_text = "".join(
        qwen_tokenizer.decode(s.token_ids) for s in trajectory.segments if s.source is TokenSource.ENV
    )
    assert "<tool_response>\n42\n</tool_response>" in env_text
    assert trajectory.metrics["template_drift_tokens"] == 0
