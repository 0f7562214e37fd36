"""agent-r1-plugin-mcp: the tools of MCP servers (stdio or streamable HTTP) as agent-r1 tools.

The environment ``mcp`` (:class:`~agent_r1_plugin_mcp.env.McpEnv`) lists the tools of the servers
named in its config and lets the agent call them, with one client session per episode for stateful
servers. See the "Use MCP tools" tutorial of the agent-r1 documentation.

The public names below are imported on first attribute access, so that loading the plugin through
its entry point stays cheap (the MCP SDK itself is imported only when a server is contacted).
"""

from __future__ import annotations

from agent_r1.lazy import lazy_dir, lazy_getattr

__version__ = "0.1.0"

_EXPORTS: dict[str, tuple[str, ...]] = {  # module → the names it gives this package
    ".connection": (
        "McpConnection",
        "McpServerError",
    ),
    ".env": (
        "McpEnv",
        "McpEnvConfig",
    ),
    ".tools": ("McpTool",),
    ".config": ("ServerConfig",),
}

__all__ = [*sorted(name for names in _EXPORTS.values() for name in names), "__version__"]
__getattr__ = lazy_getattr(__name__, _EXPORTS)
__dir__ = lazy_dir(__name__, _EXPORTS)
