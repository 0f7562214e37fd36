"""MCP tools as agent-r1 :class:`~agent_r1.Tool` classes, built from a server's tool listing.

Each listed tool becomes a subclass of :class:`McpTool` whose ``schema()`` is the server's own
JSON schema (what the chat template shows the model) and whose ``Arguments`` is a pydantic model
derived from it: top-level properties with their JSON types, required ones required, unknown keys
refused. Deeper constraints (nested objects, enums, ranges) are left to the server, which reports
a violation as an error result the agent reads.
"""

from __future__ import annotations

import re
from typing import Any, ClassVar

from agent_r1 import Tool, ToolResult
from agent_r1.json_schema import arguments_model
from agent_r1_plugin_mcp.config import ServerConfig
from agent_r1_plugin_mcp.connection import McpConnection


class Binding:
    """The connection a tool instance calls through; the environment sets it at each reset (a
    fresh one per episode for a stateful server, the rollout's shared one otherwise)."""

    def __init__(self, server: ServerConfig) -> None:
        self.server = server
        self.connection: McpConnection | None = None


class McpTool(Tool):
    """Base of the tool classes made from MCP listings: ``run`` sends the call to the server.

    Class attributes set by :func:`tool_class`: ``server`` (its config), ``remote_name`` (the name
    the server knows), ``input_schema`` (the server's JSON schema of the arguments).
    """

    server: ClassVar[ServerConfig]
    remote_name: ClassVar[str] = ""
    input_schema: ClassVar[dict[str, Any]] = {}

    def __init__(self, binding: Binding, timeout_s: float) -> None:
        super().__init__()
        self.binding = binding
        self.timeout_s = timeout_s

    async def run(self, arguments: Any) -> ToolResult | str:
        """Send the call to the episode's connection; the server's answer as text."""
        connection = self.binding.connection
        if connection is None:  # the engine always resets before stepping; a direct caller may not
            raise RuntimeError(f"MCP tool {self.name!r} was called before its environment's reset()")
        payload = arguments.model_dump(mode="json", by_alias=True, exclude_unset=True)
        return await connection.call_tool(self.remote_name, payload, timeout=self.timeout_s)

    @classmethod
    def schema(cls) -> dict[str, Any]:
        """The server's own schema of the tool, in the OpenAI function form."""
        return {
            "type": "function",
            "function": {"name": cls.name, "description": cls.description, "parameters": cls.input_schema},
        }


def tool_class(
    server: ServerConfig, listed: Any, exposed_name: str, *, errors_visible: bool
) -> type[McpTool]:
    """A :class:`McpTool` subclass for the tool ``listed`` (an ``mcp.types.Tool``) of ``server``,
    named ``exposed_name`` for the model."""
    schema = dict(listed.input_schema or {"type": "object", "properties": {}})
    schema.setdefault("type", "object")
    schema.setdefault("properties", {})
    description = (listed.description or listed.title or "").strip()
    attributes: dict[str, Any] = {
        "name": exposed_name,
        "description": description,
        "server": server,
        "remote_name": listed.name,
        "input_schema": schema,
        "infrastructure_errors_visible": errors_visible,
        "Arguments": arguments_model(exposed_name, schema),
        "__module__": __name__,
        "__doc__": f"MCP tool {listed.name!r} of server {server.name!r}: {description}",
    }
    class_name = "Mcp_" + re.sub(r"\W", "_", exposed_name)
    return type(class_name, (McpTool,), attributes)
