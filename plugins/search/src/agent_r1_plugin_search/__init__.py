"""agent-r1-plugin-search: multi-hop QA search for agent-r1.

The public names below are imported lazily (on first attribute access), so that loading the plugin
through its entry point stays cheap::

    from agent_r1_plugin_search import BM25Retriever, exact_match   # exact_match: agent_r1.rewards

    retriever = BM25Retriever.from_corpus("hotpotqa")
    hits = retriever.search(["Tinted Windows first performance"], topk=3)[0]
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "Hit": "corpus",
    "Passage": "corpus",
    "CorpusError": "corpus",
    "read_passages": "corpus",
    "bundled_path": "corpus",
    "Retriever": "retrievers",
    "BM25Retriever": "retrievers",
    "DenseRetriever": "retrievers",
    "HttpRetriever": "retrievers",
    "RetrieverConfig": "retrievers",
    "RetrievalError": "retrievers",
    "build_retriever": "retrievers",
    "get_retriever": "retrievers",
    "ProtocolError": "protocol",
    "normalize_answer": "agent_r1.rewards",
    "exact_match": "agent_r1.rewards",
    "f1_score": "agent_r1.rewards",
    "substring_match": "agent_r1.rewards",
    "SearchTool": "tool",
    "SearchRecord": "tool",
    "format_hits": "tool",
    "SearchQAEnv": "env",
    "final_answer": "agent_r1.rewards",
    "retrieval_recall": "evaluation",
    "create_app": "server",
    "serve": "server",
}

__all__ = [*sorted(_EXPORTS), "__version__"]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'agent_r1_plugin_search' has no attribute {name!r}")
    # The answer metrics live in the core (one definition for every reward and report).
    path = module if "." in module else f"agent_r1_plugin_search.{module}"
    value = getattr(importlib.import_module(path), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
