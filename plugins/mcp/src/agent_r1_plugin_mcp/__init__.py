"""agent-r1-plugin-mcp: the tools of MCP servers (stdio or streamable HTTP) as agent-r1 tools.

The environment ``mcp`` (:class:`~agent_r1_plugin_mcp.env.McpEnv`) lists the tools of the servers
named in its config and lets the agent call them, with one client session per episode for stateful
servers. See the "Use MCP tools" tutorial of the agent-r1 documentation.

The public names below are imported on first attribute access, so that loading the plugin through
its entry point stays cheap (the MCP SDK itself is imported only when a server is contacted).
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "McpConnection": "connection",
    "McpServerError": "connection",
    "McpEnv": "env",
    "McpEnvConfig": "env",
    "McpTool": "tools",
    "ServerConfig": "config",
}


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [*_EXPORTS, "__version__"]
