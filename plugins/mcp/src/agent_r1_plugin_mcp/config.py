"""The run-config section of one MCP server (``environment.servers[i]``)."""

from __future__ import annotations

import re
import shlex
from typing import Literal

from pydantic import Field, field_validator, model_validator

from agent_r1 import ComponentConfig

SERVER_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")
"""What a server name may look like: it becomes the prefix of tool names (``notes__add``)."""


class ServerConfig(ComponentConfig):
    """How to reach one MCP server: a command to start (stdio) or a URL (streamable HTTP)."""

    name: str = Field(description="short name of the server: shown in errors and used as tool-name prefix")
    command: list[str] | None = Field(
        None,
        description="stdio: the program and its arguments (a list, or one string split like a shell "
        "would), started once per episode (per rollout when stateful is false)",
    )
    url: str | None = Field(None, description="streamable HTTP: the endpoint, e.g. http://127.0.0.1:8000/mcp")
    env: dict[str, str] = Field(
        default_factory=dict, description="stdio: extra environment variables for the server process"
    )
    cwd: str | None = Field(None, description="stdio: working directory of the server process")
    headers: dict[str, str] = Field(default_factory=dict, description="HTTP: headers sent with every request")
    tools: list[str] | None = Field(
        None, description="expose only these tools of the server (default: all it lists)"
    )
    stateful: bool = Field(
        True,
        description="true: one session per episode (the server may keep per-session state, which a "
        "reconnect loses); false: one session per rollout shared by its episodes, and a call whose "
        "connection dropped is retried once reconnected",
    )
    connect_timeout_s: float = Field(
        20.0, gt=0, description="seconds to start or reach the server and finish the MCP handshake"
    )
    call_timeout_s: float | None = Field(
        None,
        gt=0,
        description="seconds one tool call may take (default: the environment's call_timeout_s)",
    )
    max_reconnects: int = Field(
        2, ge=0, description="reconnections after a dropped connection, per session (then calls fail)"
    )

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not SERVER_NAME.fullmatch(value):
            raise ValueError(
                f"server name {value!r} must start with a letter or '_' and hold only letters, digits, "
                "'_' and '-' (it prefixes tool names)"
            )
        return value

    @field_validator("command", mode="before")
    @classmethod
    def _split_command(cls, value: object) -> object:
        return shlex.split(value) if isinstance(value, str) else value

    @model_validator(mode="after")
    def _one_transport(self) -> ServerConfig:
        if (self.command is None) == (self.url is None):
            raise ValueError(
                f"server {self.name!r}: set exactly one of 'command' (a stdio server to start) and "
                "'url' (a streamable HTTP endpoint)"
            )
        if self.command is not None and not self.command:
            raise ValueError(f"server {self.name!r}: 'command' is empty; give the program to start")
        if self.url is not None and not re.match(r"https?://", self.url):
            raise ValueError(f"server {self.name!r}: url {self.url!r} must start with http:// or https://")
        return self

    @property
    def transport(self) -> Literal["stdio", "http"]:
        """``stdio`` for a command, ``http`` for a URL."""
        return "stdio" if self.command is not None else "http"

    def describe(self) -> str:
        """``'notes' (stdio: python server.py)`` or ``'web' (http://...)``, for messages."""
        if self.command is not None:
            return f"{self.name!r} (stdio: {shlex.join(self.command)})"
        return f"{self.name!r} ({self.url})"
