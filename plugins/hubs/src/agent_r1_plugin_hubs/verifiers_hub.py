"""verifiers environments (Prime Intellect's library; release 0.4, its ``verifiers.v1`` stack) as
agent-r1 components.

A verifiers 0.4 environment is a package that exports a ``Taskset`` (``vf-eval my-env`` imports
``my_env``; an Environments Hub id ``owner/my-env`` installs as the same package). Its parts map
onto agent-r1's as follows:

=============================================  ==============================================
verifiers 0.4                                  agent-r1
=============================================  ==============================================
``Taskset.load()``: tasks whose ``TaskData``   dataset ``verifiers``: one :class:`~agent_r1.Task`
carries ``system_prompt`` and ``prompt``        per task (system + user messages), the task data
                                               kept in ``metadata["verifiers"]``
``Task.toolsets`` / ``Taskset.toolsets``:      the tools of environment ``verifiers`` (a
``Toolset`` servers whose ``@vf.tool``          ``tool_env``): the policy writes calls in the run's
methods the harness offers the model            tool-call format; each call runs the tool in
                                               process through the ``mcp`` package's
                                               ``MCPServer`` (the server verifiers would launch),
                                               named ``<server>_<tool>`` as verifiers names them
the rollout's shared ``trace.state``           one state per episode, shared by its tools
                                               (per-rollout and taskset-wide servers alike);
                                               each observation carries it in
                                               ``info["verifiers"]["state"]``
``Task.setup`` / ``Toolset.setup``,            run when the episode's first action arrives (a
``setup_task``                                 failure is a counted environment error)
``@vf.stop`` predicates on the trace           checked after every step, as verifiers checks
                                               them before each model call; one that fires ends
                                               the episode (termination ``stop:<name>``)
``@vf.reward`` methods (with their weights),   reward shaper ``verifiers``: ``Task.finalize`` and
plugged ``rewards`` and ``judges`` of the      ``Task.score`` on a ``vf.Trace`` rebuilt from the
task config: ``Task.score``                    trajectory; one outcome signal per reward, its
                                               verifiers weight kept
the harness (an agent program calling the      agent-r1's rollout loop: what the policy samples
model through verifiers' interception)         is what is trained on
=============================================  ==============================================

What the model wrote reaches verifiers the way an OpenAI-compatible server with a tool parser
would hand it over: the assistant message's content is the action text with the tool-call spans
the format parsed taken out, and the calls become ``tool_calls``; tool results are ``tool``
messages. A reward that reads ``trace.last_reply`` therefore sees the final action without its
calls but with whatever answer markup the policy wrote (``<answer>...</answer>`` with the ``tags``
format); verifiers 0.4 itself has no answer parser.

Refused before any model loads (``check``), with what to do: an environment that defines its own
``Env`` (multi-agent episodes, user simulators), a task that needs a container
(``NEEDS_CONTAINER``), ``setup``/``finalize`` hooks or rewards that need a ``runtime`` (a
sandbox), ``@vf.stop`` predicates on a ``Request``/``Response`` and ``@vf.intercept`` hooks, and
tasks without a prompt.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import json
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from pydantic import Field, TypeAdapter, ValidationError

from agent_r1 import (
    Action,
    ComponentConfig,
    ConfigError,
    Dataset,
    EpisodeStart,
    Observation,
    RewardShaper,
    RewardSignal,
    Task,
    Tool,
    ToolCall,
    ToolEnv,
    ToolEnvConfig,
    ToolError,
    ToolResult,
    Trajectory,
)
from agent_r1.rollout.generation import run_sync
from agent_r1_plugin_hubs.requirements import require
from agent_r1_plugin_hubs.schema_tools import SchemaTool, schema_tool_class

__all__ = [
    "VerifiersDataset",
    "VerifiersEnv",
    "VerifiersEnvConfig",
    "VerifiersRewards",
    "load_environment",
    "rebuild_trace",
]


ENV_ID_HELP = (
    "the verifiers environment, as `vf-eval` takes it: an installed package ('my-env' imports "
    "my_env), an Environments Hub id once installed ('owner/my-env'), or a module on the Python path"
)
TASKSET_HELP = (
    "options of the environment's taskset config (its TasksetConfig fields, e.g. num_tasks, "
    "task: {...}); give the dataset and the environment the same ones"
)
METADATA_KEY = "verifiers"
"""``Task.metadata[METADATA_KEY]``: ``env_id``, ``taskset`` (the options) and ``data`` (the task's
``TaskData`` as JSON), written by the dataset and read by the environment and the reward shaper."""


# --------------------------------------------------------------------------------------------
# Loading an environment (once per id and options)
# --------------------------------------------------------------------------------------------


@dataclass
class ListedTool:
    """One ``@vf.tool`` as its server lists it: which server (``scope`` ``task`` for the
    per-rollout servers of ``Task.toolsets``, ``taskset`` for the shared ones), its place in that
    list, the server's prefix and the MCP listing."""

    scope: str
    index: int
    server: str
    listed: Any


@dataclass
class LoadedEnvironment:
    """A verifiers environment loaded from its id and taskset options: the taskset, its task and
    state classes, and (on first use) its tool listing and shared tool servers."""

    env_id: str
    options: dict[str, Any]
    taskset: Any
    task_cls: type[Any]
    state_cls: type[Any]
    _tools: list[ListedTool] | None = None
    _problems: list[str] | None = None
    _shared: list[Any] | None = None
    _shared_servers: list[Any] | None = None
    _shared_ready: asyncio.Future[None] | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    # -- tasks ---------------------------------------------------------------------------------
    def task(self, data: Mapping[str, Any], *, where: str) -> Any:
        """The verifiers task of ``data`` (the ``TaskData`` JSON a dataset row carries)."""
        try:
            parsed = self.task_cls.data_type().model_validate(dict(data))
        except ValidationError as exc:
            raise ConfigError(
                f"{where}: the verifiers task data does not validate as "
                f"{self.task_cls.data_type().__name__} of {self.env_id!r}: {exc}. Rebuild the tasks with "
                "the verifiers dataset of the same environment and options.",
                path="data",
            ) from None
        return self.task_cls(parsed, self.taskset.config.task)

    def state(self, dumped: Any = None) -> Any:
        """A fresh rollout state, or the state ``dumped`` (JSON) validated back."""
        if dumped is None:
            return self.state_cls()
        return TypeAdapter(self.state_cls).validate_python(dumped)

    # -- what agent-r1 cannot play -------------------------------------------------------------
    def problems(self) -> list[str]:
        """Why agent-r1 cannot play this environment (empty when it can); each says what to do."""
        if self._problems is None:
            self._problems = _problems(self)
        return list(self._problems)

    # -- tools ---------------------------------------------------------------------------------
    def listed_tools(self) -> list[ListedTool]:
        """Every ``@vf.tool`` of the environment's tool servers, listed once (building the servers'
        classes, never setting them up)."""
        with self._lock:
            if self._tools is None:
                task_config = self.taskset.config.task
                scopes = {
                    "task": self.task_cls.toolsets(task_config),
                    "taskset": type(self.taskset).toolsets(self.taskset.config),
                }
                self._tools = run_sync(_listing(scopes))
            return list(self._tools)

    async def shared_servers(self) -> list[Any]:
        """The taskset-wide tool servers (``Taskset.toolsets``), set up once per process and shared
        by every episode, as verifiers shares them across an environment worker's rollouts (they
        end with the process)."""
        if self._shared_servers is None:
            self._shared = type(self.taskset).toolsets(self.taskset.config)
            for toolset in self._shared:
                bind_state(toolset)
            self._shared_servers = [server_of(toolset) for toolset in self._shared]
        ready = self._shared_ready
        if (
            ready is None
            or ready.cancelled()
            or (not ready.done() and ready.get_loop() is not asyncio.get_running_loop())
        ):
            # set up once; a setup that failed fails every episode that needs these servers (counted)
            self._shared_ready = ready = asyncio.ensure_future(_set_up(self._shared or [], None))
        await asyncio.shield(ready)
        return self._shared_servers


def _problems(loaded: LoadedEnvironment) -> list[str]:
    import verifiers.v1 as vf

    where = f"verifiers environment {loaded.env_id!r}"
    problems = []
    env_cls = vf.environment_class(loaded.env_id)
    if env_cls is not vf.SingleAgentEnv:
        problems.append(
            f"{where} defines its own Env ({env_cls.__name__}: multi-agent episodes or a user simulator); "
            "agent-r1 plays single-agent tasksets, where the policy alone talks to the task and its "
            "tools. Use a single-agent taskset."
        )
    task_cls = loaded.task_cls
    if task_cls.NEEDS_CONTAINER:
        problems.append(
            f"{where}: its task {task_cls.__name__} needs a container (NEEDS_CONTAINER), which agent-r1 "
            "does not provide. Use a task that runs without one."
        )
    for hook in ("setup", "finalize"):
        method = getattr(task_cls, hook)
        if method is not getattr(vf.Task, hook) and _needs_runtime(method):
            problems.append(
                f"{where}: {task_cls.__name__}.{hook} needs a runtime (a sandbox), which agent-r1 does "
                f"not provide. Give its `runtime` parameter a default of None, or use a task without one."
            )
    first = next(iter(loaded.taskset.take(1)), None)
    if first is not None:
        needing = [fn.__name__ for fn in first.hooks("reward") if _needs_runtime(fn)]
        needing += [judge.reward_name for judge in first.plugged_judges() if _needs_runtime(judge.score)]
        if needing:
            problems.append(
                f"{where}: the rewards {needing} need a runtime (a sandbox), which agent-r1 does not "
                "provide, so verifiers would skip them. Give their `runtime` parameter a default of None, "
                "or leave them out of the task config."
            )
        from verifiers.v1.session import hook_boundary

        refused = []
        for fn in first.hooks("stop"):
            try:
                if hook_boundary(fn, allow_trace=True) is not vf.Trace:
                    refused.append(fn.__name__)
            except TypeError as exc:
                problems.append(f"{where}: {exc}")
        refused += [fn.__name__ for fn in _intercepts(first)]
        if refused:
            problems.append(
                f"{where}: {refused} act on the model's Request/Response (@vf.stop on a Request or "
                "Response, @vf.intercept), which agent-r1's rollout does not route through verifiers; "
                "only @vf.stop predicates on the Trace are supported. Express them on the Trace."
            )
        if first.data.prompt is None:
            problems.append(
                f"{where}: its tasks have no prompt (a user opens the conversation), which needs a "
                "multi-agent Env; agent-r1 starts every episode from the task's prompt."
            )
    return problems


def _intercepts(task: Any) -> list[Any]:
    from verifiers.v1.utils.decorators import discover_decorated

    return list(discover_decorated(task, "intercept"))


def _needs_runtime(fn: Callable[..., Any]) -> bool:
    parameter = inspect.signature(fn).parameters.get("runtime")
    return parameter is not None and parameter.default is inspect.Parameter.empty


async def _listing(scopes: Mapping[str, Sequence[Any]]) -> list[ListedTool]:
    listed: list[ListedTool] = []
    for scope, toolsets in scopes.items():
        for index, toolset in enumerate(toolsets):
            for tool in await server_of(toolset).list_tools():
                listed.append(ListedTool(scope, index, toolset.server_name, tool))
    return listed


_loaded: dict[str, LoadedEnvironment] = {}
_loaded_lock = threading.Lock()


def load_environment(
    env_id: str, options: Mapping[str, Any] | None = None, *, component: str, path: str
) -> LoadedEnvironment:
    """The verifiers environment ``env_id`` with taskset ``options``, loaded once per process, or a
    :class:`~agent_r1.ConfigError` saying what is missing (``component`` and the config ``path``
    name where it was asked for)."""
    require("verifiers", component=component, path=path)
    options = dict(options or {})
    key = json.dumps([env_id, options], sort_keys=True, default=str)
    with _loaded_lock:
        if key in _loaded:
            return _loaded[key]
    import verifiers.v1 as vf

    module = env_id.rsplit("/", 1)[-1].split("@", 1)[0].replace("-", "_").lower()
    if "id" in options:
        raise ConfigError(
            f"{component}: {path}.taskset sets 'id'; the environment is named by {path}.env_id. Remove it.",
            path=f"{path}.taskset.id",
        )
    try:
        config_cls = vf.taskset_config_type(env_id)
    except ModuleNotFoundError as exc:
        cause = f" ({exc.__cause__})" if exc.__cause__ is not None else ""
        raise ConfigError(
            f"{component}: the verifiers environment {env_id!r} is not installed: Python cannot import "
            f"{module!r}{cause}. Install its package (`prime env install {env_id}` for an Environments Hub "
            f"id, or pip install it), or put a module named {module!r} on the Python path.",
            path=f"{path}.env_id",
        ) from None
    except (AttributeError, TypeError, ValueError) as exc:
        raise ConfigError(
            f"{component}: {env_id!r} (module {module!r}) is not a verifiers 0.4 environment: {exc}",
            path=f"{path}.env_id",
        ) from None
    try:
        config = config_cls.model_validate({**options, "id": env_id})
    except ValidationError as exc:
        raise ConfigError(
            f"{component}: {path}.taskset does not fit {config_cls.__name__} of {env_id!r}: {exc}",
            path=f"{path}.taskset",
        ) from None
    try:
        taskset = vf.load_taskset(config)
    except Exception as exc:
        raise ConfigError(
            f"{component}: loading the taskset of {env_id!r} raised {type(exc).__name__}: {exc}",
            path=f"{path}.env_id",
        ) from exc
    from verifiers.v1.state import state_cls

    task_cls = type(taskset).task_type()
    loaded = LoadedEnvironment(env_id, options, taskset, task_cls, state_cls(task_cls))
    with _loaded_lock:
        return _loaded.setdefault(key, loaded)


def _loaded_for(task: Task, *, component: str) -> tuple[LoadedEnvironment, dict[str, Any]]:
    """The environment and the ``metadata["verifiers"]`` of an agent-r1 task of the dataset."""
    meta = (task.metadata or {}).get(METADATA_KEY)
    if not isinstance(meta, Mapping) or "env_id" not in meta or "data" not in meta:
        raise ConfigError(
            f"{component}: task {task.id!r} carries no verifiers task (metadata['{METADATA_KEY}']); it plays "
            "the tasks of the verifiers dataset: data: {name: verifiers, env_id: ...}",
            path="data",
        )
    loaded = load_environment(meta["env_id"], meta.get("taskset"), component=component, path="data")
    return loaded, dict(meta)


# --------------------------------------------------------------------------------------------
# Tool servers in process, sharing the episode's state
# --------------------------------------------------------------------------------------------


class _Episode:
    """What one episode's tools share: the verifiers task, the trace whose ``state`` every tool
    server reads and writes, and the per-rollout servers (set up when the first action arrives)."""

    def __init__(self, task: Any, trace: Any) -> None:
        self.task = task
        self.trace = trace
        self.toolsets: list[Any] = []
        self.servers: list[Any] | None = None
        self.shared: list[Any] = []


_current: contextvars.ContextVar[_Episode | None] = contextvars.ContextVar(
    "agent_r1_verifiers_episode", default=None
)
"""The episode a tool call runs for (set around each call, so that a taskset-wide server used by
concurrent episodes reads and writes the caller's state)."""


def bind_state(toolset: Any) -> None:
    """Make ``toolset`` pull and push its state from the calling episode's trace.

    verifiers runs each tool server as a process that pulls ``trace.state`` from the rollout's
    interception server before every ``@vf.tool`` call and pushes it back when the call changed it
    (``ServerBase._pull_state`` / ``_push_state`` over HTTP). In process, the same two steps read
    and write the episode's trace directly; everything else (``register``, the call wrapper that
    sets ``self.state``) is verifiers' own code."""
    from verifiers.v1.state import state_cls

    adapter = TypeAdapter(state_cls(type(toolset)))

    async def pull() -> Any:
        episode = _current.get()
        if episode is None:
            return adapter.validate_python({})
        return adapter.validate_json(TypeAdapter(type(episode.trace.state)).dump_json(episode.trace.state))

    async def push(before: bytes) -> None:
        episode = _current.get()
        if episode is None:
            return
        after = adapter.dump_json(toolset.state)
        if after != before:  # the interception server's PUT /state: validated into the trace's type
            episode.trace.state = TypeAdapter(type(episode.trace.state)).validate_json(after)

    if not hasattr(toolset, "_pull_state") or not hasattr(toolset, "_push_state"):
        raise ConfigError(
            f"verifiers tool server {type(toolset).__name__} has no state channel to bind "
            "(_pull_state/_push_state); this plugin is tested with verifiers 0.4.0: pip install "
            "'agent-r1-plugin-hubs[verifiers]'"
        )
    toolset._pull_state = pull
    toolset._push_state = push


def server_of(toolset: Any) -> Any:
    """An in-process ``mcp`` server with ``toolset``'s tools registered by verifiers itself."""
    from mcp.server.mcpserver import MCPServer

    server = MCPServer(toolset.server_name or type(toolset).__name__)
    toolset.register(server)
    return server


async def _set_up(toolsets: Sequence[Any], task_data: Any) -> None:
    """``setup`` then (per-rollout servers, ``task_data`` given) ``setup_task``, as a launched
    server does before serving."""
    for toolset in toolsets:
        await toolset.setup()
        if task_data is not None:
            await toolset.setup_task(task_data)


class VerifiersTool(SchemaTool):
    """A ``@vf.tool`` of a verifiers tool server; ``run`` calls it through the episode's server."""

    scope: ClassVar[str] = "task"
    index: ClassVar[int] = 0
    remote_name: ClassVar[str] = ""

    def __init__(self, env: VerifiersEnv) -> None:
        super().__init__()
        self.env = env

    async def run(self, arguments: Any) -> str:
        """The tool's result as text; an error the server reports is an error result."""
        from mcp.server.mcpserver.exceptions import ToolError as McpToolError

        episode = self.env.episode
        if episode is None or episode.servers is None:  # the engine always steps after reset
            raise RuntimeError(f"verifiers tool {self.name!r} was called before its episode was set up")
        servers = episode.servers if self.scope == "task" else episode.shared
        token = _current.set(episode)
        try:
            result = await servers[self.index].call_tool(self.remote_name, self.payload(arguments))
        except McpToolError as exc:
            raise ToolError(str(exc)) from exc
        finally:
            _current.reset(token)
        text = _content_text(result.content)
        if result.is_error:
            raise ToolError(text)
        return text


def _content_text(blocks: Sequence[Any]) -> str:
    parts = [
        block.text if getattr(block, "type", None) == "text" else f"[{block.type} content]"
        for block in blocks
    ]
    return "\n".join(parts)


# --------------------------------------------------------------------------------------------
# The verifiers view of an episode
# --------------------------------------------------------------------------------------------


def _prompt_messages(data: Any) -> list[Any]:
    import verifiers.v1 as vf

    messages: list[Any] = []
    if data.system_prompt is not None:
        messages.append(vf.SystemMessage(content=data.system_prompt))
    if isinstance(data.prompt, str):
        messages.append(vf.UserMessage(content=data.prompt))
    else:
        messages.extend(data.prompt or [])
    return messages


def _assistant_content(text: str, calls: Sequence[ToolCall]) -> str:
    """The action's text with the spans of the calls the format parsed taken out."""
    for call in calls:
        if call.raw:
            text = text.replace(call.raw, "", 1)
    return text.strip()


def rebuild_trace(
    loaded: LoadedEnvironment,
    task: Any,
    turns: Sequence[tuple[str, Sequence[ToolCall], Sequence[ToolResult]]],
    state: Any,
) -> Any:
    """A ``vf.Trace`` of ``task`` holding the prompt, then per turn the assistant message (the
    action's text without its calls, and the calls) and the tool results, with ``state`` as its
    ``trace.state``."""
    import verifiers.v1 as vf
    from verifiers.v1.graph import MessageNode

    trace = vf.Trace(
        task=vf.TraceTask(type=type(task).__name__, data=task.data, key=task.key, hash=task.hash),
        agent=vf.AgentInfo(config=vf.AgentConfig(), name="agent-r1"),
        state=state,
    )

    def add(message: Any, *, sampled: bool = False) -> None:
        parent = len(trace.nodes) - 1 if trace.nodes else None
        trace.nodes.append(MessageNode(parent=parent, message=message, sampled=sampled))

    for message in _prompt_messages(task.data):
        add(message)
    for text, calls, results in turns:
        tool_calls = [
            vf.ToolCall(id=call.id, name=call.name, arguments=json.dumps(call.arguments)) for call in calls
        ]
        add(
            vf.AssistantMessage(content=_assistant_content(text, calls), tool_calls=tool_calls or None),
            sampled=True,
        )
        for result in results:
            add(vf.ToolMessage(tool_call_id=result.call_id, name=result.name, content=result.content))
    return trace


async def _invoke(fn: Callable[..., Any], trace: Any) -> Any:
    """Call a verifiers hook with ``trace`` (by its name or its ``vf.Trace`` annotation, through
    verifiers' own ``invoke``) and no runtime."""
    import verifiers.v1 as vf
    from verifiers.v1.utils.decorators import invoke

    result = invoke(fn, {"trace": trace, vf.Trace: trace})
    return await result if inspect.isawaitable(result) else result


# --------------------------------------------------------------------------------------------
# Components
# --------------------------------------------------------------------------------------------


class VerifiersDataset(Dataset):
    """The tasks of a verifiers environment's taskset.

    ``eval`` holds the first ``num_eval`` tasks of the taskset (in its order, or shuffled with
    ``shuffle_seed`` by verifiers' own ``shuffle``), ``train`` the ``num_train`` after them (all
    the rest by default; required for an infinite taskset). Each task's messages are its
    ``system_prompt`` and ``prompt``; ``answer`` is the task data's ``answer`` field when it has one;
    ``metadata["verifiers"]`` keeps the task data for the environment and the reward shaper.
    """

    name = "verifiers"
    SPLITS: ClassVar[tuple[str, ...]] = ("train", "eval")

    class Config(ComponentConfig):
        env_id: str = Field(description=ENV_ID_HELP)
        taskset: dict[str, Any] = Field(default_factory=dict, description=TASKSET_HELP)
        num_eval: int = Field(0, ge=0, description="the first tasks, held out as the eval split")
        num_train: int | None = Field(
            None, ge=1, description="tasks of the train split after the eval ones (null: all the rest)"
        )
        shuffle_seed: int | None = Field(
            None, description="shuffle the taskset with verifiers' shuffle(seed) first (null: load order)"
        )

    config: Config

    def __init__(self, config: ComponentConfig | Mapping[str, Any] | None = None) -> None:
        super().__init__(config)
        self._splits: dict[str, list[Task]] | None = None

    def load(self, split: str) -> list[Task]:
        if split not in self.SPLITS:
            raise ConfigError(
                f"data (verifiers): no split {split!r}; the splits are {', '.join(self.SPLITS)}",
                path="eval.split",
            )
        if self._splits is None:
            self._splits = self._load()
        return list(self._splits[split])

    def _load(self) -> dict[str, list[Task]]:
        config = self.config
        loaded = load_environment(config.env_id, config.taskset, component="data (verifiers)", path="data")
        view = loaded.taskset
        if config.shuffle_seed is not None and not view.bounded:
            raise ConfigError(
                f"data (verifiers): {config.env_id!r} is an infinite taskset, which cannot be shuffled; "
                "drop shuffle_seed",
                path="data.shuffle_seed",
            )
        if config.shuffle_seed is not None:
            view = view.shuffle(config.shuffle_seed)
        if config.num_train is None and not view.bounded:
            raise ConfigError(
                f"data (verifiers): {config.env_id!r} is an infinite taskset; set num_train",
                path="data.num_train",
            )
        if config.num_train is not None:
            view = view.take(config.num_eval + config.num_train)
        tasks = [self._task(task) for task in view]
        return {"eval": tasks[: config.num_eval], "train": tasks[config.num_eval :]}

    def _task(self, task: Any) -> Task:
        data = task.data
        where = f"data (verifiers): task {data.idx} of {self.config.env_id!r}"
        if data.prompt is None:
            raise ConfigError(
                f"{where} has no prompt (a user opens its conversation), which agent-r1 cannot start an "
                "episode from; use a taskset whose tasks carry a prompt",
                path="data.env_id",
            )
        messages = [_chat_message(message, where) for message in _prompt_messages(data)]
        answer = getattr(data, "answer", None)
        return Task(
            id=f"{self.config.env_id}/{data.id if data.id is not None else data.idx}",
            messages=messages,
            answer=answer if isinstance(answer, str | int | float | bool | list | dict) else None,
            metadata={
                METADATA_KEY: {
                    "env_id": self.config.env_id,
                    "taskset": dict(self.config.taskset),
                    "data": data.model_dump(mode="json"),
                }
            },
        )


def _chat_message(message: Any, where: str) -> dict[str, Any]:
    """A verifiers prompt message as a chat-template message."""
    from verifiers.v1.types import TextContentPart

    content = message.content
    if isinstance(content, list):
        if not all(isinstance(part, TextContentPart) for part in content):
            raise ConfigError(
                f"{where}: its prompt has image content, which agent-r1's text rollouts cannot render; "
                "use a text-only taskset",
                path="data.env_id",
            )
        content = "\n".join(part.text for part in content)
    out: dict[str, Any] = {"role": message.role, "content": content or ""}
    calls = getattr(message, "tool_calls", None)
    if calls:
        out["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in calls
        ]
    if message.role == "tool":
        out["tool_call_id"] = message.tool_call_id
    return out


class VerifiersEnvConfig(ToolEnvConfig):
    """Options of :class:`VerifiersEnv`: those of ``tool_env`` (format, limits, registered tools
    beside the environment's own) plus the environment."""

    env_id: str = Field(description=ENV_ID_HELP)
    taskset: dict[str, Any] = Field(default_factory=dict, description=TASKSET_HELP)


class VerifiersEnv(ToolEnv):
    """A ``tool_env`` that plays the tasks of a verifiers environment with its tool servers.

    The episode (see the module docstring for the mapping): the prompt is the task's; each action
    is parsed by the run's format and its calls run the environment's ``@vf.tool`` methods in
    process; after each step the task's ``@vf.stop`` predicates see the episode's ``vf.Trace``
    (messages and state) and one that fires ends the episode. ``Task.setup`` and the tool
    servers' ``setup``/``setup_task`` run when the first action arrives; their failures are
    counted environment errors of that episode. The servers' exit stacks close when the episode
    ends (``aclose``).
    """

    name = "verifiers"
    Config = VerifiersEnvConfig
    config: VerifiersEnvConfig

    def __init__(self, config: ComponentConfig | Mapping[str, Any] | None = None) -> None:
        super().__init__(config)
        self.loaded = load_environment(
            self.config.env_id, self.config.taskset, component="environment (verifiers)", path="environment"
        )
        self.episode: _Episode | None = None
        self._turns: list[tuple[str, list[ToolCall], list[ToolResult]]] = []
        added: list[Tool] = []
        for listed in self.loaded.listed_tools():
            exposed = f"{listed.server}_{listed.listed.name}" if listed.server else listed.listed.name
            if exposed in self.tool_classes or any(tool.name == exposed for tool in added):
                raise ConfigError(
                    f"environment (verifiers): the tool {exposed!r} of {self.config.env_id!r} has the name "
                    "of another tool; remove that one from environment.tools",
                    path="environment.tools",
                )
            cls = schema_tool_class(
                VerifiersTool,
                name=exposed,
                description=(listed.listed.description or "").strip(),
                schema=listed.listed.input_schema,
                scope=listed.scope,
                index=listed.index,
                remote_name=listed.listed.name,
            )
            added.append(cls(self))
        self.add_tools(added)

    @classmethod
    def check(cls, config: VerifiersEnvConfig) -> list[str]:
        """Preflight: verifiers is installed, the environment loads, agent-r1 can play it (see the
        module docstring for what it refuses) and its tools list."""
        loaded = load_environment(
            config.env_id, config.taskset, component="environment (verifiers)", path="environment"
        )
        problems = loaded.problems()
        if not problems:
            loaded.listed_tools()
        return problems

    async def reset(self, task: Task) -> EpisodeStart:
        """The task's prompt (with the format's description of the tools in the system message);
        starts no tool server (the first action does)."""
        await self.aclose()
        loaded, meta = _loaded_for(task, component="environment (verifiers)")
        if loaded is not self.loaded:
            raise ConfigError(
                f"environment (verifiers): task {task.id!r} comes from {meta['env_id']!r} with taskset "
                f"{meta.get('taskset')}, but the environment plays {self.config.env_id!r} with "
                f"{self.config.taskset}; give the dataset and the environment the same env_id and taskset",
                path="environment.env_id",
            )
        vf_task = loaded.task(meta["data"], where=f"task {task.id!r}")
        self.episode = _Episode(vf_task, rebuild_trace(loaded, vf_task, [], loaded.state()))
        self._turns = []
        return await super().reset(task)

    async def step(self, action: Action, turn: int) -> Observation:
        """``tool_env``'s step, then the ``@vf.stop`` predicates; the observation carries the
        episode's state in ``info["verifiers"]``."""
        episode = self.episode
        if episode is None:
            raise RuntimeError("environment (verifiers): step() before reset()")
        try:
            if episode.servers is None:
                await self._open(episode)
            observation = await super().step(action, turn)
            self._turns.append(
                (action.text, list(observation.tool_calls or []), list(observation.tool_results))
            )
            state = episode.trace.state
            episode.trace = rebuild_trace(self.loaded, episode.task, self._turns, state)
            fired = None if observation.done else await self._stopped(episode)
            if fired is not None:
                observation = observation.model_copy(
                    update={"done": True, "termination": f"stop:{fired}", "messages": []}
                )
            observation.info[METADATA_KEY] = {
                "state": TypeAdapter(type(state)).dump_python(state, mode="json"),
                "stop": fired,
            }
        except BaseException:
            await self.aclose()
            raise
        if observation.done:
            await self.aclose()
        return observation

    async def _open(self, episode: _Episode) -> None:
        """``Task.setup``, then the per-rollout tool servers (``setup``, ``setup_task``) and the
        shared ones, as a verifiers rollout opens."""
        task = episode.task
        import verifiers.v1 as vf

        if type(task).setup is not vf.Task.setup:
            await _invoke(task.setup, episode.trace)
        episode.toolsets = type(task).toolsets(task.config)
        for toolset in episode.toolsets:
            bind_state(toolset)
        servers = [server_of(toolset) for toolset in episode.toolsets]
        token = _current.set(episode)
        try:
            await _set_up(episode.toolsets, task.data)
        finally:
            _current.reset(token)
        episode.shared = await self.loaded.shared_servers()
        episode.servers = servers

    async def _stopped(self, episode: _Episode) -> str | None:
        """The name of the first ``@vf.stop`` (by priority) that fires on the episode's trace."""
        for stop in episode.task.hooks("stop"):
            fired = await _invoke(stop, episode.trace)
            if not isinstance(fired, bool):
                raise TypeError(f"@vf.stop {stop.__name__} must return bool, got {type(fired).__name__}")
            if fired:
                return str(stop.__name__)
        return None

    async def aclose(self) -> None:
        """Close the episode's per-rollout tool servers (their exit stacks; idempotent)."""
        episode = self.episode
        if episode is None or not episode.toolsets:
            return
        toolsets, episode.toolsets = episode.toolsets, []
        failures = []
        for toolset in toolsets:
            stack = getattr(toolset, "_exit_stack", None)  # what a launched server closes on exit
            if stack is None:
                continue
            try:
                await stack.aclose()
            except Exception as exc:
                failures.append(f"{type(toolset).__name__}: {type(exc).__name__}: {exc}")
        if failures:
            raise RuntimeError(f"closing the verifiers tool servers failed: {'; '.join(failures)}")


class VerifiersRewards(RewardShaper):
    """The verifiers task's own scoring of a trajectory: ``Task.finalize`` (when the task has one)
    and ``Task.score`` on a ``vf.Trace`` rebuilt from the trajectory (messages as the environment
    hands them to verifiers, ``trace.state`` from the last observation), one outcome signal per
    reward that verifiers records, named as verifiers names it, with its verifiers weight (the run
    config's shaper weight multiplies it). Plays the tasks of the ``verifiers`` dataset, with the
    ``verifiers`` environment (the state) or another one (no state: a fresh one)."""

    name = "verifiers"

    @classmethod
    def check(cls, config: ComponentConfig) -> list[str]:
        """Preflight: verifiers is installed (the environment itself is checked by the dataset)."""
        require("verifiers", component="rewards (verifiers)", path="rewards")
        return []

    async def score(self, trajectory: Trajectory, task: Task) -> list[RewardSignal]:
        loaded, meta = _loaded_for(task, component="rewards (verifiers)")
        problems = loaded.problems()
        if problems:
            raise ConfigError(f"rewards (verifiers): {problems[0]}", path="rewards")
        vf_task = loaded.task(meta["data"], where=f"task {task.id!r}")
        turns = []
        state_dump = None
        for step in trajectory.steps:
            observation = step.observation
            results = list(observation.tool_results) if observation is not None else []
            turns.append((step.action.text, list(step.action.tool_calls), results))
            carried = (observation.info.get(METADATA_KEY) if observation is not None else None) or {}
            if "state" in carried:
                state_dump = carried["state"]
        trace = rebuild_trace(loaded, vf_task, turns, loaded.state(state_dump))
        import verifiers.v1 as vf

        if type(vf_task).finalize is not vf.Task.finalize:
            await _invoke(vf_task.finalize, trace)
        await vf_task.score(trace)
        unscored = [name for name, reward in trace.rewards.items() if reward is None]
        if unscored:
            raise RuntimeError(f"verifiers left the rewards {unscored} of task {task.id!r} unscored")
        return [
            RewardSignal(
                name=name, value=reward.score, weight=reward.weight, kind="outcome", source=self.name
            )
            for name, reward in trace.rewards.items()
        ]


DATASETS: list[Any] = [VerifiersDataset]
ENVIRONMENTS: list[Any] = [VerifiersEnv]
SHAPERS: list[Any] = [VerifiersRewards]
