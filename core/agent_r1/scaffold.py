"""``agent-r1 new-plugin``: render the plugin template into a new plugin distribution.

The template is the directory ``agent_r1/templates/plugin`` of this package, so an installed
agent-r1 can scaffold without a checkout. Rendering is plain string substitution: every
``{{placeholder}}`` in a file's text or path is replaced (see :class:`PluginNames`), and a
``.tmpl`` suffix is dropped (the suffix keeps linters, type checkers and pytest away from template
sources, which are not valid Python until rendered). An unknown placeholder is an error, so a typo
in the template cannot slip into a generated plugin.

Example::

    from agent_r1.scaffold import render_plugin

    project = render_plugin("weather", parent="plugins")  # plugins/agent-r1-plugin-weather/
"""

from __future__ import annotations

import keyword
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

from agent_r1.errors import AgentR1Error

if TYPE_CHECKING:  # pragma: no cover
    from importlib.resources.abc import Traversable

__all__ = ["PluginNames", "ScaffoldError", "plugin_names", "render_plugin", "template_files"]

TEMPLATE_SUFFIX = ".tmpl"
PLACEHOLDER = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")
_NAME = re.compile(r"[a-z][a-z0-9_]*")
_PREFIXES = ("agent_r1_plugin_", "agent_r1_")
MAX_NAME_LENGTH = 40
"""Longer names would make the generated code's lines too long to read."""


class ScaffoldError(AgentR1Error):
    """The plugin cannot be scaffolded (bad name, target not empty, broken template)."""


@dataclass(frozen=True)
class PluginNames:
    """Every spelling of a plugin's name that the template uses, one placeholder each."""

    name: str
    """``{{name}}``: the plugin (entry-point) name and the prefix of its component names: ``weather``."""
    package: str
    """``{{package}}``: the import package: ``agent_r1_plugin_weather``."""
    distribution: str
    """``{{distribution}}``: the distribution (``pip install`` name): ``agent-r1-plugin-weather``."""
    agent_r1_version: str
    """``{{agent_r1_version}}``: the agent-r1 version the plugin is scaffolded with (its lower bound)."""

    def placeholders(self) -> dict[str, str]:
        """Placeholder name → replacement."""
        return {
            "name": self.name,
            "package": self.package,
            "distribution": self.distribution,
            "agent_r1_version": self.agent_r1_version,
        }


def plugin_names(name: str) -> PluginNames:
    """Validate a plugin name and derive its other spellings.

    The name is lower-cased, hyphens become underscores, and a leading ``agent-r1-plugin-`` is
    dropped (``agent-r1-plugin-Weather-Now`` → ``weather_now``). What remains must start with a
    letter, hold only letters, digits and single underscores, and be at most
    :data:`MAX_NAME_LENGTH` characters long, because it prefixes Python identifiers and component
    names.
    """
    from agent_r1 import __version__

    raw = name
    name = name.strip().lower().replace("-", "_")
    for prefix in _PREFIXES:
        if name.startswith(prefix) and len(name) > len(prefix):
            name = name[len(prefix) :]
            break
    if not _NAME.fullmatch(name) or name.endswith("_") or "__" in name or len(name) > MAX_NAME_LENGTH:
        raise ScaffoldError(
            f"{raw!r} is not a usable plugin name: use at most {MAX_NAME_LENGTH} lowercase letters, "
            "digits and single underscores or hyphens, starting with a letter (e.g. 'weather' or "
            "'my-tools')"
        )
    if keyword.iskeyword(name) or name == "builtins":
        raise ScaffoldError(f"{raw!r} cannot be a plugin name (it is reserved); choose another name")
    return PluginNames(
        name=name,
        package=f"agent_r1_plugin_{name}",
        distribution=f"agent-r1-plugin-{name.replace('_', '-')}",
        agent_r1_version=__version__,
    )


def _template_root() -> Traversable:
    return resources.files("agent_r1") / "templates" / "plugin"


def template_files() -> list[tuple[str, str]]:
    """The template as ``(relative path, text)`` pairs, placeholders not yet substituted."""
    files: list[tuple[str, str]] = []

    def walk(node: Traversable, prefix: str) -> None:
        for child in sorted(node.iterdir(), key=lambda item: item.name):
            if child.name == "__pycache__":
                continue
            relative = f"{prefix}{child.name}"
            if child.is_dir():
                walk(child, f"{relative}/")
            else:
                files.append((relative, child.read_text(encoding="utf-8")))

    root = _template_root()
    if not root.is_dir():
        raise ScaffoldError(
            f"the plugin template is missing from the agent_r1 package ({root}); reinstall agent-r1"
        )
    walk(root, "")
    return files


def _substitute(text: str, values: dict[str, str], where: str) -> str:
    unknown = sorted({match.group(1) for match in PLACEHOLDER.finditer(text)} - set(values))
    if unknown:
        raise ScaffoldError(
            f"the plugin template file {where} uses unknown placeholders {unknown}; "
            f"known ones are {sorted(values)}"
        )
    return PLACEHOLDER.sub(lambda match: values[match.group(1)], text)


def render_plugin(name: str, parent: str | Path = ".", *, directory: str | Path | None = None) -> Path:
    """Write a new plugin distribution rendered from the template and return its directory.

    The project goes to ``directory`` when given, else to ``parent/<distribution>``
    (``./agent-r1-plugin-<name>``). The target may exist only as an empty directory: nothing is
    ever overwritten. Every file is rendered in memory before the first one is written, so a broken
    template leaves nothing behind.
    """
    names = plugin_names(name)
    target = Path(directory) if directory is not None else Path(parent) / names.distribution
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise ScaffoldError(
            f"{target} already exists and is not empty; nothing was written. Choose another "
            "directory (--dir) or remove it first."
        )
    values = names.placeholders()
    rendered: list[tuple[Path, str]] = []
    for relative, text in template_files():
        name = _substitute(relative, values, relative).removesuffix(TEMPLATE_SUFFIX)
        rendered.append((target / name, _substitute(text, values, relative)))
    for destination, content in rendered:
        destination.parent.mkdir(parents=True, exist_ok=True)
        destination.write_text(content, encoding="utf-8")
    return target
