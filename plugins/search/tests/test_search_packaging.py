"""The packaging test: build the plugin's wheel, pip-install it into a fresh virtual environment,
check that `agent-r1 plugins list --json` there shows its components, uninstall it, check they are
gone.

The development environment has the plugin installed editable, so the fresh environment must not
simply see the development site-packages. It is created without pip and given a *filtered view*
of the development site-packages: a directory of symlinks to every entry except the plugin's own
(its ``.dist-info`` and its editable ``.pth``), added with ``site.addsitedir`` so that the core's
editable ``.pth`` still works. The wheel itself is installed by the development pip with
``--python``, exactly as a user's pip would.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

PLUGIN_ROOT = Path(__file__).resolve().parents[1]
DISTRIBUTION = "agent-r1-plugin-search"
EXPECTED = {
    "tools": ["search"],
    "environments": ["search_qa"],
    "datasets": ["2wikimultihopqa", "hotpotqa", "musique", "nq"],
    "reward_shapers": ["qa_em", "qa_f1", "qa_format", "qa_substring", "search_gold", "search_valid"],
}


def _run(command: list[str], **kwargs) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV"}}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300, **kwargs)
    if result.returncode != 0:
        pytest.fail(f"{' '.join(command)} exited {result.returncode}:\n{result.stdout}\n{result.stderr}")
    return result


def _belongs_to_plugin(name: str) -> bool:
    return "agent_r1_plugin_search" in name.lower().replace("-", "_")


def _filtered_site(tmp_path: Path) -> Path:
    """Symlinks to the development site-packages, minus this plugin's installation."""
    source = Path(sysconfig.get_paths()["purelib"])
    view = tmp_path / "dev-site"
    view.mkdir()
    for entry in source.iterdir():
        if _belongs_to_plugin(entry.name):
            continue
        if entry.suffix == ".pth" and str(PLUGIN_ROOT) in entry.read_text(encoding="utf-8", errors="replace"):
            continue
        (view / entry.name).symlink_to(entry)
    return view


def _plugins(python: Path, cwd: Path) -> list[dict]:
    result = _run([str(python), "-m", "agent_r1.cli", "plugins", "list", "--json"], cwd=cwd)
    return json.loads(result.stdout)


@pytest.mark.timeout(300)
def test_wheel_installs_into_a_fresh_venv_and_uninstalls(tmp_path: Path) -> None:
    # 1. build the wheel (hatchling comes from build isolation unless it is installed already)
    wheel_dir = tmp_path / "wheels"
    build = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", str(PLUGIN_ROOT), "-w", str(wheel_dir)]
    try:
        import hatchling  # noqa: F401

        build.insert(5, "--no-build-isolation")
    except ImportError:
        pass
    _run(build)
    (wheel,) = wheel_dir.glob("agent_r1_plugin_search-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for data in ("hotpotqa_dev_200.jsonl", "wiki_passages_1000.jsonl", "nq_toy.jsonl", "ATTRIBUTION.md"):
        assert f"agent_r1_plugin_search/data/{data}" in names
    assert not [n for n in names if n.startswith("tests/") or "/tests/" in n]
    assert wheel.stat().st_size < 3_000_000

    # 2. a fresh venv that sees the core and third-party packages but not the editable plugin
    venv = tmp_path / "fresh"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    python = venv / "bin" / "python"
    site_packages = Path(
        _run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip()
    )
    view = _filtered_site(tmp_path)
    (site_packages / "_agent_r1_dev_site.pth").write_text(f"import site; site.addsitedir({str(view)!r})\n")
    probe = "import importlib.util as u; print(u.find_spec('agent_r1_plugin_search'))"
    assert _run([str(python), "-c", probe], cwd=tmp_path).stdout.strip() == "None"
    before = _plugins(python, tmp_path)
    assert "search" not in {p["name"] for p in before}
    assert "builtins" in {p["name"] for p in before}

    # 3. install the wheel with pip, as a user would
    pip = [sys.executable, "-m", "pip", "--python", str(python)]
    _run([*pip, "install", "--no-deps", "--no-index", "-q", str(wheel)])
    where = _run([str(python), "-c", "import agent_r1_plugin_search as m; print(m.__file__)"], cwd=tmp_path)
    assert Path(where.stdout.strip()).is_relative_to(venv)
    (search,) = [p for p in _plugins(python, tmp_path) if p["name"] == "search"]
    assert search["distribution"] == DISTRIBUTION and search["status"] == "loaded", search
    assert search["errors"] == [] and search["module"] == "agent_r1_plugin_search.plugin"
    for kind, names_of_kind in EXPECTED.items():
        assert search["components"].get(kind) == names_of_kind, (kind, search["components"])
    help_text = _run([str(venv / "bin" / "agent-r1-search"), "--help"], cwd=tmp_path).stdout
    assert "serve" in help_text and "index" in help_text

    # 4. uninstall: the components are gone
    _run([*pip, "uninstall", "-y", "-q", DISTRIBUTION])
    after = _plugins(python, tmp_path)
    assert "search" not in {p["name"] for p in after}
    assert not any("search_qa" in p["components"].get("environments", []) for p in after)
    assert not (venv / "bin" / "agent-r1-search").exists()
