"""agent-r1-plugin-search: multi-hop QA search for agent-r1.

The public names below are imported lazily (on first attribute access), so that loading the plugin
through its entry point stays cheap::

    from agent_r1_plugin_search import BM25Retriever, exact_match   # exact_match: agent_r1.rewards

    retriever = BM25Retriever.from_corpus("hotpotqa")
    hits = retriever.search(["Tinted Windows first performance"], topk=3)[0]
"""

from __future__ import annotations

from agent_r1.lazy import lazy_dir, lazy_getattr

__version__ = "0.1.0"

_EXPORTS: dict[str, tuple[str, ...]] = {  # module → the names it gives this package
    ".corpus": ("Hit", "Passage", "CorpusError", "read_passages", "bundled_path"),
    ".retrievers": (
        "Retriever",
        "BM25Retriever",
        "DenseRetriever",
        "HttpRetriever",
        "RetrieverConfig",
        "RetrievalError",
        "build_retriever",
        "get_retriever",
    ),
    ".protocol": ("ProtocolError",),
    "agent_r1.rewards": ("normalize_answer", "exact_match", "f1_score", "substring_match", "final_answer"),
    ".tool": ("SearchTool", "SearchRecord", "format_hits"),
    ".env": ("SearchQAEnv",),
    ".evaluation": ("retrieval_recall",),
    ".server": ("create_app", "serve"),
}

__all__ = [*sorted(name for names in _EXPORTS.values() for name in names), "__version__"]
__getattr__ = lazy_getattr(__name__, _EXPORTS)
__dir__ = lazy_dir(__name__, _EXPORTS)
