"""The calculator task: safe evaluator and tool, arithmetic dataset, calculator environment
(agent_r1.builtins.calculator)."""

from __future__ import annotations

import asyncio
import re
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from agent_r1.builtins.calculator import (
    CATEGORIES,
    FEW_SHOT_BY_CATEGORY,
    ArithmeticDataset,
    CalculatorEnv,
    CalculatorError,
    CalculatorTool,
    Limits,
    evaluate,
    format_number,
)
from agent_r1.builtins.formats import TagsFormat
from agent_r1.errors import ConfigError
from agent_r1.mdp import Action
from agent_r1.registry import Registry


def calc(expression: str, **limits: object) -> str:
    tool = CalculatorTool(limits)
    return tool.run(tool.Arguments(expression=expression))


# --------------------------------------------------------------------------------------------
# Evaluator and tool
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("347*29", "10063"),
        ("2 + 3 * (4 - 1)", "11"),
        ("12/4", "3"),  # exact division stays an integer
        ("10/4", "2.5"),
        ("1/3", "0.333333"),
        ("2/3", "0.666667"),
        ("-7 // 2", "-4"),
        ("-7 % 3", "2"),
        ("2**10", "1024"),
        ("2**-2", "0.25"),
        ("-(3 - 5)", "2"),
        ("+4", "4"),
        ("0.1 + 0.2", "0.3"),  # decimals are exact, not binary floats
        ("2.5 * 4", "10"),
        ("1e-9 * 3", "3e-9"),
        ("2**0.5", "1.414214"),
        ("12 × 7", "84"),
        ("84 ÷ 12", "7"),
        ("3^2", "9"),
        ("6*7 =", "42"),
        ("99999999999999999999 * 99999999999999999999", str(99999999999999999999**2)),
    ],
)
def test_calculator_results(expression: str, expected: str) -> None:
    assert calc(expression) == expected


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("1/0", "division by zero"),
        ("5 % 0", "division by zero"),
        ("0**-1", "division by zero (0 to a negative power)"),
        ("x + 1", "names are not allowed ('x'); use only numbers, + - * / // % ** and parentheses"),
        ("abs(-1)", "function calls are not allowed"),
        ("__import__('os').system('ls')", "function calls are not allowed"),
        ("(1).real", "Attribute is not allowed"),
        ("1 < 2", "comparisons are not allowed"),
        ("1 << 4", "operator LShift is not allowed"),
        ("~1", "operator Invert is not allowed"),
        ("'a' * 3", "'a' is not a number"),
        ("True + 1", "True is not a number"),
        ("1,000 + 2", "commas are not allowed: write numbers without separators (1000, not 1,000)"),
        ("(1 + 2", "cannot parse '(1 + 2' ('(' was never closed)"),
        ("", "empty expression"),
        ("  = ", "empty expression"),
        ("2**101", "exponent 101 is too large (at most 100)"),
        ("9**9**9", "exponent 387420489 is too large (at most 100)"),
        ("(10**90)**12", "result too large (more than 1000 digits)"),
        ("(-8)**0.5", "a negative number to a fractional power is not a real number"),
        ("1e999", "number too large"),
    ],
)
def test_calculator_errors_say_what_is_wrong(expression: str, message: str) -> None:
    with pytest.raises(CalculatorError) as info:
        calc(expression)
    assert message in str(info.value)


def test_calculator_limits_are_configurable() -> None:
    with pytest.raises(CalculatorError, match=r"expression too long \(11 characters, at most 10\)"):
        calc("1+1+1+1+1+1", max_expression_chars=10)
    assert calc("1+1+1+1+1", max_expression_chars=10) == "5"
    with pytest.raises(CalculatorError, match="at most 3"):
        calc("2**4", max_exponent=3)
    with pytest.raises(CalculatorError, match="more than 5 digits"):
        calc("999*999", max_result_digits=5)
    assert calc("1/3", decimals=2) == "0.33"
    with pytest.raises(ValidationError):
        Limits(max_exponent=0)


def test_large_intermediate_values_are_refused_before_they_are_computed() -> None:
    with pytest.raises(CalculatorError, match="result too large"):
        evaluate("(7**100)**100")  # would have 8451 digits


def test_format_number() -> None:
    assert format_number(Fraction(943)) == "943"
    assert format_number(Fraction(-5, 2)) == "-2.5"
    assert format_number(Fraction(1, 8), decimals=2) == "0.12"  # half to even
    assert format_number(Fraction(1, 3 * 10**8)) == "3.33333e-9"


def test_calculator_tool_schema() -> None:
    schema = CalculatorTool.schema()
    assert schema["function"]["name"] == "calculator"
    assert schema["function"]["parameters"]["required"] == ["expression"]
    assert schema["function"]["parameters"]["properties"]["expression"]["type"] == "string"


integers = st.integers(min_value=-(10**4), max_value=10**4)
"""Leaves small enough that no tree below reaches the 1000-digit limit (at most ~330 digits)."""

PYTHON_OPERATORS = {
    "+": lambda a, b: a + b,
    "-": lambda a, b: a - b,
    "*": lambda a, b: a * b,
    "//": lambda a, b: Fraction(a // b),
    "%": lambda a, b: a % b,
    "/": lambda a, b: a / b,  # on Fractions: exact division
}


@st.composite
def expression_trees(draw: st.DrawFn, depth: int = 4) -> tuple[str, Fraction | None]:
    """A random integer expression and its value by Python's own arithmetic (exact: Fractions,
    which behave like Python ints for + - * // % **); ``None`` where Python divides by zero."""
    if depth == 0 or draw(st.integers(0, 3)) == 0:
        value = draw(integers)
        return (f"({value})" if value < 0 else str(value)), Fraction(value)
    op = draw(st.sampled_from(["+", "-", "*", "//", "%", "**", "/"]))
    left_text, left = draw(expression_trees(depth=depth - 1))
    if op == "**":
        exponent = draw(st.integers(0, 3))
        return f"({left_text})**{exponent}", None if left is None else left**exponent
    right_text, right = draw(expression_trees(depth=depth - 1))
    if draw(st.booleans()):
        left_text, left = f"-({left_text})", None if left is None else -left
    text = f"({left_text}){op}({right_text})"
    if left is None or right is None or (op in {"//", "%", "/"} and right == 0):
        return text, None
    return text, PYTHON_OPERATORS[op](left, right)


@settings(max_examples=300, deadline=None)
@given(expression_trees())
def test_calculator_agrees_with_python_on_integer_expressions(tree: tuple[str, Fraction | None]) -> None:
    expression, expected = tree
    if expected is None:
        with pytest.raises(CalculatorError, match="division by zero"):
            evaluate(expression)
        return
    assert evaluate(expression) == expected
    if "/" not in expression.replace("//", ""):
        assert calc(expression) == str(eval(expression))  # pure int arithmetic in Python itself
    else:
        assert Fraction(calc(expression)) == pytest.approx(expected, rel=1e-6, abs=1e-6)


# --------------------------------------------------------------------------------------------
# Dataset
# --------------------------------------------------------------------------------------------


def test_dataset_is_deterministic_and_seeded() -> None:
    first = ArithmeticDataset({"seed": 3, "num_train": 40, "num_eval": 10})
    second = ArithmeticDataset({"seed": 3, "num_train": 40, "num_eval": 10})
    assert first.load("train") == second.load("train")
    assert first.load("eval") == second.load("eval")
    other = ArithmeticDataset({"seed": 4, "num_train": 40, "num_eval": 10})
    assert [t.messages for t in other.load("train")] != [t.messages for t in first.load("train")]
    # the eval split does not depend on the train size (so runs with other sizes compare)
    bigger = ArithmeticDataset({"seed": 3, "num_train": 400, "num_eval": 10})
    assert bigger.load("eval") == first.load("eval")
    assert bigger.load("train")[:40] == first.load("train")


def test_train_and_eval_never_share_a_question() -> None:
    dataset = ArithmeticDataset({"num_train": 3000, "num_eval": 500})
    train = [t.messages[0]["content"] for t in dataset.load("train")]
    evaluation = [t.messages[0]["content"] for t in dataset.load("eval")]
    assert len(train) == 3000 and len(evaluation) == 500
    assert len(set(train)) == len(train) and len(set(evaluation)) == len(evaluation)
    assert not set(train) & set(evaluation)
    assert {t.id for t in dataset.load("train")}.isdisjoint(t.id for t in dataset.load("eval"))


def test_tasks_are_well_formed_and_the_calculator_solves_them() -> None:
    tasks = ArithmeticDataset({"num_train": 200, "num_eval": 0}).load("train")
    assert [t.category for t in tasks[:5]] == list(CATEGORIES)
    tool = CalculatorTool()
    for task in tasks:
        assert task.messages == [{"role": "user", "content": task.messages[0]["content"]}]
        assert isinstance(task.answer, int) and task.answer > 0
        assert tool.run(tool.Arguments(expression=task.metadata["expression"])) == str(task.answer)
        numbers = re.findall(r"\d+", task.messages[0]["content"])
        assert sorted(numbers) == sorted(re.findall(r"\d+", task.metadata["expression"])), task
        assert task.messages[0]["content"].endswith("?")


def test_questions_are_varied() -> None:
    tasks = ArithmeticDataset({"num_train": 500, "num_eval": 0, "categories": ["multiply"]}).load("train")
    items = {
        re.search(r"(\d+) ([a-z ]+?)(?: in each)?\.", t.messages[0]["content"]) is not None for t in tasks
    }
    assert items == {True}
    openings = {" ".join(t.messages[0]["content"].split()[:2]) for t in tasks}
    assert len(openings) >= 15
    assert all(t.category == "multiply" for t in tasks)
    per, count = map(int, tasks[0].metadata["expression"].split("*"))
    assert 100 <= per <= 999 and 11 <= count <= 99


def test_train_categories_weight_the_train_split_and_leave_eval_alone() -> None:
    plain = ArithmeticDataset({"num_train": 90, "num_eval": 30})
    weighted = ArithmeticDataset(
        {"num_train": 90, "num_eval": 30, "train_categories": ["add", "divide", "two_step", "divide"]}
    )
    assert [t.messages for t in weighted.load("eval")] == [t.messages for t in plain.load("eval")]
    kinds = [t.category for t in weighted.load("train")]
    assert kinds[:4] == ["add", "divide", "two_step", "divide"]
    assert kinds.count("divide") == 45 and kinds.count("two_step") == 22 and kinds.count("add") == 23
    assert {"multiply", "subtract"}.isdisjoint(kinds)
    evaluation = {t.messages[0]["content"] for t in weighted.load("eval")}
    assert evaluation.isdisjoint(t.messages[0]["content"] for t in weighted.load("train"))
    with pytest.raises(ValidationError, match="train_categories"):
        ArithmeticDataset({"train_categories": ["modulo"]})
    with pytest.raises(ValidationError, match="train_categories"):
        ArithmeticDataset({"train_categories": []})


def test_dataset_config_and_split_errors() -> None:
    with pytest.raises(ValueError, match="no split 'test'; splits are train, eval"):
        ArithmeticDataset().load("test")
    with pytest.raises(ValidationError, match="categories"):
        ArithmeticDataset({"categories": ["modulo"]})
    with pytest.raises(ValidationError, match="more than once"):
        ArithmeticDataset({"categories": ["add", "add"]})
    with pytest.raises(ValidationError):
        ArithmeticDataset({"categories": []})
    assert ArithmeticDataset({"num_eval": 0}).load("eval") == []


def test_loaded_tasks_are_copies() -> None:
    dataset = ArithmeticDataset({"num_train": 2, "num_eval": 1})
    dataset.load("train")[0].messages[0]["content"] = "changed"
    assert dataset.load("train")[0].messages[0]["content"] != "changed"


# --------------------------------------------------------------------------------------------
# Environment
# --------------------------------------------------------------------------------------------


def test_calculator_components_are_registered(builtin_registry: Registry) -> None:
    assert builtin_registry.get("tools", "calculator") is CalculatorTool
    assert builtin_registry.get("environments", "calculator") is CalculatorEnv
    assert builtin_registry.get("datasets", "arithmetic") is ArithmeticDataset


def test_calculator_env_prompt_has_the_format_and_worked_examples_as_turns(
    builtin_registry: Registry,
) -> None:
    env = builtin_registry.build("environments", "calculator", {})
    assert isinstance(env.format, TagsFormat)
    assert env.stop_sequences == ["</calc>"]
    task = ArithmeticDataset({"num_train": 1, "num_eval": 0}).load("train")[0]
    start = asyncio.run(env.reset(task))
    assert start.tools == []
    system, *examples, user = start.messages
    assert user == task.messages[0]
    assert system["content"] == (
        "Solve the math problem. Use the calculator for every calculation.\n\n"
        "To use a tool, write its tag and stop; the result comes back as <result>...</result>.\n"
        "Tools:\n"
        "- <calc>expression</calc>: "
        "Evaluate an arithmetic expression with + - * / ( ) and return the number.\n"
        "Give the final answer as <answer>answer</answer>."
    )
    assert examples == [
        {"role": "user", "content": "A crate holds 23 jars. How many jars are in 41 crates?"},
        {"role": "assistant", "content": "<calc>23*41</calc>"},
        {"role": "user", "content": "<result>943</result>"},
        {"role": "assistant", "content": "<answer>943</answer>"},
        {"role": "user", "content": "A shop had 512 apples and sold 178. How many apples are left?"},
        {"role": "assistant", "content": "<calc>512-178</calc>"},
        {"role": "user", "content": "<result>334</result>"},
        {"role": "assistant", "content": "<answer>334</answer>"},
    ]


def test_calculator_env_options(builtin_registry: Registry) -> None:
    task = ArithmeticDataset().load("eval")[0]
    plain = builtin_registry.build("environments", "calculator", {"few_shot": 0})
    assert len(asyncio.run(plain.reset(task)).messages) == 2
    three = builtin_registry.build("environments", "calculator", {"few_shot": 3})
    assert len(asyncio.run(three.reset(task)).messages) == 2 + 3 * 4
    search_style = builtin_registry.build(
        "environments",
        "calculator",
        {"format": {"name": "tags", "tool_tags": {"calculator": "calc"}, "result_tag": "information"}},
    )
    shown = asyncio.run(search_style.reset(task)).messages
    assert {"role": "user", "content": "<information>943</information>"} in shown
    hermes = builtin_registry.build("environments", "calculator", {"format": "hermes"})
    start = asyncio.run(hermes.reset(task))
    assert any('"arguments": {"expression": "23*41"}' in str(m["content"]) for m in start.messages)
    assert start.tools == [CalculatorTool.schema()]
    with pytest.raises(ConfigError, match="unknown key 'few_shots'"):
        builtin_registry.build("environments", "calculator", {"few_shots": 1})
    chosen = builtin_registry.build("environments", "calculator", {"few_shot": ["divide", "two_step"]})
    shown = asyncio.run(chosen.reset(task)).messages
    calls = [m["content"] for m in shown if m["role"] == "assistant" and "<calc>" in str(m["content"])]
    results = [m["content"] for m in shown if m["role"] == "user" and "<result>" in str(m["content"])]
    assert calls == ["<calc>3262/14</calc>", "<calc>12*36+215</calc>"]
    assert results == ["<result>233</result>", "<result>647</result>"]  # computed by the real tool
    with pytest.raises(ConfigError, match="few_shot=6: give 0 to 5 examples"):
        builtin_registry.build("environments", "calculator", {"few_shot": 6})
    with pytest.raises(ConfigError, match="few_shot"):
        builtin_registry.build("environments", "calculator", {"few_shot": ["modulo"]})


def test_calculator_env_shows_worked_examples_of_your_own(builtin_registry: Registry) -> None:
    task = ArithmeticDataset().load("eval")[0]
    shared = {"question": "3024 pens are shared equally among 14 boxes. How many go in each box?"}
    env = builtin_registry.build(
        "environments",
        "calculator",
        {"few_shot": ["divide", {**shared, "expression": "3024 / 14"}, "two_step"]},
    )
    shown = asyncio.run(env.reset(task)).messages
    assert [m["content"] for m in shown if m["role"] == "user"] == [
        FEW_SHOT_BY_CATEGORY["divide"][0],
        "<result>233</result>",
        shared["question"],
        "<result>216</result>",  # computed by the real tool
        FEW_SHOT_BY_CATEGORY["two_step"][0],
        "<result>647</result>",
        task.messages[0]["content"],
    ]
    assert "<calc>3024 / 14</calc>" in [m["content"] for m in shown if m["role"] == "assistant"]
    # A broken example is refused when the config is read, before any model loads.
    with pytest.raises(ConfigError, match=r"few_shot.*calculator refuses '3024/'"):
        builtin_registry.build(
            "environments", "calculator", {"few_shot": [{**shared, "expression": "3024/"}]}
        )
    with pytest.raises(ConfigError, match="same example more than once"):
        builtin_registry.build(
            "environments",
            "calculator",
            {"few_shot": [{**shared, "expression": "3024/14"}, {**shared, "expression": "3024/14"}]},
        )
    with pytest.raises(ConfigError, match="expression"):  # both fields are required
        builtin_registry.build("environments", "calculator", {"few_shot": [shared]})
    with pytest.raises(ConfigError, match="give a count or a list"):
        builtin_registry.build("environments", "calculator", {"few_shot": "all"})


def test_every_few_shot_example_is_right_and_no_generated_task_repeats_it() -> None:
    for kind, (_question, expression) in FEW_SHOT_BY_CATEGORY.items():
        assert kind in CATEGORIES
        value = evaluate(expression, Limits())
        assert value == int(value) and value > 0, (kind, expression, value)
    dataset = ArithmeticDataset()
    questions = {t.messages[0]["content"] for split in ("train", "eval") for t in dataset.load(split)}
    assert not questions & {question for question, _ in FEW_SHOT_BY_CATEGORY.values()}


def test_a_scripted_agent_solves_every_eval_task(builtin_registry: Registry) -> None:
    """calc -> result -> answer, through the real environment, for each task of the eval split."""
    tasks = ArithmeticDataset({"num_eval": 50}).load("eval")

    async def solve(task_index: int) -> tuple[str | None, str | None]:
        task = tasks[task_index]
        env = builtin_registry.build("environments", "calculator", {})
        await env.reset(task)
        first = await env.step(
            Action(text=f"<calc>{task.metadata['expression']}</calc>", finish_reason="stop"), 0
        )
        assert not first.done
        (message,) = first.messages
        value = re.fullmatch(r"<result>(.*)</result>", message["content"]).group(1)
        action = Action(text=f"The answer is <answer>{value}</answer>")
        last = await env.step(action, 1)
        assert last.done and last.termination == "answer"
        return last.answer, str(task.answer)

    async def solve_all() -> list[tuple[str | None, str | None]]:
        return await asyncio.gather(*(solve(i) for i in range(len(tasks))))

    for answer, expected in asyncio.run(solve_all()):
        assert answer == expected


def test_calculator_components_pass_the_plugin_contract_checks(builtin_registry: Registry) -> None:
    from agent_r1.testing import check_dataset, check_environment, check_tool

    check_tool(CalculatorTool, calls=[{"expression": "17*23"}, {"expression": "1/3"}])
    tasks = check_dataset(
        ArithmeticDataset, config={"num_train": 20, "num_eval": 5}, splits=["train", "eval"]
    )
    assert [len(tasks["train"]), len(tasks["eval"])] == [20, 5]
    observations = check_environment(CalculatorEnv, actions=["<calc>17*23</calc>", "<answer>391</answer>"])
    assert observations[0].messages == [{"role": "user", "content": "<result>391</result>"}]
    assert observations[1].termination == "answer"
