"""Tasks from tables: ``jsonl_tasks`` (JSONL or JSON files), ``parquet_tasks`` (Parquet files) and
``hf_datasets`` (anything the Hugging Face ``datasets`` library loads), with one column mapping.

Each row becomes one :class:`~agent_r1.Task`: the question column fills the user message (through
``user_template``), or a messages column gives the chat messages as they are; the answer column
becomes ``task.answer``; the remaining columns go to ``task.metadata``. A column name may be a
dotted path into nested columns (``reward_model.ground_truth``), so verl-style Parquet files load
as they are. The eval split comes from a second file (or split), or from a seeded random fraction
of the first one::

    data:
      name: jsonl_tasks
      path: data/train.jsonl          # {"id": "q1", "question": "...", "answer": "42"} per line
      eval_path: data/test.jsonl      # or: eval_fraction: 0.1
      question_field: question
      answer_field: answer
      system_prompt: "Think step by step."

    data:                             # a verl data file: prompt is a list of chat messages
      name: parquet_tasks
      path: data/train.parquet
      eval_path: data/test.parquet
      messages_field: prompt
      answer_field: reward_model.ground_truth

    data:                             # needs `pip install agent-r1[datasets]`
      name: hf_datasets
      path: data/gsm8k                # a save_to_disk directory, a data file, or a load_dataset path
      eval_split: test

Every problem with a file names the file and the row (line, index or split and index).
"""

from __future__ import annotations

import random
import string
import warnings
from collections.abc import Callable, Iterable, Mapping
from functools import partial
from pathlib import Path
from typing import Any, ClassVar

from pydantic import Field, model_validator

from agent_r1.contracts import ComponentConfig, Dataset
from agent_r1.errors import ConfigError
from agent_r1.mdp import Message, Task
from agent_r1.records import read_records

Row = tuple[str, str, dict[str, Any]]
"""``(where, fallback id, row)``: where the row is (``file:line``, ``file[index]``...) for messages,
and the task id to use when the row has none."""

_MISSING = object()


class TaskColumns(ComponentConfig):
    """The column mapping shared by the table datasets (options of every ``data`` section that
    reads a table)."""

    question_field: str = Field("question", description="row field that holds the question")
    messages_field: str | None = Field(
        None,
        description="row field holding the chat messages (a list of {role, content}) used as they are; "
        "when set, question_field and user_template are not used",
    )
    answer_field: str | None = Field("answer", description="row field of the reference answer (null: none)")
    id_field: str | None = Field(
        "id", description="row field of the task id; rows without one get <file>:<line> (or <split>:<index>)"
    )
    category_field: str | None = Field(None, description="row field of the category (per-category eval)")
    system_prompt: str | None = Field(None, description="system message put before the question")
    user_template: str = Field(
        "{question}",
        description="user message; {question} and any row field such as {context} are filled in",
    )
    limit: int | None = Field(None, ge=1, description="use at most this many tasks per split")
    eval_fraction: float = Field(
        0.0, ge=0.0, lt=1.0, description="without an eval file or split: share held out for eval (seeded)"
    )
    seed: int = Field(0, description="seed of the train/eval split")

    @model_validator(mode="after")
    def _check_template(self) -> TaskColumns:
        try:
            fields = [name for _, name, _, _ in string.Formatter().parse(self.user_template) if name]
        except ValueError as exc:
            raise ValueError(f"user_template {self.user_template!r} is not a valid template: {exc}") from None
        if any(not name.isidentifier() for name in fields):
            raise ValueError(f"user_template {self.user_template!r} may only use plain {{field}} names")
        return self


class _TableTasks(Dataset):
    """Splits ``train`` and ``eval`` from rows, with the :class:`TaskColumns` mapping. Subclasses
    read the rows (:meth:`_read`); the same config always gives the same tasks."""

    SPLITS: ClassVar[tuple[str, ...]] = ("train", "eval")
    config: Any

    def __init__(self, config: ComponentConfig | Mapping[str, Any] | None = None) -> None:
        super().__init__(config)
        self._cache: dict[str, list[Task]] = {}
        self._no_eval = False

    def load(self, split: str) -> list[Task]:
        """The tasks of ``split`` (``train`` or ``eval``), as fresh copies."""
        if split not in self.SPLITS:
            raise ValueError(f"{self.name} has no split {split!r}; splits are {', '.join(self.SPLITS)}")
        if not self._cache:
            train, evaluation = self._read()
            if evaluation is None and self.config.eval_fraction > 0:
                order = list(range(len(train)))
                random.Random(f"agent-r1/{self.name}/{self.config.seed}").shuffle(order)
                held_out = set(order[: round(len(train) * self.config.eval_fraction)])
                evaluation = [t for i, t in enumerate(train) if i in held_out]
                train = [t for i, t in enumerate(train) if i not in held_out]
            self._cache = {"train": train, "eval": evaluation or []}
            self._no_eval = evaluation is None
        if split == "eval" and self._no_eval:
            warnings.warn(f"{self.name}: {self._no_eval_advice()}; evaluation is skipped", stacklevel=2)
        tasks = self._cache[split]
        if self.config.limit is not None:
            tasks = tasks[: self.config.limit]
        return [task.model_copy(deep=True) for task in tasks]

    def _read(self) -> tuple[list[Task], list[Task] | None]:  # pragma: no cover - abstract
        """The train tasks and the eval tasks (``None`` when no eval file or split is set)."""
        raise NotImplementedError

    def _no_eval_advice(self) -> str:  # pragma: no cover - abstract
        raise NotImplementedError

    def _check_disjoint(self, train: list[Task], evaluation: list[Task], where: str, path: str) -> None:
        clash = sorted({t.id for t in train} & {t.id for t in evaluation})
        if clash:
            raise ConfigError(
                f"data: task ids {clash[:5]} appear in both {where}; give eval tasks their own ids",
                path=path,
            )

    def _tasks(self, rows: Iterable[Row], config_key: str) -> list[Task]:
        config: TaskColumns = self.config
        tasks: list[Task] = []
        seen: dict[str, str] = {}
        for where, fallback_id, row in rows:
            messages = self._messages(where, row)
            answer = None
            if config.answer_field is not None:
                answer = _required_field(
                    row,
                    where,
                    "answer_field",
                    config.answer_field,
                    "set data.answer_field, or null for tasks without a reference answer",
                )
            task_id = _field(row, config.id_field) if config.id_field else None
            task_id = str(task_id) if task_id not in (None, _MISSING) else fallback_id
            if task_id in seen:
                raise ConfigError(
                    f"{where}: task id {task_id!r} was already used at {seen[task_id]}; ids must be unique",
                    path=f"data.{config_key}",
                )
            seen[task_id] = where
            category = _field(row, config.category_field) if config.category_field else None
            mapped = {
                config.question_field if not config.messages_field else None,
                config.messages_field,
                config.answer_field,
                config.id_field,
                config.category_field,
            }
            tasks.append(
                Task(
                    id=task_id,
                    messages=messages,
                    answer=answer,
                    category=str(category) if category not in (None, _MISSING) else None,
                    metadata={"source": where, **{k: v for k, v in row.items() if k not in mapped}},
                )
            )
        return tasks

    def _messages(self, where: str, row: dict[str, Any]) -> list[Message]:
        config: TaskColumns = self.config
        messages: list[Message] = []
        if config.messages_field:
            value = _required_field(
                row,
                where,
                "messages_field",
                config.messages_field,
                "set data.messages_field to the field that holds the chat messages",
            )
            if not _is_message_list(value):
                raise ConfigError(
                    f"{where}: field {config.messages_field!r} must hold a list of chat messages "
                    f"({{role, content}} objects), got {value!r:.80}; for a plain question use "
                    "data.question_field instead",
                    path="data.messages_field",
                )
            # columnar formats fill keys that other messages have with None: drop those
            messages = [{k: v for k, v in m.items() if v is not None} for m in value]
            if config.system_prompt:
                if messages and messages[0].get("role") == "system":
                    raise ConfigError(
                        f"{where}: the messages already start with a system message, so "
                        "data.system_prompt would be a second one; remove data.system_prompt",
                        path="data.system_prompt",
                    )
                messages.insert(0, {"role": "system", "content": config.system_prompt})
            return messages
        question = _required_field(
            row,
            where,
            "question_field",
            config.question_field,
            "set data.question_field to the field that holds the question",
        )
        if _is_message_list(question):
            raise ConfigError(
                f"{where}: field {config.question_field!r} holds chat messages, not a question; set "
                f"data.messages_field: {config.question_field} to use them as they are",
                path="data.question_field",
            )
        fields = {**row, "question": question}
        try:
            user = config.user_template.format(**{k: v for k, v in fields.items() if isinstance(k, str)})
        except KeyError as exc:
            raise ConfigError(
                f"{where}: data.user_template uses field {exc.args[0]!r}, which the row lacks "
                f"(fields: {_fields(row)})",
                path="data.user_template",
            ) from None
        if config.system_prompt:
            messages.append({"role": "system", "content": config.system_prompt})
        messages.append({"role": "user", "content": user})
        return messages


def _field(row: Mapping[str, Any], name: str) -> Any:
    """``row[name]``, or the nested value a dotted ``name`` leads to; ``_MISSING`` when absent."""
    if name in row:
        return row[name]
    value: Any = row
    for part in name.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return _MISSING
        value = value[part]
    return value


def _fields(row: Mapping[str, Any]) -> str:
    return ", ".join(sorted(str(k) for k in row))


def _required_field(row: Mapping[str, Any], where: str, option: str, name: str, advice: str) -> Any:
    """:func:`_field` ``name``, which the ``data.<option>`` setting names; a row without it is a
    :class:`ConfigError` saying where, which fields the row has, and ``advice``."""
    value = _field(row, name)
    if value is _MISSING:
        raise ConfigError(
            f"{where}: no field {name!r} (fields: {_fields(row)}); {advice}", path=f"data.{option}"
        )
    return value


def _is_message_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(m, Mapping) and "role" in m for m in value)


# --------------------------------------------------------------------------------------------
# Files: JSONL / JSON and Parquet
# --------------------------------------------------------------------------------------------


class _FileTasks(_TableTasks):
    """Tasks from a train file and an optional eval file."""

    FORMAT: ClassVar[str] = ""

    def _read(self) -> tuple[list[Task], list[Task] | None]:
        config = self.config
        train = self._tasks(self._rows(Path(config.path), "path"), "path")
        if config.eval_path is None:
            return train, None
        evaluation = self._tasks(self._rows(Path(config.eval_path), "eval_path"), "eval_path")
        self._check_disjoint(train, evaluation, f"{config.path} and {config.eval_path}", "data.eval_path")
        return train, evaluation

    def _no_eval_advice(self) -> str:
        return f"{self.config.path} has no eval split (set data.eval_path or data.eval_fraction)"

    def _rows(self, path: Path, config_key: str) -> list[Row]:  # pragma: no cover - abstract
        raise NotImplementedError


class _FileConfig(TaskColumns):
    path: str = Field(description="the file of the train split")
    eval_path: str | None = Field(None, description="file of the eval split; else see eval_fraction")

    @model_validator(mode="after")
    def _check_split(self) -> _FileConfig:
        if self.eval_path is not None and self.eval_fraction > 0:
            raise ValueError("set eval_path or eval_fraction, not both")
        return self


def _missing_file(path: Path, config_key: str) -> ConfigError:
    return ConfigError(
        f"data.{config_key}: task file {str(path)!r} does not exist", path=f"data.{config_key}"
    )


def _read_json_rows(path: Path, config_key: str) -> list[Row]:
    """The rows of a JSONL or JSON file: ``where`` is ``file:line`` (or ``file[index]`` for
    ``.json``) and the fallback id ``<stem>:<line>`` (or ``<stem>:<index>``)."""
    if not path.is_file():
        raise _missing_file(path, config_key)
    if path.suffix == ".parquet":
        raise ConfigError(
            f"data.{config_key}: {str(path)!r} is a Parquet file; jsonl_tasks reads JSONL and JSON. Use "
            "data.name: parquet_tasks (same options)",
            path="data.name",
        )
    key = f"data.{config_key}"
    records = read_records(
        path,
        error=lambda message: ConfigError(message, path=key),
        json_advice="use .jsonl for one object per line",
    )
    return [(where, f"{path.stem}:{position}", row) for where, position, row in records]


class JsonlTasks(_FileTasks):
    """Tasks from local JSONL/JSON files with a configurable field mapping (see the module
    docstring). Splits: ``train`` and ``eval``. The same config always gives the same tasks."""

    name = "jsonl_tasks"

    class Config(_FileConfig):
        """Options of :class:`JsonlTasks`."""

        path: str = Field(description="JSONL file (one object per line) or JSON file (a list of objects)")

    config: Config

    def _rows(self, path: Path, config_key: str) -> list[Row]:
        return _read_json_rows(path, config_key)


class ParquetTasks(_FileTasks):
    """Tasks from local Parquet files (a file, or a directory of files), with the same options as
    ``jsonl_tasks``. Needs pyarrow (``pip install agent-r1[parquet]``). Rows without an id get
    ``<file stem>:<row index>``."""

    name = "parquet_tasks"

    class Config(_FileConfig):
        """Options of :class:`ParquetTasks`."""

        path: str = Field(description="Parquet file (or directory of Parquet files) of the train split")

    config: Config

    def _rows(self, path: Path, config_key: str) -> list[Row]:
        if not path.exists():
            raise _missing_file(path, config_key)
        try:
            import pyarrow
            import pyarrow.parquet as parquet
        except ImportError:
            raise ConfigError(
                "data.name: parquet_tasks reads Parquet with pyarrow, which is not installed; "
                "pip install 'agent-r1[parquet]'",
                path="data.name",
            ) from None
        try:
            table = parquet.read_table(str(path))
        except (pyarrow.ArrowException, OSError) as exc:
            raise ConfigError(
                f"data.{config_key}: {str(path)!r} is not a readable Parquet file: {exc}",
                path=f"data.{config_key}",
            ) from None
        return [(f"{path}[row {i}]", f"{path.stem}:{i}", row) for i, row in enumerate(table.to_pylist())]


# --------------------------------------------------------------------------------------------
# Hugging Face datasets
# --------------------------------------------------------------------------------------------

_BUILDERS = {
    ".json": "json",
    ".jsonl": "json",
    ".csv": "csv",
    ".tsv": "csv",
    ".parquet": "parquet",
    ".arrow": "arrow",
    ".txt": "text",
}
"""Data file suffix → the ``datasets`` builder that reads it."""


class HfDatasetTasks(_TableTasks):
    """Tasks from anything the Hugging Face ``datasets`` library loads, with the column mapping of
    ``jsonl_tasks``. Needs ``pip install agent-r1[datasets]``.

    ``path`` is tried in this order: a directory written by ``save_to_disk`` (read with
    ``datasets.load_from_disk``); a data file (``.json``, ``.jsonl``, ``.csv``, ``.tsv``, ``.parquet``,
    ``.arrow``, ``.txt``: read with the matching builder, as split ``train``); otherwise
    ``datasets.load_dataset(path, name=subset, data_files=data_files, **load_kwargs)`` (a builder
    such as ``json`` or ``parquet`` with ``data_files``, a local dataset directory, or a dataset on
    the Hugging Face Hub when the machine can reach it). Rows without an id get ``<split>:<index>``.
    """

    name = "hf_datasets"

    class Config(TaskColumns):
        """Options of :class:`HfDatasetTasks`."""

        path: str = Field(
            description="save_to_disk directory, data file, or the path argument of datasets.load_dataset"
        )
        data_files: str | list[str] | dict[str, str | list[str]] | None = Field(
            None, description="data_files of datasets.load_dataset (e.g. {train: a.parquet, test: b.parquet})"
        )
        subset: str | None = Field(None, description="the configuration name (name= of load_dataset)")
        load_kwargs: dict[str, Any] = Field(
            default_factory=dict, description="more keyword arguments of datasets.load_dataset (revision...)"
        )
        train_split: str = Field("train", description="split of the dataset used for training")
        eval_split: str | None = Field(None, description="split used for eval; else see eval_fraction")

        @model_validator(mode="after")
        def _check_split(self) -> HfDatasetTasks.Config:
            if self.eval_split is not None and self.eval_fraction > 0:
                raise ValueError("set eval_split or eval_fraction, not both")
            if self.eval_split is not None and self.eval_split == self.train_split:
                raise ValueError(f"eval_split and train_split are both {self.train_split!r}")
            return self

    config: Config

    def _no_eval_advice(self) -> str:
        return f"{self.config.path} has no eval split (set data.eval_split or data.eval_fraction)"

    def _read(self) -> tuple[list[Task], list[Task] | None]:
        config = self.config
        loaded, described = self._load_dataset()
        splits = _splits(loaded)
        if splits is None:  # one Dataset, not a DatasetDict
            if config.train_split != "train" or config.eval_split is not None:
                raise ConfigError(
                    f"data.path: {described} is a single dataset without named splits; leave "
                    "data.train_split and data.eval_split unset (use data.eval_fraction to hold out eval)",
                    path="data.eval_split" if config.eval_split is not None else "data.train_split",
                )
            return self._tasks(_rows(loaded, described, "train"), "path"), None
        train = self._tasks(
            _rows(_split(loaded, splits, config.train_split, described), described, config.train_split),
            "train_split",
        )
        if config.eval_split is None:
            return train, None
        evaluation = self._tasks(
            _rows(
                _split(loaded, splits, config.eval_split, described, key="eval_split"),
                described,
                config.eval_split,
            ),
            "eval_split",
        )
        self._check_disjoint(
            train,
            evaluation,
            f"splits {config.train_split!r} and {config.eval_split!r} of {described}",
            "data.eval_split",
        )
        return train, evaluation

    def _load_dataset(self) -> tuple[Any, str]:
        """The loaded ``Dataset`` or ``DatasetDict``, and how it was loaded (for messages)."""
        config = self.config
        try:
            import datasets
        except ImportError:
            raise ConfigError(
                "data.name: hf_datasets needs the Hugging Face datasets library, which is not installed; "
                "pip install 'agent-r1[datasets]'",
                path="data.name",
            ) from None
        path = Path(config.path).expanduser()
        load_options = {
            "subset": config.subset,
            "data_files": config.data_files,
            "load_kwargs": config.load_kwargs,
        }
        if path.is_dir() and ((path / "dataset_dict.json").is_file() or (path / "state.json").is_file()):
            unused = [k for k, v in load_options.items() if v]
            if unused:
                raise ConfigError(
                    f"data.{unused[0]}: {str(path)!r} was written by save_to_disk and is read with "
                    f"load_from_disk, which takes no {', '.join(unused)}; remove them",
                    path=f"data.{unused[0]}",
                )
            described = f"load_from_disk({str(path)!r})"
            call: Callable[[], Any] = partial(datasets.load_from_disk, str(path))
        elif path.is_file():
            builder = _BUILDERS.get(path.suffix.lower())
            if builder is None:
                raise ConfigError(
                    f"data.path: cannot tell the format of {str(path)!r} from its suffix; known: "
                    f"{', '.join(sorted(_BUILDERS))}. Or name a builder: data.path: json (or csv, parquet) "
                    "with data.data_files",
                    path="data.path",
                )
            if config.data_files is not None:
                raise ConfigError(
                    f"data.data_files: data.path {str(path)!r} is already a data file; set either path to "
                    "the file, or path to a builder (json, csv, parquet...) with data_files",
                    path="data.data_files",
                )
            described = f"load_dataset({builder!r}, data_files={str(path)!r})"
            call = partial(
                datasets.load_dataset, builder, name=config.subset, data_files=str(path), **config.load_kwargs
            )
        else:
            if config.path.startswith((".", "/", "~")) or Path(config.path).suffix.lower() in _BUILDERS:
                raise ConfigError(
                    f"data.path: {config.path!r} does not exist (looked for {str(path.absolute())!r})",
                    path="data.path",
                )
            arguments = [repr(config.path)]
            arguments += [
                f"{k}={v!r}" for k, v in (("name", config.subset), ("data_files", config.data_files)) if v
            ]
            arguments += [f"{k}={v!r}" for k, v in config.load_kwargs.items()]
            described = f"load_dataset({', '.join(arguments)})"
            call = partial(
                datasets.load_dataset,
                config.path,
                name=config.subset,
                data_files=config.data_files,
                **config.load_kwargs,
            )
        try:
            return call(), described
        except Exception as exc:
            raise ConfigError(
                f"data.path: {described} failed: {type(exc).__name__}: {exc}. Check data.path and "
                "data.data_files; without network access only local files and directories load",
                path="data.path",
            ) from None


def _splits(loaded: Any) -> list[str] | None:
    """The split names of a ``DatasetDict`` (None for a single dataset)."""
    keys = getattr(loaded, "keys", None)
    return [str(k) for k in keys()] if callable(keys) else None


def _split(loaded: Any, splits: list[str], split: str, described: str, key: str = "train_split") -> Any:
    if split not in splits:
        raise ConfigError(
            f"data.{key}: {described} has no split {split!r}; its splits are {', '.join(splits)}",
            path=f"data.{key}",
        )
    return loaded[split]


def _rows(dataset: Any, described: str, split: str) -> list[Row]:
    rows: list[Row] = []
    for index, row in enumerate(dataset):
        if not isinstance(row, Mapping):
            raise ConfigError(
                f"{described} split {split!r} row {index}: expected a row of named columns, got "
                f"{type(row).__name__}",
                path="data.path",
            )
        rows.append((f"{described} split {split!r} row {index}", f"{split}:{index}", dict(row)))
    return rows


JsonlTasksConfig = JsonlTasks.Config

DATASETS: list[type[Dataset]] = [JsonlTasks, ParquetTasks, HfDatasetTasks]
"""The datasets of this module that the bundled plugin registers."""
