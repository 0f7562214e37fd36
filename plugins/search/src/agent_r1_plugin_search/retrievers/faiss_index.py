"""FAISS: an existing Search-R1 / FlashRAG dense index (a FAISS index file whose row ``i`` is line
``i`` of the corpus JSONL, e.g. their e5 ``Flat`` index of wiki-18), queried with a
sentence-transformers encoder (the ``faiss`` and ``dense`` extras); :func:`build_faiss_index`
writes such an index.

(Named ``faiss_index`` so that it never stands for the ``faiss`` package itself.)
"""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agent_r1_plugin_search.corpus import CorpusFormat, Hit, Passage, read_passages, resolve_corpus_path
from agent_r1_plugin_search.retrievers.base import RetrievalError, Retriever, check_topk
from agent_r1_plugin_search.retrievers.dense import BUNDLED_DENSE_MODEL, resolve_dense_model

__all__ = ["FaissRetriever", "build_faiss_index", "default_query_prefix"]


def _import_faiss() -> Any:
    try:
        import faiss
    except ImportError:
        raise RetrievalError(
            "the faiss retriever needs faiss-cpu: pip install 'agent-r1-plugin-search[faiss]'"
        ) from None
    return faiss


def default_query_prefix(model: str) -> str:
    """``"query: "`` for E5 models (they were trained with it; Search-R1 and FlashRAG add it), else ``""``."""
    return "query: " if "e5" in Path(model).name.lower() else ""


class FaissRetriever(Retriever):
    """Dense search with a FAISS index built elsewhere (Search-R1's ``e5_Flat.index``, FlashRAG's).

    The index's row ``i`` must be passage ``i`` of the corpus file (the order of its lines), as in
    Search-R1's ``wiki-18.jsonl`` + ``e5_Flat.index``. Queries are encoded with a
    sentence-transformers model (``model``: a local directory, e.g. a downloaded
    ``intfloat/e5-base-v2``; its pooling comes from the model's own configuration), prefixed with
    ``query_prefix`` (``"query: "`` for E5 models) and L2-normalised, then searched by inner product,
    as Search-R1's retrieval server does. The index file is memory-mapped when FAISS can (flat
    indexes), so a 60 GB wiki-18 index does not need to fit in memory twice.
    """

    name = "faiss"

    def __init__(
        self,
        index_path: str | os.PathLike[str],
        passages: Sequence[Passage],
        *,
        model: str = BUNDLED_DENSE_MODEL,
        query_prefix: str | None = None,
        device: str | None = None,
        batch_size: int = 64,
    ) -> None:
        faiss = _import_faiss()
        try:
            from sentence_transformers import SentenceTransformer
        except ImportError:
            raise RetrievalError(
                "the faiss retriever encodes queries with sentence-transformers: "
                "pip install 'agent-r1-plugin-search[dense,faiss]'"
            ) from None
        path = Path(index_path).expanduser()
        if not path.is_file():
            raise RetrievalError(f"FAISS index {str(index_path)!r} does not exist")
        try:
            self._index = faiss.read_index(str(path), faiss.IO_FLAG_MMAP | faiss.IO_FLAG_READ_ONLY)
        except RuntimeError:
            try:  # index types that cannot be memory-mapped are read whole
                self._index = faiss.read_index(str(path))
            except RuntimeError as exc:
                raise RetrievalError(f"cannot read FAISS index {path}: {exc}") from None
        self.passages = list(passages)
        if self._index.ntotal != len(self.passages):
            raise RetrievalError(
                f"FAISS index {path} holds {self._index.ntotal} vectors but the corpus has "
                f"{len(self.passages)} passages; row i of the index must be passage i of the corpus "
                "(use the corpus file the index was built from)"
            )
        self.index_path = path
        self.model_name = model
        self.query_prefix = default_query_prefix(model) if query_prefix is None else query_prefix
        self.batch_size = batch_size
        self._model = SentenceTransformer(resolve_dense_model(model), device=device)
        # renamed get_embedding_dimension in sentence-transformers 6; the old name still works there
        dimension_of = (
            getattr(self._model, "get_embedding_dimension", None)
            or self._model.get_sentence_embedding_dimension
        )
        dimension = dimension_of()
        if dimension is not None and dimension != self._index.d:
            raise RetrievalError(
                f"FAISS index {path} has {self._index.d}-dimensional vectors but model {model!r} "
                f"encodes {dimension} dimensions; use the model the index was built with"
            )
        self._lock = threading.Lock()  # torch modules are not re-entrant across threads

    @classmethod
    def from_files(
        cls,
        index_path: str | os.PathLike[str],
        corpus: str | os.PathLike[str],
        *,
        corpus_format: CorpusFormat = "auto",
        **options: Any,
    ) -> FaissRetriever:
        """Read the corpus (in index order) and open the index."""
        return cls(index_path, read_passages(resolve_corpus_path(corpus), corpus_format), **options)

    def search(self, queries: Sequence[str], topk: int) -> list[list[Hit]]:
        import numpy as np

        check_topk(topk)
        queries = list(queries)
        if not queries:
            return []
        with self._lock:
            vectors = self._model.encode(
                [f"{self.query_prefix}{q}" for q in queries],
                batch_size=self.batch_size,
                normalize_embeddings=True,
                convert_to_numpy=True,
                show_progress_bar=False,
            )
        scores, rows = self._index.search(np.ascontiguousarray(vectors, dtype=np.float32), topk)
        return [
            [
                Hit.of(self.passages[int(row)], float(score))
                for row, score in zip(rows[i], scores[i], strict=True)
                if row >= 0  # FAISS pads with -1 when the index holds fewer than topk vectors
            ]
            for i in range(len(queries))
        ]

    def describe(self) -> dict[str, Any]:
        return {
            "retriever": self.name,
            "passages": len(self.passages),
            "model": self.model_name,
            "index": str(self.index_path),
        }


def build_faiss_index(
    corpus: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    model: str = BUNDLED_DENSE_MODEL,
    passage_prefix: str | None = None,
    corpus_format: CorpusFormat = "auto",
    device: str | None = None,
    batch_size: int = 64,
) -> int:
    """Encode every passage of ``corpus`` and write a flat inner-product FAISS index to ``out``.

    The layout is Search-R1's / FlashRAG's (``Flat``, L2-normalised embeddings, row ``i`` = passage
    ``i``); passages are encoded as their ``contents`` (``"Title"\ntext``), prefixed with
    ``passage_prefix`` (``"passage: "`` for E5 models). Returns the number of vectors written; the
    file is written through a temporary name, so a reader never sees half an index.
    """
    import numpy as np

    faiss = _import_faiss()
    try:
        from sentence_transformers import SentenceTransformer
    except ImportError:
        raise RetrievalError(
            "building a FAISS index needs sentence-transformers: "
            "pip install 'agent-r1-plugin-search[dense,faiss]'"
        ) from None
    passages = read_passages(resolve_corpus_path(corpus), corpus_format)
    prefix = (
        ("passage: " if default_query_prefix(model) else "") if passage_prefix is None else passage_prefix
    )
    encoder = SentenceTransformer(resolve_dense_model(model), device=device)
    vectors = encoder.encode(
        [f"{prefix}{p.contents}" for p in passages],
        batch_size=batch_size,
        normalize_embeddings=True,
        convert_to_numpy=True,
        show_progress_bar=False,
    )
    vectors = np.ascontiguousarray(vectors, dtype=np.float32)
    index = faiss.IndexFlatIP(vectors.shape[1])
    index.add(vectors)
    target = Path(out).expanduser()
    target.parent.mkdir(parents=True, exist_ok=True)
    temporary = target.with_name(f".{target.name}.{uuid.uuid4().hex}.tmp")
    faiss.write_index(index, str(temporary))
    os.replace(temporary, target)
    return int(index.ntotal)
