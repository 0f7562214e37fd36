"""Learned trajectory rewards: ``reward_model`` (a sequence classifier) and ``llm_judge`` (a
generative judge through the ``hf`` backend), on tiny real models built here: a random
``LlamaForSequenceClassification`` with the tiny ChatML tokenizer, the tiny causal LM of
``agent_r1.testing.models`` as judge (and a copy of it fine-tuned in the test to always answer
``Score: 7/10``), then a two-step training run with both shapers.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from agent_r1.builtins.reward_models import (
    DEFAULT_JUDGE_PROMPT,
    JudgeParseError,
    LLMJudge,
    RewardModelShaper,
    conversation,
    conversation_text,
)
from agent_r1.errors import AgentR1Error, ConfigError
from agent_r1.mdp import Action, Observation, Step, Task, TokenSource, Trajectory
from agent_r1.registry import validate_component_config

# --------------------------------------------------------------------------------------------
# Models and trajectories
# --------------------------------------------------------------------------------------------


def _classifier(tokenizer: Any, num_labels: int = 1, seed: int = 0) -> Any:
    from transformers import LlamaConfig, LlamaForSequenceClassification

    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        num_labels=num_labels,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return LlamaForSequenceClassification(config).eval()


@pytest.fixture(scope="module")
def rm_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from agent_r1.testing.models import tiny_tokenizer

    directory = tmp_path_factory.mktemp("reward-model")
    tokenizer = tiny_tokenizer()
    _classifier(tokenizer, num_labels=2).save_pretrained(str(directory))
    tokenizer.save_pretrained(str(directory))
    return directory


@pytest.fixture(scope="module")
def judge_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from agent_r1.testing.models import save_tiny_model

    return save_tiny_model(tmp_path_factory.mktemp("judge"))


TASK = Task(
    id="q1",
    messages=[
        {"role": "system", "content": "Use the calculator."},
        {"role": "user", "content": "What is 12*3?"},
    ],
    answer="36",
)


def _trajectory(i: int, answer: str | None, *, tool_turn: bool = True) -> Trajectory:
    """A scored-looking episode: an optional tool call answered by a tool message, then an answer."""
    trajectory = Trajectory(id=f"t{i}", task_id=TASK.id, group_id="g", sample_index=i)
    steps = []
    if tool_turn:
        steps.append(
            Step(
                turn=0,
                action=Action(text=f"<tool_call>calc {i}*3</tool_call>"),
                observation=Observation(messages=[{"role": "tool", "content": str(3 * i)}]),
            )
        )
    final = f"The answer is <answer>{answer}</answer>" if answer is not None else "I do not know."
    steps.append(
        Step(turn=len(steps), action=Action(text=final, answer=answer), observation=Observation(done=True))
    )
    trajectory.steps = steps
    trajectory.append(TokenSource.PROMPT, 0, [1, 2, 3])
    trajectory.append(TokenSource.POLICY, 0, [5, 6], [-1.0, -1.0])
    return trajectory


def _direct_logit(
    directory: Path, text: str, label: int, *, special: bool, max_length: int | None = None
) -> float:
    """The classifier on one text, unbatched and unpadded: what the shaper must reproduce."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(directory))
    model = AutoModelForSequenceClassification.from_pretrained(str(directory)).eval()
    ids = tokenizer(text, add_special_tokens=special)["input_ids"]
    if max_length is not None:
        ids = ids[-max_length:]
    with torch.no_grad():
        return float(model(input_ids=torch.tensor([ids])).logits[0, label])


# --------------------------------------------------------------------------------------------
# Rendering
# --------------------------------------------------------------------------------------------


def test_conversation_renders_actions_and_observations() -> None:
    messages = conversation(_trajectory(4, "36"), TASK)
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool", "assistant"]
    assert messages[2]["content"] == "<tool_call>calc 4*3</tool_call>" and messages[3]["content"] == "12"
    assert messages[4]["content"] == "The answer is <answer>36</answer>"
    text = conversation_text(messages)
    assert text.startswith("system: Use the calculator.\n\nuser: What is 12*3?") and "tool: 12" in text


def test_continuations_stay_in_the_assistant_message() -> None:
    """Search-R1 layout: an observation that continues the assistant's turn is part of it."""
    trajectory = _trajectory(1, "36", tool_turn=False)
    trajectory.steps = [
        Step(
            turn=0,
            action=Action(text="<search>x</search>"),
            observation=Observation(continuation="<info>y</info>"),
        ),
        Step(
            turn=1, action=Action(text="<answer>36</answer>", answer="36"), observation=Observation(done=True)
        ),
    ]
    messages = conversation(trajectory, TASK)
    assert messages[-1] == {
        "role": "assistant",
        "content": "<search>x</search><info>y</info><answer>36</answer>",
    }


# --------------------------------------------------------------------------------------------
# reward_model
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("render", ["chat", "text"])
def test_batched_scores_equal_single_unpadded_passes(rm_dir: Path, render: str) -> None:
    """Batching pads rows of different lengths; each score must still be the model's logit on that
    text alone (the classifier pools each row's last real token)."""
    shaper = RewardModelShaper({"path": str(rm_dir), "render": render, "label": 1, "batch_size": 3})
    trajectories = [
        _trajectory(i, ans) for i, ans in enumerate(["36", "35", "a much longer wrong answer", "36"])
    ]
    results = shaper.score_batch(trajectories, [TASK] * 4)
    values = []
    for trajectory, result in zip(trajectories, results, strict=True):
        assert not isinstance(result, Exception)
        by_name = {s.name: s for s in result}
        assert set(by_name) == {"reward_model", "reward_model/clipped", "reward_model/truncated"}
        assert (
            by_name["reward_model/clipped"].weight == 0.0 and by_name["reward_model/truncated"].value == 0.0
        )
        text = shaper.text(trajectory, TASK)
        assert text is not None
        expected = _direct_logit(rm_dir, text, 1, special=render == "text")
        assert by_name["reward_model"].value == pytest.approx(expected, abs=1e-5)
        values.append(by_name["reward_model"].value)
    assert len({round(v, 6) for v in values}) == 4  # different trajectories, different scores
    assert shaper.score(trajectories[0], TASK)[0].value == pytest.approx(values[0], abs=1e-6)


def test_chat_render_uses_the_reward_models_template(rm_dir: Path) -> None:
    shaper = RewardModelShaper({"path": str(rm_dir)})
    text = shaper.text(_trajectory(2, "36"), TASK)
    assert text is not None and text.count("<|im_start|>") == 5 and "<|im_start|>tool" in text


def test_answer_input_scores_the_question_and_the_final_answer(rm_dir: Path) -> None:
    shaper = RewardModelShaper(
        {"path": str(rm_dir), "input": "answer", "render": "text", "no_answer_value": -2.0}
    )
    answered, unanswered = _trajectory(1, "36"), _trajectory(2, None)
    assert (
        shaper.text(answered, TASK) == "system: Use the calculator.\n\nuser: What is 12*3?\n\nassistant: 36"
    )
    assert shaper.text(unanswered, TASK) is None
    signals = shaper.score(unanswered, TASK)
    assert signals[0].value == -2.0 and signals[1].value == 0.0
    # the tool call in between does not reach the reward model: same answer, same score
    assert shaper.score(answered, TASK)[0].value == shaper.score(_trajectory(9, "36"), TASK)[0].value


def test_identical_texts_run_the_model_once(rm_dir: Path) -> None:
    shaper = RewardModelShaper({"path": str(rm_dir), "input": "answer", "batch_size": 8})
    shaper._load()
    rows: list[int] = []
    forward = shaper._model.forward

    def counting_forward(*args: Any, **kwargs: Any) -> Any:  # a spy on the real forward pass
        rows.append(int(kwargs["input_ids"].shape[0]))
        return forward(*args, **kwargs)

    shaper._model.forward = counting_forward
    group = [_trajectory(i, "36" if i % 2 else "35") for i in range(6)]
    first = shaper.score_batch(group, [TASK] * 6)
    assert rows == [2]  # two distinct answers, one batch
    second = shaper.score_batch(group, [TASK] * 6)
    assert rows == [2] and first == second  # all cached


def test_truncation_keeps_the_end_and_is_reported(rm_dir: Path) -> None:
    shaper = RewardModelShaper({"path": str(rm_dir), "render": "text", "max_length": 12})
    trajectory = _trajectory(3, "36")
    signals = {s.name: s.value for s in shaper.score(trajectory, TASK)}
    text = shaper.text(trajectory, TASK)
    assert text is not None
    assert signals["reward_model/truncated"] == 1.0
    assert signals["reward_model"] == pytest.approx(
        _direct_logit(rm_dir, text, 0, special=True, max_length=12), abs=1e-5
    )


@settings(max_examples=60, deadline=None)
@given(
    logit=st.floats(-50, 50, allow_nan=False),
    shift=st.floats(-3, 3, allow_nan=False),
    scale=st.floats(0.1, 5, allow_nan=False),
    squash=st.sampled_from(["none", "sigmoid", "tanh"]),
    clip=st.one_of(st.none(), st.floats(0.05, 4, allow_nan=False)),
)
def test_normalisation_matches_naive(
    logit: float, shift: float, scale: float, squash: str, clip: float | None
) -> None:
    shaper = RewardModelShaper(
        {"path": "unused", "shift": shift, "scale": scale, "squash": squash, "clip": clip}
    )
    z = (logit - shift) / scale
    if squash == "sigmoid":
        z = 1 / (1 + math.exp(-z)) if z > -700 else 0.0
    elif squash == "tanh":
        z = math.tanh(z)
    clipped = clip is not None and abs(z) > clip
    expected = max(-clip, min(clip, z)) if clip is not None else z
    value, was_clipped = shaper.value(logit)
    assert value == pytest.approx(expected, rel=1e-9, abs=1e-12)
    assert was_clipped == clipped


def test_reward_model_check_says_what_is_wrong(rm_dir: Path, judge_dir: Path, tmp_path: Path) -> None:
    missing = RewardModelShaper.check(RewardModelShaper.Config(path=str(tmp_path / "nope")))
    assert len(missing) == 1 and "is not a directory" in missing[0] and "save_pretrained" in missing[0]
    causal = RewardModelShaper.check(RewardModelShaper.Config(path=str(judge_dir)))
    assert any("not a sequence-classification model" in p and "LlamaForCausalLM" in p for p in causal)
    assert RewardModelShaper.check(RewardModelShaper.Config(path=str(rm_dir), label=1)) == []
    wrong_label = RewardModelShaper.check(RewardModelShaper.Config(path=str(rm_dir), label=2))
    assert wrong_label == ["reward_model.label=2 but the model has 2 output(s)"]
    (tmp_path / "empty").mkdir()
    assert (
        "no config.json" in RewardModelShaper.check(RewardModelShaper.Config(path=str(tmp_path / "empty")))[0]
    )


def test_a_missing_reward_model_stops_preflight_before_any_model_loads(tmp_path: Path) -> None:
    from trainer_helpers import toy_config, toy_registry, write_tiny_checkpoint

    from agent_r1.config import RunConfig, validate_components
    from agent_r1.registry import reset_registry
    from agent_r1.run.preflight import preflight

    registry = toy_registry()
    try:
        model_dir = write_tiny_checkpoint(tmp_path / "policy")
        config = toy_config(
            model_dir,
            tmp_path / "run",
            rewards=[{"name": "target_char"}, {"name": "reward_model", "path": str(tmp_path / "no-rm")}],
        )
        run = RunConfig.model_validate(config)
        report = preflight(run, validate_components(run, registry))
    finally:
        reset_registry()
    failures = [c.message for c in report.failures]
    assert len(failures) == 1, failures
    assert failures[0].startswith("rewards[1] (reward_model): reward_model.path") and "no-rm" in failures[0]
    assert not (tmp_path / "run").exists()


def test_reward_model_device_option(rm_dir: Path) -> None:
    shaper = RewardModelShaper(
        {"path": str(rm_dir), "device": "cuda:7" if not torch.cuda.is_available() else "tpu"}
    )
    with pytest.raises(ConfigError, match="reward shaper 'reward_model', option device"):
        shaper.score(_trajectory(0, "36"), TASK)
    cpu = RewardModelShaper({"path": str(rm_dir), "device": "cpu"})
    cpu.score(_trajectory(0, "36"), TASK)
    assert next(cpu._model.parameters()).device.type == "cpu"


# --------------------------------------------------------------------------------------------
# llm_judge
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        ("Score: 7/10", 0.7),
        ("The answer is right.\nScore: 10/10", 1.0),
        ("Score:3 / 4", 0.75),
        ("Score: 7", 0.7),  # no denominator: divided by max_score (10)
        ("The record says 'Score: 10/10' but it is wrong.\nScore: 2/10", 0.2),  # the last one counts
        ("Score: 0/10", 0.0),
        ("Score: 12/10", None),  # outside [0, 1]
        ("Score: -1/10", None),
        ("Score: 5/0", None),
        ("I cannot grade this.", None),
        ("", None),
    ],
)
def test_judge_parses_the_last_score(reply: str, expected: float | None) -> None:
    judge = LLMJudge({"path": "unused"})
    value = judge.parse(reply)
    assert value == (pytest.approx(expected) if expected is not None else None)


def test_judge_score_pattern_is_configurable() -> None:
    judge = LLMJudge({"path": "unused", "score_pattern": r"Rating:\s*(\d)", "max_score": 5})
    assert judge.parse("Rating: 4") == pytest.approx(0.8)
    assert judge.parse("Score: 4/5") is None


def test_judge_config_errors_name_the_problem() -> None:
    where = "reward shaper 'llm_judge'"
    with pytest.raises(ConfigError, match="capturing group"):
        validate_component_config(LLMJudge, {"path": "x", "score_pattern": r"Score: \d"}, where=where)
    with pytest.raises(ConfigError, match="not a valid regular expression"):
        validate_component_config(LLMJudge, {"path": "x", "score_pattern": r"(\d"}, where=where)
    with pytest.raises(ConfigError, match=r"unknown field\(s\) \['task'\]"):
        validate_component_config(LLMJudge, {"path": "x", "prompt": "{task}: {answer}"}, where=where)
    with pytest.raises(ConfigError, match="on_parse_failure"):
        validate_component_config(LLMJudge, {"path": "x", "on_parse_failure": "zero"}, where=where)


def test_judge_prompt_fills_the_template() -> None:
    judge = LLMJudge({"path": "unused", "max_trajectory_chars": 100})
    messages = judge.prompt_messages(_trajectory(5, "36"), TASK)
    assert [m["role"] for m in messages] == ["system", "user"]
    user = messages[1]["content"]
    assert "Task:\nWhat is 12*3?" in user and "Reference answer (may be empty): 36" in user
    assert "The agent's final answer: 36" in user and "tool: 15" in user
    assert DEFAULT_JUDGE_PROMPT.startswith("Task:")
    long = _trajectory(6, "36")
    long.steps[0].observation = Observation(messages=[{"role": "tool", "content": "x" * 500}])
    record = judge.prompt_messages(long, TASK)[1]["content"].split("<<<RECORD\n")[1].split("\nRECORD>>>")[0]
    assert record.startswith("[...] ") and len(record) == 100 + len("[...] ") and record.endswith("</answer>")
    unanswered = judge.prompt_messages(_trajectory(7, None), TASK)[1]["content"]
    assert "The agent's final answer: (no final answer)" in unanswered


def test_judge_replies_come_from_the_hf_backend_in_batches(judge_dir: Path) -> None:
    """Batched replies equal one-prompt replies (greedy), and are what the backend generates for
    the chat-rendered prompt."""
    judge = LLMJudge({"path": str(judge_dir), "batch_size": 3, "max_new_tokens": 8, "device": "cpu"})
    prompts = [judge.prompt_messages(_trajectory(i, str(30 + i)), TASK) for i in range(4)]
    batched = judge.judge(prompts)
    single = [judge.judge([p])[0] for p in prompts]
    assert batched == single and len(batched) == 4


@pytest.mark.parametrize("mode", ["error", "skip", "value", "abort"])
def test_unparsable_judgements_are_never_silently_zero(judge_dir: Path, mode: str) -> None:
    """The tiny random judge writes no score: what the trajectory gets depends on
    on_parse_failure, and every failure is counted by the weight-0 diagnostic."""
    judge = LLMJudge(
        {
            "path": str(judge_dir),
            "max_new_tokens": 6,
            "on_parse_failure": mode,
            "failure_value": -0.5,
            "device": "cpu",
        }
    )
    trajectories = [_trajectory(i, "36") for i in range(3)]
    replies = judge.judge([judge.prompt_messages(t, TASK) for t in trajectories])
    assert all(judge.parse(r) is None for r in replies), replies
    if mode == "abort":
        with pytest.raises(AgentR1Error, match="on_parse_failure is 'abort'"):
            judge.score_batch(trajectories, [TASK] * 3)
        return
    results = judge.score_batch(trajectories, [TASK] * 3)
    if mode == "error":
        assert all(isinstance(r, JudgeParseError) for r in results)
        with pytest.raises(JudgeParseError, match="trajectory 't0' of task 'q1'"):
            judge.score(trajectories[0], TASK)
        return
    for result in results:
        assert not isinstance(result, Exception)
        by_name = {s.name: s for s in result}
        assert (
            by_name["llm_judge/parse_failure"].value == 1.0
            and by_name["llm_judge/parse_failure"].weight == 0.0
        )
        assert by_name["llm_judge/top_score"].value == 0.0
        if mode == "skip":
            assert set(by_name) == {"llm_judge/parse_failure", "llm_judge/top_score"}
        else:
            assert by_name["llm_judge"].value == -0.5 and by_name["llm_judge"].weight == 1.0


def test_judge_replies_map_to_signals(monkeypatch: pytest.MonkeyPatch) -> None:
    """From replies to signals. The replies are fixed here (a stand-in for the model call, which
    the tests around this one run for real) so that every case occurs: a top score, a middling
    one, and one without a score."""
    judge = LLMJudge({"path": "unused", "on_parse_failure": "value", "failure_value": -1.0})
    replies = ["Fine.\nScore: 10/10", "Partly.\nScore: 3/10", "No idea."]
    monkeypatch.setattr(judge, "judge", lambda prompts: replies[: len(prompts)])
    results = judge.score_batch([_trajectory(i, "36") for i in range(3)], [TASK] * 3)
    values = [{s.name: s.value for s in r} for r in results if not isinstance(r, Exception)]
    assert values == [
        {"llm_judge": 1.0, "llm_judge/parse_failure": 0.0, "llm_judge/top_score": 1.0},
        {"llm_judge": pytest.approx(0.3), "llm_judge/parse_failure": 0.0, "llm_judge/top_score": 0.0},
        {"llm_judge": -1.0, "llm_judge/parse_failure": 1.0, "llm_judge/top_score": 0.0},
    ]


def test_a_judge_that_writes_a_score_is_parsed(judge_dir: Path, tmp_path: Path) -> None:
    """The tiny judge, fine-tuned here for a few steps to answer 'Score: 7/10', grades through the
    whole path: prompt, chat template, hf backend, decoding, parsing."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(judge_dir))
    model = AutoModelForCausalLM.from_pretrained(str(judge_dir))
    judge = LLMJudge({"path": str(judge_dir), "max_new_tokens": 12, "device": "cpu"})
    target = tokenizer("Score: 7/10<|im_end|>", add_special_tokens=False)["input_ids"]
    examples = []
    for i in range(3):
        text = tokenizer.apply_chat_template(
            judge.prompt_messages(_trajectory(i, str(35 + i)), TASK),
            add_generation_prompt=True,
            tokenize=False,
        )
        examples.append(tokenizer(text, add_special_tokens=False)["input_ids"])
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    torch.manual_seed(0)
    model.train()
    for _ in range(40):
        for prompt in examples:
            ids = torch.tensor([prompt + target])
            labels = torch.tensor([[-100] * len(prompt) + target])
            loss = model(input_ids=ids, labels=labels).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    trained = tmp_path / "judge"
    model.eval().save_pretrained(str(trained))
    tokenizer.save_pretrained(str(trained))

    judge = LLMJudge({"path": str(trained), "max_new_tokens": 12, "device": "cpu"})
    held_out = [_trajectory(7, "36"), _trajectory(8, "40")]
    results = judge.score_batch(held_out, [TASK, TASK])
    for result in results:
        assert not isinstance(result, Exception), result
        by_name = {s.name: s.value for s in result}
        assert by_name == {
            "llm_judge/parse_failure": 0.0,
            "llm_judge/top_score": 0.0,
            "llm_judge": pytest.approx(0.7),
        }


def test_judge_check_accepts_causal_lms_only(judge_dir: Path, rm_dir: Path, tmp_path: Path) -> None:
    assert LLMJudge.check(LLMJudge.Config(path=str(judge_dir))) == []
    assert LLMJudge.check(LLMJudge.Config(path="smollm2-135m-instruct")) == []  # bundled: prepared on use
    problems = LLMJudge.check(LLMJudge.Config(path=str(rm_dir)))
    assert any("not a causal language model" in p for p in problems)
    assert "is not a directory" in LLMJudge.check(LLMJudge.Config(path=str(tmp_path / "none")))[0]


# --------------------------------------------------------------------------------------------
# A short training run with both shapers
# --------------------------------------------------------------------------------------------


def test_two_training_steps_with_a_reward_model_and_a_judge(
    rm_dir: Path, judge_dir: Path, tmp_path: Path
) -> None:
    from trainer_helpers import toy_config, toy_registry, write_config, write_tiny_checkpoint

    from agent_r1.registry import reset_registry
    from agent_r1.run.training import train

    toy_registry()
    try:
        policy = write_tiny_checkpoint(tmp_path / "policy")
        config = toy_config(
            policy,
            tmp_path / "run",
            rewards=[
                {"name": "target_char", "weight": 1.0},
                {"name": "reward_model", "path": str(rm_dir), "render": "text", "clip": 0.05, "weight": 0.5},
                {
                    "name": "llm_judge",
                    "path": str(judge_dir),
                    "max_new_tokens": 4,
                    "on_parse_failure": "value",
                    "failure_value": 0.0,
                    "weight": 0.5,
                },
            ],
            trainer={"steps": 2, "tasks_per_step": 2, "checkpoint_every": 0},
            eval={"num_tasks": 2, "before_training": False},
        )
        train(write_config(tmp_path / "run.yaml", config), [])
    finally:
        reset_registry()
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == [1, 2]
    for line in lines:
        assert -0.05 <= line["reward/reward_model"] <= 0.05
        assert 0.0 <= line["reward/reward_model/clipped"] <= 1.0
        assert line["reward/llm_judge/parse_failure"] == 1.0  # the random judge never writes a score
        assert line["reward/llm_judge"] == 0.0
        assert line["reward/llm_judge/top_score"] == 0.0
        assert line["errors/failed_episodes"] == 0.0
    samples = [json.loads(x) for x in (tmp_path / "run" / "samples.jsonl").read_text().splitlines()]
    signals = {r["name"]: r for r in samples[0]["rewards"]}
    assert signals["reward_model"]["weight"] == 0.5 and signals["reward_model/clipped"]["weight"] == 0.0
    assert signals["llm_judge"]["source"] == "llm_judge"


def test_shapers_are_registered_and_documented() -> None:
    import agent_r1.builtins
    from agent_r1.registry import Registry

    registry = Registry(entry_points=False)  # only the bundled plugin
    registry.register_plugin(agent_r1.builtins, "builtins")
    for cls in (RewardModelShaper, LLMJudge):
        assert registry.get("reward_shapers", cls.name) is cls
        for field_name, field in cls.Config.model_fields.items():
            assert field.description, f"{cls.name}.{field_name} has no description"
