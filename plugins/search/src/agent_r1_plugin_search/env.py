"""``search_qa``: the search-augmented question-answering environment (a ``tool_env`` preset).

The agent gets the question, may search (``search`` tool) over several turns, and ends the episode
with ``<answer>...</answer>``. Both bundled tool-call formats work:

* ``tags`` (default, Search-R1 style): ``<search>query</search>``, generation stops at
  ``</search>``, results come back as ``<information>Doc 1 (Title: ...) ...</information>``;
* ``hermes`` (Qwen2.5/Qwen3 chat templates): ``<tool_call>{"name": "search", "arguments":
  {"query": "..."}}</tool_call>``, results come back as ``tool`` messages.

Configuration (everything of ``tool_env`` applies too)::

    environment:
      name: search_qa
      format: tags                  # or hermes, or {name: tags, result_tag: information, ...}
      retriever: {kind: bm25, corpus: hotpotqa}   # or {kind: http, url: http://127.0.0.1:8000}
      topk: 3
      max_turns: 4

``retriever`` and ``topk`` are shortcuts for the options of the ``search`` entry of ``tools``
(``tools: [{name: search, topk: 3, retriever: {...}}]`` is equivalent; giving both is an error).

Each observation's ``info["search"]`` lists what the turn's searches retrieved (query, passage ids,
titles, scores); the ``search_gold`` reward reads it. A retriever failure (e.g. the server is down
after the client's retries) aborts the rollout with the error by default
(``on_retrieval_error: raise``), because training on "server unreachable" observations teaches the
agent nothing; ``show`` turns it into an error result the agent reads instead.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from agent_r1 import (
    Action,
    ComponentConfig,
    ComponentSpec,
    EpisodeStart,
    Observation,
    Task,
    ToolEnv,
    ToolEnvConfig,
)
from agent_r1_plugin_search.retrievers import RetrievalError, RetrieverConfig
from agent_r1_plugin_search.tool import recording_searches

TAGS_PROMPT = (
    "You answer questions with the help of a search engine over Wikipedia. Reason step by step "
    "inside <think>...</think>. Whenever a fact is missing, search for it with one short query; you "
    "may search several times, one query per search. When you know the answer, give only the answer, "
    "in as few words as possible, for example <answer>Tulsa</answer>."
)
"""Default system prompt with the ``tags`` format (the format's tool list follows it)."""

HERMES_PROMPT = (
    "You answer questions with the help of a search tool over Wikipedia. Think step by step. Whenever "
    "a fact is missing, call the search tool with one short query; you may search several times. When "
    "you know the answer, reply with only the answer, in as few words as possible, inside "
    "<answer>...</answer>, for example <answer>Tulsa</answer>."
)
"""Default system prompt with the ``hermes`` format (the chat template lists the tools)."""


def _is_search(spec: ComponentSpec) -> bool:
    return spec.name.rpartition(":")[2] == "search"


class SearchQAConfig(ToolEnvConfig):
    """:class:`ToolEnvConfig` with search defaults, the retriever shortcuts and the prompt options."""

    tools: list[str | ComponentSpec] = Field(
        default_factory=lambda: ["search"], description="must include the search tool"
    )
    format: str | ComponentSpec = Field(
        default_factory=lambda: ComponentSpec(name="tags", result_tag="information"),
        description="tool-call format; with tags, results come in <information> unless result_tag is set",
    )
    system_prompt: str | None = Field(None, description="None: the preset's prompt for the chosen format")
    question_template: str = Field(
        "Question: {question}", description="how the user message shows the question"
    )
    retriever: RetrieverConfig | None = Field(None, description="shortcut for the search tool's retriever")
    topk: int | None = Field(None, ge=1, le=100, description="shortcut for the search tool's topk")
    on_retrieval_error: Literal["raise", "show"] = Field(
        "raise", description="abort the rollout when the retriever fails, or show the error to the agent"
    )

    @field_validator("question_template")
    @classmethod
    def _template(cls, template: str) -> str:
        try:
            template.format(question="?")
        except (KeyError, IndexError, ValueError) as exc:
            raise ValueError(f"must use only the field {{question}} (problem: {exc!r})") from None
        if "{question}" not in template:
            raise ValueError("must contain {question}")
        return template

    @model_validator(mode="after")
    def _search_listed(self) -> SearchQAConfig:
        specs = [ComponentSpec(name=item) if isinstance(item, str) else item for item in self.tools]
        search = [spec for spec in specs if _is_search(spec)]
        if not search:
            raise ValueError("tools must include the search tool ('search')")
        for shortcut in ("retriever", "topk"):
            if getattr(self, shortcut) is not None and shortcut in search[0].options:
                raise ValueError(
                    f"{shortcut} is given both for the environment and in tools[search]; keep one"
                )
        return self

    def tool_specs(self) -> list[ComponentSpec]:
        specs = super().tool_specs()
        shortcuts: dict[str, Any] = {}
        if self.retriever is not None:
            shortcuts["retriever"] = self.retriever.model_dump(exclude_unset=True)
        if self.topk is not None:
            shortcuts["topk"] = self.topk
        if not shortcuts:
            return specs
        return [
            ComponentSpec(name=spec.name, **{**spec.options, **shortcuts}) if _is_search(spec) else spec
            for spec in specs
        ]

    def format_spec(self) -> ComponentSpec:
        spec = super().format_spec()
        if spec.name.rpartition(":")[2] == "tags" and "result_tag" not in spec.options:
            return ComponentSpec(name=spec.name, **spec.options, result_tag="information")
        return spec


class SearchQAEnv(ToolEnv):
    """Multi-hop QA with a search tool (see the module docstring for the options and protocol)."""

    name = "search_qa"
    Config = SearchQAConfig
    config: SearchQAConfig

    def __init__(self, config: ComponentConfig | Mapping[str, Any] | None = None) -> None:
        super().__init__(config)
        if self.config.system_prompt is None:
            prompt = HERMES_PROMPT if self.format.tools_in_template else TAGS_PROMPT
            self.config = self.config.model_copy(update={"system_prompt": prompt})

    async def reset(self, task: Task) -> EpisodeStart:
        messages = [dict(message) for message in task.messages]
        for message in reversed(messages):
            if message.get("role") == "user":
                question = task.metadata.get("question") or str(message.get("content", ""))
                message["content"] = self.config.question_template.format(question=question)
                break
        return await super().reset(task.model_copy(update={"messages": messages}))

    async def step(self, action: Action, turn: int) -> Observation:
        with recording_searches() as records:
            observation = await super().step(action, turn)
        failures = [record for record in records if record.error]
        if failures and self.config.on_retrieval_error == "raise":
            raise RetrievalError(f"search_qa turn {turn}: the search tool failed: {failures[0].error}")
        observation.info["search"] = [record.as_dict() for record in records if not record.error]
        return observation
