"""``mcp``: a multi-turn tool environment whose tools come from MCP servers.

::

    environment:
      name: mcp
      servers:
        - {name: notes, command: [python, notes_server.py]}       # stdio, one process per episode
        - {name: web, url: "http://127.0.0.1:8765/mcp", stateful: false}
      tools: [calculator]          # registered agent-r1 tools may sit beside them
      format: hermes
      tool_schemas: system         # tool schemas in the system message: any chat template shows them
      max_turns: 4

:class:`McpEnv` is a :class:`~agent_r1.ToolEnv` (same formats, limits, process rewards and error
rules) whose tool list is extended with the tools the servers list. The listing is taken once per
configuration (by the preflight check before any model loads, or by the first environment built)
and each tool keeps the server's JSON schema. Tool names stay as the servers spell them, unless
two sources share a name: then those are prefixed with their server (``notes__search``); with
``tool_names: prefixed`` every MCP tool is.

Sessions: a ``stateful`` server (the default) gets one session per episode, opened when the
episode's first action arrives (an episode that is only rendered, as the preflight's prompt check
does, starts no server) and closed when the episode ends (its last ``step``, also when a step
fails); a stateless one gets one session per rollout, shared by its episodes, opened by its first
call. A session the environment could not close (the engine ended the episode on a budget of its
own) ends with the rollout's event loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import threading
import weakref
from collections.abc import Coroutine, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from pydantic import Field, model_validator

from agent_r1 import (
    Action,
    ComponentConfig,
    ConfigError,
    EpisodeStart,
    Observation,
    Task,
    ToolCall,
    ToolEnv,
    ToolEnvConfig,
    ToolResult,
)
from agent_r1_plugin_mcp.config import ServerConfig
from agent_r1_plugin_mcp.connection import McpConnection, McpServerError, describe
from agent_r1_plugin_mcp.tools import Binding, McpTool, tool_class

T = TypeVar("T")

PREFIX_SEPARATOR = "__"
"""Between server and tool in a prefixed name (``notes__search``): OpenAI-style function names
allow letters, digits, ``_`` and ``-`` only."""


class McpEnvConfig(ToolEnvConfig):
    """Options of :class:`McpEnv`: those of ``tool_env`` plus the servers."""

    servers: list[ServerConfig] = Field(
        min_length=1, description="the MCP servers whose tools the agent may call"
    )
    tool_names: Literal["auto", "prefixed"] = Field(
        "auto",
        description="auto: a tool keeps its name unless another server or tool has it too (then "
        "'server__tool'); prefixed: every MCP tool is named 'server__tool'",
    )
    on_server_error: Literal["end_episode", "observation"] = Field(
        "end_episode",
        description="a server that cannot be reached or drops mid-call: end_episode fails the step "
        "(counted as an environment error, not trained on); observation shows the error to the agent "
        "(a failed call of kind 'infrastructure') and the episode goes on",
    )

    @model_validator(mode="after")
    def _unique_servers(self) -> McpEnvConfig:
        names = [server.name for server in self.servers]
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            raise ValueError(f"servers lists {', '.join(map(repr, duplicates))} more than once")
        return self


# --------------------------------------------------------------------------------------------
# Tool listings, taken once per configuration
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Catalog:
    """The MCP tool classes of one configuration, in server order."""

    classes: tuple[type[McpTool], ...]


_catalogs: dict[str, Catalog] = {}
_listings: dict[str, list[Any]] = {}
"""Server address (see _address) -> its tool listing, taken once per process."""
_catalogs_lock = threading.Lock()


def _catalog_key(config: McpEnvConfig, other_tools: Sequence[str]) -> str:
    return json.dumps(
        {
            "servers": [server.model_dump(mode="json") for server in config.servers],
            "tool_names": config.tool_names,
            "on_server_error": config.on_server_error,
            "other_tools": list(other_tools),
        },
        sort_keys=True,
    )


def catalog(config: McpEnvConfig, other_tools: Sequence[str]) -> Catalog:
    """The tool classes of ``config`` (``other_tools``: the names of the registered tools listed
    beside the servers). Each server is listed once per process and address (command or URL)."""
    key = _catalog_key(config, other_tools)
    with _catalogs_lock:
        if key in _catalogs:
            return _catalogs[key]
        missing = [server for server in config.servers if _address(server) not in _listings]
    if missing:
        listed = run_sync(list_servers(missing))
        with _catalogs_lock:
            for server in missing:
                _listings.setdefault(_address(server), listed[server.name])
    with _catalogs_lock:
        listings = {server.name: _listings[_address(server)] for server in config.servers}
    built = build_catalog(config, listings, other_tools)
    with _catalogs_lock:
        return _catalogs.setdefault(key, built)


def _address(server: ServerConfig) -> str:
    """What decides a server's tool listing: how it is started or reached."""
    return json.dumps(
        server.model_dump(mode="json", include={"command", "url", "env", "cwd", "headers"}), sort_keys=True
    )


async def list_servers(servers: Sequence[ServerConfig]) -> dict[str, list[Any]]:
    """Connect to every server at once, list its tools, disconnect. Raises
    :class:`~agent_r1_plugin_mcp.connection.McpServerError` for the first server that fails (the
    message names it); use :func:`probe_servers` to hear about all of them."""
    results = await probe_servers(servers)
    for result in results.values():
        if isinstance(result, BaseException):
            raise result
    return {name: listing for name, listing in results.items() if not isinstance(listing, BaseException)}


async def probe_servers(servers: Sequence[ServerConfig]) -> dict[str, list[Any] | BaseException]:
    """Each server's tool listing, or the error that kept us from getting it. Every server is
    started (or reached) once, all at once; a stdio server's stderr is captured, and quoted in its
    error."""

    async def probe(server: ServerConfig) -> list[Any]:
        connection = McpConnection(server, capture_stderr=True)
        try:
            await connection.connect()
            return await connection.list_tools()
        finally:
            await connection.close()

    outcomes = await asyncio.gather(*(probe(server) for server in servers), return_exceptions=True)
    return {server.name: outcome for server, outcome in zip(servers, outcomes, strict=True)}


def build_catalog(
    config: McpEnvConfig, listings: Mapping[str, list[Any]], other_tools: Sequence[str]
) -> Catalog:
    """Name and build the tool classes from the servers' ``listings``. Raises
    :class:`~agent_r1.ConfigError` for a tool the config asks for that a server does not list, and
    for names that stay ambiguous."""
    chosen: list[tuple[ServerConfig, Any]] = []
    for index, server in enumerate(config.servers):
        listed = {tool.name: tool for tool in listings[server.name]}
        wanted = server.tools if server.tools is not None else list(listed)
        missing = [name for name in wanted if name not in listed]
        if missing:
            raise ConfigError(
                f"servers[{index}] ({server.name!r}): the server lists no tool "
                f"{', '.join(map(repr, missing))}; it lists {', '.join(map(repr, listed)) or 'none'}. "
                "Fix 'tools' of that server.",
                path=f"servers[{index}].tools",
            )
        chosen.extend((server, listed[name]) for name in wanted)
    counts: dict[str, int] = {}
    for name in [*other_tools, *(tool.name for _, tool in chosen)]:
        counts[name] = counts.get(name, 0) + 1
    classes: list[type[McpTool]] = []
    taken = set(other_tools)
    for server, tool in chosen:
        prefixed = config.tool_names == "prefixed" or counts[tool.name] > 1
        exposed = f"{server.name}{PREFIX_SEPARATOR}{tool.name}" if prefixed else tool.name
        if exposed in taken:
            raise ConfigError(
                f"MCP tool {tool.name!r} of server {server.name!r} would be exposed as {exposed!r}, a name "
                "already taken; rename the server or set tool_names: prefixed",
                path="servers",
            )
        taken.add(exposed)
        classes.append(
            tool_class(server, tool, exposed, errors_visible=config.on_server_error == "observation")
        )
    return Catalog(classes=tuple(classes))


def run_sync(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run ``coroutine`` to the end from synchronous code, also when an event loop is running in
    this thread (environments are built inside the rollout's loop): then in a worker thread."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coroutine).result()


# --------------------------------------------------------------------------------------------
# Sessions shared by the episodes of a rollout (stateless servers)
# --------------------------------------------------------------------------------------------

_shared: dict[int, tuple[weakref.ref[asyncio.AbstractEventLoop], dict[str, McpConnection]]] = {}
"""Event loop id -> (the loop, server key -> its connection). An entry is dropped once its loop is
closed (or gone); by then the loop has cancelled the owner tasks, which closed the sessions."""


def _shared_for(server: ServerConfig) -> McpConnection:
    loop = asyncio.get_running_loop()
    for loop_id, (ref, _) in list(_shared.items()):
        other = ref()
        if other is None or other.is_closed():
            del _shared[loop_id]
    entry = _shared.get(id(loop))
    if entry is None or entry[0]() is not loop:
        entry = _shared[id(loop)] = (weakref.ref(loop), {})
    pool = entry[1]
    key = json.dumps(server.model_dump(mode="json"), sort_keys=True)
    if key not in pool:
        pool[key] = McpConnection(server)
    return pool[key]


# --------------------------------------------------------------------------------------------
# The environment
# --------------------------------------------------------------------------------------------


class McpEnv(ToolEnv):
    """A ``tool_env`` whose tools include those of MCP servers (stdio or streamable HTTP).

    Each MCP tool is called through the episode's session with the server (see the module
    docstring), under the server's ``call_timeout_s`` (default: ``call_timeout_s``). What goes
    wrong, and what the agent or the run sees:

    * the server reports an error for the call: an error result naming server and tool (kind
      ``exception``);
    * no answer in time: an error result of kind ``timeout`` naming server and tool;
    * the server cannot be reached, or the connection drops: a
      :class:`~agent_r1_plugin_mcp.connection.McpServerError` (a ``ToolInfrastructureError``)
      naming server and tool, which by default fails the step (the engine counts an environment
      error and ends the episode); with ``on_server_error: observation`` it is an error result of
      kind ``infrastructure`` and the episode goes on. The next call reconnects, at most
      ``max_reconnects`` times per session; ``observation.info["mcp"]`` counts reconnections and
      dropped connections.
    """

    name = "mcp"
    Config = McpEnvConfig
    config: McpEnvConfig

    def __init__(self, config: ComponentConfig | Mapping[str, Any] | None = None) -> None:
        super().__init__(config)
        other_tools = list(self.tool_classes)
        classes = catalog(self.config, other_tools).classes
        self._bindings = {server.name: Binding(server) for server in self.config.servers}
        self._owned: list[McpConnection] = []
        self._unopened = False  # reset bound this episode's sessions; the first step opens them
        self._reported = {"reconnects": 0, "lost": 0}  # counters already in Observation.metrics
        # system_text and the stop sequences (ToolEnv's) then cover every tool, MCP tools included
        self.add_tools(
            [
                cls(self._bindings[cls.server.name], cls.server.call_timeout_s or self.config.call_timeout_s)
                for cls in classes
            ]
        )

    @classmethod
    async def check(cls, config: McpEnvConfig) -> list[str]:
        """Preflight: every server starts (or answers), lists its tools, and the tool names work
        out; the listings are kept for the run, so that no server is started again to list it.
        Returns one problem per failing server, named by its config path (``servers[0] 'time'
        (stdio: uvx time)``): a command not found, the exit code and first stderr lines of a
        server that ended before the handshake, a handshake that timed out."""
        results = await probe_servers(config.servers)
        listings = {name: result for name, result in results.items() if not isinstance(result, BaseException)}
        with _catalogs_lock:
            for server in config.servers:
                if server.name in listings:
                    _listings.setdefault(_address(server), listings[server.name])
        problems = [
            _problem(index, server, results[server.name])
            for index, server in enumerate(config.servers)
            if server.name not in listings
        ]
        if problems:
            return problems
        other_tools = [spec.name for spec in config.tool_specs()]
        from agent_r1.registry import get_registry

        registry = get_registry()
        other_tools = [registry.get("tools", name).name for name in other_tools]
        built = build_catalog(config, listings, other_tools)
        with _catalogs_lock:
            _catalogs.setdefault(_catalog_key(config, other_tools), built)
        return []

    # -- episode -----------------------------------------------------------------------------------
    async def reset(self, task: Task) -> EpisodeStart:
        """Start the episode: a session of its own for every stateful server, opened when the first
        action arrives (see :meth:`step`), and the rollout's shared session for the stateless ones.
        Starts no server, so rendering an episode's prompt costs no process."""
        await self._close_owned()
        for server in self.config.servers:
            binding = self._bindings[server.name]
            if server.stateful:
                binding.connection = McpConnection(server)
                self._owned.append(binding.connection)
            else:
                binding.connection = _shared_for(server)
        self._unopened = bool(self._owned)
        return await super().reset(task)

    async def step(self, action: Action, turn: int) -> Observation:
        """``tool_env``'s step. The first one opens the episode's sessions with the stateful servers,
        all at once and outside the calls' timeouts (a failure is kept for the first call of that
        server, which tries again within the reconnection budget); they are closed when the episode
        ends or a step fails."""
        try:
            if self._unopened:
                self._unopened = False
                await self._open_owned()
            observation = await super().step(action, turn)
        except BaseException:
            await self._close_owned()
            raise
        counters = observation.info["mcp"] = self.counters()
        # this step's reconnects and lost connections, logged as env/mcp_reconnects, env/mcp_lost
        observation.metrics.update({f"mcp_{k}": float(v - self._reported[k]) for k, v in counters.items()})
        self._reported = dict(counters)
        if observation.done:
            await self._close_owned()
        return observation

    async def call(self, call: ToolCall) -> ToolResult:
        """``tool_env``'s call; a timeout of an MCP tool names its server and tool."""
        result = await super().call(call)
        tool = self.tools.get(call.name)
        if isinstance(tool, McpTool) and result.error == "timeout" and "MCP server" not in result.content:
            detail = result.content.removeprefix("Error: ")
            result.content = f"Error: MCP server {tool.server.name!r} tool {tool.remote_name!r}: {detail}"
        return result

    def counters(self) -> dict[str, int]:
        """This episode's ``reconnects`` and dropped connections (``lost``), over all servers."""
        connections = [b.connection for b in self._bindings.values() if b.connection is not None]
        return {
            "reconnects": sum(c.reconnects for c in connections),
            "lost": sum(c.lost for c in connections),
        }

    async def aclose(self) -> None:
        """Close this episode's sessions now (idempotent); for callers that end episodes themselves."""
        await self._close_owned()

    async def _open_owned(self) -> None:
        outcomes = await asyncio.gather(
            *(connection.connect() for connection in self._owned), return_exceptions=True
        )
        for connection, outcome in zip(self._owned, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                if not isinstance(outcome, McpServerError):
                    raise outcome
                connection.last_error = str(outcome)  # the first call retries and reports it

    async def _close_owned(self) -> None:
        owned, self._owned = self._owned, []
        self._unopened = False
        results = await asyncio.gather(*(c.close() for c in owned), return_exceptions=True)
        for connection, result in zip(owned, results, strict=True):
            if isinstance(result, Exception):  # closing is best effort; the session is gone either way
                connection.last_error = describe(result)


def _problem(index: int, server: ServerConfig, error: Any) -> str:
    """One preflight problem: the server by its config path, what happened, what to do."""
    where = f"servers[{index}] {server.describe()}"
    if isinstance(error, McpServerError):
        return f"{where}: {error.problem}. {error.advice}".rstrip()
    return f"{where}: {describe(error)}"


__all__ = ["Catalog", "McpEnv", "McpEnvConfig", "build_catalog", "catalog", "list_servers", "probe_servers"]
