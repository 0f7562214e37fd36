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
titles, scores); the ``search_gold`` reward reads it. A retriever failure (the server is down after
the client's retries, the corpus is missing) is handled by ``on_retrieval_error``:

* ``raise`` (default): the step raises :class:`~agent_r1.errors.EnvironmentFatalError` and the run
  aborts with the retriever's message, whatever the engine's ``on_env_error`` says, because training
  on "server unreachable" observations teaches the agent nothing;
* ``env_error``: the step raises :class:`~agent_r1.errors.ToolInfrastructureError`; the engine counts
  the episode as an environment error (and stops the run when their share gets too high);
* ``show``: the failure is a failed call whose ``Error: search failed: ...`` the agent reads.
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
from agent_r1.errors import EnvironmentFatalError, ToolInfrastructureError
from agent_r1_plugin_search.retrievers import RetrieverConfig
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


SEARCH_R1_TEMPLATE = (
    "Answer the given question. You must conduct reasoning inside <think> and </think> first every "
    "time you get new information. After reasoning, if you find you lack some knowledge, you can call "
    "a search engine by <search> query </search> and it will return the top searched results between "
    "<information> and </information>. You can search as many times as your want. If you find no "
    "further external knowledge needed, you can directly provide the answer inside <answer> and "
    "</answer>, without detailed illustrations. For example, <answer> Beijing </answer>. "
    "Question: {question}\n"
)
"""Search-R1's prompt (``make_prefix`` of its data scripts, ``template_type="base"``), word for word,
including its "as your want": the whole user message under ``layout: search_r1``, with no system
message of ours (the chat template adds its default one, as it does for Search-R1)."""


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
    layout: Literal["agent_r1", "search_r1"] = Field(
        "agent_r1",
        description="search_r1: Search-R1's prompt as the user message (no system prompt), its result "
        "text 'Doc i(Title: \"T\") text' in '\\n\\n<information>...</information>\\n\\n' appended "
        "inside the assistant's turn (no chat-template tokens around it), and a turn without search or "
        "answer goes on",
    )
    on_retrieval_error: Literal["raise", "env_error", "show"] = Field(
        "raise",
        description="when the retriever fails: abort the run (raise), fail the step as an environment "
        "error (env_error), or show the error to the agent (show)",
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
    def _layout_defaults(self) -> SearchQAConfig:
        if self.layout != "search_r1":
            return self
        defaults = {
            "question_template": SEARCH_R1_TEMPLATE,
            "system_prompt": "",
            "include_format_instructions": False,
            "end_on_no_tool_call": False,
        }
        for name, value in defaults.items():
            if name not in self.model_fields_set:
                object.__setattr__(self, name, value)
        fmt = self.format_spec()
        if fmt.name.rpartition(":")[2] != "tags":
            raise ValueError(f"layout 'search_r1' needs the tags format (Search-R1's), not {fmt.name!r}")
        return self

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
        out = []
        for spec in specs:
            if _is_search(spec):
                options = {**spec.options, **shortcuts}  # never both: the validator sees to it
                if self.on_retrieval_error == "show":
                    options.setdefault("show_errors", True)
                if self.layout == "search_r1":
                    options.setdefault("result_style", "search_r1")
                spec = ComponentSpec(name=spec.name, **options)
            out.append(spec)
        return out

    def format_spec(self) -> ComponentSpec:
        spec = super().format_spec()
        if spec.name.rpartition(":")[2] == "tags" and "result_tag" not in spec.options:
            return ComponentSpec(name=spec.name, **spec.options, result_tag="information")
        return spec


SEARCH_R1_INVALID_ACTION = (
    "\nMy previous action is invalid. If I want to search, I should put the query between <search> and "
    "</search>. If I want to give the final answer, I should put the answer between <answer> and "
    "</answer>. Let me try again.\n"
)
"""What Search-R1 appends after an action with neither a search nor an answer (layout search_r1)."""


class SearchQAEnv(ToolEnv):
    """Multi-hop QA with a search tool (see the module docstring for the options and protocol)."""

    name = "search_qa"
    Config = SearchQAConfig
    config: SearchQAConfig

    def __init__(self, config: ComponentConfig | Mapping[str, Any] | None = None) -> None:
        super().__init__(config)
        if self.config.system_prompt is None:  # layout search_r1 sets "" (no system message)
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
        """:meth:`ToolEnv.step`, then the turn's search records into ``info["search"]``; a retriever
        failure is handled as ``on_retrieval_error`` says (see the module docstring)."""
        mode = self.config.on_retrieval_error
        with recording_searches() as records:
            try:
                observation = await super().step(action, turn)
            except ToolInfrastructureError as exc:  # ToolEnv fails the step on a tool's infrastructure error
                if mode == "raise":
                    failed = [record.error for record in records if record.error]
                    raise self._fatal(turn, str(failed[0] if failed else exc)) from exc
                raise
        failures = [record for record in records if record.error]
        if failures and mode == "raise":
            raise self._fatal(turn, str(failures[0].error))
        if failures and mode == "env_error":
            raise ToolInfrastructureError(
                f"search_qa turn {turn}: the search tool failed: {failures[0].error}"
            )
        observation.info["search"] = [record.as_dict() for record in records if not record.error]
        if self.config.layout == "search_r1" and not observation.done and not observation.tool_calls:
            # Neither a search nor an answer: Search-R1 appends its fixed reminder and goes on
            # (search_r1/llm_agent/generation.py in PeterGriffinJin/Search-R1).
            return observation.model_copy(update={"messages": [], "continuation": SEARCH_R1_INVALID_ACTION})
        if self.config.layout == "search_r1" and observation.messages:
            # Search-R1 appends "\n\n<information>...</information>\n\n" to the model's own
            # response, tokenised on its own, and generation goes on in the same assistant turn.
            body = "\n".join(str(message.get("content", "")) for message in observation.messages).strip()
            observation = observation.model_copy(update={"messages": [], "continuation": f"\n\n{body}\n\n"})
        return observation

    def _fatal(self, turn: int, error: str) -> EnvironmentFatalError:
        return EnvironmentFatalError(
            f"search_qa turn {turn}: the search tool failed and environment.on_retrieval_error is "
            f"'raise', so the run stops: {error}. Fix the retriever (start the retrieval server, fix "
            "the corpus path), or set environment.on_retrieval_error to 'env_error' (count such "
            "episodes as environment errors) or 'show' (let the agent read the error)."
        )
