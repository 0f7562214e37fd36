"""Retrieval quality on QA data whose gold paragraphs are known (HotpotQA, 2Wiki and MuSiQue with
paragraphs): how often the top-k hits of the question itself contain one, or all, gold paragraphs."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from agent_r1 import Task
from agent_r1_plugin_search.corpus import CorpusError
from agent_r1_plugin_search.retrievers import Retriever


@dataclass
class RecallReport:
    """Share of questions with at least one / every gold paragraph among the top ``topk`` hits."""

    questions: int
    topk: int
    any_gold: float
    all_gold: float
    mean_gold_found: float
    """Average share of a question's gold paragraphs found."""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def retrieval_recall(retriever: Retriever, tasks: Sequence[Task], topk: int = 5) -> RecallReport:
    """Search each task's question and compare the hit titles with ``metadata["supporting_titles"]``.

    Tasks without supporting titles are left out; a :class:`~agent_r1_plugin_search.corpus.CorpusError`
    (an :class:`~agent_r1.AgentR1Error`) is raised when none has them.
    """
    scored = [t for t in tasks if t.metadata.get("supporting_titles")]
    if not scored:
        datasets = sorted({str(t.metadata.get("dataset", "?")) for t in tasks}) or ["(no tasks)"]
        raise CorpusError(
            f"none of the {len(tasks)} questions ({', '.join(datasets)}) names its supporting "
            "paragraphs, so retrieval recall cannot be measured. Use data that names them: HotpotQA or "
            "2WikiMultihopQA rows with 'supporting_facts', MuSiQue rows with 'paragraphs' or a "
            "'question_decomposition' with document ids (the bundled 2WikiMultihopQA sample has none)."
        )
    results = retriever.search(
        [str(t.metadata.get("question", t.messages[-1]["content"])) for t in scored], topk
    )
    any_gold = all_gold = 0
    share = 0.0
    for task, hits in zip(scored, results, strict=True):
        gold = set(task.metadata["supporting_titles"])
        found = gold & {hit.title for hit in hits}
        any_gold += bool(found)
        all_gold += found == gold
        share += len(found) / len(gold)
    n = len(scored)
    return RecallReport(n, topk, any_gold / n, all_gold / n, share / n)
