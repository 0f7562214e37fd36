"""A real MCP server for the tests: a notebook whose notes belong to the client session.

Run it as ``python notebook_server.py`` (stdio) or ``python notebook_server.py --http PORT``
(streamable HTTP on 127.0.0.1:PORT, endpoint ``/mcp``). Built on ``MCPServer`` of the official
SDK (the class that was called ``FastMCP`` before mcp 2).

Each client session has its own notebook, so a test can tell one session per episode (the first
note of every episode is note 1) from a session shared across episodes (the numbers would grow).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections import defaultdict

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError

server = MCPServer("notebook")
notebooks: defaultdict[str, list[str]] = defaultdict(list)


def _notes(ctx: Context) -> list[str]:
    # Over HTTP each MCP session has its id header; over stdio the process is the session.
    headers = ctx.headers or {}
    return notebooks[headers.get("mcp-session-id", "stdio")]


@server.tool()
def note(text: str, ctx: Context) -> str:
    """Write a note into this session's notebook; returns its number."""
    notes = _notes(ctx)
    notes.append(text)
    return f"saved note {len(notes)}"


@server.tool()
def read_notes(ctx: Context) -> str:
    """All notes of this session, one per line."""
    return "\n".join(_notes(ctx)) or "(no notes)"


@server.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@server.tool()
def fail(reason: str) -> str:
    """Always fails with ``reason`` (an error the tool reports)."""
    raise ToolError(reason)


@server.tool()
async def sleep(seconds: float) -> str:
    """Wait ``seconds``, then answer."""
    await asyncio.sleep(seconds)
    return f"slept {seconds:g} s"


@server.tool()
def pid() -> int:
    """The server's process id (the tests kill it to simulate a crash)."""
    return os.getpid()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--http", type=int, default=None, help="serve streamable HTTP on this port")
    args = parser.parse_args()
    if args.http is None:
        server.run("stdio")
    else:
        print(f"serving on 127.0.0.1:{args.http}", file=sys.stderr, flush=True)
        server.run("streamable-http", host="127.0.0.1", port=args.http)
