"""Retrievers behind one interface: ``search(queries, topk) -> hits per query``.

* :class:`BM25Retriever` (:mod:`.bm25`): in-process BM25 (``bm25s``) over a local corpus; the index
  is built once and cached on disk under a key made of the corpus's SHA-256 and the index settings
  (:mod:`.cache`).
* :class:`DenseRetriever` (:mod:`.dense`): sentence-transformers embeddings and exact inner-product
  search (the ``dense`` extra); embeddings are cached like the BM25 index.
* :class:`FaissRetriever` (:mod:`.faiss_index`): an existing Search-R1 / FlashRAG dense index (a FAISS
  index file whose row ``i`` is line ``i`` of the corpus JSONL, e.g. their e5 ``Flat`` index of
  wiki-18), queried with a sentence-transformers encoder (the ``faiss`` and ``dense`` extras);
  :func:`build_faiss_index` writes such an index.
* :class:`HttpRetriever` (:mod:`.http_client`): a client of the Search-R1 retrieval-server
  protocol, with retries and exponential backoff (see :mod:`agent_r1_plugin_search.protocol`).

:class:`Retriever` and :class:`RetrievalError` are in :mod:`.base`. :func:`get_retriever`
(:mod:`.config`) builds one from a :class:`RetrieverConfig` and shares it process-wide, since the
engine creates one environment (and so one tool) per trajectory; :func:`check_retriever`
(:mod:`.checks`) finds what would stop a config from working without building anything.

Every public name is importable from this package, as it was from the single module it replaces:
each module's ``__all__`` lists what the package re-exports (helpers the modules share, such as
``base.check_topk`` or ``cache.cached_corpus``, stay in their module).
"""

from __future__ import annotations

from agent_r1_plugin_search.retrievers.base import RetrievalError, Retriever
from agent_r1_plugin_search.retrievers.bm25 import BM25Retriever
from agent_r1_plugin_search.retrievers.cache import INDEX_FORMAT_VERSION, default_cache_dir
from agent_r1_plugin_search.retrievers.checks import check_retriever
from agent_r1_plugin_search.retrievers.config import (
    RetrieverConfig,
    build_retriever,
    clear_retrievers,
    get_retriever,
)
from agent_r1_plugin_search.retrievers.dense import BUNDLED_DENSE_MODEL, DenseRetriever, resolve_dense_model
from agent_r1_plugin_search.retrievers.faiss_index import (
    FaissRetriever,
    build_faiss_index,
    default_query_prefix,
)
from agent_r1_plugin_search.retrievers.http_client import HttpRetriever

__all__ = [
    "BUNDLED_DENSE_MODEL",
    "INDEX_FORMAT_VERSION",
    "BM25Retriever",
    "DenseRetriever",
    "FaissRetriever",
    "HttpRetriever",
    "RetrievalError",
    "Retriever",
    "RetrieverConfig",
    "build_faiss_index",
    "build_retriever",
    "check_retriever",
    "clear_retrievers",
    "default_cache_dir",
    "default_query_prefix",
    "get_retriever",
    "resolve_dense_model",
]
