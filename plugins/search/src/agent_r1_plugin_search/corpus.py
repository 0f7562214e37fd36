"""Search corpora: reading passages from local files, and the bundled sample data.

Two families of files are understood (``format="auto"`` tells them apart by the first record):

* **Passage files** (``format="passages"``), one passage per record, in the Wikipedia-passage
  format of DPR, Search-R1 and FlashRAG: ``{"id": "0", "contents": "\\"Title\\"\\ntext"}`` (the title
  is the first line, optionally in double quotes), or ``{"id", "title", "text"}``.
* **QA files with evidence paragraphs** (``format="qa"``): HotpotQA and 2WikiMultihopQA records with
  ``context`` (either ``{"title": [...], "sentences": [[...]]}`` as on the Hugging Face hub, or the
  original ``[[title, [sentences]], ...]``), and MuSiQue records with
  ``paragraphs: [{"title", "paragraph_text"}]``. Each paragraph becomes one passage (its sentences
  joined); paragraphs repeated across questions are kept once. A passage's id is its title; when two
  different paragraphs share a title, the later ones get ``Title#2``, ``Title#3``...

Files may be ``.jsonl`` (one record a line), ``.json`` (a list of records, or ``{"data": [...]}``),
and either may be gzip-compressed (``.gz``). Errors name the file, the line (or record index) and
the missing field.
"""

from __future__ import annotations

import hashlib
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from agent_r1 import AgentR1Error
from agent_r1.records import read_records

CorpusFormat = Literal["auto", "passages", "qa"]


class CorpusError(AgentR1Error):
    """A corpus or QA data file is missing, unreadable or malformed (the message names where)."""


@dataclass(frozen=True)
class Passage:
    """One retrievable unit of text."""

    id: str
    title: str
    text: str

    @property
    def contents(self) -> str:
        """The passage in the Wikipedia-passage format: ``"Title"`` on the first line, then the text."""
        return f'"{self.title}"\n{self.text}'


@dataclass(frozen=True)
class Hit:
    """A passage returned for a query, with the retriever's score (higher is better)."""

    id: str
    title: str
    text: str
    score: float

    @classmethod
    def of(cls, passage: Passage, score: float) -> Hit:
        return cls(passage.id, passage.title, passage.text, float(score))


# --------------------------------------------------------------------------------------------
# Bundled data
# --------------------------------------------------------------------------------------------

BUNDLED_FILES: dict[str, str] = {
    "hotpotqa": "hotpotqa_dev_200.jsonl",
    "2wikimultihopqa": "2wikimultihopqa_dev_100.jsonl",
    "musique": "musique_dev_100.jsonl",
    "nq": "nq_toy.jsonl",
    "wiki": "wiki_passages_1000.jsonl",
}
"""Short names of the sample files shipped in ``agent_r1_plugin_search/data`` (see ATTRIBUTION.md)."""

BUNDLED_CORPORA: dict[str, str] = {
    "hotpotqa": "hotpotqa",
    "wiki": "wiki",
}
"""Corpus names usable wherever a corpus path is expected: ``hotpotqa`` is the paragraphs of the
200 bundled HotpotQA questions (1,975 passages), ``wiki`` the 1,000 bundled Wikipedia passages."""


def bundled_path(name: str) -> Path:
    """Path of a bundled sample file by short name (``hotpotqa``, ``musique``, ``wiki``...)."""
    if name not in BUNDLED_FILES:
        raise CorpusError(f"no bundled data named {name!r}; bundled: {', '.join(sorted(BUNDLED_FILES))}")
    return Path(str(resources.files("agent_r1_plugin_search") / "data" / BUNDLED_FILES[name]))


def resolve_corpus_path(corpus: str | os.PathLike[str]) -> Path:
    """A corpus argument as a file path: an existing path, or a bundled corpus name."""
    path = Path(corpus).expanduser()
    if path.exists():
        if not path.is_file():
            raise CorpusError(f"corpus {str(corpus)!r} is not a file")
        return path
    if str(corpus) in BUNDLED_CORPORA:
        return bundled_path(BUNDLED_CORPORA[str(corpus)])
    if str(corpus) in BUNDLED_FILES:
        raise CorpusError(
            f"the bundled {str(corpus)!r} sample holds questions without paragraphs, so it cannot be "
            f"a search corpus. {_NO_PARAGRAPHS_ADVICE}"
        )
    raise CorpusError(
        f"corpus file {str(corpus)!r} does not exist (bundled corpora: {', '.join(sorted(BUNDLED_CORPORA))})"
    )


# --------------------------------------------------------------------------------------------
# Reading records
# --------------------------------------------------------------------------------------------


def iter_records(path: str | os.PathLike[str]) -> Iterator[tuple[str, dict[str, Any]]]:
    """Yield ``(where, record)`` from a JSONL or JSON file (``.gz`` too; a JSON file holds a list
    or ``{"data": [...]}``); ``where`` is ``file:line`` or ``file[index]``. A problem raises
    :class:`CorpusError` naming the file and the record."""
    for where, _, record in read_records(path, error=CorpusError):
        yield where, record


def split_contents(contents: str) -> tuple[str, str]:
    """Split ``"Title"\\ntext`` into title and text (quotes around the title are removed)."""
    title, _, text = contents.partition("\n")
    title = title.strip()
    if len(title) >= 2 and title[0] == title[-1] == '"':
        title = title[1:-1]
    return title, text.strip()


def _require(record: dict[str, Any], field: str, where: str, expected: type | tuple[type, ...]) -> Any:
    if field not in record:
        raise CorpusError(f"{where}: missing field {field!r} (fields present: {', '.join(sorted(record))})")
    value = record[field]
    if not isinstance(value, expected):
        names = expected.__name__ if isinstance(expected, type) else " or ".join(t.__name__ for t in expected)
        raise CorpusError(f"{where}: field {field!r} should be a {names}, got {type(value).__name__}")
    return value


_NO_PARAGRAPHS_ADVICE = (
    'Give a passage file ({"id", "contents"} per line, e.g. a Wikipedia dump), QA records that '
    "carry their evidence ('context' for HotpotQA/2WikiMultihopQA, 'paragraphs' for MuSiQue), the "
    "bundled 'hotpotqa' or 'wiki' corpus, or a retrieval server (retriever kind: http)."
)


def question_only_dataset(record: dict[str, Any]) -> str | None:
    """The dataset a QA record without evidence paragraphs looks like (``None`` for other records).

    Such rows (the bundled 2WikiMultihopQA and MuSiQue samples, FlashRAG exports) hold questions
    and answers only; given as a corpus they would otherwise fail as "passages without text".
    """
    if "question" not in record or "context" in record or "paragraphs" in record:
        return None
    if "question_decomposition" in record or "answerable" in record or "answer_aliases" in record:
        return "MuSiQue"
    if "golden_answers" in record:
        return "Natural-Questions-style (FlashRAG)"
    if "answer" in record:
        return "2WikiMultihopQA" if ("test_id" in record or "_id" in record or "type" in record) else "QA"
    return None


def passage_from_record(record: dict[str, Any], where: str, index: int) -> Passage:
    """A passage from a ``{"id", "contents"}`` or ``{"id", "title", "text"}`` record."""
    passage_id = str(record.get("id", record.get("_id", index)))
    dataset = question_only_dataset(record) if "contents" not in record and "text" not in record else None
    if dataset is not None:
        raise CorpusError(
            f"{where}: this is a {dataset} question record (fields: {', '.join(sorted(record))}); it "
            f"carries no paragraphs, so the file cannot be a search corpus. {_NO_PARAGRAPHS_ADVICE}"
        )
    if "contents" in record:
        title, text = split_contents(_require(record, "contents", where, str))
    elif "text" in record:
        text = _require(record, "text", where, str)
        title = str(record.get("title", ""))
    else:
        raise CorpusError(
            f"{where}: a passage needs 'contents' (\"Title\"\\ntext) or 'text' (and 'title'); "
            f"fields present: {', '.join(sorted(record))}"
        )
    return Passage(passage_id, title, text)


def qa_paragraphs(record: dict[str, Any], where: str) -> list[tuple[str, str]]:
    """The ``(title, text)`` evidence paragraphs of a HotpotQA, 2WikiMultihopQA or MuSiQue record."""
    if "paragraphs" in record:  # MuSiQue
        paragraphs = _require(record, "paragraphs", where, list)
        out = []
        for i, paragraph in enumerate(paragraphs):
            if not isinstance(paragraph, dict) or "paragraph_text" not in paragraph:
                raise CorpusError(f"{where}: paragraphs[{i}] needs 'title' and 'paragraph_text'")
            out.append((str(paragraph.get("title", "")), str(paragraph["paragraph_text"]).strip()))
        return out
    context = _require(record, "context", where, (dict, list))
    if isinstance(context, dict):  # Hugging Face layout: parallel lists
        titles = _require(context, "title", f"{where}: context", list)
        sentences = _require(context, "sentences", f"{where}: context", list)
        if len(titles) != len(sentences):
            raise CorpusError(
                f"{where}: context has {len(titles)} titles but {len(sentences)} sentence lists"
            )
        pairs = list(zip(titles, sentences, strict=True))
    else:  # original layout: [[title, [sentences]], ...]
        pairs = []
        for i, item in enumerate(context):
            if not (isinstance(item, (list, tuple)) and len(item) == 2):
                raise CorpusError(f"{where}: context[{i}] should be [title, [sentences]]")
            pairs.append((item[0], item[1]))
    out = []
    for i, (title, sents) in enumerate(pairs):
        if isinstance(sents, str):
            sents = [sents]
        if not isinstance(sents, list):
            raise CorpusError(f"{where}: context paragraph {i} ({title!r}) has no sentence list")
        out.append((str(title), "".join(str(s) for s in sents).strip()))
    return out


def detect_format(record: dict[str, Any]) -> Literal["passages", "qa"]:
    """``qa`` for records with ``context``/``paragraphs`` evidence, else ``passages``."""
    return "qa" if ("context" in record or "paragraphs" in record) else "passages"


def read_passages(path: str | os.PathLike[str], format: CorpusFormat = "auto") -> list[Passage]:
    """Read every passage of a corpus file (see the module docstring for the formats)."""
    path = Path(path)
    passages: list[Passage] = []
    ids: dict[str, int] = {}
    seen_paragraphs: set[tuple[str, str]] = set()
    title_variants: dict[str, int] = {}
    chosen: str | None = None if format == "auto" else format
    for index, (where, record) in enumerate(iter_records(path)):
        if chosen is None:
            chosen = detect_format(record)
        if chosen == "passages":
            passage = passage_from_record(record, where, index)
            if passage.id in ids:
                raise CorpusError(
                    f"{where}: passage id {passage.id!r} was already used by record {ids[passage.id] + 1}"
                )
            ids[passage.id] = index
            passages.append(passage)
            continue
        for title, text in qa_paragraphs(record, where):
            if (title, text) in seen_paragraphs:
                continue
            seen_paragraphs.add((title, text))
            variant = title_variants.get(title, 0) + 1
            title_variants[title] = variant
            passages.append(Passage(title if variant == 1 else f"{title}#{variant}", title, text))
    if not passages:
        raise CorpusError(f"corpus {path} holds no passages")
    return passages


# --------------------------------------------------------------------------------------------
# Fingerprints
# --------------------------------------------------------------------------------------------


def file_sha256(path: str | os.PathLike[str], *, memo_dir: str | os.PathLike[str] | None = None) -> str:
    """SHA-256 of a file's bytes.

    With ``memo_dir`` the digest is remembered per (absolute path, size, modification time), so a
    multi-gigabyte corpus is hashed once, not at every start.
    """
    path = Path(path).resolve()
    stat = path.stat()
    memo: Path | None = None
    if memo_dir is not None:
        key = hashlib.sha256(f"{path}\0{stat.st_size}\0{stat.st_mtime_ns}".encode()).hexdigest()
        memo = Path(memo_dir) / "hashes" / f"{key}.txt"
        try:
            cached = memo.read_text(encoding="ascii").strip()
            if len(cached) == 64:
                return cached
        except OSError:
            pass
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    value = digest.hexdigest()
    if memo is not None:
        atomic_write_text(memo, value)
    return value


def atomic_write_text(path: Path, text: str) -> None:
    """Write a file through a temporary sibling and ``os.replace`` (readers never see half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    temporary.write_text(text, encoding="utf-8")
    os.replace(temporary, path)
