"""The bundled calculator task: a safe arithmetic tool, a word-problem dataset and the environment
that ties them together (the task of ``agent-r1 demo``).

* :class:`CalculatorTool` (tool ``calculator``): evaluates ``+ - * / // % **`` over numbers and
  parentheses with :mod:`ast` and exact rational arithmetic; no names, no calls, bounded sizes.
* :class:`ArithmeticDataset` (dataset ``arithmetic``): deterministic word problems ("A box holds
  347 pencils. How many pencils are in 29 boxes?") that a small model cannot do in its head but can
  solve with one or two calculator calls.
* :class:`CalculatorEnv` (environment ``calculator``): a :class:`~agent_r1.builtins.tool_env.ToolEnv`
  preset with the ``tags`` format, where the calculator's tag is ``calc`` (set through the format's
  ``tool_tags`` alias option): ``<calc>347*29</calc>`` → ``<result>10063</result>`` →
  ``<answer>10063</answer>``.
"""

from __future__ import annotations

import ast
import decimal
import math
import random
from collections.abc import Callable, Mapping
from fractions import Fraction
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, field_validator, model_validator

from agent_r1.builtins.tool_env import ToolEnv, ToolError
from agent_r1.contracts import ComponentConfig, ComponentSpec, Dataset, Tool
from agent_r1.mdp import Message, Task, ToolCall, ToolResult

# --------------------------------------------------------------------------------------------
# Safe evaluation
# --------------------------------------------------------------------------------------------

ALLOWED = "numbers, + - * / // % ** and parentheses"
_SYMBOLS = {"×": "*", "·": "*", "÷": "/", "−": "-", "^": "**"}
_BINARY: dict[type[ast.operator], str] = {
    ast.Add: "+",
    ast.Sub: "-",
    ast.Mult: "*",
    ast.Div: "/",
    ast.FloorDiv: "//",
    ast.Mod: "%",
    ast.Pow: "**",
}


class CalculatorError(ToolError):
    """The expression cannot be evaluated; the message says why, for the agent to read."""


class Limits(ComponentConfig):
    """Bounds that keep one evaluation cheap (the calculator tool's config)."""

    max_expression_chars: int = Field(200, ge=1, description="longer expressions are refused")
    max_exponent: int = Field(100, ge=1, description="largest |exponent| of **")
    max_result_digits: int = Field(
        1000, ge=1, description="largest number of digits of any intermediate value"
    )
    decimals: int = Field(6, ge=0, le=30, description="decimal places shown for a non-integer result")


def normalize_expression(expression: str) -> str:
    """Accept common notations: ``×``/``·`` for ``*``, ``÷`` for ``/``, ``^`` for ``**``, a
    trailing ``=``."""
    for symbol, replacement in _SYMBOLS.items():
        expression = expression.replace(symbol, replacement)
    return expression.strip().removesuffix("=").strip()


def evaluate(expression: str, limits: Limits | None = None) -> Fraction:
    """Evaluate an arithmetic expression exactly. Raises :class:`CalculatorError` with a message
    an agent can act on."""
    limits = limits or Limits()
    expression = normalize_expression(expression)
    if not expression:
        raise CalculatorError(f"empty expression; write one with {ALLOWED}, e.g. 12*(3+4)")
    if len(expression) > limits.max_expression_chars:
        raise CalculatorError(
            f"expression too long ({len(expression)} characters, at most {limits.max_expression_chars})"
        )
    try:
        tree = ast.parse(expression, mode="eval")
    except SyntaxError as exc:
        raise CalculatorError(f"cannot parse {expression!r} ({exc.msg}); use only {ALLOWED}") from None
    return _Evaluator(limits).visit(tree.body)


class _Evaluator:
    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.max_bits = math.ceil(limits.max_result_digits * math.log2(10))

    def visit(self, node: ast.AST) -> Fraction:
        if isinstance(node, ast.Constant):
            return self._number(node.value)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            value = self.visit(node.operand)
            return -value if isinstance(node.op, ast.USub) else value
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            left, right = self.visit(node.left), self.visit(node.right)
            return self._check(self._binary(type(node.op), left, right))
        raise CalculatorError(self._refusal(node))

    def _number(self, value: Any) -> Fraction:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise CalculatorError(f"{value!r} is not a number; use only {ALLOWED}")
        if isinstance(value, float) and not math.isfinite(value):
            raise CalculatorError("number too large")
        # str() keeps the decimal the agent wrote: 0.1 is 1/10, not the nearest binary float
        return self._check(Fraction(str(value)) if isinstance(value, float) else Fraction(value))

    def _binary(self, op: type[ast.operator], left: Fraction, right: Fraction) -> Fraction:
        if op is ast.Add:
            return left + right
        if op is ast.Sub:
            return left - right
        if op is ast.Mult:
            return left * right
        if op is ast.Pow:
            return self._power(left, right)
        if right == 0:
            raise CalculatorError("division by zero")
        if op is ast.Div:
            return left / right
        if op is ast.FloorDiv:
            return Fraction(left // right)
        return left % right

    def _power(self, base: Fraction, exponent: Fraction) -> Fraction:
        if abs(exponent) > self.limits.max_exponent:
            raise CalculatorError(
                f"exponent {_show(exponent, 6)} is too large (at most {self.limits.max_exponent})"
            )
        if exponent.denominator == 1:
            if base == 0 and exponent < 0:
                raise CalculatorError("division by zero (0 to a negative power)")
            size = max(base.numerator.bit_length(), base.denominator.bit_length()) * abs(int(exponent))
            if size > self.max_bits:
                raise CalculatorError(f"result too large (more than {self.limits.max_result_digits} digits)")
            return base ** int(exponent)
        if base < 0:
            raise CalculatorError("a negative number to a fractional power is not a real number")
        try:
            return Fraction(float(base) ** float(exponent))
        except (OverflowError, ValueError):
            raise CalculatorError("result too large") from None

    def _check(self, value: Fraction) -> Fraction:
        if max(value.numerator.bit_length(), value.denominator.bit_length()) > self.max_bits:
            raise CalculatorError(f"result too large (more than {self.limits.max_result_digits} digits)")
        return value

    @staticmethod
    def _refusal(node: ast.AST) -> str:
        if isinstance(node, ast.Name):
            return f"names are not allowed ({node.id!r}); use only {ALLOWED}"
        if isinstance(node, ast.Call):
            return f"function calls are not allowed; use only {ALLOWED}"
        if isinstance(node, ast.BinOp):
            return f"operator {type(node.op).__name__} is not allowed; use only {ALLOWED}"
        if isinstance(node, ast.UnaryOp):
            return f"operator {type(node.op).__name__} is not allowed; use only {ALLOWED}"
        if isinstance(node, ast.Tuple):
            return "commas are not allowed: write numbers without separators (1000, not 1,000)"
        if isinstance(node, ast.Compare):
            return f"comparisons are not allowed; use only {ALLOWED}"
        return f"{type(node).__name__} is not allowed; use only {ALLOWED}"


def _show(value: Fraction, decimals: int) -> str:
    """An integer as such; otherwise a decimal rounded to ``decimals`` places (trailing zeros
    dropped), or 6 significant digits when that rounding would hide a non-zero value."""
    if value.denominator == 1:
        return str(value.numerator)
    context = decimal.Context(
        prec=max(60, len(str(abs(value.numerator) // value.denominator)) + decimals + 5)
    )
    exact = context.divide(decimal.Decimal(value.numerator), decimal.Decimal(value.denominator))
    rounded = exact.quantize(
        decimal.Decimal(1).scaleb(-decimals), rounding=decimal.ROUND_HALF_EVEN, context=context
    )
    if rounded == 0:
        return f"{exact:.6g}"
    text = f"{rounded:f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def format_number(value: Fraction, decimals: int = 6) -> str:
    """How the calculator shows a result: ``943``, ``0.333333``, ``-2.5``."""
    return _show(value, decimals)


class CalculatorTool(Tool):
    """Safe arithmetic: numbers, ``+ - * / // % **`` and parentheses. Integer results stay
    integers (``12/4`` gives ``3``); other results are decimals rounded to ``decimals`` places."""

    name = "calculator"
    description = "Evaluate an arithmetic expression with + - * / ( ) and return the number."

    class Arguments(BaseModel):
        model_config = ConfigDict(extra="forbid")

        expression: str = Field(description="an arithmetic expression, e.g. 347*29")

    class Config(Limits):
        """The evaluation limits (see :class:`Limits`)."""

    config: Config

    def run(self, arguments: Arguments) -> str:
        return format_number(evaluate(arguments.expression, self.config), self.config.decimals)


# --------------------------------------------------------------------------------------------
# Dataset
# --------------------------------------------------------------------------------------------

Category = Literal["multiply", "add", "subtract", "divide", "two_step"]
CATEGORIES: tuple[Category, ...] = ("multiply", "add", "subtract", "divide", "two_step")

# (container, containers, item): "A {container} holds 347 {item}. How many {item} are in 29 {containers}?"
_PACKS = [
    ("box", "boxes", "pencils"),
    ("crate", "crates", "apples"),
    ("bag", "bags", "marbles"),
    ("shelf", "shelves", "books"),
    ("jar", "jars", "cookies"),
    ("carton", "cartons", "eggs"),
    ("truck", "trucks", "bricks"),
    ("bus", "buses", "passengers"),
    ("tray", "trays", "cupcakes"),
    ("pack", "packs", "stickers"),
    ("basket", "baskets", "oranges"),
    ("barrel", "barrels", "liters of oil"),
    ("drawer", "drawers", "socks"),
    ("roll", "rolls", "stamps"),
    ("album", "albums", "photos"),
    ("sack", "sacks", "potatoes"),
    ("bottle", "bottles", "pills"),
    ("classroom", "classrooms", "students"),
    ("row", "rows", "seats"),
    ("page", "pages", "words"),
]
_SHOP_PACKS = [
    pack
    for pack in _PACKS
    if pack[2]
    in {
        "pencils",
        "apples",
        "marbles",
        "cookies",
        "eggs",
        "stickers",
        "cupcakes",
        "oranges",
        "potatoes",
        "stamps",
    }
]
# (who, item, verb in past tense): "A farm picked 1234 apples on Monday, ..."
_COUNTERS = [
    ("A farm", "apples", "picked"),
    ("A library", "books", "lent out"),
    ("A bakery", "loaves", "baked"),
    ("A factory", "chairs", "built"),
    ("A school", "meals", "served"),
    ("A shop", "shirts", "sold"),
    ("A museum", "visitors", "welcomed"),
    ("A post office", "letters", "sorted"),
    ("A stadium", "tickets", "sold"),
    ("A printer", "pages", "printed"),
    ("A ferry", "cars", "carried"),
    ("A website", "orders", "received"),
]
_PERIODS = [
    ["on Monday", "on Tuesday", "on Wednesday", "on Thursday"],
    ["in January", "in February", "in March", "in April"],
    ["in the first week", "in the second week", "in the third week", "in the fourth week"],
    ["in the morning", "at noon", "in the afternoon", "in the evening"],
]
# (place, item, verb of removal): "A warehouse had 5203 boxes. It shipped 1877 of them."
_STOCKS = [
    ("A warehouse", "boxes", "shipped"),
    ("A library", "books", "lent out"),
    ("A farmer", "eggs", "sold"),
    ("A school", "pencils", "handed out"),
    ("A bank", "coins", "paid out"),
    ("A store", "cans", "sold"),
    ("A tank", "liters of water", "drained"),
    ("A zoo", "tickets", "sold"),
    ("A garden center", "seeds", "planted"),
    ("A theater", "seats", "booked"),
]


def _multiply(rng: random.Random) -> tuple[str, str, int]:
    per, count = rng.randint(100, 999), rng.randint(11, 99)
    container, containers, item = rng.choice(_PACKS)
    question = rng.choice(
        [
            f"A {container} holds {per} {item}. How many {item} are in {count} {containers}?",
            f"There are {count} {containers} with {per} {item} in each. How many {item} are there in all?",
            f"Each {container} has {per} {item}. How many {item} do {count} {containers} have?",
        ]
    )
    return question, f"{per}*{count}", per * count


def _add(rng: random.Random) -> tuple[str, str, int]:
    size = rng.randint(3, 4)
    numbers = [rng.randint(100, 9999) for _ in range(size)]
    who, item, verb = rng.choice(_COUNTERS)
    periods = rng.choice(_PERIODS)[:size]
    listed = ", ".join(f"{n} {item} {p}" for n, p in zip(numbers[:-1], periods[:-1], strict=True)) + (
        f" and {numbers[-1]} {periods[-1]}"
    )
    question = rng.choice(
        [
            f"{who} {verb} {listed}. How many {item} in total?",
            f"{who} {verb} {listed}. What is the total number of {item}?",
        ]
    )
    return question, "+".join(map(str, numbers)), sum(numbers)


def _subtract(rng: random.Random) -> tuple[str, str, int]:
    start = rng.randint(1000, 9999)
    taken = rng.randint(100, start - 100)
    who, item, verb = rng.choice(_STOCKS)
    question = rng.choice(
        [
            f"{who} had {start} {item}. It {verb} {taken} of them. How many {item} are left?",
            f"{who} started with {start} {item} and {verb} {taken}. How many {item} remain?",
        ]
    )
    return question, f"{start}-{taken}", start - taken


def _divide(rng: random.Random) -> tuple[str, str, int]:
    per, count = rng.randint(12, 999), rng.randint(11, 99)
    total = per * count
    container, containers, item = rng.choice(_PACKS)
    question = rng.choice(
        [
            f"{total} {item} are shared equally among {count} {containers}. "
            f"How many {item} go in each {container}?",
            f"{count} {containers} hold {total} {item} in all, the same number in each. How many {item} are "
            f"in one {container}?",
        ]
    )
    return question, f"{total}/{count}", per


def _two_step(rng: random.Random) -> tuple[str, str, int]:
    _, containers, item = rng.choice(_SHOP_PACKS)
    form = rng.randrange(3)
    if form == 0:  # a*b + c
        count, per, extra = rng.randint(11, 99), rng.randint(12, 99), rng.randint(100, 999)
        question = (
            f"A shop has {count} {containers} of {per} {item} and {extra} loose {item}. "
            f"How many {item} does it have?"
        )
        return question, f"{count}*{per}+{extra}", count * per + extra
    if form == 1:  # a*b - c
        count, per = rng.randint(11, 99), rng.randint(12, 99)
        used = rng.randint(100, count * per - 1)
        question = (
            f"There are {count} {containers} with {per} {item} each. {used} {item} are used. "
            f"How many {item} are left?"
        )
        return question, f"{count}*{per}-{used}", count * per - used
    days, first, second = rng.randint(11, 49), rng.randint(100, 999), rng.randint(100, 999)
    who, item, verb = rng.choice(_COUNTERS)
    question = (
        f"{who} {verb} {first} {item} in the morning and {second} {item} in the afternoon, "
        f"every day for {days} days. How many {item} is that in total?"
    )
    return question, f"({first}+{second})*{days}", (first + second) * days


GENERATORS: dict[str, Callable[[random.Random], tuple[str, str, int]]] = {
    "multiply": _multiply,
    "add": _add,
    "subtract": _subtract,
    "divide": _divide,
    "two_step": _two_step,
}
"""Category -> generator of ``(question, expression, answer)``."""


class ArithmeticDataset(Dataset):
    """Deterministic arithmetic word problems, solvable with one or two calculator calls.

    Task ``i`` of a split has category ``categories[i % len(categories)]`` (the train split cycles
    ``train_categories`` instead when it is set), ``answer`` the integer result, ``messages`` a
    single user message (the environment adds the system prompt) and
    ``metadata = {"expression": "347*29", "split": ...}``. Splits ``train`` and ``eval`` come from
    separate random streams, and train never repeats an eval question.
    """

    name = "arithmetic"
    SPLITS: ClassVar[tuple[str, ...]] = ("train", "eval")

    class Config(ComponentConfig):
        seed: int = Field(0, description="the same seed gives the same tasks")
        num_train: int = Field(1000, ge=0, description="tasks in the train split")
        num_eval: int = Field(200, ge=0, description="tasks in the eval split")
        categories: list[Category] = Field(
            default_factory=lambda: list(CATEGORIES), min_length=1, description="problem kinds, cycled"
        )
        train_categories: list[Category] | None = Field(
            None,
            min_length=1,
            description="problem kinds of the train split only, cycled (default: categories); a kind "
            "listed more than once is drawn that much more often, so training can dwell on the hard "
            "kinds while the eval split keeps its balanced mix",
        )

        @model_validator(mode="after")
        def _distinct(self) -> ArithmeticDataset.Config:
            if len(set(self.categories)) != len(self.categories):
                raise ValueError(f"categories lists a category more than once: {self.categories}")
            return self

    config: Config

    def __init__(self, config: ComponentConfig | Mapping[str, Any] | None = None) -> None:
        super().__init__(config)
        self._cache: dict[str, list[Task]] = {}

    def load(self, split: str) -> list[Task]:
        if split not in self.SPLITS:
            raise ValueError(
                f"arithmetic dataset has no split {split!r}; splits are {', '.join(self.SPLITS)}"
            )
        if split not in self._cache:
            if split == "eval":
                self._cache[split] = self._generate("eval", self.config.num_eval, exclude=set())
            else:
                held_out = {task.messages[0]["content"] for task in self.load("eval")}
                self._cache[split] = self._generate("train", self.config.num_train, exclude=held_out)
        return [task.model_copy(deep=True) for task in self._cache[split]]

    def _generate(self, split: str, count: int, exclude: set[str]) -> list[Task]:
        rng = random.Random(f"agent-r1/arithmetic/{self.config.seed}/{split}")
        seen = set(exclude)
        tasks: list[Task] = []
        categories = self.config.categories
        if split == "train" and self.config.train_categories is not None:
            categories = self.config.train_categories
        for index in range(count):
            category = categories[index % len(categories)]
            for _ in range(1000):
                question, expression, answer = GENERATORS[category](rng)
                if question not in seen:
                    break
            else:  # pragma: no cover - the question space is far larger than any sane split
                raise ValueError(
                    f"cannot generate {count} distinct {category!r} questions for split {split!r}"
                )
            seen.add(question)
            tasks.append(
                Task(
                    id=f"arithmetic-{self.config.seed}-{split}-{index:05d}",
                    messages=[{"role": "user", "content": question}],
                    answer=answer,
                    category=category,
                    metadata={"expression": expression, "split": split},
                )
            )
        return tasks


# --------------------------------------------------------------------------------------------
# Environment
# --------------------------------------------------------------------------------------------

SYSTEM_PROMPT = "Solve the math problem. Use the calculator for every calculation."
FEW_SHOT_BY_CATEGORY: dict[str, tuple[str, str]] = {
    "multiply": ("A crate holds 23 jars. How many jars are in 41 crates?", "23*41"),
    "subtract": ("A shop had 512 apples and sold 178. How many apples are left?", "512-178"),
    "add": ("A farm has 126 cows, 348 sheep and 57 goats. How many animals are there?", "126+348+57"),
    "divide": (
        "14 boxes hold 3262 pens in all, the same number in each. How many pens are in one box?",
        "3262/14",
    ),
    "two_step": (
        "A shop has 12 bags of 36 nuts and 215 loose nuts. How many nuts does it have?",
        "12*36+215",
    ),
}
"""One worked example (question, expression) per problem kind, shown as earlier conversation turns.
Numbers and wording differ from every generated task."""
FEW_SHOT_EXAMPLES: tuple[tuple[str, str], ...] = tuple(FEW_SHOT_BY_CATEGORY.values())
"""The worked examples in order: ``few_shot: k`` shows the first ``k``."""


class WorkedExample(BaseModel):
    """A worked example of your own for ``few_shot``: a question and the expression that solves it
    (the environment computes the result with the real tool)."""

    model_config = ConfigDict(extra="forbid")

    question: str = Field(min_length=1, description="the problem, as the user would ask it")
    expression: str = Field(min_length=1, description="the calculator call that solves it, e.g. 3024/14")

    @field_validator("expression")
    @classmethod
    def _computable(cls, expression: str) -> str:
        try:
            evaluate(expression, Limits())
        except CalculatorError as exc:
            raise ValueError(f"the calculator refuses {expression!r}: {exc}") from exc
        return expression


def _shape(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return "list"
    if isinstance(value, (dict, WorkedExample)):
        return "example"
    return "int" if isinstance(value, int) else "kind"


FewShotItem = Annotated[
    Annotated[Category, Tag("kind")] | Annotated[WorkedExample, Tag("example")], Discriminator(_shape)
]
FewShot = Annotated[
    Annotated[int, Tag("int")] | Annotated[list[FewShotItem], Tag("list")],
    Discriminator(
        _shape,
        custom_error_type="few_shot",
        custom_error_message="give a count or a list of problem kinds and {question, expression} examples",
    ),
]
"""``few_shot``: a count, or a list of problem kinds and worked examples of your own."""


class CalculatorEnv(ToolEnv):
    """The calculator task: ``<calc>expression</calc>`` calls, ``<answer>number</answer>`` ends.

    The system message is the short ``system_prompt`` plus the format's tool list. With
    ``few_shot: k`` the conversation starts with ``k`` worked examples as earlier turns (question,
    call, result, answer), written by the format itself so that changing the format options keeps
    them consistent. Small models (such as SmolLM2-135M-Instruct) follow demonstrations given as
    real turns far better than examples described inside the system prompt.
    """

    name = "calculator"

    class Config(ToolEnv.Config):
        """:class:`ToolEnv`'s options with the calculator defaults, plus ``few_shot``."""

        tools: list[str | ComponentSpec] = Field(
            default_factory=lambda: list[str | ComponentSpec](["calculator"])
        )
        format: str | ComponentSpec = Field(
            default_factory=lambda: ComponentSpec(name="tags", tool_tags={"calculator": "calc"}),
            description="tool-call format; the default calls the calculator with <calc>...</calc>",
        )
        system_prompt: str | None = SYSTEM_PROMPT
        few_shot: FewShot = Field(
            2,
            description="worked examples shown as earlier conversation turns: a count (the first k of "
            "multiply, subtract, add, divide, two_step) or a list, in order, of problem kinds (the "
            "bundled example of that kind) and {question, expression} examples of your own",
        )

        @field_validator("few_shot")
        @classmethod
        def _known_examples(cls, value: FewShot) -> FewShot:
            if isinstance(value, int) and not 0 <= value <= len(FEW_SHOT_EXAMPLES):
                raise ValueError(f"few_shot={value}: give 0 to {len(FEW_SHOT_EXAMPLES)} examples")
            if isinstance(value, list):
                questions = [
                    item.question if isinstance(item, WorkedExample) else FEW_SHOT_BY_CATEGORY[item][0]
                    for item in value
                ]
                repeated = sorted({q for q in questions if questions.count(q) > 1})
                if repeated:
                    raise ValueError(f"few_shot shows the same example more than once: {repeated[0]!r}")
            return value

    config: Config

    def few_shot_messages(self) -> list[Message]:
        """The worked examples as messages: user question, assistant call, the result message(s),
        assistant answer. Empty when the format cannot write calls."""
        tool = self.tools.get("calculator")
        if tool is None or not self.config.few_shot:
            return []
        messages: list[Message] = []
        chosen = self.config.few_shot
        examples = (
            FEW_SHOT_EXAMPLES[:chosen]
            if isinstance(chosen, int)
            else tuple(
                (item.question, item.expression)
                if isinstance(item, WorkedExample)
                else FEW_SHOT_BY_CATEGORY[item]
                for item in chosen
            )
        )
        for index, (question, expression) in enumerate(examples):
            value = tool.run(tool.Arguments.model_validate({"expression": expression}))
            call = ToolCall(id=f"example-{index}", name=tool.name, arguments={"expression": expression})
            try:
                written_call = self.format.render_call(call, self.tool_classes)
                written_answer = self.format.render_answer(value)
            except NotImplementedError:
                return []  # a third-party format that cannot write calls gets no examples
            result = ToolResult(call_id=call.id, name=tool.name, content=value)
            messages.append({"role": "user", "content": question})
            messages.append({"role": "assistant", "content": written_call})
            messages.extend(self.format.render_results([result]))
            messages.append({"role": "assistant", "content": written_answer})
        return messages


__all__ = [
    "CATEGORIES",
    "FEW_SHOT_BY_CATEGORY",
    "GENERATORS",
    "ArithmeticDataset",
    "CalculatorEnv",
    "CalculatorError",
    "CalculatorTool",
    "Limits",
    "WorkedExample",
    "evaluate",
    "format_number",
    "normalize_expression",
]
