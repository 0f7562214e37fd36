"""The packaging test: build the plugin's wheel, pip-install it into a fresh virtual environment
next to agent-r1, check that `agent-r1 plugins list --json` there shows its tools, environments,
datasets and rewards, run sandboxed code from there, uninstall it, check they are gone.

The development environment has the plugin installed editable, so the fresh environment must not
simply see the development site-packages: :func:`agent_r1.testing.packaging.fresh_venv_with_agent_r1`
gives it a filtered view of them without the plugin's own entries (its ``.dist-info`` and its
editable ``.pth``). The wheel is installed by the development pip with ``--python``.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from agent_r1.testing.packaging import build_wheel, fresh_venv_with_agent_r1
from agent_r1_plugin_code.sandbox import namespace_prefix

PLUGIN_ROOT = Path(__file__).resolve().parents[1]
DISTRIBUTION = "agent-r1-plugin-code"
EXPECTED = {
    "tools": ["python", "run_tests"],
    "environments": ["code", "math"],
    "datasets": ["gsm8k", "humaneval", "mbpp"],
    "reward_shapers": ["code_runs", "code_solved", "code_tests", "math_correct", "test_progress"],
}


@pytest.mark.timeout(300)
def test_wheel_installs_into_a_fresh_venv_and_uninstalls(tmp_path: Path) -> None:
    wheel = build_wheel(PLUGIN_ROOT, tmp_path / "wheels")
    assert wheel.name.startswith("agent_r1_plugin_code-")
    names = set(zipfile.ZipFile(wheel).namelist())
    for data in (
        "data/gsm8k_train_sample.jsonl",
        "data/gsm8k_test_sample.jsonl",
        "data/ATTRIBUTION.md",
        "_runner.py",
        "harness.py",
    ):
        assert f"agent_r1_plugin_code/{data}" in names
    assert not [n for n in names if n.startswith("tests/") or "/tests/" in n]
    assert wheel.stat().st_size < 1_000_000

    venv = fresh_venv_with_agent_r1(tmp_path / "fresh", hide=[DISTRIBUTION], hide_paths=[PLUGIN_ROOT])
    probe = "import importlib.util as u; print(u.find_spec('agent_r1_plugin_code'))"
    assert venv.run(["-c", probe], cwd=tmp_path).stdout.strip() == "None"
    assert "code" not in {p["name"] for p in venv.plugins()}

    venv.install(wheel)
    where = venv.run(["-c", "import agent_r1_plugin_code as m; print(m.__file__)"], cwd=tmp_path)
    assert Path(where.stdout.strip()).is_relative_to(venv.root)
    (code,) = [p for p in venv.plugins() if p["name"] == "code"]
    assert code["distribution"] == DISTRIBUTION and code["status"] == "loaded", code
    assert code["errors"] == [] and code["module"] == "agent_r1_plugin_code.plugin"
    for kind, names_of_kind in EXPECTED.items():
        assert code["components"].get(kind) == names_of_kind, (kind, code["components"])
    if namespace_prefix() is not None:  # the installed copy's runner works from its new place
        ran = venv.run(
            ["-c", "from agent_r1_plugin_code import run_python; print(run_python('6 * 7').value)"],
            cwd=tmp_path,
        )
        assert ran.stdout.strip() == "42"

    venv.uninstall(DISTRIBUTION)
    assert "code" not in {p["name"] for p in venv.plugins()}
