"""The reasoning-gym family against reasoning-gym 0.1.25: the ``reasoning_gym`` dataset's splits,
its errors, the ``reasoning_gym`` reward shaper against the package's own ``score_answer``,
scripted episodes and two GRPO steps on the tiny model through ``tool_env`` (one reply, answer in
``<answer>...</answer>``), and ``agent-r1 check`` refusing what cannot run before any model loads."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from hub_checks import (
    agent_r1_check,
    assert_listed_with_or_without,
    assert_token_fidelity,
    example_components,
    failures,
    metrics_lines,
    run_config,
    write_config,
)

from agent_r1 import Task
from agent_r1.errors import ConfigError

rg = pytest.importorskip("reasoning_gym", reason="needs the reasoning-gym extra of agent-r1-plugin-hubs")

ENVIRONMENT = {"name": "tool_env", "tools": [], "max_turns": 1}
"""One reply; the tags format reads the answer from <answer>...</answer>."""

SMALL_SUMS = {
    "min_terms": 2,
    "max_terms": 2,
    "min_digits": 1,
    "max_digits": 1,
    "operators": ["+"],
    "allow_negation": False,
    "allow_parentheses": False,
}
"""basic_arithmetic options with few distinct questions (a + b of one-digit numbers, in a few
wordings): the generator repeats itself within a hundred items."""


def build(kind: str, name: str, options: dict[str, Any]) -> Any:
    from agent_r1.registry import get_registry

    return get_registry().build(kind, name, options)


def load(options: dict[str, Any], split: str = "train") -> list[Task]:
    return build("datasets", "reasoning_gym", options).load(split)


def question(task: Task) -> str:
    return task.metadata["reasoning_gym"]["entry"]["question"]


# --------------------------------------------------------------------------------------------
# The dataset
# --------------------------------------------------------------------------------------------


def test_the_generators_repeat_questions_across_seeds_and_within_a_seed() -> None:
    """Why the dataset dedupes: with reasoning-gym alone, seeds one apart give the same items
    shifted by one, and a small generator repeats questions under one seed."""
    first = rg.create_dataset("basic_arithmetic", seed=10, size=50)
    second = rg.create_dataset("basic_arithmetic", seed=11, size=50)
    assert [first[i + 1]["question"] for i in range(49)] == [second[i]["question"] for i in range(49)]
    small = rg.create_dataset("basic_arithmetic", seed=0, size=100, **SMALL_SUMS)
    questions = [small[i]["question"] for i in range(100)]
    assert len(set(questions)) < len(questions)


@pytest.mark.parametrize("seed", [0, 1])
def test_splits_are_seeded_distinct_and_disjoint(seed: int) -> None:
    options = {
        "task": "basic_arithmetic",
        "config": SMALL_SUMS,
        "num_train": 60,
        "num_eval": 20,
        "seed": seed,
    }
    options["few_shot"] = 2
    train, evaluation = load(options, "train"), load(options, "eval")
    assert (len(train), len(evaluation)) == (60, 20)
    train_questions = [question(t) for t in train]
    eval_questions = [question(t) for t in evaluation]
    assert len(set(train_questions)) == 60 and len(set(eval_questions)) == 20
    assert not set(train_questions) & set(eval_questions)
    examples = {m["content"] for m in train[0].messages[:-1] if m["role"] == "user"}
    assert len(examples) == 2 and not examples & (set(train_questions) | set(eval_questions))
    # the same config gives the same tasks; another seed other ones
    assert [t.model_dump() for t in load(options, "train")] == [t.model_dump() for t in train]
    assert [t.id for t in load(options, "test")] == [t.id for t in evaluation]
    assert [t.id for t in load(options, "all")] == [t.id for t in evaluation + train]
    other = load({**options, "seed": seed + 2}, "train")
    assert [question(t) for t in other] != train_questions


def test_a_task_carries_the_item_and_what_scoring_needs() -> None:
    options = {"task": "leg_counting", "config": {"max_animals": 3}, "num_train": 3, "num_eval": 1}
    options |= {"system_prompt": "Count carefully.", "user_template": "Question: {question}"}
    [task, *_] = load(options)
    item = rg.create_dataset("leg_counting", max_animals=3, seed=0, size=1)[0]
    assert task.id == "leg_counting/train-0" and task.category == "leg_counting"
    assert task.answer == item["answer"]
    assert task.messages == [
        {"role": "system", "content": "Count carefully."},
        {"role": "user", "content": f"Question: {item['question']}"},
    ]
    assert task.metadata["reasoning_gym"] == {
        "dataset": "leg_counting",
        "config": {"max_animals": 3},
        "entry": item,
    }


def test_a_mix_of_generators_keeps_each_ones_options() -> None:
    options = {
        "task": [{"name": "chain_sum", "weight": 3}, {"name": "leg_counting", "config": {"max_animals": 3}}],
        "num_train": 40,
        "num_eval": 4,
    }
    train = load(options)
    categories = {t.category for t in train}
    assert categories == {"chain_sum", "leg_counting"}
    assert sum(t.category == "chain_sum" for t in train) > sum(t.category == "leg_counting" for t in train)
    for task in train:
        expected = {"max_animals": 3} if task.category == "leg_counting" else {}
        assert task.metadata["reasoning_gym"]["config"] == expected
        assert task.metadata["reasoning_gym"]["entry"]["metadata"]["source_dataset"] == task.category


@pytest.mark.parametrize(
    ("options", "path", "expected"),
    [
        (
            {"task": "basic_arithmetc"},
            "data.task",
            "no dataset 'basic_arithmetc'. Did you mean 'basic_arithmetic'?",
        ),
        ({"task": "no_such_puzzle"}, "data.task", "Its datasets: ab, acre, advanced_geometry"),
        ({"task": "composite"}, "data.task", "To mix datasets, list them under data.task"),
        (
            {"task": [{"name": "chain_sum"}, {"name": "leg_countin"}]},
            "data.task[1].name",
            "Did you mean 'leg_counting'?",
        ),
        (
            {"task": "basic_arithmetic", "config": {"max_term": 3, "colour": 1}},
            "data.config",
            "no options 'max_term' (did you mean 'max_terms'?), 'colour'. Its options: min_terms,",
        ),
        (
            {"task": "basic_arithmetic", "config": {"min_terms": 5, "max_terms": 2}},
            "data.config",
            "refused the options of 'basic_arithmetic': AssertionError: max_terms must be >= min_terms",
        ),
        (
            {"task": "basic_arithmetic", "config": SMALL_SUMS, "num_train": 500, "num_eval": 20},
            "data.num_train",
            "new distinct questions in 10100 draws",
        ),
    ],
)
def test_what_cannot_be_generated_is_a_config_error(
    options: dict[str, Any], path: str, expected: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        load(options)
    assert caught.value.path == path
    assert expected in str(caught.value)


def test_options_the_dataset_sets_itself_are_refused() -> None:
    with pytest.raises(ConfigError, match="set seed, which the dataset sets itself"):
        build("datasets", "reasoning_gym", {"task": "chain_sum", "config": {"seed": 3}})
    with pytest.raises(ConfigError, match="with a list of tasks give each entry its own config"):
        build("datasets", "reasoning_gym", {"task": [{"name": "chain_sum"}], "config": {"max_terms": 2}})


def test_a_generator_that_fails_names_the_item(monkeypatch: pytest.MonkeyPatch) -> None:
    """A generator raising while it makes items (monkeypatched: every bundled one works offline)."""
    from reasoning_gym.arithmetic.leg_counting import LegCountingDataset

    def broken(self: Any, index: int) -> Any:
        raise OSError("data file missing")

    monkeypatch.setattr(LegCountingDataset, "__getitem__", broken)
    with pytest.raises(ConfigError, match=r"failed to generate item 0 .*OSError: data file missing"):
        load({"task": "leg_counting", "num_train": 2, "num_eval": 0, "seed": 12345})


# --------------------------------------------------------------------------------------------
# Scoring: the package's own score_answer
# --------------------------------------------------------------------------------------------


def scripted(tasks: list[Task], replies: list[str], tokenizer: Any) -> list[Any]:
    """One episode per task through the real rollout engine and ``tool_env``, the policy saying
    ``replies[i]`` to ``tasks[i]``."""
    from agent_r1.testing.scripted import scripted_rollout

    by_question = {task.messages[-1]["content"]: reply for task, reply in zip(tasks, replies, strict=True)}

    def say(prompt: str) -> str:
        return next(reply for text, reply in by_question.items() if text in prompt)

    return scripted_rollout(
        lambda: build("environments", "tool_env", {k: v for k, v in ENVIRONMENT.items() if k != "name"}),
        say,
        tasks,
        tokenizer=tokenizer,
        max_turns=1,
    )


def shaper_signals(trajectory: Any, task: Task, **options: Any) -> dict[str, tuple[float, float]]:
    shaper = build("reward_shapers", "reasoning_gym", options)
    [signals] = shaper.score_batch([trajectory], [task])
    assert not isinstance(signals, Exception), signals
    assert all(s.kind == "outcome" and s.source == "reasoning_gym" for s in signals)
    return {s.name: (s.value, s.weight) for s in signals}


def package_score(task: Task, completion: str) -> float:
    """reasoning-gym's own scoring of a completion: its extract_answer, then the generator's
    score_answer (a generator built with the task's options)."""
    data = task.metadata["reasoning_gym"]
    generator = rg.create_dataset(data["dataset"], **data["config"])
    return generator.score_answer(rg.utils.extract_answer(completion), data["entry"])


def test_rewards_are_the_packages_own_scores(tokenizer: Any) -> None:
    mix = [{"name": "basic_arithmetic", "config": {"max_terms": 2}}, {"name": "word_sorting"}]
    tasks = load({"task": mix, "num_train": 6, "num_eval": 0, "seed": 3})
    replies = []
    for i, task in enumerate(tasks):
        answer = str(task.answer)
        replies.append(
            [
                f"<think>easy</think> <answer>{answer}</answer>",  # right
                "<answer>12345</answer>",  # wrong
                f"It is {answer}.",  # no answer tag: the package scores None
                f"<answer> {answer}, I think</answer>",  # partial credit where the generator gives it
            ][i % 4]
        )
    trajectories = scripted(tasks, replies, tokenizer)
    seen = set()
    for trajectory, task, reply in zip(trajectories, tasks, replies, strict=True):
        expected = package_score(task, reply)
        assert shaper_signals(trajectory, task) == {"reasoning_gym": (expected, 1.0)}
        seen.add(expected)
    assert {0.0, 1.0} <= seen


def test_without_partial_credit_only_full_marks_count(tokenizer: Any) -> None:
    """basic_arithmetic pays a reply that contains the answer inside a longer one part of a point
    ("-4" for 4: 0.5); partial_credit: false keeps the package's full marks only."""
    tasks = [t for t in load({"task": "basic_arithmetic", "config": {"max_terms": 2}, "num_train": 12})]
    task = next(t for t in tasks if str(t.answer).lstrip("-").isdigit() and not str(t.answer).startswith("-"))
    replies = [f"<answer>-{task.answer}</answer>", f"<answer>{task.answer}</answer>"]
    [partial], [full] = (scripted([task], [reply], tokenizer) for reply in replies)
    assert 0.0 < package_score(task, replies[0]) < 1.0 and package_score(task, replies[1]) == 1.0
    assert shaper_signals(partial, task) == {"reasoning_gym": (package_score(task, replies[0]), 1.0)}
    assert shaper_signals(partial, task, partial_credit=False) == {"reasoning_gym": (0.0, 1.0)}
    assert shaper_signals(full, task, partial_credit=False) == {"reasoning_gym": (1.0, 1.0)}


def test_hedged_answers_never_get_full_marks(tokenizer: Any) -> None:
    """A policy under optimisation hedges: several numbers in one answer, a wrong answer followed by
    the right one, the right one outside the tag. Only the first answer tag is read, and none of
    these gets full marks (without partial credit: nothing)."""
    tasks = load({"task": "basic_arithmetic", "config": {"max_terms": 2}, "num_train": 12})
    task = next(t for t in tasks if str(t.answer).lstrip("-").isdigit())
    right = str(task.answer)
    wrong = str(int(right) + 1)
    hedges = [
        f"<answer>{wrong}, {right}</answer>",
        f"<answer>{right} or {wrong}</answer>",
        f"<answer>{wrong}</answer><answer>{right}</answer>",
        f"{right} <answer>{wrong}</answer>",
    ]
    for reply in hedges:
        [trajectory] = scripted([task], [reply], tokenizer)
        value, _ = shaper_signals(trajectory, task)["reasoning_gym"]
        assert value < 1.0, reply
        assert shaper_signals(trajectory, task, partial_credit=False) == {"reasoning_gym": (0.0, 1.0)}, reply


def test_a_scorer_that_raises_is_a_counted_failed_episode(tokenizer: Any) -> None:
    """reasoning-gym's prime_factorization raises ValueError on an answer that is not a product
    of integers (a real faulty input, no mock): the engine's scoring records it on the trajectory,
    which training then sets aside and counts (errors/failed_episodes)."""
    from agent_r1.engine.collect import score

    tasks = load({"task": "prime_factorization", "num_train": 2, "num_eval": 0})
    entry = tasks[0].metadata["reasoning_gym"]["entry"]
    with pytest.raises(ValueError):  # the package itself
        rg.create_dataset("prime_factorization").score_answer("two times x", entry)
    trajectories = scripted(
        tasks, ["<answer>two times x</answer>", f"<answer>{tasks[1].answer}</answer>"], tokenizer
    )

    shaper = build("reward_shapers", "reasoning_gym", {})
    score(SimpleNamespace(shapers=[(shaper, 1.0)]), trajectories, {t.id: t for t in tasks})
    broken, fine = trajectories
    assert len(broken.errors) == 1 and "reward shaper 'reasoning_gym' raised" in broken.errors[0]
    assert "ValueError: invalid literal for int()" in broken.errors[0]
    assert broken.metrics["reward_errors"] == 1.0 and broken.rewards == []
    assert not fine.errors and [(s.name, s.value) for s in fine.rewards] == [("reasoning_gym", 1.0)]

    # on_error: zero scores it 0 and counts it in a signal of weight 0
    assert shaper_signals(broken, tasks[0], on_error="zero") == {
        "reasoning_gym": (0.0, 1.0),
        "reasoning_gym_error": (1.0, 0.0),
    }


def test_the_shaper_refuses_tasks_of_another_dataset(tokenizer: Any) -> None:
    task = Task(id="q1", messages=[{"role": "user", "content": "2+2?"}], answer="4")
    [trajectory] = scripted([task], ["<answer>4</answer>"], tokenizer)
    shaper = build("reward_shapers", "reasoning_gym", {})
    with pytest.raises(ConfigError, match=r"set data\.name: reasoning_gym"):
        shaper.score(trajectory, task)


# --------------------------------------------------------------------------------------------
# Training and preflight
# --------------------------------------------------------------------------------------------


def test_two_training_steps_on_the_tiny_model(
    tiny_model_dir: Path, recorder: Any, tmp_path: Path, tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two GRPO steps; the scorer of one task in two raises (monkeypatched, so that a random model
    meets it: it never writes an answer the package chokes on), which the run counts and goes on."""
    from reasoning_gym.arithmetic.basic_arithmetic import BasicArithmeticDataset

    from agent_r1.run.training import train

    data = {"name": "reasoning_gym", "task": "basic_arithmetic", "config": {"max_terms": 2}, "num_train": 8}
    data |= {"num_eval": 2, "few_shot": 1}
    tasks = {t.id: t for t in load({k: v for k, v in data.items() if k != "name"})}
    broken = {question(t) for i, t in enumerate(tasks.values()) if i % 2 == 0}
    package_score_answer = BasicArithmeticDataset.score_answer

    def score_answer(self: Any, answer: Any, entry: dict[str, Any]) -> float:
        if entry["question"] in broken:
            raise RuntimeError("reasoning-gym broke")
        return package_score_answer(self, answer, entry)

    monkeypatch.setattr(BasicArithmeticDataset, "score_answer", score_answer)
    run_dir = tmp_path / "run"
    config = run_config(
        tiny_model_dir,
        run_dir,
        data=data,
        environment=ENVIRONMENT,
        rewards=[{"name": "reasoning_gym"}],
        success_signal="reasoning_gym",
        max_new_tokens=16,
    )
    summary = train(write_config(tmp_path / "rg.yaml", config), [])

    assert summary["steps"] == 2
    lines = metrics_lines(run_dir)
    assert [line["step"] for line in lines] == [1, 2]
    assert all("reward/reasoning_gym" in line for line in lines)
    failed = sum(line["errors/failed_episodes"] for line in lines)
    assert failed > 0, "the seed no longer draws a task whose scorer raises; change `broken`"
    trajectories = recorder.trajectories
    assert len(trajectories) + failed == 2 * 2 * 2
    environment = build("environments", "tool_env", {k: v for k, v in ENVIRONMENT.items() if k != "name"})
    for trajectory in trajectories:
        task = tasks[trajectory.task_id]
        assert_token_fidelity(trajectory, tokenizer, task=task, environment=environment)
        completion = trajectory.steps[-1].action.text
        signals = [(s.name, s.value) for s in trajectory.rewards]
        assert signals == [("reasoning_gym", package_score(task, completion))]


def check_config(tmp_path: Path, tiny_model_dir: Path, **data: Any) -> Path:
    config = run_config(
        tiny_model_dir,
        tmp_path / "run",
        data={"name": "reasoning_gym", "num_train": 4, "num_eval": 1, **data},
        environment=ENVIRONMENT,
        rewards=[{"name": "reasoning_gym"}],
        success_signal="reasoning_gym",
    )
    return write_config(tmp_path / "check.yaml", config)


def test_check_passes_a_good_config(tmp_path: Path, tiny_model_dir: Path) -> None:
    code, report = agent_r1_check(check_config(tmp_path, tiny_model_dir, task="chain_sum"))
    assert code == 0, failures(report)
    [data] = [c["message"] for c in report if c["name"] == "data"]
    assert data == "reasoning_gym: 4 train tasks, 1 in split 'eval'"


def test_check_stops_on_an_unknown_task_or_a_missing_package(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    code, report = agent_r1_check(check_config(tmp_path, tiny_model_dir, task="chain_summ"))
    assert code == 2
    failed = failures(report)
    assert set(failed) == {"data", "component"}
    assert "data.task: reasoning-gym has no dataset 'chain_summ'. Did you mean 'chain_sum'?" in failed["data"]
    assert not (tmp_path / "run").exists()

    # sys.modules[name] = None makes `import reasoning_gym` raise ImportError in this process: the
    # check's view of a machine without the package (the check path only imports; it loads no model)
    monkeypatch.setitem(sys.modules, "reasoning_gym", None)
    code, report = agent_r1_check(check_config(tmp_path, tiny_model_dir, task="chain_sum"))
    assert code == 2
    failed = failures(report)
    assert set(failed) == {"data", "component"}
    install = "install it with: pip install 'agent-r1-plugin-hubs[reasoning-gym]'"
    assert install in failed["data"] and "(tested with reasoning-gym==0.1.25)" in failed["data"]
    assert "data (reasoning_gym) needs the reasoning-gym package" in failed["data"]
    assert "reward shaper (reasoning_gym) needs the reasoning-gym package" in failed["component"]
    assert not (tmp_path / "run").exists()


def test_the_example_config_is_valid_and_its_data_loads() -> None:
    """examples/reasoning_gym_smollm2.yaml (docs/hubs.md): valid, 150 + 64 tasks, answer format
    shown by the few-shot turns, the success signal the shaper emits."""
    config, components = example_components("reasoning_gym_smollm2.yaml")
    data = components["data"]
    train, evaluation = data.cls(data.config).load("train"), data.cls(data.config).load("eval")
    assert (len(train), len(evaluation)) == (150, 64)
    assert train[0].messages[1]["content"].startswith("<answer>")
    assert config.eval.success_signal == "reasoning_gym" == components["rewards[0]"].config.signal_name
    assert config.rollout.max_turns == components["environment"].config.max_turns == 1


def test_plugins_list_shows_the_components_with_their_origin(monkeypatch: pytest.MonkeyPatch) -> None:
    """Listed under the plugin hubs and its distribution, also where reasoning_gym is missing."""
    assert_listed_with_or_without(
        "reasoning_gym", {"datasets": "reasoning_gym", "reward_shapers": "reasoning_gym"}, monkeypatch
    )
