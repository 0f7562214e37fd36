"""Every hook is documented (docstring with "Since:" and a ``:param <name>:`` line per argument),
listed in the generated hooks page, and exercised by a test marked
``@pytest.mark.covers_hook("<hook>")``. Each check is also shown to fail on a counter-example, so
this meta-test cannot pass vacuously."""

from __future__ import annotations

import importlib.util
import inspect
import re
import types
from pathlib import Path

import pluggy
import pytest

from agent_r1 import hookspecs

ROOT = Path(__file__).resolve().parent.parent
HOOKS_PAGE = ROOT / "docs" / "reference" / "hooks.md"
TEST_DIRS = [ROOT / "tests", *sorted((ROOT / "plugins").glob("*/tests"))]
COVERS = re.compile(r"""covers_hook\(\s*["'](\w+)["']\s*\)""")


def _load_generator() -> types.ModuleType:
    spec = importlib.util.spec_from_file_location("gen_reference", ROOT / "docs" / "gen_reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gen = _load_generator()
HOOK_NAMES = [name for name, _ in gen.hookspecs(hookspecs)]


def covered_hooks(sources: list[str]) -> set[str]:
    """Hook names named by ``covers_hook`` markers in test sources."""
    return {name for source in sources for name in COVERS.findall(source)}


PARAM_LINE = re.compile(r"^:param (\w+):", flags=re.M)


def param_problems(module: types.ModuleType) -> list[str]:
    """Hook arguments without a ``:param <name>:`` line in their hook's docstring (as pytest's
    hookspecs have), and ``:param`` lines that name no argument."""
    problems = []
    for name, function in gen.hookspecs(module):
        arguments = list(inspect.signature(function).parameters)
        documented = PARAM_LINE.findall(gen.docstring(function))
        problems += [
            f"hook {name!r}: argument {argument!r} has no ':param {argument}:' line"
            for argument in arguments
            if argument not in documented
        ]
        problems += [
            f"hook {name!r}: ':param {extra}:' names no argument"
            for extra in documented
            if extra not in arguments
        ]
    return problems


def hooks_missing_from_page(page: str, names: list[str]) -> list[str]:
    return [name for name in names if gen.hook_heading(name) not in page.splitlines()]


def test_the_hookspecs_are_found() -> None:
    registration = [n for n in HOOK_NAMES if n.startswith("register_")]
    observers = [n for n in HOOK_NAMES if n.startswith("on_")]
    assert "register_tools" in registration and "on_train_end" in observers
    assert set(HOOK_NAMES) == set(registration) | set(observers), "every hook is register_* or on_*"
    assert set(hookspecs.REGISTRATION_HOOKS.values()) | {"register_commands"} == set(registration)


def test_every_hook_has_a_docstring_with_since() -> None:
    assert gen.hook_problems(hookspecs) == []


def test_every_hook_argument_has_a_param_line() -> None:
    assert param_problems(hookspecs) == []


def test_every_hook_is_in_the_generated_docs_page() -> None:
    page = HOOKS_PAGE.read_text(encoding="utf-8")
    assert hooks_missing_from_page(page, HOOK_NAMES) == [], "run `python docs/gen_reference.py`"
    assert page == gen.render_hooks(hookspecs), (
        "docs/reference/hooks.md is out of date with agent_r1/hookspecs.py; "
        "run `python docs/gen_reference.py`"
    )


def test_every_hook_is_exercised_by_a_marked_test() -> None:
    sources = [p.read_text(encoding="utf-8") for d in TEST_DIRS for p in d.rglob("test_*.py")]
    missing = sorted(set(HOOK_NAMES) - covered_hooks(sources))
    assert missing == [], f'hooks without a test marked @pytest.mark.covers_hook("<hook>"): {missing}'
    unknown = sorted(covered_hooks(sources) - set(HOOK_NAMES))
    assert unknown == [], f"covers_hook names that are not hooks: {unknown}"


# --------------------------------------------------------------------------------------------
# The checks fail when they should
# --------------------------------------------------------------------------------------------


def _fake_hookspecs() -> types.ModuleType:
    module = types.ModuleType("fake_hookspecs")
    module.PROJECT = "agent_r1"  # type: ignore[attr-defined]
    spec = pluggy.HookspecMarker("agent_r1")

    def register_widgets() -> list[type]:
        """Return widgets.

        Since: 0.2.0
        """
        return []

    def register_gadgets() -> list[type]:
        return []

    def on_widget_made(widget: object) -> None:
        """Called when a widget is made (no version line)."""

    for function in (register_widgets, register_gadgets, on_widget_made):
        setattr(module, function.__name__, spec(function))
    return module


def test_a_hook_without_docstring_or_since_is_detected() -> None:
    assert gen.hook_problems(_fake_hookspecs()) == [
        "hook 'register_gadgets' has no docstring",
        "hook 'on_widget_made': its docstring has no 'Since: <version>' line",
    ]
    with pytest.raises(ValueError, match="cannot document the hooks"):
        gen.render_hooks(_fake_hookspecs())


def test_a_hook_argument_without_a_param_line_is_detected() -> None:
    module = _fake_hookspecs()
    spec = pluggy.HookspecMarker("agent_r1")

    def on_widget_sold(widget: object, price: float) -> None:
        """Called when a widget is sold.

        :param widget: The widget.
        :param colour: Not an argument.

        Since: 0.2.0
        """

    module.on_widget_sold = spec(on_widget_sold)  # type: ignore[attr-defined]
    assert param_problems(module) == [
        "hook 'on_widget_made': argument 'widget' has no ':param widget:' line",
        "hook 'on_widget_sold': argument 'price' has no ':param price:' line",
        "hook 'on_widget_sold': ':param colour:' names no argument",
    ]


def test_a_hook_missing_from_the_page_is_detected() -> None:
    page = HOOKS_PAGE.read_text(encoding="utf-8")
    without = page.replace(gen.hook_heading("on_checkpoint"), "### something else")
    assert hooks_missing_from_page(without, HOOK_NAMES) == ["on_checkpoint"]


def test_a_hook_without_a_test_is_detected() -> None:
    sources = ['@pytest.mark.covers_hook("register_tools")\n', "@pytest.mark.covers_hook( 'on_train_end' )"]
    assert covered_hooks(sources) == {"register_tools", "on_train_end"}
    assert "register_datasets" in set(HOOK_NAMES) - covered_hooks(sources)


def test_every_generated_reference_page_is_up_to_date() -> None:
    stale = [
        str(path.relative_to(ROOT))
        for path, content in gen.pages().items()
        if not path.exists() or path.read_text(encoding="utf-8") != content
    ]
    assert stale == [], f"out of date: {stale}; run `python docs/gen_reference.py`"
