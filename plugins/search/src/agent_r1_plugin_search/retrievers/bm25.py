"""In-process BM25 (``bm25s``) over a local corpus; the index is built once and cached on disk
under a key made of the corpus's SHA-256 and the index settings."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from agent_r1_plugin_search.corpus import CorpusFormat, Hit, Passage
from agent_r1_plugin_search.retrievers.base import RetrievalError, Retriever, check_topk
from agent_r1_plugin_search.retrievers.cache import cached_corpus, publish_dir

__all__ = ["BM25Retriever"]


class BM25Retriever(Retriever):
    """BM25 over a list of passages with ``bm25s``.

    Titles are indexed with the text (``"Title"\\ntext``), English stop words are dropped, and
    stemming is optional (``stemmer="english"`` needs the ``PyStemmer`` package, extra ``stem``).
    Hits with a score of zero (no query term in the passage) are not returned.
    """

    name = "bm25"

    def __init__(
        self,
        passages: Sequence[Passage],
        *,
        k1: float = 1.5,
        b: float = 0.75,
        method: str = "lucene",
        stemmer: Literal["none", "english"] = "none",
        index_dir: Path | None = None,
    ) -> None:
        import bm25s

        self.passages = list(passages)
        self.settings = {"k1": k1, "b": b, "method": method, "stemmer": stemmer}
        self._stemmer = _make_stemmer(stemmer)
        self.index_dir = index_dir
        self.loaded_from_cache = False
        if index_dir is not None and (index_dir / "DONE").is_file():
            self._model = bm25s.BM25.load(str(index_dir), load_corpus=False, mmap=False)
            self.loaded_from_cache = True
            if int(self._model.scores.get("num_docs", len(self.passages))) != len(self.passages):
                raise RetrievalError(
                    f"cached BM25 index {index_dir} holds {self._model.scores.get('num_docs')} passages "
                    f"but the corpus has {len(self.passages)}; delete the directory to rebuild it"
                )
        else:
            self._model = bm25s.BM25(k1=k1, b=b, method=method)
            tokens = bm25s.tokenize(
                [f"{p.title}\n{p.text}" for p in self.passages],
                stopwords="en",
                stemmer=self._stemmer,
                show_progress=False,
            )
            self._model.index(tokens, show_progress=False)
            if index_dir is not None:
                temporary = index_dir.with_name(f".{index_dir.name}.{uuid.uuid4().hex}.tmp")
                temporary.mkdir(parents=True)
                self._model.save(str(temporary), show_progress=False)
                (temporary / "DONE").write_text(json.dumps(self.settings), encoding="utf-8")
                publish_dir(temporary, index_dir)

    @classmethod
    def from_corpus(
        cls,
        corpus: str | os.PathLike[str],
        *,
        corpus_format: CorpusFormat = "auto",
        cache_dir: str | os.PathLike[str] | None = None,
        use_cache: bool = True,
        k1: float = 1.5,
        b: float = 0.75,
        method: str = "lucene",
        stemmer: Literal["none", "english"] = "none",
    ) -> BM25Retriever:
        """Read a corpus file (or bundled corpus name) and load its cached index, or build it."""
        settings = {"k1": k1, "b": b, "method": method, "stemmer": stemmer, "format": corpus_format}
        passages, index_dir = cached_corpus(
            corpus, corpus_format, cache_dir=cache_dir, use_cache=use_cache, kind="bm25", settings=settings
        )
        return cls(passages, k1=k1, b=b, method=method, stemmer=stemmer, index_dir=index_dir)

    def search(self, queries: Sequence[str], topk: int) -> list[list[Hit]]:
        import bm25s

        check_topk(topk)
        queries = list(queries)
        if not queries:
            return []
        k = min(topk, len(self.passages))
        tokens = bm25s.tokenize(
            [str(q) for q in queries],
            stopwords="en",
            stemmer=self._stemmer,
            return_ids=False,
            show_progress=False,
        )
        known = self._model.vocab_dict
        tokens = [[t for t in query if t in known] for query in tokens]
        results: list[list[Hit]] = [[] for _ in queries]
        todo = [i for i, query in enumerate(tokens) if query]
        if not todo:
            return results
        documents, scores = self._model.retrieve(
            [tokens[i] for i in todo], k=k, show_progress=False, n_threads=1
        )
        for row, i in enumerate(todo):
            results[i] = [
                Hit.of(self.passages[int(doc)], float(score))
                for doc, score in zip(documents[row], scores[row], strict=True)
                if score > 0
            ]
        return results

    def describe(self) -> dict[str, Any]:
        return {"retriever": self.name, "passages": len(self.passages), **self.settings}


def _make_stemmer(stemmer: str) -> Any:
    if stemmer == "none":
        return None
    if stemmer != "english":
        raise RetrievalError(f"unknown stemmer {stemmer!r}; use 'none' or 'english'")
    try:
        import Stemmer
    except ImportError:
        raise RetrievalError(
            "stemmer='english' needs the PyStemmer package: pip install 'agent-r1-plugin-search[stem]'"
        ) from None
    return Stemmer.Stemmer("english")
