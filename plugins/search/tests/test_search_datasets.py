"""QA dataset loaders on every bundled format, other layouts, splits and errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent_r1_plugin_search.corpus import CorpusError
from agent_r1_plugin_search.datasets import (
    HotpotQADataset,
    MuSiQueDataset,
    NQDataset,
    TwoWikiMultihopQADataset,
)


def _write_jsonl(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return str(path)


def test_bundled_hotpotqa() -> None:
    dataset = HotpotQADataset()
    tasks = dataset.load("all")
    assert len(tasks) == 200
    first = tasks[0]
    assert first.id == "5a8ce55f554299441c6b9f62"
    assert first.messages == [
        {
            "role": "user",
            "content": 'The band who released the debut album "Tinted Windows" had their first '
            "performance in what city?",
        }
    ]
    assert first.answer == ["Tulsa"]
    assert first.category == "hotpotqa/bridge"
    assert first.metadata["supporting_titles"] == ["Tinted Windows (album)", "Tinted Windows (band)"]
    assert first.metadata["level"] == "hard" and first.metadata["dataset"] == "hotpotqa"
    assert {t.category for t in tasks} == {"hotpotqa/bridge", "hotpotqa/comparison"}
    assert all(len(t.metadata["supporting_titles"]) == 2 for t in tasks)
    # default split: the last quarter is eval, the rest train, disjoint and in file order
    train, evaluation = dataset.load("train"), dataset.load("eval")
    assert (len(train), len(evaluation)) == (150, 50)
    assert [t.id for t in train + evaluation] == [t.id for t in tasks]
    assert [t.id for t in dataset.load("validation")] == [t.id for t in evaluation]


def test_bundled_2wiki_keeps_alias_lists() -> None:
    tasks = TwoWikiMultihopQADataset().load("all")
    assert len(tasks) == 100
    by_id = {t.id: t for t in tasks}
    assert by_id["1"].answer == ["Mask of Fu Manchu", "The Mask of Fu Manchu"]
    assert by_id["2"].answer == ["12 June 1516"]  # a bare string becomes one alias
    assert by_id["6"].answer == ["Galati", "Galaţi", "Galac", "Galatz", "Galați"]
    assert by_id["0"].category == "2wikimultihopqa"
    assert by_id["0"].metadata["supporting_titles"] == []  # the sample has no evidence


def test_bundled_musique() -> None:
    tasks = MuSiQueDataset().load("all")
    assert len(tasks) == 100
    first = tasks[0]
    assert first.id == "2hop__460946_294723"
    assert first.answer == ["Miquette Giraudy"]
    assert first.category == "musique/2hop" and first.metadata["hops"] == 2
    assert first.metadata["supporting_titles"] == ["Green (Steve Hillage album)", "Miquette Giraudy"]
    assert first.metadata["decomposition"][0] == {"question": "Green >> performer", "answer": "Steve Hillage"}


def test_bundled_nq_toy() -> None:
    tasks = NQDataset().load("all")
    assert len(tasks) == 17
    assert tasks[0].answer == ["Wilhelm Conrad Röntgen"]
    assert tasks[6].answer == ["Xiu Li Dai", "Dai Xiuli", "Dai Yongge", "Yongge Dai"]
    assert tasks[0].category == "nq"
    assert NQDataset({"category": "triviaqa"}).load("all")[0].category == "triviaqa"


def test_original_layouts(tmp_path: Path) -> None:
    hotpot = {
        "_id": "h1",
        "question": "Q?",
        "answer": "yes",
        "type": "comparison",
        "supporting_facts": [["A", 0], ["B", 1], ["A", 2]],
        "context": [["A", ["a."]], ["B", ["b."]]],
    }
    path = tmp_path / "hotpot.json"
    path.write_text(json.dumps([hotpot]), encoding="utf-8")
    (task,) = HotpotQADataset({"path": str(path)}).load("all")
    assert task.id == "h1" and task.answer == ["yes"] and task.category == "hotpotqa/comparison"
    assert task.metadata["supporting_titles"] == ["A", "B"]

    wiki2 = {
        "_id": "w1",
        "type": "compositional",
        "question": "Q?",
        "answer": "X",
        "supporting_facts": [["T", 0]],
    }
    (task,) = TwoWikiMultihopQADataset({"path": _write_jsonl(tmp_path / "2w.jsonl", [wiki2])}).load("all")
    assert task.category == "2wikimultihopqa/compositional" and task.metadata["supporting_titles"] == ["T"]

    musique = [
        {
            "id": "3hop1__1_2_3",
            "question": "Q?",
            "answer": "X",
            "answer_aliases": ["Ex", "X"],
            "answerable": True,
            "paragraphs": [
                {"idx": 0, "title": "P0", "paragraph_text": "...", "is_supporting": False},
                {"idx": 1, "title": "P1", "paragraph_text": "...", "is_supporting": True},
            ],
        },
        {"id": "2hop__9", "question": "Unanswerable?", "answer": "Y", "answerable": False},
    ]
    path = _write_jsonl(tmp_path / "mq.jsonl", musique)
    tasks = MuSiQueDataset({"path": path}).load("all")
    assert len(tasks) == 1  # unanswerable rows are skipped by default
    assert tasks[0].answer == ["X", "Ex"] and tasks[0].category == "musique/3hop"
    assert tasks[0].metadata["supporting_titles"] == ["P1"]
    assert len(MuSiQueDataset({"path": path, "keep_unanswerable": True}).load("all")) == 2

    flashrag = {"id": "t1", "question": "Q?", "golden_answers": ["A", "a", " A "]}
    (task,) = NQDataset({"path": _write_jsonl(tmp_path / "nq.jsonl", [flashrag])}).load("all")
    assert task.answer == ["A", "a"]  # duplicates and padding removed, case kept


def test_splits_with_eval_path_and_limits(tmp_path: Path) -> None:
    rows = [{"id": str(i), "question": f"q{i}?", "golden_answers": [str(i)]} for i in range(10)]
    train = _write_jsonl(tmp_path / "train.jsonl", rows[:7])
    evaluation = _write_jsonl(tmp_path / "dev.jsonl", rows[7:])
    dataset = NQDataset({"path": train, "eval_path": evaluation, "limit": 5})
    assert [t.id for t in dataset.load("train")] == ["0", "1", "2", "3", "4"]
    assert [t.id for t in dataset.load("test")] == ["7", "8", "9"]
    assert len(NQDataset({"path": train, "eval_path": evaluation}).load("all")) == 10
    sized = NQDataset({"path": train, "eval_size": 2})
    assert [t.id for t in sized.load("eval")] == ["5", "6"]
    with pytest.raises(CorpusError, match="has no split 'holdout'; use train, eval or all"):
        dataset.load("holdout")


@pytest.mark.parametrize(
    ("cls", "row", "message"),
    [
        (HotpotQADataset, {"id": "x", "answer": "a"}, r"bad\.jsonl:2: missing field 'question'"),
        (HotpotQADataset, {"id": "x", "question": "q?"}, r"bad\.jsonl:2: missing field 'answer'"),
        (
            HotpotQADataset,
            {"id": "x", "question": "  ", "answer": "a"},
            r"'question' should be a non-empty string",
        ),
        (
            NQDataset,
            {"question": "q?", "golden_answers": []},
            r"bad\.jsonl:2: field 'golden_answers' holds no answer",
        ),
        (
            NQDataset,
            {"question": "q?", "golden_answers": 5},
            r"should be a string or a list of strings, got 5",
        ),
        (
            TwoWikiMultihopQADataset,
            {"question": "q?"},
            r"bad\.jsonl:2: missing field 'answer' or 'golden_answers'",
        ),
    ],
)
def test_row_errors_name_file_line_and_field(tmp_path: Path, cls, row: dict, message: str) -> None:
    good = {"id": "ok", "question": "fine?", "answer": "a", "golden_answers": ["a"]}
    path = _write_jsonl(tmp_path / "bad.jsonl", [good, row])
    with pytest.raises(CorpusError, match=message):
        cls({"path": path}).load("all")


def test_missing_file_and_unknown_format(tmp_path: Path) -> None:
    with pytest.raises(CorpusError, match=r"data file '.*nope\.jsonl' does not exist"):
        NQDataset({"path": str(tmp_path / "nope.jsonl")}).load("train")
    parquet = tmp_path / "data.parquet"
    parquet.write_bytes(b"PAR1")
    try:
        import datasets  # noqa: F401
    except ImportError:
        with pytest.raises(CorpusError, match="install the `datasets` library"):
            NQDataset({"path": str(parquet)}).load("train")
    else:
        with pytest.raises(CorpusError, match="could not load"):
            NQDataset({"path": str(parquet)}).load("train")


def test_datasets_library_reads_other_formats(tmp_path: Path) -> None:
    pytest.importorskip("datasets", reason="the `datasets` library is not installed (optional)")
    import pandas as pd

    frame = pd.DataFrame(
        {"id": ["a", "b"], "question": ["q1?", "q2?"], "golden_answers": [["x"], ["y", "z"]]}
    )
    frame.to_parquet(tmp_path / "nq.parquet")
    tasks = NQDataset({"path": str(tmp_path / "nq.parquet")}).load("all")
    assert [t.answer for t in tasks] == [["x"], ["y", "z"]]


def test_unknown_config_key_is_an_error() -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="eval_fracton"):
        HotpotQADataset({"eval_fracton": 0.1})


def test_qa_mix_interleaves_and_prefixes(tmp_path: Path) -> None:
    from agent_r1_plugin_search.datasets import QAMixDataset

    mix = QAMixDataset({"datasets": [{"name": "hotpotqa", "limit": 3}, {"name": "nq", "eval_size": 2}]})
    hotpot, nq = HotpotQADataset({"limit": 3}).load("eval"), NQDataset({"eval_size": 2}).load("eval")
    tasks = mix.load("eval")
    # round-robin: hotpotqa, nq, hotpotqa, nq, hotpotqa (nq has only 2 eval tasks)
    assert [t.id for t in tasks] == [
        f"hotpotqa:{hotpot[0].id}",
        f"nq:{nq[0].id}",
        f"hotpotqa:{hotpot[1].id}",
        f"nq:{nq[1].id}",
        f"hotpotqa:{hotpot[2].id}",
    ]
    assert [t.answer for t in tasks[:2]] == [hotpot[0].answer, nq[0].answer]
    assert {t.category.split("/")[0] for t in tasks} == {"hotpotqa", "nq"}
    assert tasks[0].metadata == hotpot[0].metadata  # supporting titles etc. kept
    assert len(mix.load("train")) == 3 + 15
    # the same dataset twice (two NQ-format files, say) keeps ids unique
    twice = QAMixDataset({"datasets": [{"name": "nq", "limit": 2}, {"name": "nq", "limit": 2}]})
    assert [t.id.split(":")[0] for t in twice.load("train")] == ["nq[0]", "nq[1]", "nq[0]", "nq[1]"]


def test_qa_mix_checks_its_datasets_with_the_run_config() -> None:
    from agent_r1 import ConfigError
    from agent_r1.config import RunConfig, validate_components

    good = RunConfig.model_validate({"data": {"name": "qa_mix", "datasets": [{"name": "hotpotqa"}]}})
    paths = [c.path for c in validate_components(good)]
    assert "data.datasets[0]" in paths
    for datasets, message in (
        ([{"name": "hotpotqa", "limt": 3}], "data.datasets[0].limt: unknown key"),
        ([{"name": "hotpotq"}], "data.datasets[0].name"),
        ([], "data.datasets"),
    ):
        bad = RunConfig.model_validate({"data": {"name": "qa_mix", "datasets": datasets}})
        with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
            validate_components(bad)
