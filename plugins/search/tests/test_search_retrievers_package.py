"""``agent_r1_plugin_search.retrievers`` is a package of one module per retriever; every name the
single module it replaced offered is still importable from it, as the same object as in its
module, and the plugin's lazy top-level names still resolve."""

from __future__ import annotations

import importlib
import pkgutil

import agent_r1_plugin_search
from agent_r1_plugin_search import retrievers

FORMER_PUBLIC_NAMES = {
    *("Retriever", "RetrievalError", "RetrieverConfig", "INDEX_FORMAT_VERSION", "default_cache_dir"),
    *("build_retriever", "get_retriever", "clear_retrievers", "check_retriever"),
    *("BM25Retriever", "DenseRetriever", "BUNDLED_DENSE_MODEL", "resolve_dense_model"),
    *("FaissRetriever", "build_faiss_index", "default_query_prefix", "HttpRetriever"),
}
"""The public names of ``retrievers.py`` before it became a package."""


def test_every_former_name_is_importable_from_the_package() -> None:
    assert sorted(FORMER_PUBLIC_NAMES - set(dir(retrievers))) == []
    assert set(retrievers.__all__) == FORMER_PUBLIC_NAMES


def test_the_package_re_exports_each_module_s_names_as_the_same_objects() -> None:
    modules = [info.name for info in pkgutil.iter_modules(retrievers.__path__)]
    assert {"base", "bm25", "dense", "faiss_index", "http_client", "config", "checks"} <= set(modules)
    exported: set[str] = set()
    for name in modules:
        module = importlib.import_module(f"{retrievers.__name__}.{name}")
        for public in module.__all__:
            assert getattr(retrievers, public) is getattr(module, public), f"{name}.{public}"
        exported |= set(module.__all__)
    assert exported == set(retrievers.__all__)


def test_the_plugin_s_lazy_names_resolve_to_the_package_s() -> None:
    for name in ("Retriever", "BM25Retriever", "HttpRetriever", "RetrieverConfig", "get_retriever"):
        assert getattr(agent_r1_plugin_search, name) is getattr(retrievers, name)
