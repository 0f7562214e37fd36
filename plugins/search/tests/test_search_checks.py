"""Silent conversions and unclear errors, fixed: list-valued MuSiQue answers, question files given as
corpora, recall on data without gold paragraphs; and the ``check`` classmethod a preflight calls."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from agent_r1_plugin_search.corpus import CorpusError, bundled_path, read_passages
from agent_r1_plugin_search.datasets import MuSiQueDataset
from agent_r1_plugin_search.tool import SearchTool


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def test_musique_list_answer_becomes_aliases_not_python_text(tmp_path: Path) -> None:
    path = _jsonl(
        tmp_path / "musique.jsonl",
        [
            {
                "id": "2hop__1_2",
                "question": "Who?",
                "answer": ["Steve Hillage", "Hillage"],
                "answer_aliases": ["S. Hillage"],
            },
            {"id": "2hop__3_4", "question": "When?", "answer": "1990", "answer_aliases": []},
        ],
    )
    first, second = MuSiQueDataset({"path": str(path)}).load("all")
    assert first.answer == ["Steve Hillage", "Hillage", "S. Hillage"]
    assert not any("[" in alias for alias in first.answer)
    assert second.answer == ["1990"]


def test_musique_answer_of_another_type_is_an_error(tmp_path: Path) -> None:
    path = _jsonl(tmp_path / "bad.jsonl", [{"id": "x", "question": "Who?", "answer": [{"text": "A"}]}])
    with pytest.raises(CorpusError, match=r"bad.jsonl:1: field 'answer' should hold strings .* got dict"):
        MuSiQueDataset({"path": str(path)}).load("all")


@pytest.mark.parametrize(
    ("name", "dataset"), [("2wikimultihopqa", "2WikiMultihopQA"), ("musique", "MuSiQue")]
)
def test_question_file_given_as_corpus_says_it_has_no_paragraphs(name: str, dataset: str) -> None:
    with pytest.raises(CorpusError) as error:
        read_passages(bundled_path(name))
    message = str(error.value)
    assert f":1: this is a {dataset} question record" in message
    assert "it carries no paragraphs, so the file cannot be a search corpus" in message
    assert "'paragraphs' for MuSiQue" in message  # what to give instead
    # the bundled name used as a corpus name says the same
    problems = SearchTool.check({"retriever": {"corpus": name}})
    assert problems == [
        f"retriever.corpus: the bundled {name!r} sample holds questions without paragraphs, "
        "so it cannot be a search corpus. " + message.split("search corpus. ", 1)[1]
    ]


def test_musique_with_paragraphs_is_a_corpus(tmp_path: Path) -> None:
    path = _jsonl(
        tmp_path / "musique_full.jsonl",
        [
            {
                "id": "2hop__1_2",
                "question": "Who?",
                "answer": "A",
                "paragraphs": [{"title": "T", "paragraph_text": "text", "is_supporting": True}],
            }
        ],
    )
    assert [p.title for p in read_passages(path)] == ["T"]
    assert SearchTool.check({"retriever": {"corpus": str(path)}}) == []


def test_check_reports_corpus_problems(tmp_path: Path) -> None:
    assert SearchTool.check({}) == []  # the bundled hotpotqa corpus
    assert SearchTool.check(SearchTool.Config(retriever={"corpus": "wiki"})) == []  # a validated config
    assert SearchTool.check({"retriever": {"kind": "http", "url": "http://127.0.0.1:1"}}) == []
    missing = tmp_path / "missing.jsonl"
    (problem,) = SearchTool.check({"retriever": {"corpus": str(missing)}})
    assert problem.startswith("retriever.corpus: corpus file ") and "does not exist" in problem
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert SearchTool.check({"retriever": {"corpus": str(empty)}}) == [
        f"retriever.corpus: corpus file {str(empty)!r} is empty"
    ]
    blank = tmp_path / "blank.jsonl"
    blank.write_text("\n\n")
    assert SearchTool.check({"retriever": {"corpus": str(blank)}}) == [
        f"retriever.corpus: corpus file {str(blank)!r} holds no records"
    ]
    broken = _jsonl(tmp_path / "broken.jsonl", [{"id": "1", "body": "no text field"}])
    (problem,) = SearchTool.check({"retriever": {"corpus": str(broken)}})
    assert "broken.jsonl:1: a passage needs 'contents'" in problem
    (problem,) = SearchTool.check({"retriever": {"kind": "faiss", "corpus": "wiki", "index": str(missing)}})
    assert problem == f"retriever.index: FAISS index {str(missing)!r} does not exist"


def test_search_qa_environment_reaches_the_tool_check() -> None:
    """The preflight walks ``requires``: the search tool's options there carry the environment's
    retriever shortcut, so the tool's check sees the corpus the environment was given."""
    from agent_r1.registry import get_registry

    cls = get_registry().get("environments", "search_qa")
    config = cls.Config.model_validate({"retriever": {"corpus": "musique"}})
    (tool,) = [item for item in cls.requires(config) if item[0] == "tools"]
    (problem,) = SearchTool.check(tool[2])
    assert "the bundled 'musique' sample holds questions without paragraphs" in problem


def test_recall_without_supporting_titles_is_an_error_not_a_traceback() -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "agent_r1_plugin_search",
            "recall",
            "--dataset",
            "2wikimultihopqa",
            "--corpus",
            "wiki",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert done.stderr.startswith(
        "agent-r1-search: error: none of the 100 questions (2wikimultihopqa) names its supporting paragraphs"
    )


def test_eval_only_dataset_never_trains() -> None:
    from agent_r1.registry import get_registry

    mix = get_registry().build(
        "datasets",
        "qa_mix",
        {"datasets": [{"name": "hotpotqa", "limit": 3}, {"name": "musique", "use_for": "eval", "limit": 3}]},
    )
    assert {t.metadata["dataset"] for t in mix.load("train")} == {"hotpotqa"}
    evaluated = mix.load("eval")
    assert [t.metadata["dataset"] for t in evaluated] == ["hotpotqa", "musique"] * 3
    assert len(MuSiQueDataset({"use_for": "eval"}).load("eval")) == 100  # every row, none held for training


def test_the_run_preflight_reports_a_question_file_as_corpus(tmp_path: Path) -> None:
    """The run's preflight (run by ``agent-r1 train`` / ``check`` before any model loads) reaches the
    tool's check through the environment and stops on a question file given as the corpus."""
    from agent_r1 import AgentR1Error
    from agent_r1.run.training import prepare
    from agent_r1.testing.models import save_tiny_model, tiny_model, tiny_tokenizer

    tokenizer = tiny_tokenizer()
    model_dir = save_tiny_model(tmp_path / "model", tiny_model(tokenizer, seed=0), tokenizer)
    config = Path(__file__).resolve().parents[1] / "configs" / "hotpotqa_bm25.yaml"
    overrides = [
        "environment.retriever={kind: bm25, corpus: musique}",
        f"model.path={model_dir}",
        f"output_dir={tmp_path / 'run'}",
    ]
    with pytest.raises(AgentR1Error) as error:
        prepare(config, overrides)
    assert (
        "environment.tools[0] (search): retriever.corpus: the bundled 'musique' sample holds questions"
        in str(error.value)
    )
    assert not (tmp_path / "run").exists()  # nothing created
