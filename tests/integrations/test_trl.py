"""agent_r1.integrations.trl against the real TRL (1.16.0): GRPOTrainer with our rollout_func, the
masking of environment tokens in TRL's loss, the AsyncGRPOTrainer worker's rows through TRL's own
queue, planner and packer, and a TRL environment class inside agent-r1."""

from __future__ import annotations

import copy
import os
import queue
from pathlib import Path
from typing import Any

import pytest
import torch

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

trl = pytest.importorskip("trl")

from agent_r1.contracts import RewardShaper  # noqa: E402
from agent_r1.integrations import IntegrationError  # noqa: E402
from agent_r1.integrations.trl import (  # noqa: E402
    AgentR1RolloutFunc,
    AgentR1RolloutWorker,
    TRLEnvironment,
    rollout_dict,
)
from agent_r1.mdp import RewardSignal, TokenSource, Trajectory  # noqa: E402
from agent_r1.testing.models import save_tiny_model, tiny_model, tiny_tokenizer  # noqa: E402

ANSWER_MATCH = ("answer_match", {"mode": "numeric"}, 1.0)


class DigitShare(RewardShaper):
    """The share of digits in what the policy wrote: a random tiny model never answers right, so
    this gives a group's scores the variance that makes GRPO's advantages non-zero."""

    name = "digit_share"

    def score(self, trajectory: Trajectory, task: Any) -> list[RewardSignal]:
        text = "".join(step.action.text for step in trajectory.steps)
        return [RewardSignal(name=self.name, value=sum(c.isdigit() for c in text) / max(len(text), 1))]


class TokenHash(RewardShaper):
    """A score in [0, 1) that differs between samples that differ (a stand-in for a real reward, so
    that a group's advantages are not all zero)."""

    name = "token_hash"

    def score(self, trajectory: Trajectory, task: Any) -> list[RewardSignal]:
        return [RewardSignal(name=self.name, value=(hash(tuple(trajectory.token_ids)) % 997) / 997)]


def grpo_trainer(tmp_path: Path, rollout: AgentR1RolloutFunc, **overrides: Any) -> Any:
    """A GRPOTrainer on CPU with the tiny model saved to disk (as a user would load it)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    model_dir = save_tiny_model(tmp_path / "model", arch="qwen2", seed=3)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    if "tools" in overrides:  # TRL parses tool calls with a response schema; ours is Qwen's format
        from trl.chat_template_utils import qwen3_schema

        tokenizer.response_schema = qwen3_schema
    options: dict[str, Any] = {
        "output_dir": str(tmp_path / "out"),
        "per_device_train_batch_size": 4,
        "num_generations": 2,
        "max_completion_length": 16,
        "max_steps": 2,
        "learning_rate": 1e-3,
        "logging_steps": 1,
        "report_to": "none",
        "use_cpu": True,
        "bf16": False,
        "save_strategy": "no",
        "seed": 0,
        "dataloader_num_workers": 0,
    }
    options.update(overrides.pop("config", {}))
    return GRPOTrainer(
        model=model,
        processing_class=tokenizer,
        reward_funcs=[rollout.reward_func],
        args=GRPOConfig(**options),
        train_dataset=rollout.dataset(),
        rollout_func=rollout,
        **overrides,
    )


def test_two_grpo_steps_on_cpu_with_the_calculator_environment(
    tmp_path: Path, calculator_tasks: list
) -> None:
    rollout = AgentR1RolloutFunc(
        "calculator",
        {"few_shot": 1},
        tasks=calculator_tasks[:4],
        reward_shapers=[ANSWER_MATCH, (DigitShare(), 1.0)],
        max_turns=3,
        max_new_tokens=12,
        max_context=1024,
    )
    trainer = grpo_trainer(tmp_path, rollout)
    before = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
    result = trainer.train()

    assert trainer.state.global_step == 2
    assert result.training_loss == result.training_loss  # not NaN
    moved = [name for name, p in trainer.model.named_parameters() if not torch.equal(p, before[name])]
    assert moved, "two optimizer steps left every weight unchanged"
    trajectories = rollout.last_trajectories
    assert len(trajectories) == 4 and rollout.calls == 2
    # TRL logged our reward function's mean under its name
    logged = [entry for entry in trainer.state.log_history if "rewards/agent_r1_score/mean" in entry]
    assert len(logged) == 2
    # the rollout really ran the multi-turn engine: every episode has at least one action
    assert all(t.num_turns >= 1 for t in trajectories)
    assert any(entry["reward_std"] > 0 for entry in logged)


def test_rollout_dict_masks_everything_but_policy_tokens(calculator_tasks: list) -> None:
    from agent_r1.registry import get_registry
    from agent_r1.rollout.loop import RolloutEngine
    from agent_r1.testing.scripted import ScriptedBackend

    tokenizer = tiny_tokenizer()
    task = calculator_tasks[0]
    expression = task.metadata["expression"]
    backend = ScriptedBackend(
        tokenizer=tokenizer, responses=[f"<calc>{expression}</calc>", f"<answer>{task.answer}</answer>"]
    )
    engine = RolloutEngine(backend, tokenizer, lambda: get_registry().build("environments", "calculator", {}))
    [trajectory] = engine.collect([task], 1, seed=0)
    assert TokenSource.ENV in trajectory.sources
    out = rollout_dict([trajectory])

    prompt, completion, mask = out["prompt_ids"][0], out["completion_ids"][0], out["env_mask"][0]
    assert prompt + completion == trajectory.token_ids
    sources = trajectory.sources[len(prompt) :]
    assert mask == [int(s is TokenSource.POLICY) for s in sources]
    assert 0 in mask and 1 in mask
    assert len(out["logprobs"][0]) == len(completion)


def _hand_trajectory(observation_ids: list[int]) -> Trajectory:
    """prompt, action, template, observation: the completion ends on environment tokens, so changing
    one of them changes no other token's context and only its own loss term (if it had one)."""
    trajectory = Trajectory(id="t/0", task_id="t", group_id="t@g")
    trajectory.append(TokenSource.PROMPT, 0, [1, 40, 41, 42, 2, 1, 43, 44])
    trajectory.append(TokenSource.POLICY, 0, [50, 51, 52, 53], [-1.0, -1.1, -1.2, -1.3])
    trajectory.append(TokenSource.TEMPLATE, 0, [2])
    trajectory.append(TokenSource.ENV, 0, observation_ids)
    return trajectory


def _loss_gradient(trainer: Any, trajectories: list[Trajectory], *, use_env_mask: bool) -> torch.Tensor:
    """The gradient of TRL's own GRPO loss (its _generate_and_score_completions, then compute_loss)
    for a batch made of ``trajectories``."""
    output = rollout_dict(trajectories)
    if not use_env_mask:
        output.pop("env_mask")
    output["agent_r1_score"] = [1.0, 0.0]  # a group of two with different scores: non-zero advantages
    trainer.rollout_func = lambda prompts, _trainer: copy.deepcopy(output)
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1  # set by Trainer.training_step during train()
    inputs = trainer._generate_and_score_completions([{"prompt": "x"}, {"prompt": "x"}])
    trainer.model.zero_grad()
    loss = trainer.compute_loss(trainer.model, inputs)
    loss.backward()
    return torch.cat([p.grad.flatten() for p in trainer.model.parameters() if p.grad is not None]).clone()


def test_environment_tokens_get_no_gradient_in_trls_loss(tmp_path: Path, calculator_tasks: list) -> None:
    rollout = AgentR1RolloutFunc("calculator", tasks=calculator_tasks[:1], max_turns=1, max_new_tokens=4)
    trainer = grpo_trainer(tmp_path, rollout, config={"per_device_train_batch_size": 2})
    first = [_hand_trajectory([60, 61, 62]), _hand_trajectory([70, 71, 72])]
    changed = [_hand_trajectory([60, 61, 99]), _hand_trajectory([70, 71, 98])]  # last observation token

    masked = _loss_gradient(trainer, first, use_env_mask=True)
    masked_changed = _loss_gradient(trainer, changed, use_env_mask=True)
    assert masked.abs().sum() > 0
    torch.testing.assert_close(masked_changed, masked, rtol=0, atol=1e-7)

    # The control: without env_mask TRL trains on the observation, and the same change moves the gradient.
    unmasked = _loss_gradient(trainer, first, use_env_mask=False)
    unmasked_changed = _loss_gradient(trainer, changed, use_env_mask=False)
    assert (unmasked_changed - unmasked).abs().max() > 1e-4


def test_tools_with_rollout_func_is_refused(tmp_path: Path, calculator_tasks: list) -> None:
    def add(a: int, b: int) -> int:
        """Add two numbers.

        Args:
            a: first number
            b: second number
        """
        return a + b

    rollout = AgentR1RolloutFunc("calculator", tasks=calculator_tasks[:2], max_turns=1, max_new_tokens=4)
    trainer = grpo_trainer(tmp_path, rollout, tools=[add])
    with pytest.raises(IntegrationError, match="ignores env_mask"):
        trainer.train()


def test_an_unknown_environment_fails_before_training() -> None:
    from agent_r1.errors import AgentR1Error

    with pytest.raises(AgentR1Error, match="no_such_env"):
        AgentR1RolloutFunc("no_such_env")


# --------------------------------------------------------------------------------------------
# AsyncGRPOTrainer's rollout worker
# --------------------------------------------------------------------------------------------


def _worker(calculator_tasks: list, **options: Any) -> AgentR1RolloutWorker:
    from agent_r1.builtins.hf_backend import HFBackend
    from agent_r1.contracts import SamplingParams

    tokenizer = tiny_tokenizer()
    model = tiny_model(tokenizer, arch="qwen2", seed=5)
    backend = HFBackend({}, model=model, tokenizer=tokenizer)
    defaults: dict[str, Any] = {
        "tasks": calculator_tasks[:2],
        "group_size": 4,
        "tasks_per_round": 2,
        "reward_shapers": [ANSWER_MATCH, {"name": "format", "weight": 0.5}, (TokenHash(), 1.0)],
        "max_turns": 2,
        "max_new_tokens": 10,
        "max_context": 1024,
        "sampling": SamplingParams(temperature=1.0),
    }
    defaults.update(options)
    return AgentR1RolloutWorker(backend, tokenizer, "calculator", {"few_shot": 1}, **defaults)


def _through_trls_packer(samples: list[Any], microbatch_size: int) -> list[Any]:
    """Drain ``samples`` through TRL's RolloutQueueDataset, FixedCountBatcher and
    DataCollatorForRollout (its real code), as AsyncGRPOTrainer's dataloader does."""
    from collections import defaultdict

    from trl.experimental.async_grpo.async_grpo_trainer import (
        DataCollatorForRollout,
        FixedCountBatcher,
        RolloutQueueDataset,
    )

    buffer: queue.Queue[Any] = queue.Queue()
    for sample in samples:
        buffer.put(sample)
    metrics: dict[str, list] = defaultdict(list)

    def healthy(_stale_after_s: float) -> None:
        raise AssertionError("TRL's dataset waited on an empty queue: fewer rows than a micro-batch")

    dataset = RolloutQueueDataset(
        buffer,
        model_version_fn=lambda: 0,
        check_health_fn=healthy,
        stale_after_s=1.0,
        metrics=metrics,
        poll_interval_s=0.01,
    )
    batcher = FixedCountBatcher(dataset, num_processes=1, microbatch_size=microbatch_size)
    collator = DataCollatorForRollout(pad_token_id=0, num_processes=1, metrics=metrics)
    rows = next(iter(batcher))
    return [collator.torch_call([rows]), rows]


@pytest.mark.parametrize(
    ("estimator", "options", "granularity"),
    [("grpo", {}, "trajectory"), ("rloo", {}, "trajectory"), ("reinforce_pp", {"gamma": 1.0}, "turn")],
)
def test_async_worker_rows_go_through_trls_packer_with_our_advantages(
    calculator_tasks: list, estimator: str, options: dict, granularity: str
) -> None:
    from trl.experimental.async_grpo.async_rollout_worker import RolloutSample

    from agent_r1.contracts import AdvantageInput
    from agent_r1.engine.learner.batch import collate
    from agent_r1.registry import get_registry

    worker = _worker(
        calculator_tasks, estimator=estimator, estimator_options=options, granularity=granularity
    )
    samples = worker.produce()
    assert samples and all(isinstance(s, RolloutSample) for s in samples)
    assert any(abs(s.advantage) > 1e-3 for s in samples)
    # our advantages: the estimator over the same trajectories, by hand
    kept = worker.last_trajectories
    assert kept
    batch = collate(kept, pad_token_id=0)
    expected, _ = (
        get_registry()
        .build("advantage_estimators", estimator, options)
        .compute(AdvantageInput(batch.token_rewards, batch.loss_mask, batch.scores, batch.group_ids))
    )
    for sample in samples:
        ids = sample.input_ids.tolist()
        row = next(i for i, t in enumerate(kept) if t.token_ids[: len(ids)] == ids)
        trained = sample.completion_mask.astype(bool)
        sources = kept[row].sources[: len(ids)]
        assert all(sources[i] is TokenSource.POLICY for i in range(len(ids)) if trained[i])
        assert float(expected[row, : len(ids)][torch.from_numpy(trained)].mean()) == pytest.approx(
            sample.advantage, abs=1e-6
        )
        assert sample.old_log_probs[~trained].tolist() == [0.0] * int((~trained).sum())
    if granularity == "turn":
        assert len(samples) >= len(kept)  # one row per action

    batch_out, rows = _through_trls_packer(samples, microbatch_size=len(samples))
    packed_samples = rows[0].samples
    assert len(packed_samples) == len(samples)
    # TRL trains exactly our policy tokens, with our old log-probs and advantages
    n_trained = sum(int(s.completion_mask.sum()) for s in samples)
    assert batch_out["token_index"].shape[1] == n_trained
    assert sorted(batch_out["advantages"][0].tolist()) == pytest.approx(
        sorted(a for s in samples for a in [s.advantage] * int(s.completion_mask.sum())), abs=1e-6
    )
    assert sorted(batch_out["old_log_probs"][0].tolist()) == pytest.approx(
        sorted(lp for s in samples for lp in s.old_log_probs[s.completion_mask.astype(bool)].tolist()),
        abs=1e-6,
    )


class OutcomeOne(RewardShaper):
    """Reward 1 for every episode."""

    name = "outcome_one"

    def score(self, trajectory: Trajectory, task: Any) -> list[RewardSignal]:
        return [RewardSignal(name=self.name, value=1.0)]


def test_async_worker_refuses_advantages_that_vary_within_a_row(calculator_tasks: list) -> None:
    worker = _worker(
        calculator_tasks,
        estimator="reinforce_pp",
        estimator_options={"gamma": 0.5},
        granularity="trajectory",
        reward_shapers=[(OutcomeOne(), 1.0)],  # a non-zero reward, so the discounting shows
    )
    with pytest.raises(IntegrationError, match="one advantage each"):
        worker.produce()


def test_async_worker_thread_protocol(calculator_tasks: list) -> None:
    worker = _worker(calculator_tasks, group_size=2, tasks_per_round=1, max_turns=1)
    worker.start()
    try:
        first = worker.rollout_buffer.get(timeout=120)
        worker.check_health(stale_after_s=600)
        worker.update_model_version(3)
        assert worker.backend.policy_version == 3
    finally:
        worker.stop()
    assert first.model_version == 0 and first.input_ids.dtype.kind == "i"
    assert not worker.metrics_queue.empty()
    with pytest.raises(IntegrationError, match="not running"):
        worker.check_health(stale_after_s=600)


# --------------------------------------------------------------------------------------------
# A TRL environment class inside agent-r1
# --------------------------------------------------------------------------------------------


class CounterEnv:
    """A TRL-style environment (environment_factory contract): reset, tool methods, get_reward."""

    def reset(self, **kwargs: Any) -> str:
        self.total = 0
        self.target = int(kwargs["answer"])
        return " Use the add tool."

    def add(self, amount: int) -> str:
        """Add an amount to the running total.

        Args:
            amount: how much to add
        """
        self.total += amount
        return f"total={self.total}"

    def get_reward(self) -> float:
        return 1.0 if self.total == self.target else 0.0


def test_a_trl_environment_class_runs_inside_agent_r1() -> None:
    from agent_r1.mdp import Task
    from agent_r1.rollout.loop import RolloutEngine
    from agent_r1.testing.scripted import ScriptedBackend

    tokenizer = tiny_tokenizer()
    task = Task(id="count", messages=[{"role": "user", "content": "Reach 7."}], answer=7)
    backend = ScriptedBackend(
        tokenizer=tokenizer,
        responses=[
            '<tool_call>\n{"name": "add", "arguments": {"amount": 3}}\n</tool_call>',
            '<tool_call>\n{"name": "add", "arguments": {"amount": 4}}\n</tool_call>',
            "Done: 7",
        ],
    )
    engine = RolloutEngine(backend, tokenizer, lambda: TRLEnvironment(CounterEnv), max_turns=4)
    [trajectory] = engine.collect([task], 1, seed=0)

    assert trajectory.termination == "answer"
    assert [
        r.content for s in trajectory.steps for r in (s.observation.tool_results if s.observation else [])
    ] == [
        "total=3",
        "total=7",
    ]
    assert trajectory.reward_by_name() == {"trl_env_reward": 1.0}
    prompt_text = tokenizer.decode(trajectory.token_ids[: trajectory.prompt_length])
    assert "Reach 7. Use the add tool." in prompt_text and '"name": "add"' in prompt_text


class SlowLookupEnv:
    """A TRL-style environment whose tool is synchronous and slow (a blocking network call)."""

    active = 0
    peak = 0
    lock = __import__("threading").Lock()

    def reset(self, **kwargs: Any) -> None:
        return None

    def lookup(self, key: str) -> str:
        """Look a key up in a slow remote table.

        Args:
            key: what to look up
        """
        import time

        cls = type(self)
        with cls.lock:
            cls.active += 1
            cls.peak = max(cls.peak, cls.active)
        try:
            time.sleep(0.3 if key != "hang" else 5.0)
        finally:
            with cls.lock:
                cls.active -= 1
        return f"{key}=ok"

    def get_reward(self) -> float:
        return 1.0


def _lookup_engine(responses: list[str], **options: Any) -> Any:
    from agent_r1.rollout.loop import RolloutEngine
    from agent_r1.testing.scripted import ScriptedBackend

    tokenizer = tiny_tokenizer()
    backend = ScriptedBackend(tokenizer=tokenizer, responses=responses)
    return RolloutEngine(backend, tokenizer, lambda: TRLEnvironment(SlowLookupEnv, **options), max_turns=2)


@pytest.mark.parametrize(("threaded", "expected_peak"), [(True, 8), (False, 1)])
def test_sync_trl_tools_of_different_episodes_wait_together(threaded: bool, expected_peak: int) -> None:
    """Sync tool methods run in worker threads: the 8 episodes' slow calls overlap (all 8 at once),
    not one after another; with threaded_tools=False they run inline, one at a time."""
    from agent_r1.mdp import Task

    SlowLookupEnv.active = SlowLookupEnv.peak = 0
    call = '<tool_call>\n{"name": "lookup", "arguments": {"key": "a"}}\n</tool_call>'
    engine = _lookup_engine([call, "done"], threaded_tools=threaded)
    messages = [{"role": "user", "content": "Look a up."}]
    tasks = [Task(id=f"t{i}", messages=messages, answer=1) for i in range(8)]
    trajectories = engine.collect(tasks, 1, seed=0)
    assert len(trajectories) == 8
    for trajectory in trajectories:
        [result] = trajectory.steps[0].observation.tool_results
        assert result.ok and result.content == "a=ok"
    assert SlowLookupEnv.peak == expected_peak


def test_a_hanging_trl_tool_times_out_into_an_observation() -> None:
    from agent_r1.mdp import Task

    call = '<tool_call>\n{"name": "lookup", "arguments": {"key": "hang"}}\n</tool_call>'
    engine = _lookup_engine([call, "done"], call_timeout_s=0.5)
    task = Task(id="h", messages=[{"role": "user", "content": "x"}], answer=1)
    [trajectory] = engine.collect([task], 1, seed=0)
    [result] = trajectory.steps[0].observation.tool_results
    assert not result.ok and result.error == "timeout"
    assert "timed out after 0.5 s" in result.content
    assert trajectory.termination == "answer"  # the episode went on after the failed call
    with pytest.raises(IntegrationError, match="call_timeout_s"):
        TRLEnvironment(SlowLookupEnv, call_timeout_s=0)


def test_trl_tool_calls_are_read_by_agent_r1_s_hermes_parser() -> None:
    """TRLEnvironment reads calls with the same parser as the hermes format: arguments are checked
    against the method's schema (a missing one is a parse error the agent reads, the method is not
    called), and a call whose closing tag the backend left out still runs."""
    from agent_r1.mdp import Task

    SlowLookupEnv.active = SlowLookupEnv.peak = 0
    responses = [
        '<tool_call>\n{"name": "lookup", "arguments": {}}\n</tool_call>',
        '<tool_call>{"name": "lookup", "arguments": {"key": "a"}}',
    ]
    engine = _lookup_engine([*responses, "done"])
    engine.max_turns = 3
    task = Task(id="p", messages=[{"role": "user", "content": "x"}], answer=1)
    [trajectory] = engine.collect([task], 1, seed=0)
    first, second, last = (step.observation for step in trajectory.steps)
    assert first.tool_results == [] and first.parse_errors == [
        "tool call 1 (lookup): missing required argument 'key'."
    ]
    assert [m["content"] for m in first.messages] == [f"Error: {first.parse_errors[0]}"]
    assert [r.content for r in second.tool_results] == ["a=ok"] and second.parse_errors == []
    assert last.termination == "answer" and SlowLookupEnv.peak == 1
