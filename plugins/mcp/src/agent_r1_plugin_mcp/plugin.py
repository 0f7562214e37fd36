"""The hook implementations of agent-r1-plugin-mcp (entry point ``mcp`` of the ``agent_r1`` group)."""

from __future__ import annotations

from typing import Any

from agent_r1 import hookimpl


@hookimpl
def register_environments() -> list[type[Any]]:
    """``mcp``: a tool environment whose tools come from MCP servers."""
    from agent_r1_plugin_mcp.env import McpEnv

    return [McpEnv]
