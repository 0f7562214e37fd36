"""Reward shapers for search-augmented QA.

Outcome rewards compare the final answer with ``task.answer`` (a string or a list of aliases; the
best alias counts) with the core's answer metrics (:mod:`agent_r1.rewards`), so that ``qa_em`` and
the core's ``answer_match`` (``mode: exact``) give the same value on the same trajectory:

* ``qa_em``: exact match (1 or 0);
* ``qa_f1``: token F1 (0..1, HotpotQA's yes/no rule);
* ``qa_substring``: a gold alias occurs in the answer at word boundaries (1 or 0);
* ``qa_format``: the episode ended with a well-formed, short, non-empty answer and no turn had a
  malformed tool call (1 or 0).

Each takes ``normalization``: ``official`` (default; the HotpotQA / SQuAD scripts' rules exactly, so
numbers compare with papers) or ``robust`` (Unicode-aware, accents folded unless ``keep_accents``).

Process rewards, one signal per rewarded turn:

* ``search_valid``: the turn made a search call that ran and whose query was new in the episode
  (at most ``max_rewarded_turns`` turns are rewarded, so spamming searches does not pay);
* ``search_gold``: the turn's search retrieved supporting paragraphs (``task.metadata
  ["supporting_titles"]``) not retrieved before; the value is the share of gold paragraphs newly
  found, so a whole episode earns at most 1. Tasks whose data names no supporting paragraphs get
  no signal.

A turn whose observation ended the episode (for example the last turn allowed by ``max_turns``)
earns no process reward: its search results were never shown to the agent.

The final answer is :func:`agent_r1.rewards.final_answer`: the ``answer`` of the last action (what the
tool-call format parsed, e.g. the text of ``<answer>...</answer>``). Which passages a turn retrieved
is read from ``observation.info["search"]`` (written by the ``search_qa`` environment) or, failing
that, parsed from the search results' text (see :mod:`agent_r1_plugin_search.tool`).

Weights come from the run config (``rewards: [{name: qa_em, weight: 1.0}, ...]``); the engine
multiplies every signal by its shaper's weight.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import Field

from agent_r1 import ComponentConfig, RewardShaper, RewardSignal, Task, Trajectory
from agent_r1.rewards import (
    DEFAULT_NORMALIZATION,
    TEXT_METRICS,
    Normalization,
    final_answer,
    normalize_answer,
)
from agent_r1_plugin_search.tool import titles_from_text


class QAAnswerConfig(ComponentConfig):
    """Options of the answer shapers (``qa_em``, ``qa_f1``, ``qa_substring``)."""

    normalization: Normalization = Field(
        DEFAULT_NORMALIZATION,
        description="'official' (HotpotQA/SQuAD scripts, comparable with papers) or 'robust' (Unicode-aware)",
    )
    keep_accents: bool = Field(False, description="robust only: compare accents too ('René' != 'Rene')")


class _AnswerShaper(RewardShaper):
    metric: ClassVar[str] = ""
    Config = QAAnswerConfig
    config: QAAnswerConfig

    def score(self, trajectory: Trajectory, task: Task) -> list[RewardSignal]:
        """One outcome signal (none when the task has no reference answer)."""
        if task.answer is None:
            return []
        answer = final_answer(trajectory)
        value = (
            0.0
            if answer is None
            else TEXT_METRICS[self.metric](
                answer,
                task.answer,
                normalization=self.config.normalization,
                keep_accents=self.config.keep_accents,
            )
        )
        return [RewardSignal(name=self.name, value=value, kind="outcome", source=self.name)]


class ExactMatchReward(_AnswerShaper):
    """1.0 when the normalised final answer equals a normalised gold alias."""

    name = "qa_em"
    metric = "exact"


class F1Reward(_AnswerShaper):
    """Token-level F1 between the final answer and the best gold alias (HotpotQA's yes/no rule)."""

    name = "qa_f1"
    metric = "f1"


class SubstringReward(_AnswerShaper):
    """1.0 when a normalised gold alias occurs in the normalised final answer (word boundaries)."""

    name = "qa_substring"
    metric = "substring"


class AnswerFormatReward(RewardShaper):
    """1.0 for an episode that ends with a short non-empty answer and made no malformed call."""

    name = "qa_format"

    class Config(ComponentConfig):
        max_answer_words: int = Field(20, ge=1, description="longer answers score 0")
        allow_parse_errors: bool = Field(False, description="do not require every turn to parse cleanly")

    def score(self, trajectory: Trajectory, task: Task) -> list[RewardSignal]:
        """One outcome signal, 1 or 0."""
        answer = final_answer(trajectory)
        words = normalize_answer(answer, "robust").split() if answer is not None else []
        good = bool(words) and len(words) <= self.config.max_answer_words
        if good and not self.config.allow_parse_errors:
            good = not any(step.action.parse_errors for step in trajectory.steps)
        return [RewardSignal(name=self.name, value=float(good), kind="outcome", source=self.name)]


def _seen_by_agent(step: Any) -> bool:
    """Whether the agent read the step's observation (an observation that ended the episode was
    never shown: its search results cannot have helped)."""
    return step.observation is not None and not step.observation.done


def _search_results(step: Any, tool_name: str) -> list[Any]:
    observation = step.observation
    if observation is None:
        return []
    return [r for r in observation.tool_results if r.name == tool_name and r.ok]


def retrieved_titles(step: Any, tool_name: str = "search") -> list[str]:
    """Titles a turn's searches retrieved: ``observation.info["search"]`` records, else parsed text."""
    observation = step.observation
    if observation is None:
        return []
    records = observation.info.get("search") if isinstance(observation.info, dict) else None
    if isinstance(records, list):
        return [str(t) for record in records if isinstance(record, dict) for t in record.get("titles", [])]
    return [
        title for result in _search_results(step, tool_name) for title in titles_from_text(result.content)
    ]


def _title_key(title: str) -> str:
    return " ".join(title.casefold().split())


class ValidSearchReward(RewardShaper):
    """Process reward for turns that made a search call which ran and asked something new."""

    name = "search_valid"

    class Config(ComponentConfig):
        tool: str = Field("search", description="name of the search tool")
        max_rewarded_turns: int = Field(4, ge=1, description="reward at most this many turns")

    def score(self, trajectory: Trajectory, task: Task) -> list[RewardSignal]:
        """One process signal (1.0) per turn with a new search, at most ``max_rewarded_turns``."""
        seen: set[str] = set()
        signals: list[RewardSignal] = []
        for step in trajectory.steps:
            if not _seen_by_agent(step):
                continue
            queries = {call.id: str(call.arguments.get("query", "")) for call in step.action.tool_calls}
            fresh = False
            for result in _search_results(step, self.config.tool):
                key = normalize_answer(queries.get(result.call_id, ""), "robust", keep_accents=True)
                if key and key not in seen:
                    seen.add(key)
                    fresh = True
            if fresh and len(signals) < self.config.max_rewarded_turns:
                signals.append(
                    RewardSignal(name=self.name, value=1.0, kind="process", turn=step.turn, source=self.name)
                )
        return signals


class GoldRetrievalReward(RewardShaper):
    """Process reward for turns whose searches found supporting paragraphs not found before."""

    name = "search_gold"

    class Config(ComponentConfig):
        tool: str = Field("search", description="name of the search tool")
        metadata_key: str = Field("supporting_titles", description="task.metadata key of the gold titles")

    def score(self, trajectory: Trajectory, task: Task) -> list[RewardSignal]:
        """One process signal per turn that found gold paragraphs not found before."""
        gold_titles = task.metadata.get(self.config.metadata_key) or []
        gold = {_title_key(str(t)) for t in gold_titles}
        if not gold:
            return []
        found: set[str] = set()
        signals: list[RewardSignal] = []
        for step in trajectory.steps:
            if not _seen_by_agent(step):
                continue
            new = ({_title_key(t) for t in retrieved_titles(step, self.config.tool)} & gold) - found
            if new:
                found |= new
                signals.append(
                    RewardSignal(
                        name=self.name,
                        value=len(new) / len(gold),
                        kind="process",
                        turn=step.turn,
                        source=self.name,
                    )
                )
        return signals


SHAPERS: list[type[RewardShaper]] = [
    ExactMatchReward,
    F1Reward,
    SubstringReward,
    AnswerFormatReward,
    ValidSearchReward,
    GoldRetrievalReward,
]
