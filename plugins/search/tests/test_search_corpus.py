"""Corpus formats, their errors, and the on-disk BM25 index cache."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from agent_r1_plugin_search.corpus import (
    CorpusError,
    Passage,
    file_sha256,
    read_passages,
    resolve_corpus_path,
)
from agent_r1_plugin_search.retrievers import BM25Retriever, RetrievalError, build_retriever


def _write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def test_bundled_corpora() -> None:
    hotpot = read_passages(resolve_corpus_path("hotpotqa"))
    assert len(hotpot) == 1975  # 200 questions x 10 paragraphs, shared ones kept once
    assert len({p.id for p in hotpot}) == len(hotpot)
    band = next(p for p in hotpot if p.title == "Tinted Windows (band)")
    assert band.id == "Tinted Windows (band)"
    assert band.text.startswith("Tinted Windows is an American rock supergroup")
    wiki = read_passages(resolve_corpus_path("wiki"))
    assert len(wiki) == 1000
    assert wiki[0] == Passage("0", "Evan Morris", wiki[0].text)
    assert wiki[0].text.startswith("Evan Morris Evan L. Morris")


def test_passage_formats(tmp_path: Path) -> None:
    rows = [
        {"id": 7, "contents": '"Quoted Title"\nsome text'},
        {"id": "b", "title": "Plain", "text": "more text"},
    ]
    path = _write_jsonl(tmp_path / "mixed.jsonl", rows)
    assert read_passages(path) == [
        Passage("7", "Quoted Title", "some text"),
        Passage("b", "Plain", "more text"),
    ]
    as_json = tmp_path / "list.json.gz"
    with gzip.open(as_json, "wt", encoding="utf-8") as handle:
        json.dump(rows, handle)
    assert read_passages(as_json) == read_passages(path)


def test_qa_formats_and_duplicates(tmp_path: Path) -> None:
    hf_layout = {"context": {"title": ["A", "B"], "sentences": [["A1.", " A2."], ["B1."]]}}
    original = {"context": [["A", ["A1.", " A2."]], ["C", ["C1."]]]}  # 'A' again, same text
    conflicting = {"context": [["A", ["A different paragraph."]]]}
    musique = {"paragraphs": [{"title": "D", "paragraph_text": "D text", "is_supporting": True}]}
    path = _write_jsonl(tmp_path / "qa.jsonl", [hf_layout, original, conflicting, musique])
    passages = read_passages(path)
    assert [(p.id, p.title, p.text) for p in passages] == [
        ("A", "A", "A1. A2."),
        ("B", "B", "B1."),
        ("C", "C", "C1."),
        ("A#2", "A", "A different paragraph."),
        ("D", "D", "D text"),
    ]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (
            '{"id": "1", "contents": "\\"T\\"\\nx"}\n{"id": "2"}\n',
            r"bad\.jsonl:2: a passage needs 'contents'",
        ),
        ('{"id": "1", "contents": "x"}\n{"id": "1", "contents": "y"}\n', r"bad\.jsonl:2: passage id '1'"),
        ('{"id": "1", "contents": "x"}\nnot json\n', r"bad\.jsonl:2: not valid JSON"),
        ('["a list"]\n', r"bad\.jsonl:1: expected a JSON object"),
        ('{"contents": 5}\n', r"bad\.jsonl:1: field 'contents' should be a str"),
        ('{"context": {"title": ["A"], "sentences": []}}\n', r"bad\.jsonl:1: context has 1 titles but 0"),
        ("\n\n", r"holds no passages"),
    ],
)
def test_corpus_errors_name_file_line_and_field(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(CorpusError, match=message):
        read_passages(path)


def test_missing_corpus_lists_bundled_names() -> None:
    with pytest.raises(CorpusError, match=r"does not exist \(bundled corpora: hotpotqa, wiki\)"):
        resolve_corpus_path("no/such/corpus.jsonl")


def test_index_cache_is_reused_and_keyed_by_content(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    corpus = _write_jsonl(
        tmp_path / "c.jsonl",
        [{"id": str(i), "contents": f'"Doc {i}"\nword{i} shared text'} for i in range(20)],
    )
    first = BM25Retriever.from_corpus(corpus, cache_dir=cache)
    assert not first.loaded_from_cache
    assert first.index_dir is not None and (first.index_dir / "DONE").is_file()
    second = BM25Retriever.from_corpus(corpus, cache_dir=cache)
    assert second.loaded_from_cache and second.index_dir == first.index_dir
    assert [h.id for h in second.search(["word3"], 2)[0]] == ["3"]
    # other settings -> another index; no temporary directories left behind
    stemmed_key = BM25Retriever.from_corpus(corpus, cache_dir=cache, k1=1.2).index_dir
    assert stemmed_key != first.index_dir
    assert not [p for p in cache.iterdir() if p.name.endswith(".tmp")]
    # changed content -> a new key, even with the same path
    _write_jsonl(corpus, [{"id": str(i), "contents": f'"Doc {i}"\nother{i} text'} for i in range(5)])
    changed = BM25Retriever.from_corpus(corpus, cache_dir=cache)
    assert not changed.loaded_from_cache and changed.index_dir != first.index_dir
    assert [h.id for h in changed.search(["other4"], 3)[0]] == ["4"]


def test_hash_memo_follows_modification(tmp_path: Path) -> None:
    path = tmp_path / "f.txt"
    path.write_text("one", encoding="utf-8")
    first = file_sha256(path, memo_dir=tmp_path / "memo")
    assert file_sha256(path, memo_dir=tmp_path / "memo") == first
    path.write_text("two!", encoding="utf-8")
    assert file_sha256(path, memo_dir=tmp_path / "memo") != first


def test_bm25_search_edge_cases(hotpot_bm25: BM25Retriever) -> None:
    assert hotpot_bm25.search([], 3) == []
    results = hotpot_bm25.search(["", "the of and", "zzzqqqxxx", "Tinted Windows band"], 3)
    assert results[:3] == [[], [], []]  # nothing, stop words only, unknown words
    assert len(results[3]) == 3 and results[3][0].title.startswith("Tinted Windows")
    assert results[3][0].score >= results[3][1].score >= results[3][2].score > 0
    assert len(hotpot_bm25.search(["Tinted Windows"], 5000)[0]) <= 1975
    with pytest.raises(RetrievalError, match="topk must be a positive integer"):
        hotpot_bm25.search(["x"], 0)


def test_retriever_config_errors() -> None:
    with pytest.raises(RetrievalError, match="kind='http' needs url"):
        build_retriever({"kind": "http"})
    with pytest.raises(RetrievalError, match="kind: Input should be 'bm25', 'dense', 'faiss' or 'http'"):
        build_retriever({"kind": "elastic"})
    with pytest.raises(RetrievalError, match="kind='faiss' needs index"):
        build_retriever({"kind": "faiss"})
    with pytest.raises(RetrievalError, match="stemmer"):
        build_retriever({"stemmer": "porter"})


def test_cached_index_of_another_size_is_refused(tmp_path: Path) -> None:
    corpus = _write_jsonl(
        tmp_path / "c.jsonl", [{"id": str(i), "contents": f'"D{i}"\nw{i}'} for i in range(6)]
    )
    built = BM25Retriever.from_corpus(corpus, cache_dir=tmp_path / "cache")
    with pytest.raises(RetrievalError, match=r"holds 6 passages but the corpus has 3; delete the directory"):
        BM25Retriever(built.passages[:3], index_dir=built.index_dir)
