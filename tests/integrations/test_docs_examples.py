"""The complete examples of docs/integrations_trl.md and docs/integrations_verl.md, run as written,
each in a fresh interpreter (as a user would paste them)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[2] / "docs"


def python_blocks(page: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", (DOCS / page).read_text(encoding="utf-8"), flags=re.S)


def run(code: str, tmp_path: Path) -> str:
    script = tmp_path / "example.py"
    script.write_text(code, encoding="utf-8")
    result = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
        env={**os.environ, "TOKENIZERS_PARALLELISM": "false"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def test_trl_grpo_example(tmp_path: Path) -> None:
    pytest.importorskip("trl")
    out = run(python_blocks("integrations_trl.md")[0], tmp_path)
    assert "steps: 2" in out
    assert re.search(r"env_mask of one completion: \[[01, ]+\]", out)


def test_trl_async_worker_example(tmp_path: Path) -> None:
    pytest.importorskip("trl")
    out = run(python_blocks("integrations_trl.md")[1], tmp_path)
    assert re.search(r"^\d+ rows; advantages: \[", out, flags=re.M)


def test_verl_example(tmp_path: Path) -> None:
    pytest.importorskip("verl")
    out = run(python_blocks("integrations_verl.md")[0], tmp_path)
    assert "token fidelity: True" in out
    assert "'response_mask'" in out and "'rollout_log_probs'" in out
