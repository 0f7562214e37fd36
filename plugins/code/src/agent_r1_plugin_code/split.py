"""How a task's tests are split for the trusted harness (see :mod:`agent_r1_plugin_code.harness`).

:func:`plan_tests` parses the test code (the tests, the task's setup, the helpers of HumanEval's
prompt) once per task and decides, name by name, what belongs to the solution: the names the test
code uses but never binds that are neither builtins nor standard modules, plus ``candidate`` and
the entry point. It then rewrites every statement: each **region** (a chain of calls, attributes
and subscripts starting at a name of the solution, with builtin conversions around it) becomes a
call ``__agent_r1_region__(index, (arguments...))``; the sandbox evaluates the region as ``lambda
__r1_0, __r1_1, ...: <region>``, whose parameters stand for the region's trusted sub-expressions
(evaluated where the test runs, sent as plain data). Sub-expressions that are evaluated only
sometimes (the branches of ``x if c else y``, the right of ``and``/``or``, the body of a ``lambda``
or comprehension) stay code, their free trusted names turned into parameters. A :class:`TestPlan`
holds the compiled, rewritten code; it is the same for every solution of the task.
"""

from __future__ import annotations

import ast
import builtins
import copy
import hashlib
import sys
import threading
import types
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

CALL = "__agent_r1_region__"
"""The name a rewritten test calls for each region."""
PARAM = "__r1_"
BUILTIN_NAMES = frozenset(dir(builtins))
CONVERSIONS = frozenset(
    {"list", "tuple", "set", "frozenset", "sorted", "dict", "str", "repr", "len", "sum", "min", "max"}
    | {"any", "all", "abs", "round", "int", "float", "bool"}
)
"""Builtins that, applied to nothing but a region (``tuple(candidate(x))``, ``list(gen(3))``), join
it: their value depends on the solution's value alone, so the sandbox may compute it (a generator
the solution returns then never has to cross)."""


@dataclass(frozen=True)
class Region:
    """A sub-expression of a test that the sandbox evaluates."""

    code: str
    """``lambda __r1_0, __r1_1, ...: <expression>``."""
    names: tuple[str | None, ...]
    """For each argument, the name it stands for when it is a bare name (a setup object may then
    be sent by reference)."""


@dataclass(frozen=True)
class PlannedTest:
    """One test: a rewritten statement, or a stdin/stdout pair."""

    source: str
    code: types.CodeType | None = None
    error: str | None = None
    """Why the test cannot run at all (it does not parse); it then fails."""
    stdin: str | None = None
    stdout: str | None = None
    in_sandbox: bool = False
    """The test keeps an object of the solution in a variable and uses it later (``s = Stack();
    s.push(1); assert s.pop() == 1``, see :func:`_holds_objects`): no value of it can cross, so the
    whole statement runs in the sandbox (only a plain ``True`` passes; counted in
    ``sandbox_verdicts``)."""


def _root_name(node: ast.expr) -> str | None:
    while isinstance(node, (ast.Call, ast.Attribute, ast.Subscript)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


def _holds_objects(tree: ast.Module, user: frozenset[str]) -> bool:
    """Whether ``tree`` makes an object of the solution, keeps it in a variable and then uses its
    attributes (``s = Stack(); s.push(1)``): a variable bound to a region that starts at a
    capitalised name of the solution (a class, by Python's naming convention). Decided from the
    test's text alone, never from what a solution returns; a variable holding what a function
    returns (``r = candidate(x); r.count(1)``) stays split, its value plain data."""
    held = {
        target.id
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign)
        and _rooted(node.value, user)
        and (_root_name(node.value) or "")[:1].isupper()
        for target in node.targets
        if isinstance(target, ast.Name)
    }
    return any(
        isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in held
        for node in ast.walk(tree)
    )


@dataclass(frozen=True)
class TestPlan:
    """A task's tests, ready to run against any solution (built once per task)."""

    tests: tuple[PlannedTest, ...]
    regions: tuple[Region, ...]
    user_names: frozenset[str]
    """Names the solution defines (``candidate`` among them): they stand for the sandbox."""
    modules: tuple[str, ...]
    """Standard modules the tests use without importing them (imported here)."""
    prompt: types.CodeType | None
    """The prompt's helpers (imports, functions, classes; not the entry point), run here."""
    setup: tuple[types.CodeType, ...]
    setup_sources: tuple[str, ...]
    setup_names: frozenset[str]
    aliases: dict[str, str] = field(default_factory=dict)
    """Names the sandbox binds for the tests (``{"candidate": entry_point}``)."""

    @property
    def has_statements(self) -> bool:
        return any(test.stdin is None for test in self.tests)


def _bound_names(trees: Sequence[ast.AST]) -> set[str]:
    """Every name that code binds anywhere (assignments, loops, imports, definitions, parameters)."""
    bound: set[str] = set()
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
                bound.add(node.id)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                bound.add(node.name)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                bound.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
            elif isinstance(node, ast.arg):
                bound.add(node.arg)
            elif isinstance(node, ast.ExceptHandler) and node.name:
                bound.add(node.name)
    return bound


def _loaded_names(trees: Sequence[ast.AST]) -> set[str]:
    return {
        node.id
        for tree in trees
        for node in ast.walk(tree)
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)
    }


def _rooted(node: ast.expr, user: frozenset[str]) -> bool:
    """A chain of calls, attributes and subscripts that starts at a name of the solution."""
    while isinstance(node, (ast.Call, ast.Attribute, ast.Subscript)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return isinstance(node, ast.Name) and node.id in user


def _names_in(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


class _Hollow(ast.NodeTransformer):
    """Inside a region: trusted sub-expressions become the lambda's parameters (computed here)."""

    def __init__(self, user: frozenset[str], trusted_bound: set[str]) -> None:
        self.user = user
        self.trusted_bound = trusted_bound
        self.params: list[ast.expr] = []
        self.names: list[str | None] = []
        self.local: list[set[str]] = []
        self.conditional = 0

    def _param(self, node: ast.expr) -> ast.Name:
        self.params.append(node)
        self.names.append(node.id if isinstance(node, ast.Name) else None)
        return ast.copy_location(ast.Name(f"{PARAM}{len(self.params) - 1}", ast.Load()), node)

    def _is_local(self, name: str) -> bool:
        return any(name in scope for scope in self.local)

    def _free_trusted(self, name: str) -> bool:
        """A name whose value lives here (the builtins the sandbox has too stay code)."""
        if name in self.user or self._is_local(name):
            return False
        return name in self.trusted_bound or name not in BUILTIN_NAMES

    def _closed(self, node: ast.expr) -> bool:
        """Computable here: no name of the solution, none bound inside the region, loaded only."""
        if isinstance(node, (ast.Constant, ast.Lambda, ast.Starred)):
            return False
        if getattr(node, "ctx", ast.Load()).__class__ is not ast.Load:
            return False
        if isinstance(node, ast.Name) and not self._free_trusted(node.id):
            return False
        return not any(n in self.user or self._is_local(n) for n in _names_in(node))

    def visit(self, node: ast.AST) -> ast.AST:
        if isinstance(node, ast.expr):
            if not self.conditional and self._closed(node):
                return self._param(node)
            if (
                self.conditional
                and isinstance(node, ast.Name)
                and isinstance(node.ctx, ast.Load)
                and self._free_trusted(node.id)
            ):
                return self._param(node)
        return super().visit(node)

    def visit_Lambda(self, node: ast.Lambda) -> ast.AST:
        node.args.defaults = [self.visit(d) for d in node.args.defaults]  # type: ignore[misc]
        node.args.kw_defaults = [None if d is None else self.visit(d) for d in node.args.kw_defaults]  # type: ignore[misc]
        self.local.append({a.arg for a in ast.walk(node.args) if isinstance(a, ast.arg)})
        self.conditional += 1
        node.body = self.visit(node.body)  # type: ignore[assignment]
        self.conditional -= 1
        self.local.pop()
        return node

    def _comprehension(self, node: Any, parts: Sequence[str]) -> ast.AST:
        first = node.generators[0]
        first.iter = self.visit(first.iter)  # evaluated in the enclosing scope, once
        self.local.append(
            {n.id for g in node.generators for n in ast.walk(g.target) if isinstance(n, ast.Name)}
        )
        self.conditional += 1
        for index, generator in enumerate(node.generators):
            if index:
                generator.iter = self.visit(generator.iter)
            generator.ifs = [self.visit(test) for test in generator.ifs]
        for part in parts:
            setattr(node, part, self.visit(getattr(node, part)))
        self.conditional -= 1
        self.local.pop()
        return node

    def visit_ListComp(self, node: ast.ListComp) -> ast.AST:
        return self._comprehension(node, ("elt",))

    visit_SetComp = visit_ListComp
    visit_GeneratorExp = visit_ListComp  # type: ignore[assignment]

    def visit_DictComp(self, node: ast.DictComp) -> ast.AST:
        return self._comprehension(node, ("key", "value"))

    def visit_IfExp(self, node: ast.IfExp) -> ast.AST:
        node.test = self.visit(node.test)  # type: ignore[assignment]
        self.conditional += 1
        node.body, node.orelse = self.visit(node.body), self.visit(node.orelse)  # type: ignore[assignment]
        self.conditional -= 1
        return node

    def visit_BoolOp(self, node: ast.BoolOp) -> ast.AST:
        first, *rest = node.values
        values = [self.visit(first)]
        self.conditional += 1
        values += [self.visit(value) for value in rest]
        self.conditional -= 1
        node.values = values  # type: ignore[assignment]
        return node


class _Splitter(ast.NodeTransformer):
    """Trusted code with each region replaced by ``__agent_r1_region__(index, (arguments...))``."""

    VALUE_PARENTS = (ast.Compare, ast.BinOp, ast.UnaryOp, ast.BoolOp, ast.FormattedValue, ast.Assert)

    def __init__(self, user: frozenset[str], trusted_bound: set[str], regions: dict[Region, int]) -> None:
        self.user = user
        self.trusted_bound = trusted_bound
        self.regions = regions

    def _ship(self, node: ast.expr) -> ast.expr:
        hollow = _Hollow(self.user, self.trusted_bound)
        body = hollow.visit(copy.deepcopy(node))
        params = ", ".join(f"{PARAM}{i}" for i in range(len(hollow.params)))
        region = Region(code=f"lambda {params}: {ast.unparse(body)}", names=tuple(hollow.names))
        index = self.regions.setdefault(region, len(self.regions))
        call = ast.Call(
            func=ast.Name(CALL, ast.Load()),
            args=[ast.Constant(index), ast.Tuple(hollow.params, ast.Load())],
            keywords=[],
        )
        return ast.fix_missing_locations(ast.copy_location(call, node))

    def _conversion(self, node: ast.AST) -> bool:
        return (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in CONVERSIONS
            and node.func.id not in self.trusted_bound
            and bool(node.args)
            and all(_rooted(arg, self.user) or self._conversion(arg) for arg in node.args)
            and all(isinstance(keyword.value, ast.Constant) for keyword in node.keywords)
        )

    def _bare(self, node: ast.AST) -> bool:
        return isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id in self.user

    def visit(self, node: ast.AST) -> ast.AST:
        loaded = isinstance(getattr(node, "ctx", ast.Load()), ast.Load)
        chain = isinstance(node, (ast.Call, ast.Attribute, ast.Subscript)) and loaded
        if chain and (_rooted(node, self.user) or self._conversion(node)):
            return self._ship(node)
        if isinstance(node, self.VALUE_PARENTS):
            # a name of the solution used as a value (``assert LIMIT == 3``) is asked for as one;
            # elsewhere (``map(candidate, xs)``) it stays a callable stand-in
            for name, value in ast.iter_fields(node):
                if self._bare(value):
                    setattr(node, name, self._ship(value))
                elif isinstance(value, list):
                    setattr(node, name, [self._ship(v) if self._bare(v) else v for v in value])
        return super().visit(node)


def _prompt_helpers(prompt: str, entry_point: str | None) -> list[ast.stmt]:
    """The prompt's imports, functions and classes, without the entry point (HumanEval's tests
    call helpers of the prompt, e.g. ``encode_shift``; the trusted copy is the one they get)."""
    try:
        tree = ast.parse(prompt)
    except SyntaxError:
        return []
    kinds = (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    return [
        node for node in tree.body if isinstance(node, kinds) and getattr(node, "name", None) != entry_point
    ]


def plan_tests(
    tests: Sequence[str | dict[str, str]],
    *,
    setup: str = "",
    check_setup: Sequence[str] = (),
    prompt: str | None = None,
    entry_point: str | None = None,
    candidate: bool = False,
) -> TestPlan:
    """Split a task's tests (see the module docstring). ``tests`` are statements, or
    ``{"stdin", "stdout"}`` pairs; ``candidate`` binds ``candidate`` to ``entry_point`` (HumanEval)."""
    setup_sources = [s for s in (setup, *check_setup) if s and s.strip()]
    try:
        setup_trees = [ast.parse(source) for source in setup_sources]
    except SyntaxError as exc:  # the dataset's fault: every test fails, saying why
        broken = PlannedTest(source="", error=f"SyntaxError in the test's setup: {exc.msg}")
        return TestPlan((broken,) * len(tests), (), frozenset(), (), None, (), (), frozenset())
    helpers = _prompt_helpers(prompt, entry_point) if prompt else []
    parsed: list[tuple[str, ast.Module | None, str | None, dict[str, str] | None]] = []
    for test in tests:
        if isinstance(test, dict):
            parsed.append(("", None, None, test))
            continue
        try:
            parsed.append((test, ast.parse(test), None, None))
        except SyntaxError as exc:
            parsed.append((test, None, f"SyntaxError in the test: {exc.msg}", None))
    test_trees = [tree for _, tree, _, _ in parsed if tree is not None]
    trusted_bound = _bound_names([*setup_trees, *test_trees, *helpers])
    forced = {name for name in (entry_point, "candidate" if candidate else None) if name}
    free = _loaded_names([*setup_trees, *test_trees]) - trusted_bound - BUILTIN_NAMES
    modules = sorted(name for name in free - forced if name in sys.stdlib_module_names)
    user = frozenset((free - set(modules)) | forced)
    regions: dict[Region, int] = {}
    splitter = _Splitter(user, trusted_bound - forced, regions)

    def compiled(tree: ast.Module) -> types.CodeType:
        return compile(ast.fix_missing_locations(splitter.visit(tree)), "<test>", "exec")

    setup_code = tuple(compiled(tree) for tree in setup_trees)
    planned = []
    for source, tree, error, pair in parsed:
        if pair is not None:
            planned.append(
                PlannedTest(
                    source=f"stdin: {pair.get('stdin', '')!r}",
                    stdin=pair.get("stdin", ""),
                    stdout=pair.get("stdout", ""),
                )
            )
        elif tree is None:
            planned.append(PlannedTest(source=source, error=error))
        else:
            held = _holds_objects(tree, user)
            planned.append(PlannedTest(source=source, code=compiled(tree), in_sandbox=held))
    prompt_code = compile(ast.Module(helpers, []), "<prompt>", "exec") if helpers else None
    return TestPlan(
        tests=tuple(planned),
        regions=tuple(sorted(regions, key=regions.__getitem__)),
        user_names=user,
        modules=tuple(modules),
        prompt=prompt_code,
        setup=setup_code,
        setup_sources=tuple(setup_sources),
        setup_names=frozenset(_bound_names(setup_trees)),
        aliases={"candidate": entry_point} if candidate and entry_point else {},
    )


_PLANS: OrderedDict[str, TestPlan] = OrderedDict()
_PLANS_LOCK = threading.Lock()


def cached_plan(tests: Sequence[str | dict[str, str]], **options: Any) -> TestPlan:
    """:func:`plan_tests`, remembered (1024 plans) by the tests and options."""
    key = hashlib.sha256(repr((list(tests), sorted(options.items()))).encode()).hexdigest()
    with _PLANS_LOCK:
        if key in _PLANS:
            _PLANS.move_to_end(key)
            return _PLANS[key]
    plan = plan_tests(tests, **options)
    with _PLANS_LOCK:
        _PLANS[key] = plan
        while len(_PLANS) > 1024:
            _PLANS.popitem(last=False)
    return plan


__all__ = ["CALL", "PARAM", "PlannedTest", "Region", "TestPlan", "cached_plan", "plan_tests"]
