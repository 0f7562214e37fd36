"""Multi-hop QA datasets as agent-r1 ``Dataset`` plugins.

Each dataset reads local JSON/JSONL files (and, when the ``datasets`` library is installed, any
path or hub name it can load) and turns every row into a :class:`~agent_r1.Task`:

* ``messages``: one user message holding the question (the ``search_qa`` environment wraps it in
  its prompt);
* ``answer``: the list of gold aliases (always a list, possibly of one);
* ``category``: ``<dataset>`` or ``<dataset>/<type>`` (``hotpotqa/bridge``, ``musique/2hop``...);
* ``metadata``: ``dataset``, ``question``, ``supporting_titles`` (titles of the gold paragraphs,
  when the data names them; the ``search_gold`` reward uses them) and dataset-specific fields.

Splits: with only ``path``, the last ``eval_fraction`` of the rows (or ``eval_size`` rows) form the
``eval`` split and the rest ``train``; with ``eval_path`` the two files are the two splits.
``validation``, ``dev`` and ``test`` are accepted as names of the eval split, ``all`` returns every
row. Without ``path`` the bundled sample is used (see ``data/ATTRIBUTION.md``).

``qa_mix`` combines several of them (e.g. HotpotQA and NQ) into one dataset, for runs and
evaluations over several datasets at once.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import Field

from agent_r1 import ComponentConfig, ComponentSpec, Dataset, Task
from agent_r1.records import split_key, tail_split
from agent_r1.rewards import as_aliases
from agent_r1_plugin_search.corpus import CorpusError, bundled_path, iter_records

_LOCAL_SUFFIXES = (".json", ".jsonl", ".json.gz", ".jsonl.gz")


class QADatasetConfig(ComponentConfig):
    """Options shared by every QA dataset."""

    path: str | None = Field(
        None, description="JSON/JSONL file (or a `datasets` path); None: the bundled sample"
    )
    eval_path: str | None = Field(None, description="separate file for the eval split")
    eval_fraction: float = Field(0.25, ge=0.0, lt=1.0, description="share of `path` held out as eval")
    eval_size: int | None = Field(None, ge=0, description="rows held out as eval (overrides eval_fraction)")
    limit: int | None = Field(None, ge=1, description="at most this many tasks per split")
    hf_config: str | None = Field(None, description="`datasets` config name, e.g. 'distractor'")
    hf_splits: dict[str, str] = Field(
        default_factory=lambda: {"train": "train", "eval": "validation"},
        description="`datasets` split per agent-r1 split, for hub datasets",
    )
    use_for: Literal["train+eval", "eval"] = Field(
        "train+eval",
        description="'eval': an evaluation-only (e.g. out-of-domain) set: every row of `path` (or "
        "`eval_path`) is the eval split and the train split is empty, so in a qa_mix it never trains",
    )


def _load_with_datasets(path: str, config: QADatasetConfig, split: str) -> list[tuple[str, dict[str, Any]]]:
    try:
        import datasets
    except ImportError:
        raise CorpusError(
            f"data file {path!r} does not exist (or is not .json/.jsonl); install the `datasets` "
            "library to read other formats or hub datasets"
        ) from None
    file = Path(path).expanduser()
    builders = {".parquet": "parquet", ".csv": "csv", ".arrow": "arrow", ".txt": "text"}
    try:
        if file.is_file():
            builder = builders.get(file.suffix)
            if builder is None:
                raise CorpusError(f"cannot read {file}: unknown suffix {file.suffix!r}")
            rows = datasets.load_dataset(builder, data_files=str(file), split="train")
        else:
            hf_split = config.hf_splits.get(split)
            if hf_split is None:
                raise CorpusError(
                    f"hf_splits has no entry for split {split!r} (it has {sorted(config.hf_splits)})"
                )
            rows = datasets.load_dataset(path, config.hf_config, split=hf_split)
    except CorpusError:
        raise
    except Exception as exc:  # datasets raises many kinds; name the source either way
        raise CorpusError(
            f"the `datasets` library could not load {path!r}: {type(exc).__name__}: {exc}"
        ) from None
    return [(f"{path}[{i}]", dict(row)) for i, row in enumerate(rows)]


class QADataset(Dataset):
    """Base of the QA datasets: file reading, splits and limits. Subclasses convert rows."""

    bundled: ClassVar[str] = ""
    Config = QADatasetConfig

    def __init__(self, config: Any = None) -> None:
        super().__init__(config)
        self._cache: dict[str, list[Task]] = {}

    def convert(self, record: dict[str, Any], where: str, index: int) -> Task | None:  # pragma: no cover
        """One row as a task (``None`` skips it). Errors name ``where`` (file and line)."""
        raise NotImplementedError

    def _rows(self, path: str, split: str) -> list[tuple[str, dict[str, Any]]]:
        if path.endswith(_LOCAL_SUFFIXES):  # ours to read (and to report missing)
            return list(iter_records(Path(path).expanduser()))
        return _load_with_datasets(path, self.config, split)

    def _tasks(self, path: str, split: str) -> list[Task]:
        tasks = []
        for index, (where, record) in enumerate(self._rows(path, split)):
            task = self.convert(record, where, index)
            if task is not None:
                tasks.append(task)
        if not tasks:
            raise CorpusError(f"{self.name} data {path} holds no usable rows")
        return tasks

    def load(self, split: str) -> list[Task]:
        """The tasks of ``split`` (``train``, ``eval`` and its synonyms, or ``all``)."""
        key = split_key(self.name, split, error=CorpusError)
        if key not in self._cache:
            self._cache[key] = self._eval_only(key) if self.config.use_for == "eval" else self._split(key)
        tasks = self._cache[key]
        return list(tasks[: self.config.limit] if self.config.limit else tasks)

    def _eval_only(self, key: str) -> list[Task]:
        if key == "train":
            return []
        path = self.config.eval_path or self.config.path or str(bundled_path(self.bundled))
        return self._tasks(path, "eval")

    def _split(self, key: str) -> list[Task]:
        config = self.config
        path = config.path or str(bundled_path(self.bundled))
        if not path.endswith(_LOCAL_SUFFIXES) and not Path(path).expanduser().is_file():
            if key == "all":
                return self._tasks(path, "train") + self._tasks(path, "eval")
            return self._tasks(path, key)  # a hub dataset: its own splits
        if config.eval_path is not None:
            if key == "all":
                return self._tasks(path, "train") + self._tasks(config.eval_path, "eval")
            return self._tasks(config.eval_path if key == "eval" else path, key)
        tasks = self._tasks(path, key)
        return tail_split(tasks, key, eval_size=config.eval_size, eval_fraction=config.eval_fraction)


# --------------------------------------------------------------------------------------------
# Row helpers
# --------------------------------------------------------------------------------------------


def _field(record: dict[str, Any], names: tuple[str, ...], where: str) -> Any:
    for name in names:
        if name in record and record[name] is not None:
            return record[name]
    wanted = " or ".join(repr(n) for n in names)
    raise CorpusError(f"{where}: missing field {wanted} (fields present: {', '.join(sorted(record))})")


def _question(record: dict[str, Any], where: str) -> str:
    question = _field(record, ("question",), where)
    if not isinstance(question, str) or not question.strip():
        raise CorpusError(f"{where}: field 'question' should be a non-empty string, got {question!r}")
    return question.strip()


def _flat_aliases(value: Any, where: str, field: str) -> list[Any]:
    """Alias values with nested lists flattened (MuSiQue rows may hold a list in ``answer``); a
    dict or another container inside is an error rather than its Python text."""
    if isinstance(value, (list, tuple)):
        return [alias for item in value for alias in _flat_aliases(item, where, field)]
    if value is None or (isinstance(value, (str, int, float)) and not isinstance(value, bool)):
        return [value]
    raise CorpusError(
        f"{where}: field {field!r} should hold strings (or lists of strings), got {type(value).__name__} "
        f"{value!r}"
    )


def _aliases(value: Any, where: str, field: str) -> list[str]:
    if isinstance(value, dict):  # {"aliases": [...], "value": ...} style (TriviaQA)
        value = [value.get("value"), *value.get("aliases", [])]
    if not isinstance(value, (str, list, tuple)):
        raise CorpusError(f"{where}: field {field!r} should be a string or a list of strings, got {value!r}")
    aliases = [alias.strip() for alias in as_aliases(_flat_aliases(value, where, field)) if alias.strip()]
    if not aliases:
        raise CorpusError(f"{where}: field {field!r} holds no answer")
    return list(dict.fromkeys(aliases))


def _supporting_titles(facts: Any) -> list[str]:
    """Unique titles of HotpotQA/2Wiki supporting facts, in both layouts, in order."""
    if isinstance(facts, dict):
        titles = facts.get("title", [])
    elif isinstance(facts, list):
        titles = [fact[0] for fact in facts if isinstance(fact, (list, tuple)) and fact]
    else:
        titles = []
    return list(dict.fromkeys(str(t) for t in titles))


def _task(
    dataset: str, task_id: str, question: str, answers: list[str], category: str, **metadata: Any
) -> Task:
    return Task(
        id=task_id,
        messages=[{"role": "user", "content": question}],
        answer=answers,
        category=category,
        metadata={"dataset": dataset, "question": question, **metadata},
    )


# --------------------------------------------------------------------------------------------
# Datasets
# --------------------------------------------------------------------------------------------


class HotpotQADataset(QADataset):
    """HotpotQA in the distractor format (``question``, ``answer``, ``type``, ``level``,
    ``supporting_facts``, ``context``); Hugging Face and original layouts both read.

    Bundled: the first 200 "hard" dev questions. Their paragraphs are the bundled corpus
    ``hotpotqa``; for your own file, point the retriever's ``corpus`` at the same file.
    """

    name = "hotpotqa"
    bundled = "hotpotqa"

    def convert(self, record: dict[str, Any], where: str, index: int) -> Task:
        question = _question(record, where)
        answers = _aliases(_field(record, ("answer",), where), where, "answer")
        kind = record.get("type")
        facts = record.get("supporting_facts")
        return _task(
            "hotpotqa",
            str(record.get("id", record.get("_id", index))),
            question,
            answers,
            f"hotpotqa/{kind}" if kind else "hotpotqa",
            type=kind,
            level=record.get("level"),
            supporting_titles=_supporting_titles(facts),
        )


class TwoWikiMultihopQADataset(QADataset):
    """2WikiMultihopQA: the original format (``_id``, ``type``, ``question``, ``answer``,
    ``supporting_facts``, ``context``), or question/answer rows (``answer`` may be a list of aliases;
    FlashRAG's ``golden_answers`` works too).

    Bundled: 100 dev questions *without* evidence paragraphs: search them with an external corpus
    (a Wikipedia index or a server), not the bundled ``hotpotqa`` corpus.
    """

    name = "2wikimultihopqa"
    bundled = "2wikimultihopqa"

    def convert(self, record: dict[str, Any], where: str, index: int) -> Task:
        question = _question(record, where)
        answers = _aliases(_field(record, ("answer", "golden_answers"), where), where, "answer")
        kind = record.get("type")
        task_id = record.get("_id", record.get("id", record.get("test_id", index)))
        return _task(
            "2wikimultihopqa",
            str(task_id),
            question,
            answers,
            f"2wikimultihopqa/{kind}" if kind else "2wikimultihopqa",
            type=kind,
            supporting_titles=_supporting_titles(record.get("supporting_facts")),
        )


_MUSIQUE_HOPS = re.compile(r"^(\d+)hop")
_DOCUMENT_SUFFIX = re.compile(r"_\d+$")


class MuSiQueDataset(QADataset):
    """MuSiQue-Ans (``id``, ``question``, ``answer``, ``answer_aliases``, ``answerable``,
    ``question_decomposition``, optionally ``paragraphs``).

    Supporting titles come from the supporting ``paragraphs`` when present, else from the
    decomposition's ``document_id`` (``"Title_0"`` → ``"Title"``). Unanswerable rows (MuSiQue-Full)
    are skipped unless ``keep_unanswerable``. Bundled: 100 dev questions without paragraphs (use an
    external corpus).
    """

    name = "musique"
    bundled = "musique"

    class Config(QADatasetConfig):
        keep_unanswerable: bool = Field(False, description="keep rows with answerable=false")

    def convert(self, record: dict[str, Any], where: str, index: int) -> Task | None:
        if record.get("answerable") is False and not self.config.keep_unanswerable:
            return None
        question = _question(record, where)
        answer = _field(record, ("answer",), where)
        extra = record.get("answer_aliases") or []
        answers = _aliases([answer, *(extra if isinstance(extra, list) else [extra])], where, "answer")
        task_id = str(record.get("id", index))
        hops = _MUSIQUE_HOPS.match(task_id)
        decomposition = record.get("question_decomposition") or []
        if isinstance(record.get("paragraphs"), list):
            titles = [str(p.get("title", "")) for p in record["paragraphs"] if p.get("is_supporting")]
        else:
            titles = [
                _DOCUMENT_SUFFIX.sub("", str(step["document_id"]))
                for step in decomposition
                if isinstance(step, dict) and step.get("document_id")
            ]
        return _task(
            "musique",
            task_id,
            question,
            answers,
            f"musique/{hops.group(1)}hop" if hops else "musique",
            hops=int(hops.group(1)) if hops else None,
            answerable=record.get("answerable", True),
            supporting_titles=list(dict.fromkeys(t for t in titles if t)),
            decomposition=[
                {"question": step.get("question"), "answer": step.get("answer")}
                for step in decomposition
                if isinstance(step, dict)
            ],
        )


class NQDataset(QADataset):
    """Natural-Questions-style rows ``{"id", "question", "golden_answers": [...]}`` (the FlashRAG
    format, shared by TriviaQA, PopQA, WebQuestions... exports). ``answer``/``answers`` also work.

    Bundled: the 17-question NQ toy set that goes with the bundled ``wiki`` passages.
    """

    name = "nq"
    bundled = "nq"

    class Config(QADatasetConfig):
        category: str = Field("nq", description="category of every task (e.g. 'triviaqa')")

    def convert(self, record: dict[str, Any], where: str, index: int) -> Task:
        question = _question(record, where)
        answers = _aliases(
            _field(record, ("golden_answers", "answers", "answer"), where), where, "golden_answers"
        )
        return _task(
            self.config.category, str(record.get("id", index)), question, answers, self.config.category
        )


DATASETS: list[type[QADataset]] = [HotpotQADataset, TwoWikiMultihopQADataset, MuSiQueDataset, NQDataset]
"""The QA datasets that read files (``qa_mix`` combines them)."""

LOADERS: dict[str, Callable[..., QADataset]] = {cls.name: cls for cls in DATASETS}
"""Dataset name → class (the file-reading datasets)."""


class QAMixConfig(ComponentConfig):
    """Options of ``qa_mix``."""

    datasets: list[ComponentSpec] = Field(
        min_length=1, description="the datasets to combine, each {name: ..., <that dataset's options>}"
    )


class QAMixDataset(Dataset):
    """Several datasets as one, e.g. to evaluate on HotpotQA and NQ in one run (Search-R1 reports
    each of its seven datasets separately)::

        data:
          name: qa_mix
          datasets:
            - {name: hotpotqa, limit: 50}
            - {name: nq, limit: 17}

    Each split interleaves the datasets' tasks round-robin (first task of each, then the second of
    each...), so that ``eval.num_tasks`` cuts every dataset alike. Task ids get the dataset's name
    as prefix (``nq:test_3``; ``nq[1]:test_3`` when a name is listed twice) so that they stay
    unique; categories stay ``<dataset>/<type>``, which ``agent-r1 eval`` reports per dataset.
    Every listed dataset and its options are checked with the run config, before any model loads.
    """

    name = "qa_mix"
    Config = QAMixConfig
    config: QAMixConfig

    @classmethod
    def requires(cls, config: Any) -> list[tuple[Any, ...]]:
        return [
            ("datasets", spec.name, spec.options, f"datasets[{i}]") for i, spec in enumerate(config.datasets)
        ]

    def __init__(self, config: Any = None) -> None:
        super().__init__(config)
        from agent_r1.registry import get_registry

        registry = get_registry()
        names = [spec.name for spec in self.config.datasets]
        self.parts: list[tuple[str, Dataset]] = [
            (
                spec.name if names.count(spec.name) == 1 else f"{spec.name}[{i}]",
                registry.build("datasets", spec.name, spec.options),
            )
            for i, spec in enumerate(self.config.datasets)
        ]

    def load(self, split: str) -> list[Task]:
        """The tasks of ``split`` of every dataset, interleaved round-robin, ids prefixed."""
        parts = [
            [task.model_copy(update={"id": f"{prefix}:{task.id}"}) for task in dataset.load(split)]
            for prefix, dataset in self.parts
        ]
        longest = max((len(tasks) for tasks in parts), default=0)
        return [tasks[i] for i in range(longest) for tasks in parts if i < len(tasks)]
