"""``parquet_tasks`` and ``hf_datasets``: tasks from Parquet files and from anything the Hugging Face
``datasets`` library loads (local files, ``save_to_disk`` directories, builders with
``data_files``), with the column mapping of ``jsonl_tasks`` (question or messages column, answer,
id and category columns, dotted paths into nested columns).

Real files throughout, written with pyarrow and ``datasets``; no hub access (this machine has
none). ``load_dataset`` caches into ``tmp_path`` (``load_kwargs.cache_dir``)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from agent_r1 import ConfigError
from agent_r1.builtins.datasets import HfDatasetTasks, JsonlTasks, ParquetTasks
from agent_r1.config import RunConfig, validate_components
from agent_r1.testing import check_dataset

pa = pytest.importorskip("pyarrow", reason="pip install 'agent-r1[parquet]'")
pq = pytest.importorskip("pyarrow.parquet", reason="pip install 'agent-r1[parquet]'")


def verl_rows(count: int, start: int = 0) -> list[dict[str, Any]]:
    """Rows shaped like verl's data files: chat messages under ``prompt``, the answer nested in
    ``reward_model``, the index nested in ``extra_info``."""
    return [
        {
            "data_source": "arith",
            "prompt": [
                {"role": "system", "content": "Answer with a number."},
                {"role": "user", "content": f"What is {i} + {i}?"},
            ],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": str(2 * i)},
            "extra_info": {"index": i, "split": "train"},
        }
        for i in range(start, start + count)
    ]


def plain_rows(count: int, start: int = 0) -> list[dict[str, Any]]:
    return [
        {"qid": f"q{i}", "problem": f"{i} x 3?", "solution": str(3 * i), "level": i % 2}
        for i in range(start, start + count)
    ]


def write_parquet(path: Path, rows: list[dict[str, Any]]) -> Path:
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


# --------------------------------------------------------------------------------------------
# parquet_tasks
# --------------------------------------------------------------------------------------------


def test_a_verl_parquet_file_loads_with_messages_and_nested_columns(tmp_path: Path) -> None:
    train = write_parquet(tmp_path / "train.parquet", verl_rows(3))
    test = write_parquet(tmp_path / "test.parquet", verl_rows(2, start=10))
    config = {
        "path": str(train),
        "eval_path": str(test),
        "messages_field": "prompt",
        "answer_field": "reward_model.ground_truth",
        "id_field": "extra_info.index",
        "category_field": "ability",
    }
    tasks = check_dataset(ParquetTasks, config=config, splits=("train", "eval"))
    first = tasks["train"][0]
    assert first.id == "0" and first.answer == "0" and first.category == "math"
    assert first.messages == [
        {"role": "system", "content": "Answer with a number."},
        {"role": "user", "content": "What is 0 + 0?"},
    ]
    assert first.metadata["source"] == f"{train}[row 0]"
    assert first.metadata["data_source"] == "arith" and "prompt" not in first.metadata
    assert [(t.id, t.answer) for t in tasks["eval"]] == [("10", "20"), ("11", "22")]


def test_a_question_column_fills_the_user_template(tmp_path: Path) -> None:
    path = write_parquet(tmp_path / "plain.parquet", plain_rows(10))
    dataset = ParquetTasks(
        {
            "path": str(path),
            "question_field": "problem",
            "answer_field": "solution",
            "id_field": None,
            "system_prompt": "Be exact.",
            "user_template": "Level {level}: {question}",
            "eval_fraction": 0.2,
        }
    )
    train, held_out = dataset.load("train"), dataset.load("eval")
    assert len(train) == 8 and len(held_out) == 2
    assert not {t.id for t in train} & {t.id for t in held_out}
    task = next(t for t in train + held_out if t.id == "plain:3")  # no id column: <stem>:<row>
    assert task.messages == [
        {"role": "system", "content": "Be exact."},
        {"role": "user", "content": "Level 1: 3 x 3?"},
    ]
    assert task.answer == "9" and task.metadata["qid"] == "q3"


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({}, "no field 'question' (fields: ability, data_source, extra_info, prompt, reward_model)"),
        (
            {"question_field": "prompt"},
            "field 'prompt' holds chat messages, not a question; set data.messages_field: prompt",
        ),
        (
            {"messages_field": "prompt", "answer_field": "reward_model.answer"},
            "no field 'reward_model.answer'",
        ),
        (
            {"messages_field": "data_source", "answer_field": None},
            "field 'data_source' must hold a list of chat messages",
        ),
        (
            {"messages_field": "prompt", "answer_field": None, "system_prompt": "Hi."},
            "the messages already start with a system message",
        ),
    ],
)
def test_column_problems_name_the_file_and_row(
    tmp_path: Path, options: dict[str, Any], expected: str
) -> None:
    path = write_parquet(tmp_path / "rows.parquet", verl_rows(2))
    with pytest.raises(ConfigError) as caught:
        ParquetTasks({"path": str(path), **options}).load("train")
    assert f"{path}[row 0]: " in str(caught.value)
    assert expected in str(caught.value)


def test_file_problems_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"data\.path: task file '.*nowhere\.parquet' does not exist"):
        ParquetTasks({"path": str(tmp_path / "nowhere.parquet")}).load("train")
    garbage = tmp_path / "garbage.parquet"
    garbage.write_bytes(b"this is not parquet")
    with pytest.raises(ConfigError, match=r"'.*garbage\.parquet' is not a readable Parquet file"):
        ParquetTasks({"path": str(garbage)}).load("train")
    real = write_parquet(tmp_path / "real.parquet", plain_rows(1))
    with pytest.raises(
        ConfigError,
        match=r"is a Parquet file; jsonl_tasks reads JSONL and JSON\. Use data\.name: parquet_tasks",
    ):
        JsonlTasks({"path": str(real)}).load("train")


def test_without_pyarrow_the_error_names_the_extra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # pyarrow is installed here; a None entry in sys.modules makes `import pyarrow` fail exactly as
    # on a machine without it
    path = write_parquet(tmp_path / "rows.parquet", plain_rows(1))
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(ConfigError, match=r"pip install 'agent-r1\[parquet\]'") as caught:
        ParquetTasks({"path": str(path)}).load("train")
    assert caught.value.path == "data.name"


# --------------------------------------------------------------------------------------------
# hf_datasets
# --------------------------------------------------------------------------------------------


@pytest.fixture
def datasets() -> Any:
    return pytest.importorskip("datasets", reason="pip install 'agent-r1[datasets]'")


def test_a_save_to_disk_directory_with_named_splits(tmp_path: Path, datasets: Any) -> None:
    directory = tmp_path / "saved"
    datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_list(verl_rows(3)),
            "test": datasets.Dataset.from_list(verl_rows(2, start=5)),
        }
    ).save_to_disk(str(directory))
    config = {
        "path": str(directory),
        "eval_split": "test",
        "messages_field": "prompt",
        "answer_field": "reward_model.ground_truth",
        "id_field": "extra_info.index",
    }
    tasks = check_dataset(HfDatasetTasks, config=config, splits=("train", "eval"))
    assert [(t.id, t.answer) for t in tasks["train"]] == [("0", "0"), ("1", "2"), ("2", "4")]
    assert [t.id for t in tasks["eval"]] == ["5", "6"]
    assert tasks["eval"][0].messages[1] == {"role": "user", "content": "What is 5 + 5?"}
    assert tasks["eval"][0].metadata["source"] == f"load_from_disk({str(directory)!r}) split 'test' row 0"
    with pytest.raises(ConfigError, match=r"has no split 'validation'; its splits are train, test") as caught:
        HfDatasetTasks({**config, "eval_split": "validation"}).load("train")
    assert caught.value.path == "data.eval_split"
    with pytest.raises(ConfigError, match=r"load_from_disk, which takes no data_files"):
        HfDatasetTasks({**config, "data_files": "x.json"}).load("train")


def test_a_single_saved_dataset_and_a_held_out_fraction(tmp_path: Path, datasets: Any) -> None:
    directory = tmp_path / "one"
    datasets.Dataset.from_list(plain_rows(10)).save_to_disk(str(directory))
    options = {
        "path": str(directory),
        "question_field": "problem",
        "answer_field": "solution",
        "id_field": "qid",
    }
    dataset = HfDatasetTasks({**options, "eval_fraction": 0.3})
    assert len(dataset.load("train")) == 7 and len(dataset.load("eval")) == 3
    with pytest.warns(UserWarning, match="has no eval split .*data.eval_split or data.eval_fraction"):
        assert HfDatasetTasks(options).load("eval") == []
    with pytest.raises(ConfigError, match="a single dataset without named splits"):
        HfDatasetTasks({**options, "eval_split": "test"}).load("train")


def test_local_data_files_through_load_dataset(tmp_path: Path, datasets: Any) -> None:
    cache = {"cache_dir": str(tmp_path / "hf-cache")}
    csv_file = tmp_path / "problems.csv"
    csv_file.write_text("qid,problem,solution\nc1,1 + 1?,2\nc2,2 + 2?,4\n", encoding="utf-8")
    options = {
        "question_field": "problem",
        "answer_field": "solution",
        "id_field": "qid",
        "load_kwargs": cache,
    }
    tasks = HfDatasetTasks({"path": str(csv_file), **options}).load("train")
    assert [(t.id, t.messages[-1]["content"], t.answer) for t in tasks] == [
        ("c1", "1 + 1?", 2),
        ("c2", "2 + 2?", 4),
    ]

    train, test = tmp_path / "train.jsonl", tmp_path / "test.jsonl"
    train.write_text('{"qid": "j1", "problem": "a?", "solution": "A"}\n', encoding="utf-8")
    test.write_text('{"qid": "j2", "problem": "b?", "solution": "B"}\n', encoding="utf-8")
    dataset = HfDatasetTasks(
        {
            "path": "json",
            "data_files": {"train": str(train), "test": str(test)},
            "eval_split": "test",
            **options,
        }
    )
    assert [t.id for t in dataset.load("train")] == ["j1"] and [t.id for t in dataset.load("eval")] == ["j2"]


def test_hf_datasets_problems_are_config_errors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, datasets: Any
) -> None:
    with pytest.raises(ConfigError, match=r"data\.path: './nowhere' does not exist"):
        HfDatasetTasks({"path": "./nowhere"}).load("train")
    odd = tmp_path / "rows.xyz"
    odd.write_text("x", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"cannot tell the format of .*rows\.xyz"):
        HfDatasetTasks({"path": str(odd)}).load("train")
    data_file = tmp_path / "rows.json"
    data_file.write_text('[{"question": "a", "answer": "b"}]', encoding="utf-8")
    with pytest.raises(ConfigError, match=r"is already a data file"):
        HfDatasetTasks({"path": str(data_file), "data_files": str(data_file)}).load("train")
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"question": "a"\n', encoding="utf-8")
    with pytest.raises(
        ConfigError, match=r"data\.path: load_dataset\('json', data_files='.*broken\.jsonl'\) failed"
    ):
        HfDatasetTasks({"path": str(broken), "load_kwargs": {"cache_dir": str(tmp_path / "c")}}).load("train")
    with pytest.raises(ValueError, match="set eval_split or eval_fraction, not both"):
        HfDatasetTasks.Config(path="x", eval_split="test", eval_fraction=0.1)
    # datasets is installed here; a None entry in sys.modules makes the import fail as without it
    monkeypatch.setitem(sys.modules, "datasets", None)
    with pytest.raises(
        ConfigError, match=r"needs the Hugging Face datasets library.*pip install 'agent-r1\[datasets\]'"
    ):
        HfDatasetTasks({"path": str(data_file)}).load("train")


def test_the_new_datasets_are_bundled_components(tmp_path: Path, builtin_registry: Any) -> None:
    path = write_parquet(tmp_path / "rows.parquet", plain_rows(2))
    config = RunConfig.model_validate(
        {
            "data": {
                "name": "parquet_tasks",
                "path": str(path),
                "question_field": "problem",
                "answr_field": "x",
            }
        }
    )
    with pytest.raises(ConfigError, match=r"data\.answr_field.*Did you mean 'answer_field'"):
        validate_components(config, builtin_registry)
    config = RunConfig.model_validate(
        {
            "data": {
                "name": "hf_datasets",
                "path": str(path),
                "question_field": "problem",
                "answer_field": "solution",
            }
        }
    )
    (data,) = [c for c in validate_components(config, builtin_registry) if c.path == "data"]
    assert data.cls is HfDatasetTasks
    assert data.cls.provenance is not None and data.cls.provenance.plugin == "builtins"
