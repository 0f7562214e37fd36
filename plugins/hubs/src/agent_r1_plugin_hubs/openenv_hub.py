"""OpenEnv environments (Meta's ``openenv-core``, release 0.3) as the agent-r1 environment
``openenv``.

An OpenEnv environment is a server (``openenv.core.env_server.create_app``) that keeps one
environment instance per WebSocket session and answers ``reset`` and ``step`` with an observation,
a reward and ``done``. The ``openenv`` environment is a client of such a server (OpenEnv's own
``GenericEnvClient``), one session per episode::

    environment:
      name: openenv
      server: {app: "server.app:app", cwd: envs/echo_env}   # or url: "http://127.0.0.1:8000"
      action: text              # the whole action text goes into the action's one text field
      observation_field: echoed_message
      max_turns: 3

What goes where:

* The server. With ``url`` it is one you run. With ``server`` agent-r1 starts it once per process
  on a free port of 127.0.0.1 (``app``: an ASGI app run by uvicorn; ``command``: any command, with
  ``{port}`` in its arguments), the first time a run needs it (``agent-r1 check`` included), and
  stops it when the process ends. Episodes do not share state: each opens its own session, whose
  ``reset`` starts a fresh environment instance on the server, and closes it when it ends. So the
  server's lifetime is the run's, an environment's the episode's (one process per episode would
  cost a server start each time). Size the server's ``max_concurrent_envs`` to the episodes of a
  rollout batch (``trainer.tasks_per_step`` x ``rollout.group_size``); a server that refuses a
  session for capacity is waited on for ``capacity_wait_s``, then the run stops saying so.
* The action. ``action: text``: the action's text (as the policy wrote it) is the value of
  ``action_field`` (by default the action schema's one required string field), ``action_defaults``
  give the others. ``action: tool``: the action schema becomes one tool, ``tool_name``, which the
  policy calls in the run's tool-call format (``tags``, ``hermes``...); each call is one ``step``.
* The observation. The server's observation (a JSON object) is shown as ``observation_field``'s
  value, or as the whole object in JSON (sorted keys) without it: a ``user`` message in text mode,
  the tool result in tool mode. The chat template renders it (the engine's renderer), never the
  environment. The observation of ``reset`` follows the task's messages in the prompt
  (``reset_observation``). The raw observation, reward and ``done`` of every step are kept in
  ``info["openenv"]``.
* The reward. ``reward: process``: each step's reward is a process signal of its turn (named
  ``reward_name``); ``reward: outcome``: the reward of the step that ends the episode is one outcome
  signal (what OpenEnv's own harness forwards as ``env_reward``). An episode the engine cuts short
  on its token budget gets no outcome signal.
* The end. ``done`` from the server ends the episode (termination ``done``), as does
  ``max_turns``. A step the server fails (an error reply, a dropped connection) raises: the engine
  counts that episode as an environment error and leaves it out of the update.

OpenEnv's MCP (production mode) tools and its Docker / Hugging Face Space providers are not used:
point ``url`` at a container you started, or ``server`` at the environment's app.
"""

from __future__ import annotations

import asyncio
import atexit
import collections
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator

from agent_r1 import (
    Action,
    AgentR1Error,
    ComponentConfig,
    ConfigError,
    EpisodeStart,
    Observation,
    RewardSignal,
    Task,
    ToolEnv,
    ToolEnvConfig,
    ToolError,
)
from agent_r1.errors import ToolInfrastructureError
from agent_r1_plugin_hubs.requirements import require
from agent_r1_plugin_hubs.schema_tools import SchemaTool, schema_tool_class

__all__ = ["OpenEnvEnv", "OpenEnvEnvConfig", "OpenEnvServerConfig", "stop_servers"]

COMPONENT = "environment (openenv)"


class OpenEnvServerConfig(ComponentConfig):
    """An OpenEnv server agent-r1 starts (once per process) on a free port of 127.0.0.1."""

    app: str | None = Field(
        None, description="'module:attribute' of the server's ASGI app (create_app(...)), run with uvicorn"
    )
    command: list[str] | None = Field(
        None, description="a command that starts the server; '{port}' in an argument becomes the port"
    )
    cwd: str | None = Field(None, description="the working directory of the server (the app's imports)")
    env: dict[str, str] = Field(default_factory=dict, description="environment variables added for it")
    startup_timeout_s: float = Field(60.0, gt=0, description="how long to wait for GET /health")

    @model_validator(mode="after")
    def _one_way(self) -> OpenEnvServerConfig:
        if (self.app is None) == (self.command is None):
            raise ValueError("give exactly one of app and command")
        return self

    def argv(self, port: int) -> list[str]:
        if self.app is not None:
            return [sys.executable, "-m", "uvicorn", self.app, "--host", "127.0.0.1", "--port", str(port)]
        return [part.replace("{port}", str(port)) for part in self.command or []]

    def describe(self) -> str:
        started = f"app {self.app}" if self.app is not None else " ".join(self.command or [])
        return started + (f" (in {self.cwd})" if self.cwd else "")


class OpenEnvEnvConfig(ToolEnvConfig):
    """Options of :class:`OpenEnvEnv`: the server, how actions and observations map, the reward.
    The ``tool_env`` options (format, ``max_turns``...) apply; the format only in tool mode."""

    url: str | None = Field(None, description="a running OpenEnv server: http://host:port")
    server: OpenEnvServerConfig | None = Field(None, description="a server agent-r1 starts (app or command)")
    action: Literal["text", "tool"] = Field(
        "text", description="text: the action text is one action field; tool: the action schema is a tool"
    )
    action_field: str | None = Field(
        None, description="text mode: the field the action text goes into (default: the one required string)"
    )
    action_defaults: dict[str, Any] = Field(default_factory=dict, description="fixed values of other fields")
    tool_name: str = Field("act", description="tool mode: the name of the tool that sends an action")
    tool_description: str | None = Field(
        None, description="tool mode: its description (default: the schema's)"
    )
    observation_field: str | None = Field(
        None, description="the observation field shown to the agent (default: the whole observation, JSON)"
    )
    reset_observation: bool = Field(True, description="show reset's observation after the task's messages")
    reset_options: dict[str, Any] = Field(
        default_factory=dict,
        description="keyword arguments of every reset (seed...); a task's "
        "metadata['openenv']['reset'] adds to them",
    )
    reward: Literal["process", "outcome"] = Field(
        "process", description="process: each step's reward at its turn; outcome: the final step's reward"
    )
    reward_name: str = Field("openenv", description="the name of the reward signals")
    connect_timeout_s: float = Field(10.0, gt=0, description="opening a session")
    message_timeout_s: float = Field(60.0, gt=0, description="one reset or step")
    capacity_wait_s: float = Field(
        10.0, ge=0, description="how long to retry a session the server refuses for capacity"
    )

    @model_validator(mode="after")
    def _one_server(self) -> OpenEnvEnvConfig:
        # neither is reported when the environment is built (server_url), so that the defaults validate
        if self.url is not None and self.server is not None:
            raise ValueError("give one of url (a running server) and server (one agent-r1 starts), not both")
        if self.action == "text" and self.tools:
            raise ValueError("tools are called in tool mode only: set action: tool, or remove tools")
        return self


# --------------------------------------------------------------------------------------------
# Servers, started once per process
# --------------------------------------------------------------------------------------------


@dataclass
class _Server:
    """A server agent-r1 started: its process (in a process group of its own), its URL and the
    last lines it wrote to stderr."""

    config: OpenEnvServerConfig
    process: subprocess.Popen[bytes]
    url: str
    stderr: collections.deque[str] = field(default_factory=lambda: collections.deque(maxlen=20))

    def tail(self) -> str:
        lines = [line.rstrip() for line in self.stderr if line.strip()]
        return " | ".join(lines[-6:]) or "(nothing on stderr)"

    def stop(self) -> None:
        if self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGTERM)
                self.process.wait(timeout=5)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                with contextlib.suppress(ProcessLookupError):  # it ended on its own meanwhile
                    os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=5)


_servers: dict[str, _Server] = {}
_servers_lock = threading.Lock()


def stop_servers() -> None:
    """Stop every server this process started (registered with ``atexit``; tests call it too)."""
    with _servers_lock:
        servers = list(_servers.values())
        _servers.clear()
    for server in servers:
        server.stop()


atexit.register(stop_servers)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _start(config: OpenEnvServerConfig) -> _Server:
    port = _free_port()
    argv = config.argv(port)
    try:
        process = subprocess.Popen(
            argv,
            cwd=config.cwd,
            env={**os.environ, **config.env},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,  # its own process group: stopping it stops what it spawned
        )
    except OSError as exc:
        raise ConfigError(
            f"{COMPONENT}: cannot start the server ({config.describe()}): {exc}. Fix environment.server.",
            path="environment.server",
        ) from None
    server = _Server(config, process, f"http://127.0.0.1:{port}")
    stderr = process.stderr
    assert stderr is not None

    def drain() -> None:
        for raw in iter(stderr.readline, b""):
            server.stderr.append(raw.decode("utf-8", "replace"))

    threading.Thread(target=drain, name=f"openenv-server-{port}", daemon=True).start()
    deadline = time.monotonic() + config.startup_timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            time.sleep(0.2)  # let the drain thread read its last words
            raise ConfigError(
                f"{COMPONENT}: the server ({config.describe()}) exited with code {process.returncode} before "
                f"answering: {server.tail()}. Fix environment.server (app path, cwd, the server's imports).",
                path="environment.server",
            )
        if _healthy(server.url):
            return server
        time.sleep(0.2)
    server.stop()
    raise ConfigError(
        f"{COMPONENT}: the server ({config.describe()}) did not answer GET /health within "
        f"{config.startup_timeout_s:g} s: {server.tail()}. Raise environment.server.startup_timeout_s "
        "or fix the server.",
        path="environment.server",
    )


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def server_url(config: OpenEnvEnvConfig) -> str:
    """The URL of the configured server, starting it when agent-r1 runs it (once per process)."""
    if config.url is not None:
        return config.url.rstrip("/")
    if config.server is None:
        raise ConfigError(
            f"{COMPONENT}: no server: give environment.url (a running OpenEnv server) or environment.server "
            "(an app or command agent-r1 starts)",
            path="environment",
        )
    key = config.server.model_dump_json()
    with _servers_lock:
        server = _servers.get(key)
        if server is not None and server.process.poll() is None:
            return server.url
        server = _servers[key] = _start(config.server)
        return server.url


_schemas: dict[str, dict[str, Any]] = {}


def schemas(url: str) -> dict[str, Any]:
    """The server's ``/schema`` (action, observation, state JSON schemas), fetched once per URL."""
    if url not in _schemas:
        try:
            with urllib.request.urlopen(f"{url}/schema", timeout=10) as response:
                _schemas[url] = json.loads(response.read())
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise ConfigError(
                f"{COMPONENT}: cannot read the OpenEnv schemas at {url}/schema ({exc}); is an OpenEnv server "
                "running there? Fix environment.url, or let agent-r1 start it with environment.server.",
                path="environment.url",
            ) from None
    return _schemas[url]


# --------------------------------------------------------------------------------------------
# Actions and observations
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Protocol:
    """How one configuration talks to its server, worked out from the schemas."""

    url: str
    action_schema: dict[str, Any]
    action_field: str | None
    observation_fields: tuple[str, ...]


def _protocol(config: OpenEnvEnvConfig) -> _Protocol:
    url = server_url(config)
    found = schemas(url)
    action_schema = dict(found.get("action") or {})
    properties = {k: v for k, v in (action_schema.get("properties") or {}).items() if k != "metadata"}
    required = [name for name in action_schema.get("required") or [] if name in properties]
    action_schema = {
        **action_schema,
        "properties": properties,
        "required": [name for name in required if name not in config.action_defaults],
    }
    observation_fields = tuple(
        k
        for k in (found.get("observation") or {}).get("properties") or {}
        if k not in ("reward", "done", "metadata")
    )
    if config.observation_field is not None and config.observation_field not in observation_fields:
        raise ConfigError(
            f"{COMPONENT}: the server's observations have no field {config.observation_field!r}; they have "
            f"{list(observation_fields)}. Fix environment.observation_field.",
            path="environment.observation_field",
        )
    unknown = sorted(set(config.action_defaults) - set(properties))
    if unknown:
        raise ConfigError(
            f"{COMPONENT}: the server's actions have no field(s) {unknown}; they have {list(properties)}. "
            "Fix environment.action_defaults.",
            path="environment.action_defaults",
        )
    field_name = None
    if config.action == "text":
        field_name = config.action_field
        strings = [n for n in required if (properties[n] or {}).get("type") == "string"]
        if field_name is None:
            if len(strings) != 1:
                raise ConfigError(
                    f"{COMPONENT}: action: text needs the action field the text goes into; the server's "
                    f"actions have the fields {list(properties)} (required strings: {strings}). Set "
                    "environment.action_field.",
                    path="environment.action_field",
                )
            field_name = strings[0]
        elif field_name not in properties:
            raise ConfigError(
                f"{COMPONENT}: the server's actions have no field {field_name!r}; they have "
                f"{list(properties)}. Fix environment.action_field.",
                path="environment.action_field",
            )
        missing = [n for n in required if n != field_name and n not in config.action_defaults]
        if missing:
            raise ConfigError(
                f"{COMPONENT}: the action fields {missing} are required besides {field_name!r}; give them in "
                "environment.action_defaults, or use action: tool.",
                path="environment.action_defaults",
            )
    return _Protocol(url, action_schema, field_name, observation_fields)


class OpenEnvActionTool(SchemaTool):
    """Tool mode: one call is one ``step`` with the call's arguments as the action."""

    def __init__(self, env: OpenEnvEnv) -> None:
        super().__init__()
        self.env = env

    async def run(self, arguments: Any) -> str:
        """Send the action; the observation as the agent reads it. An action the server refuses
        (``VALIDATION_ERROR``) is an error the agent reads; any other failure (the environment
        raised, the connection dropped) fails the step."""
        try:
            result = await self.env.send({**self.env.config.action_defaults, **self.payload(arguments)})
        except Exception as exc:
            if "VALIDATION_ERROR" in str(exc):
                raise ToolError(f"the environment refused the action: {exc}") from exc
            raise ToolInfrastructureError(
                f"{COMPONENT}: step at {self.env.protocol.url} failed: {exc}"
            ) from exc
        return self.env.render(result.observation)


# --------------------------------------------------------------------------------------------
# The environment
# --------------------------------------------------------------------------------------------


class OpenEnvEnv(ToolEnv):
    """An OpenEnv server's environment, one session per episode (see the module docstring)."""

    name = "openenv"
    Config = OpenEnvEnvConfig
    config: OpenEnvEnvConfig
    CAPACITY_CODE: ClassVar[str] = "CAPACITY_REACHED"

    def __init__(self, config: ComponentConfig | Mapping[str, Any] | None = None) -> None:
        super().__init__(config)
        require("openenv", component=COMPONENT, path="environment")
        self.protocol = _protocol(self.config)
        self._client: Any = None
        self._lock = asyncio.Lock()
        self._results: list[Any] = []
        self._steps = 0
        if self.config.action == "tool":
            name = self.config.tool_name
            if name in self.tool_classes:
                raise ConfigError(
                    f"{COMPONENT}: tool_name {name!r} is the name of another tool; rename it",
                    path="environment.tool_name",
                )
            description = self.config.tool_description or self.protocol.action_schema.get("description") or ""
            cls = schema_tool_class(
                OpenEnvActionTool,
                name=name,
                description=description.strip() or "Send an action to the environment.",
                schema=self.protocol.action_schema,
            )
            self.add_tools([cls(self)])

    @classmethod
    def check(cls, config: OpenEnvEnvConfig) -> list[str]:
        """Preflight: openenv is installed, the server starts (or answers at ``url``) and its action
        and observation schemas fit the options. A server started here is kept for the run."""
        require("openenv", component=COMPONENT, path="environment")
        _protocol(config)
        return []

    # -- observations --------------------------------------------------------------------------
    def render(self, observation: Any) -> str:
        """The text the agent reads for ``observation`` (the server's JSON object)."""
        field_name = self.config.observation_field
        if field_name is not None and isinstance(observation, Mapping):
            value = observation.get(field_name)
            return value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
        return json.dumps(observation, sort_keys=True, default=str)

    # -- the session ---------------------------------------------------------------------------
    async def _open(self, reset_options: Mapping[str, Any]) -> Any:
        from openenv.core.generic_client import GenericEnvClient

        deadline = time.monotonic() + self.config.capacity_wait_s
        while True:
            client = GenericEnvClient(
                base_url=self.protocol.url,
                connect_timeout_s=self.config.connect_timeout_s,
                message_timeout_s=self.config.message_timeout_s,
            )
            try:
                await client.connect()
                result = await client.reset(**reset_options)
            except Exception as exc:
                await client.close()
                if self.CAPACITY_CODE in str(exc) and time.monotonic() < deadline:
                    await asyncio.sleep(0.1)  # a session of an episode that just ended is being released
                    continue
                advice = (
                    "raise the server's max_concurrent_envs (create_app) to the episodes of a rollout batch "
                    "(trainer.tasks_per_step x rollout.group_size), or lower them"
                    if self.CAPACITY_CODE in str(exc)
                    else "check that the server is up and its reset works"
                )
                raise AgentR1Error(
                    f"{COMPONENT}: reset at {self.protocol.url} failed: {type(exc).__name__}: {exc}; {advice}"
                ) from exc
            self._client = client
            return result

    async def send(self, action: dict[str, Any]) -> Any:
        """One ``step`` of the episode's session (one at a time: a session is a single socket)."""
        if self._client is None:  # the engine always resets first
            raise RuntimeError(f"{COMPONENT}: step before reset")
        async with self._lock:
            result = await self._client.step(action)
            self._steps += 1
        self._results.append(result)
        return result

    async def aclose(self) -> None:
        """Close the episode's session (idempotent); the server's environment instance goes with it."""
        client, self._client = self._client, None
        if client is not None:
            await client.close()

    # -- episode -------------------------------------------------------------------------------
    async def reset(self, task: Task) -> EpisodeStart:
        """Open a session and ``reset`` it (options: ``reset_options`` and the task's
        ``metadata['openenv']['reset']``); the prompt is the task's messages and the reset
        observation."""
        await self.aclose()
        self._results, self._steps = [], 0
        extra = ((task.metadata or {}).get("openenv") or {}).get("reset") or {}
        result = await self._open({**self.config.reset_options, **extra})
        if self.config.action == "tool":
            start = await super().reset(task)
            messages = start.messages
        else:
            messages = [dict(message) for message in task.messages]
            prompt = self.config.system_prompt
            if prompt and messages and messages[0].get("role") == "system":
                messages[0]["content"] = f"{prompt}\n\n{messages[0].get('content') or ''}".rstrip()
            elif prompt:
                messages.insert(0, {"role": "system", "content": prompt})
            start = EpisodeStart(messages=messages)
        text = self.render(result.observation)
        if self.config.reset_observation and text:
            messages.append({"role": "user", "content": text})
        start.info["openenv"] = {
            "observation": result.observation,
            "reward": result.reward,
            "done": result.done,
        }
        return start

    async def step(self, action: Action, turn: int) -> Observation:
        """Send the action (text mode) or run its calls (tool mode); the server's reply as the next
        message, its reward as a signal, its ``done`` as the end."""
        self._results = []
        try:
            if self.config.action == "text":
                assert self.protocol.action_field is not None
                payload = {**self.config.action_defaults, self.protocol.action_field: action.text}
                result = await self.send(payload)
                done = bool(result.done) or turn + 1 >= self.config.max_turns
                observation = Observation(
                    messages=[] if done else [{"role": "user", "content": self.render(result.observation)}],
                    done=done,
                    termination=("done" if result.done else "max_turns") if done else None,
                )
            else:
                observation = await super().step(action, turn)
                if any(result.done for result in self._results):
                    observation = observation.model_copy(
                        update={"done": True, "termination": "done", "messages": []}
                    )
        except BaseException:
            await self.aclose()
            raise
        observation.rewards.extend(self._signals(turn, observation.done))
        observation.info["openenv"] = [
            {"observation": r.observation, "reward": r.reward, "done": r.done} for r in self._results
        ]
        if observation.done:
            await self.aclose()
        return observation

    def _signals(self, turn: int, done: bool) -> list[RewardSignal]:
        rewards = [float(r.reward) for r in self._results if r.reward is not None]
        if not rewards:
            return []
        if self.config.reward == "process":
            value = sum(rewards)
            return [
                RewardSignal(
                    name=self.config.reward_name, value=value, kind="process", turn=turn, source=self.name
                )
            ]
        if done:
            return [
                RewardSignal(
                    name=self.config.reward_name, value=rewards[-1], kind="outcome", source=self.name
                )
            ]
        return []


DATASETS: list[Any] = []
ENVIRONMENTS: list[Any] = [OpenEnvEnv]
SHAPERS: list[Any] = []
