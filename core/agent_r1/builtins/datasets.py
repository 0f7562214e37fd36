"""``jsonl_tasks``: tasks from a local JSONL (or JSON) file with a configurable field mapping.

Each row becomes one :class:`~agent_r1.Task`: the question field fills the user message (through
``user_template``), the answer field becomes ``task.answer``, and the remaining fields go to
``task.metadata``. The eval split comes from a second file, or from a seeded random fraction of
the first one::

    data:
      name: jsonl_tasks
      path: data/train.jsonl          # {"id": "q1", "question": "...", "answer": "42"} per line
      eval_path: data/test.jsonl      # or: eval_fraction: 0.1
      question_field: question
      answer_field: answer
      system_prompt: "Think step by step."

Every problem with a file names the file and the line (or, for ``.json`` files, the row index).
"""

from __future__ import annotations

import json
import random
import string
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from pydantic import Field, model_validator

from agent_r1.contracts import ComponentConfig, Dataset
from agent_r1.errors import ConfigError
from agent_r1.mdp import Message, Task


def _read_rows(path: Path, config_key: str) -> list[tuple[str, int, dict[str, Any]]]:
    """``(where, position, row)`` of each row of a JSONL or JSON file: ``where`` is ``file:line``
    (or ``file[index]`` for ``.json``) and ``position`` the line number (or index)."""
    if not path.is_file():
        raise ConfigError(
            f"data.{config_key}: task file {str(path)!r} does not exist", path=f"data.{config_key}"
        )
    rows: list[tuple[str, int, dict[str, Any]]] = []
    if path.suffix == ".json":
        try:
            loaded = json.loads(path.read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{path}: not valid JSON: {exc}", path=f"data.{config_key}") from None
        if not isinstance(loaded, list):
            raise ConfigError(
                f"{path}: a .json task file must hold a list of objects, got {type(loaded).__name__} "
                "(use .jsonl for one object per line)",
                path=f"data.{config_key}",
            )
        for index, row in enumerate(loaded):
            where = f"{path}[{index}]"
            if not isinstance(row, dict):
                raise ConfigError(
                    f"{where}: expected an object, got {type(row).__name__}", path=f"data.{config_key}"
                )
            rows.append((where, index, row))
        return rows
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            where = f"{path}:{number}"
            try:
                row = json.loads(line)
            except ValueError as exc:
                raise ConfigError(f"{where}: not valid JSON: {exc}", path=f"data.{config_key}") from None
            if not isinstance(row, dict):
                raise ConfigError(
                    f"{where}: expected an object, got {type(row).__name__}", path=f"data.{config_key}"
                )
            rows.append((where, number, row))
    return rows


class JsonlTasks(Dataset):
    """Tasks from local JSONL/JSON files with a configurable field mapping (see the module
    docstring). Splits: ``train`` and ``eval``. The same config always gives the same tasks."""

    name = "jsonl_tasks"
    SPLITS: ClassVar[tuple[str, ...]] = ("train", "eval")

    class Config(ComponentConfig):
        """Options of :class:`JsonlTasks`."""

        path: str = Field(description="JSONL file (one object per line) or JSON file (a list of objects)")
        eval_path: str | None = Field(None, description="file of the eval split; else see eval_fraction")
        eval_fraction: float = Field(
            0.0, ge=0.0, lt=1.0, description="without eval_path: share of `path` held out for eval (seeded)"
        )
        seed: int = Field(0, description="seed of the train/eval split")
        question_field: str = Field("question", description="row field that holds the question")
        answer_field: str | None = Field(
            "answer", description="row field of the reference answer (null: none)"
        )
        id_field: str | None = Field(
            "id", description="row field of the task id; rows without one get <file>:<line>"
        )
        category_field: str | None = Field(None, description="row field of the category (per-category eval)")
        system_prompt: str | None = Field(None, description="system message put before the question")
        user_template: str = Field(
            "{question}",
            description="user message; {question} and any row field such as {context} are filled in",
        )
        limit: int | None = Field(None, ge=1, description="use at most this many tasks per split")

        @model_validator(mode="after")
        def _check(self) -> JsonlTasks.Config:
            if self.eval_path is not None and self.eval_fraction > 0:
                raise ValueError("set eval_path or eval_fraction, not both")
            try:
                fields = [name for _, name, _, _ in string.Formatter().parse(self.user_template) if name]
            except ValueError as exc:
                raise ValueError(
                    f"user_template {self.user_template!r} is not a valid template: {exc}"
                ) from None
            if any(not name.isidentifier() for name in fields):
                raise ValueError(f"user_template {self.user_template!r} may only use plain {{field}} names")
            return self

    config: Config

    def __init__(self, config: ComponentConfig | Mapping[str, Any] | None = None) -> None:
        super().__init__(config)
        self._cache: dict[str, list[Task]] = {}

    def load(self, split: str) -> list[Task]:
        """The tasks of ``split`` (``train`` or ``eval``), as fresh copies."""
        if split not in self.SPLITS:
            raise ValueError(f"jsonl_tasks has no split {split!r}; splits are {', '.join(self.SPLITS)}")
        if not self._cache:
            self._cache = self._load_all()
        if split == "eval" and self.config.eval_path is None and self.config.eval_fraction == 0:
            warnings.warn(
                f"jsonl_tasks: {self.config.path} has no eval split (set data.eval_path or "
                "data.eval_fraction); evaluation is skipped",
                stacklevel=2,
            )
        tasks = self._cache[split]
        if self.config.limit is not None:
            tasks = tasks[: self.config.limit]
        return [task.model_copy(deep=True) for task in tasks]

    def _load_all(self) -> dict[str, list[Task]]:
        config = self.config
        train = self._tasks(Path(config.path), "path")
        if config.eval_path is not None:
            evaluation = self._tasks(Path(config.eval_path), "eval_path")
            clash = sorted({t.id for t in train} & {t.id for t in evaluation})
            if clash:
                raise ConfigError(
                    f"data: task ids {clash[:5]} appear in both {config.path} and {config.eval_path}; "
                    "give eval tasks their own ids",
                    path="data.eval_path",
                )
        elif config.eval_fraction > 0:
            order = list(range(len(train)))
            random.Random(f"agent-r1/jsonl_tasks/{config.seed}").shuffle(order)
            held_out = set(order[: round(len(train) * config.eval_fraction)])
            evaluation = [t for i, t in enumerate(train) if i in held_out]
            train = [t for i, t in enumerate(train) if i not in held_out]
        else:
            evaluation = []
        return {"train": train, "eval": evaluation}

    def _tasks(self, path: Path, config_key: str) -> list[Task]:
        config = self.config
        tasks: list[Task] = []
        seen: dict[str, str] = {}
        for where, position, row in _read_rows(path, config_key):
            if config.question_field not in row:
                raise ConfigError(
                    f"{where}: no field {config.question_field!r} (fields: {', '.join(sorted(row))}); "
                    "set data.question_field to the field that holds the question",
                    path="data.question_field",
                )
            if config.answer_field is not None and config.answer_field not in row:
                raise ConfigError(
                    f"{where}: no field {config.answer_field!r} (fields: {', '.join(sorted(row))}); "
                    "set data.answer_field, or null for tasks without a reference answer",
                    path="data.answer_field",
                )
            task_id = row.get(config.id_field) if config.id_field else None
            task_id = str(task_id) if task_id is not None else f"{path.stem}:{position}"
            if task_id in seen:
                raise ConfigError(
                    f"{where}: task id {task_id!r} was already used at {seen[task_id]}; ids must be unique",
                    path=f"data.{config_key}",
                )
            seen[task_id] = where
            fields = {**row, "question": row[config.question_field]}
            try:
                user = config.user_template.format(**{k: v for k, v in fields.items() if isinstance(k, str)})
            except KeyError as exc:
                raise ConfigError(
                    f"{where}: data.user_template uses field {exc.args[0]!r}, which the row lacks "
                    f"(fields: {', '.join(sorted(row))})",
                    path="data.user_template",
                ) from None
            messages: list[Message] = []
            if config.system_prompt:
                messages.append({"role": "system", "content": config.system_prompt})
            messages.append({"role": "user", "content": user})
            mapped = {config.question_field, config.answer_field, config.id_field, config.category_field}
            category = row.get(config.category_field) if config.category_field else None
            tasks.append(
                Task(
                    id=task_id,
                    messages=messages,
                    answer=row.get(config.answer_field) if config.answer_field else None,
                    category=str(category) if category is not None else None,
                    metadata={"source": where, **{k: v for k, v in row.items() if k not in mapped}},
                )
            )
        return tasks


JsonlTasksConfig = JsonlTasks.Config

DATASETS: list[type[Dataset]] = [JsonlTasks]
"""The datasets of this module that the bundled plugin registers."""
