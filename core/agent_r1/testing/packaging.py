"""Packaging tests for plugin distributions: build a wheel, install it into a fresh virtual
environment next to agent-r1, and look at it from there as a user would.

Creating a real environment and installing agent-r1 with torch into it would take minutes. The
fresh environment made by :func:`fresh_venv_with_agent_r1` is created without pip and instead sees
a *filtered view* of the current environment's site-packages: a directory of symlinks to every
entry except the distributions named in ``hide`` (say, the plugin under test when it is installed
in editable mode here), added with ``site.addsitedir`` so that ``.pth`` files such as agent-r1's
own editable one still work. Wheels are installed by the current pip with ``--python``, exactly as
a user's pip would install them::

    from agent_r1.testing.packaging import build_wheel, fresh_venv_with_agent_r1

    def test_my_wheel(tmp_path):
        wheel = build_wheel(PROJECT_DIR, tmp_path / "wheels")
        venv = fresh_venv_with_agent_r1(tmp_path / "venv", hide=["agent-r1-plugin-mine"])
        venv.install(wheel)
        (mine,) = [p for p in venv.plugins() if p["name"] == "mine"]
        assert mine["status"] == "loaded"

Needs a POSIX system (symlinks) and pip >= 22.3 in the current environment. Nothing here imports
torch.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import sysconfig
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["CommandFailed", "FreshVenv", "build_wheel", "fresh_venv_with_agent_r1", "run_checked"]

VIEW_PTH = "_agent_r1_dev_site.pth"
"""The ``.pth`` file in the fresh environment that adds the filtered view of site-packages."""


class CommandFailed(AssertionError):
    """A command exited non-zero; the message holds the command, its status and its output."""


def _clean_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The current environment without what would leak the current interpreter's setup (or the
    agent-r1 plugin switches) into a subprocess."""
    drop = {"PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP"}
    env = {k: v for k, v in os.environ.items() if k not in drop and not k.startswith("AGENT_R1_")}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env.update(extra or {})
    return env


def run_checked(
    command: Sequence[str | Path],
    *,
    cwd: str | Path | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float = 300,
) -> subprocess.CompletedProcess[str]:
    """Run ``command`` with a clean environment (plus ``env``); raise :class:`CommandFailed` with
    its output when it exits non-zero."""
    args = [str(part) for part in command]
    result = subprocess.run(
        args, capture_output=True, text=True, cwd=cwd, env=_clean_env(env), timeout=timeout, check=False
    )
    if result.returncode != 0:
        raise CommandFailed(
            f"`{' '.join(args)}` exited {result.returncode}:\n{result.stdout}\n{result.stderr}".rstrip()
        )
    return result


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def _build_requirements(project: Path) -> list[str] | None:
    """The distribution names in ``[build-system] requires`` (None when unreadable)."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        try:
            import tomli as tomllib  # type: ignore[no-redef]
        except ModuleNotFoundError:
            return None
    try:
        data = tomllib.loads((project / "pyproject.toml").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    requires = data.get("build-system", {}).get("requires", [])
    names = []
    for requirement in requires:
        match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", str(requirement))
        if match:
            names.append(match.group(1))
    return names


def _build_requirements_installed(project: Path) -> bool:
    """Whether every build requirement is installed for this interpreter, as pip will see it (a
    subprocess with the same clean environment, so ``PYTHONPATH`` cannot fool the check)."""
    names = _build_requirements(project)
    if not names:
        return False
    probe = "import importlib.metadata as m, sys\nfor name in sys.argv[1:]: m.version(name)"
    try:
        run_checked([sys.executable, "-c", probe, *names], timeout=60)
    except CommandFailed:
        return False
    return True


def build_wheel(project: str | Path, out_dir: str | Path, *, isolation: bool | None = None) -> Path:
    """Build the wheel of the project in ``project`` into ``out_dir`` with pip and return it.

    ``isolation=None`` (the default) builds without build isolation, so offline and in a second or
    so, when every ``[build-system] requires`` distribution is installed in the current
    environment, and with isolation (pip downloads the build backend) otherwise. ``out_dir`` must
    not hold another wheel of the same project.
    """
    project, out_dir = Path(project).resolve(), Path(out_dir)
    if isolation is None:
        isolation = not _build_requirements_installed(project)
    command: list[str | Path] = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q"]
    if not isolation:
        command.append("--no-build-isolation")
    before = set(out_dir.glob("*.whl")) if out_dir.is_dir() else set()
    run_checked([*command, project, "-w", out_dir])
    built = sorted(set(out_dir.glob("*.whl")) - before)
    if len(built) != 1:
        raise CommandFailed(f"building {project} left {len(built)} new wheels in {out_dir}: {built}")
    return built[0]


@dataclass
class FreshVenv:
    """A virtual environment made by :func:`fresh_venv_with_agent_r1`."""

    root: Path
    python: Path
    view: Path
    """The directory of symlinks to the filtered site-packages."""

    def script(self, name: str) -> Path:
        """The path of console script ``name`` in this environment."""
        return self.python.parent / name

    def run(
        self,
        args: Sequence[str | Path],
        *,
        cwd: str | Path | None = None,
        env: Mapping[str, str] | None = None,
        timeout: float = 300,
    ) -> subprocess.CompletedProcess[str]:
        """Run this environment's Python with ``args``; raises :class:`CommandFailed` on failure."""
        return run_checked([self.python, *args], cwd=cwd or self.root, env=env, timeout=timeout)

    def install(self, *wheels: str | Path) -> None:
        """``pip install --no-deps --no-index`` the wheels into this environment (with the
        current environment's pip, as ``pip --python`` does for a user)."""
        pip: list[str | Path] = [sys.executable, "-m", "pip", "--python", self.python]
        run_checked([*pip, "install", "--no-deps", "--no-index", "-q", *wheels])

    def uninstall(self, *distributions: str) -> None:
        """``pip uninstall -y`` the distributions from this environment."""
        pip: list[str | Path] = [sys.executable, "-m", "pip", "--python", self.python]
        run_checked([*pip, "uninstall", "-y", "-q", *distributions])

    def plugins(self, *, env: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
        """What ``agent-r1 plugins list --json`` prints in this environment."""
        result = self.run(["-m", "agent_r1.cli", "plugins", "list", "--json"], env=env)
        return list(json.loads(result.stdout))


def _site_dirs() -> list[Path]:
    paths = sysconfig.get_paths()
    return list(dict.fromkeys(Path(paths[key]) for key in ("purelib", "platlib")))


def _hidden(entry: Path, names: Sequence[str], paths: Sequence[str]) -> bool:
    normalised = _normalise(entry.name)
    if any(name in normalised for name in names):
        return True
    if entry.suffix == ".pth" and paths:
        text = entry.read_text(encoding="utf-8", errors="replace")
        return any(path in text for path in paths)
    return False


def fresh_venv_with_agent_r1(
    directory: str | Path, *, hide: Sequence[str] = (), hide_paths: Sequence[str | Path] = ()
) -> FreshVenv:
    """Create a virtual environment in ``directory`` that sees the current environment's packages
    (agent-r1 among them) except the distributions ``hide`` names.

    A site-packages entry is hidden when its normalised name (``-`` and ``.`` as ``_``, lower case)
    contains a normalised name of ``hide`` (its ``.dist-info``, its package, its editable finder)
    or when it is a ``.pth`` file that mentions one of ``hide_paths`` (an editable install of a
    source tree). The environment has no pip of its own: use :meth:`FreshVenv.install`.
    """
    root = Path(directory).resolve()
    if root.exists() and any(root.iterdir()):
        raise FileExistsError(f"{root} is not empty; fresh_venv_with_agent_r1 needs a new directory")
    run_checked([sys.executable, "-m", "venv", "--without-pip", root])
    python = root / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    query = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    site_packages = Path(run_checked([python, "-c", query]).stdout.strip())
    names = [_normalise(name) for name in hide]
    paths = [str(Path(path).resolve()) for path in hide_paths]
    view = root / "agent-r1-dev-site"
    view.mkdir()
    for source in _site_dirs():
        if not source.is_dir():
            continue
        for entry in sorted(source.iterdir()):
            if _hidden(entry, names, paths) or (view / entry.name).exists():
                continue
            (view / entry.name).symlink_to(entry)
    (site_packages / VIEW_PTH).write_text(f"import site; site.addsitedir({str(view)!r})\n", encoding="utf-8")
    return FreshVenv(root=root, python=python, view=view)
