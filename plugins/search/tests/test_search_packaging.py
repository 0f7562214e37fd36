"""The packaging test: build the plugin's wheel, pip-install it into a fresh virtual environment,
check that `agent-r1 plugins list --json` there shows its components, uninstall it, check they are
gone.

The development environment has the plugin installed editable, so the fresh environment must not
simply see the development site-packages: :func:`agent_r1.testing.packaging.fresh_venv_with_agent_r1`
gives it a filtered view of them without the plugin's own entries (its ``.dist-info`` and its
editable ``.pth``). The wheel is installed by the development pip with ``--python``, exactly as a
user's pip would.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from agent_r1.testing.packaging import build_wheel, fresh_venv_with_agent_r1, run_checked

PLUGIN_ROOT = Path(__file__).resolve().parents[1]
DISTRIBUTION = "agent-r1-plugin-search"
EXPECTED = {
    "tools": ["search"],
    "environments": ["search_qa"],
    "datasets": ["2wikimultihopqa", "hotpotqa", "musique", "nq", "qa_mix"],
    "reward_shapers": ["qa_em", "qa_f1", "qa_format", "qa_substring", "search_gold", "search_valid"],
}


@pytest.mark.timeout(300)
def test_wheel_installs_into_a_fresh_venv_and_uninstalls(tmp_path: Path) -> None:
    # 1. build the wheel (offline when hatchling is installed, else pip fetches it)
    wheel = build_wheel(PLUGIN_ROOT, tmp_path / "wheels")
    assert wheel.name.startswith("agent_r1_plugin_search-")
    names = set(zipfile.ZipFile(wheel).namelist())
    for data in ("hotpotqa_dev_200.jsonl", "wiki_passages_1000.jsonl", "nq_toy.jsonl", "ATTRIBUTION.md"):
        assert f"agent_r1_plugin_search/data/{data}" in names
    assert not [n for n in names if n.startswith("tests/") or "/tests/" in n]
    assert wheel.stat().st_size < 3_000_000

    # 2. a fresh venv that sees the core and third-party packages but not the editable plugin
    venv = fresh_venv_with_agent_r1(tmp_path / "fresh", hide=[DISTRIBUTION], hide_paths=[PLUGIN_ROOT])
    probe = "import importlib.util as u; print(u.find_spec('agent_r1_plugin_search'))"
    assert venv.run(["-c", probe], cwd=tmp_path).stdout.strip() == "None"
    before = venv.plugins()
    assert "search" not in {p["name"] for p in before}
    assert "builtins" in {p["name"] for p in before}

    # 3. install the wheel with pip, as a user would
    venv.install(wheel)
    where = venv.run(["-c", "import agent_r1_plugin_search as m; print(m.__file__)"], cwd=tmp_path)
    assert Path(where.stdout.strip()).is_relative_to(venv.root)
    (search,) = [p for p in venv.plugins() if p["name"] == "search"]
    assert search["distribution"] == DISTRIBUTION and search["status"] == "loaded", search
    assert search["errors"] == [] and search["module"] == "agent_r1_plugin_search.plugin"
    for kind, names_of_kind in EXPECTED.items():
        assert search["components"].get(kind) == names_of_kind, (kind, search["components"])
    help_text = run_checked([venv.script("agent-r1-search"), "--help"], cwd=tmp_path).stdout
    assert "serve" in help_text and "index" in help_text

    # 4. uninstall: the components are gone
    venv.uninstall(DISTRIBUTION)
    after = venv.plugins()
    assert "search" not in {p["name"] for p in after}
    assert not any("search_qa" in p["components"].get("environments", []) for p in after)
    assert not venv.script("agent-r1-search").exists()
