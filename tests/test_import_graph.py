"""The map of the package holds: imports flow one way (run → engine → rollout/models → contracts →
mdp), no two modules import each other (directly or round a circle, lazy imports inside functions
included), no product module uses an old path of a module that moved, and the rooms keep their
size (engine's top level, function length).

Imports are read from the source with ``ast``, so the test sees every import, including those
inside functions, but not those under ``if TYPE_CHECKING:`` (never executed).
"""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent_r1._moved import MOVED

PACKAGE = Path(importlib.import_module("agent_r1").__file__ or "").parent
ROOT = PACKAGE.parent


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for path in PACKAGE.rglob("*.py")}


def resolve(name: str) -> str | None:
    """The module a dotted import name lands in (its longest prefix that is a module)."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in MODULES:
            return candidate
    return None


def imported_names(path: Path) -> Iterator[tuple[str, int]]:
    """``(dotted name, line)`` of every import in the file, outside ``if TYPE_CHECKING:``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(inner) for stmt in node.body for inner in ast.walk(stmt))
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*parts, *([node.module] if node.module else [])])
            for alias in node.names:
                yield f"{base}.{alias.name}", node.lineno


def edges() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for name, path in MODULES.items():
        targets = {resolve(imported) for imported, _ in imported_names(path)}
        graph[name] = {t for t in targets if t is not None and t != name and not name.startswith(t + ".")}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_circles() -> None:
    assert cycles(edges()) == []


def test_cycle_detection_finds_a_circle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


LOWER_LAYERS = ("agent_r1.engine", "agent_r1.rollout", "agent_r1.models")
UPPER_LAYERS = ("agent_r1.gateway", "agent_r1.run")


def in_package(module: str, packages: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


def test_imports_flow_one_way() -> None:
    """engine, rollout and models never reach up into the gateway or the run layer; rollout and
    models never import the engine; nothing imports an old path of a moved module."""
    problems = []
    for name, path in sorted(MODULES.items()):
        for imported, line in imported_names(path):
            target = resolve(imported) or imported
            where = f"{path.relative_to(ROOT)}:{line} imports {imported}"
            if in_package(name, LOWER_LAYERS) and in_package(target, UPPER_LAYERS):
                problems.append(where)
            if in_package(name, ("agent_r1.rollout", "agent_r1.models")) and in_package(
                target, ("agent_r1.engine",)
            ):
                problems.append(where)
            if any(imported == old or imported.startswith(old + ".") for old in MOVED):
                problems.append(f"{where} (an old path)")
    assert problems == []


def test_the_agent_loop_imports_no_torch() -> None:
    code = "import sys, agent_r1.rollout.loop, agent_r1.rollout.generation; print('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"


def test_engine_top_level_holds_what_to_read_first() -> None:
    top = sorted(p.stem for p in (PACKAGE / "engine").glob("*.py") if p.stem != "__init__")
    assert len(top) <= 8, top


def test_no_function_in_product_code_is_over_80_lines() -> None:
    long = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > 80:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({length} lines)")
    assert long == []


@pytest.mark.parametrize("old", sorted(MOVED))
def test_old_paths_still_import_with_a_warning(old: str) -> None:
    sys.modules.pop(old, None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module = importlib.import_module(old)
    assert any(issubclass(w.category, DeprecationWarning) and MOVED[old][0] in str(w.message) for w in caught)
    new = [importlib.import_module(name) for name in MOVED[old]]
    for successor in new:  # every public function and class, reached through the old name
        defined = [
            n
            for n, value in vars(successor).items()
            if not n.startswith("_") and getattr(value, "__module__", None) == successor.__name__
        ]
        assert defined, successor.__name__
        for n in defined:
            assert getattr(module, n) is getattr(successor, n), (old, n)
    if len(new) == 1:
        assert module is new[0]  # the same object: patching through either name patches both
