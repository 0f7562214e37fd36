"""``jsonl_tasks``: tasks from local JSONL/JSON files with a field mapping and seeded splits."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent_r1 import ConfigError
from agent_r1.builtins.datasets import JsonlTasks
from agent_r1.testing import check_dataset

FIXTURES = Path(__file__).parent / "fixtures" / "tasks"
TRAIN = FIXTURES / "train.jsonl"
EVAL = FIXTURES / "eval.json"


def test_field_mapping_system_prompt_and_metadata() -> None:
    dataset = JsonlTasks(
        {
            "path": str(TRAIN),
            "eval_path": str(EVAL),
            "category_field": "topic",
            "system_prompt": "Answer with a number.",
            "user_template": "Q ({difficulty}): {question}",
        }
    )
    tasks = check_dataset(JsonlTasks, config=dataset.config.model_dump(), splits=("train", "eval"))
    train = tasks["train"]
    assert [t.id for t in train][:4] == ["q1", "q2", "train:3", "q4"], "rows without an id get <file>:<line>"
    first = train[0]
    assert first.messages == [
        {"role": "system", "content": "Answer with a number."},
        {"role": "user", "content": "Q (1): What is 2 + 2?"},
    ]
    assert (first.answer, first.category) == ("4", "add")
    assert first.metadata == {"source": f"{TRAIN}:1", "difficulty": 1}
    assert [t.id for t in tasks["eval"]] == ["e1", "e2"]
    assert tasks["eval"][1].metadata["source"] == f"{EVAL}[1]"


def test_eval_fraction_is_a_seeded_disjoint_split() -> None:
    def split(seed: int) -> tuple[list[str], list[str]]:
        dataset = JsonlTasks({"path": str(TRAIN), "eval_fraction": 0.3, "seed": seed})
        return [t.id for t in dataset.load("train")], [t.id for t in dataset.load("eval")]

    train, held_out = split(0)
    assert len(held_out) == 3 and len(train) == 7
    assert not set(train) & set(held_out)
    assert split(0) == (train, held_out), "the same seed gives the same split"
    assert split(1) != (train, held_out), "another seed gives another split"
    order = [t.id for t in JsonlTasks({"path": str(TRAIN)}).load("train")]
    assert train == [i for i in order if i in train], "the train split keeps file order"


def test_limit_and_fresh_copies() -> None:
    dataset = JsonlTasks({"path": str(TRAIN), "limit": 2, "eval_path": str(EVAL)})
    tasks = dataset.load("train")
    assert [t.id for t in tasks] == ["q1", "q2"]
    tasks[0].messages.append({"role": "user", "content": "changed"})
    assert len(dataset.load("train")[0].messages) == 1


def test_no_eval_split_warns_and_gives_no_tasks() -> None:
    with pytest.warns(UserWarning, match="no eval split"):
        assert JsonlTasks({"path": str(TRAIN)}).load("eval") == []
    with pytest.raises(ValueError, match="no split 'test'; splits are train, eval"):
        JsonlTasks({"path": str(TRAIN)}).load("test")


def test_custom_fields(tmp_path: Path) -> None:
    path = tmp_path / "rows.jsonl"
    path.write_text(
        '{"uid": 7, "prompt": "Name a prime.", "target": [2, 3, 5], "kind": "primes"}\n', encoding="utf-8"
    )
    dataset = JsonlTasks(
        {
            "path": str(path),
            "question_field": "prompt",
            "answer_field": "target",
            "id_field": "uid",
            "category_field": "kind",
        }
    )
    (task,) = dataset.load("train")
    assert (task.id, task.answer, task.category) == ("7", [2, 3, 5], "primes")
    assert task.messages == [{"role": "user", "content": "Name a prime."}]
    assert (
        JsonlTasks({"path": str(path), "question_field": "prompt", "answer_field": None})
        .load("train")[0]
        .answer
        is None
    )


@pytest.mark.parametrize(
    ("content", "options", "expected"),
    [
        ('{"question": "a", "answer": 1}\n{"question": "b"\n', {}, "rows.jsonl:2: not valid JSON"),
        ('{"question": "a", "answer": 1}\n[1, 2]\n', {}, "rows.jsonl:2: expected a JSON object, got list"),
        (
            '{"q": "a", "answer": 1}\n',
            {},
            "rows.jsonl:1: no field 'question' (fields: answer, q); set data.question_field",
        ),
        (
            '{"question": "a"}\n',
            {},
            "rows.jsonl:1: no field 'answer' (fields: question); set data.answer_field",
        ),
        (
            '{"id": 1, "question": "a", "answer": 1}\n{"id": 1, "question": "b", "answer": 2}\n',
            {},
            "rows.jsonl:2: task id '1' was already used at",
        ),
        (
            '{"question": "a", "answer": 1}\n',
            {"user_template": "{question} {context}"},
            "rows.jsonl:1: data.user_template uses field 'context'",
        ),
    ],
)
def test_file_problems_name_the_file_and_line(
    tmp_path: Path, content: str, options: dict, expected: str
) -> None:
    path = tmp_path / "rows.jsonl"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(ConfigError) as caught:
        JsonlTasks({"path": str(path), **options}).load("train")
    assert expected in str(caught.value)


def test_config_problems() -> None:
    with pytest.raises(ConfigError, match=r"data\.path: task file 'nowhere\.jsonl' does not exist"):
        JsonlTasks({"path": "nowhere.jsonl"}).load("train")
    with pytest.raises(ValueError, match="set eval_path or eval_fraction, not both"):
        JsonlTasks.Config(path="a", eval_path="b", eval_fraction=0.1)
    with pytest.raises(ValueError, match="may only use plain"):
        JsonlTasks.Config(path="a", user_template="{question.upper}")
    with pytest.raises(ValueError, match="path"):
        JsonlTasks.Config()  # type: ignore[call-arg]


def test_a_json_file_must_hold_a_list(tmp_path: Path) -> None:
    path = tmp_path / "rows.json"
    path.write_text('{"question": "a"}', encoding="utf-8")
    with pytest.raises(ConfigError, match="must hold a list of objects"):
        JsonlTasks({"path": str(path)}).load("train")


def test_train_and_eval_files_must_not_share_ids(tmp_path: Path) -> None:
    clash = tmp_path / "eval.jsonl"
    clash.write_text('{"id": "q1", "question": "x", "answer": "y"}\n', encoding="utf-8")
    with pytest.raises(ConfigError, match=r"task ids \['q1'\] appear in both"):
        JsonlTasks({"path": str(TRAIN), "eval_path": str(clash)}).load("train")


def test_one_record_reader_for_core_and_plugins(tmp_path: Path) -> None:
    """``agent_r1.records.read_records`` (the reader of jsonl_tasks and the plugins' datasets and
    corpora): gzip-compressed files and ``{"data": [...]}`` JSON read like plain ones, a truncated
    gzip stream and a non-object record raise the caller's error type naming the file and line."""
    import gzip

    from agent_r1.records import read_records, split_key, tail_split

    rows = ['{"question": "a", "answer": 1}', '{"question": "b", "answer": 2}']
    packed = tmp_path / "rows.jsonl.gz"
    packed.write_bytes(gzip.compress("\n".join(rows).encode()))
    wrapped = tmp_path / "rows.json"
    wrapped.write_text('{"data": [' + ", ".join(rows) + "]}", encoding="utf-8")
    assert [t.answer for t in JsonlTasks({"path": str(packed)}).load("train")] == [1, 2]
    assert [t.id for t in JsonlTasks({"path": str(wrapped)}).load("train")] == ["rows:0", "rows:1"]

    class Mine(Exception):
        pass

    broken = tmp_path / "cut.jsonl.gz"
    broken.write_bytes(gzip.compress("\n".join(rows * 50).encode())[:-12])
    with pytest.raises(Mine, match=f"cannot read {broken}"):
        list(read_records(broken, error=Mine))
    listed = tmp_path / "listed.jsonl"
    listed.write_text(rows[0] + "\n\n[1]\n", encoding="utf-8")
    with pytest.raises(Mine, match=r"listed\.jsonl:3: expected a JSON object, got list"):
        list(read_records(listed, error=Mine))
    assert split_key("d", "validation") == "eval" and tail_split(
        list(range(10)), "eval", eval_size=None, eval_fraction=0.25
    ) == [7, 8, 9]
    assert tail_split([1], "eval", eval_size=5, eval_fraction=0.0) == []  # one row stays train
    with pytest.raises(Mine, match="dataset 'd' has no split 'dev2'"):
        split_key("d", "dev2", error=Mine)


def test_lazy_exports_import_on_first_use_and_refuse_a_bare_string() -> None:
    import sys

    from agent_r1.lazy import lazy_dir, lazy_getattr

    getter = lazy_getattr("agent_r1", {".records": ("read_records",)})
    assert getter("read_records") is sys.modules["agent_r1.records"].read_records
    assert "read_records" in lazy_dir("agent_r1", {".records": ("read_records",)})()
    with pytest.raises(AttributeError, match="module 'agent_r1' has no attribute 'nope'"):
        getter("nope")
    with pytest.raises(TypeError, match="must be a tuple of names"):
        lazy_getattr("agent_r1", {".records": ("read_records")})  # type: ignore[dict-item]
