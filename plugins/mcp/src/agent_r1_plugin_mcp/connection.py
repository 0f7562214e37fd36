"""One client session with one MCP server, through the official MCP Python SDK.

The SDK's transports and :class:`mcp.ClientSession` are anyio context managers, which must be
entered and left by the same task. A :class:`McpConnection` therefore keeps each session in an
*owner task* of its own: :meth:`McpConnection.connect` starts it and waits for the handshake,
:meth:`McpConnection.close` tells it to leave its contexts (which stops a stdio server process or
ends an HTTP session), and tool calls from any task of the same event loop go through the session
meanwhile. When the event loop ends (a rollout's ``asyncio.run`` returns) a session nobody closed
is cancelled with its owner task, which still leaves its contexts.

Failures name the server and the tool, and are :class:`~agent_r1.errors.ToolInfrastructureError`\\ s
(not the agent's doing): a server that cannot be started or reached, a dropped connection, a
reconnection budget used up. Errors the server reports for a call (``isError`` results, protocol
errors such as unknown arguments) are :class:`~agent_r1.ToolError`\\ s, shown to the agent.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import time
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from typing import Any

from agent_r1 import ToolError, ToolResult
from agent_r1.errors import ToolInfrastructureError
from agent_r1_plugin_mcp.config import ServerConfig

if sys.version_info < (3, 11):  # pragma: no cover - a builtin from 3.11 on; anyio brings the backport
    from exceptiongroup import BaseExceptionGroup

logger = logging.getLogger("agent_r1_plugin_mcp")

CLOSE_TIMEOUT_S = 10.0
"""How long :meth:`McpConnection.close` waits for a session to end before cancelling it."""

_CONNECTION_CLOSED = -32000  # JSON-RPC code the SDK gives requests whose connection went away


class McpServerError(ToolInfrastructureError):
    """An MCP server could not be started or reached, or its connection dropped; the message names
    the server (and the tool, for a call) and says what to do."""


class McpConnection:
    """A session with ``server``, opened by :meth:`connect` and reopened (at most
    ``server.max_reconnects`` times) when a call finds it dropped.

    Counters: ``reconnects`` (connection attempts after the first), ``lost`` (connections found
    dropped), ``calls`` (tool calls sent).
    """

    def __init__(self, server: ServerConfig) -> None:
        self.server = server
        self.session: Any = None
        self.reconnects = 0
        self.lost = 0
        self.calls = 0
        self.attempted = False
        self.last_error: str | None = None
        self._owner: asyncio.Task[None] | None = None
        self._stop: asyncio.Event | None = None
        self._lock: asyncio.Lock | None = None

    # -- lifecycle -------------------------------------------------------------------------------
    @property
    def is_open(self) -> bool:
        """True while a session is up (as far as anyone has noticed)."""
        return self.session is not None and self._owner is not None and not self._owner.done()

    async def connect(self) -> None:
        """Start the server (stdio) or reach it (HTTP) and finish the MCP handshake, within
        ``server.connect_timeout_s``. Raises :class:`McpServerError` naming the server and the cause."""
        await self.close()
        self.attempted = True
        loop = asyncio.get_running_loop()
        ready: asyncio.Future[Any] = loop.create_future()
        stop = asyncio.Event()
        owner = asyncio.ensure_future(self._own(ready, stop))
        self._owner, self._stop = owner, stop
        timeout = self.server.connect_timeout_s
        try:
            self.session = await asyncio.wait_for(asyncio.shield(ready), timeout)
        except asyncio.TimeoutError:
            await self._abandon()
            raise self._error(
                f"did not finish the MCP handshake within {timeout:g} s (connect_timeout_s)"
            ) from None
        except asyncio.CancelledError:
            await self._abandon()
            raise
        except Exception as exc:
            await self._abandon()
            raise self._error(f"cannot connect: {describe(exc)}") from exc

    async def close(self) -> None:
        """End the session (a stdio server is stopped); waits at most :data:`CLOSE_TIMEOUT_S`."""
        owner, stop = self._owner, self._stop
        self.session, self._owner, self._stop = None, None, None
        if owner is None or stop is None:
            return
        stop.set()
        try:
            await asyncio.wait_for(asyncio.shield(owner), CLOSE_TIMEOUT_S)
        except asyncio.TimeoutError:
            logger.warning(
                "MCP server %s: the session did not end within %g s; cancelled", self.name, CLOSE_TIMEOUT_S
            )
            owner.cancel()
            await asyncio.gather(owner, return_exceptions=True)
        except Exception:  # the owner records its own failure; closing must not raise it again
            pass

    async def _abandon(self) -> None:
        owner = self._owner
        self.session, self._owner, self._stop = None, None, None
        if owner is not None:
            owner.cancel()
            await asyncio.gather(owner, return_exceptions=True)

    async def _own(self, ready: asyncio.Future[Any], stop: asyncio.Event) -> None:
        """The owner task: enter the transport and the session, hand the session out, wait for
        :meth:`close`, leave both. A failure before the handshake goes to ``ready``; one after it
        (the transport died) is recorded in ``last_error``."""
        from mcp import ClientSession

        try:
            async with AsyncExitStack() as stack:
                read, write = await stack.enter_async_context(self._transport())
                session = await stack.enter_async_context(ClientSession(read, write))
                await session.initialize()
                if not ready.done():
                    ready.set_result(session)
                await stop.wait()
        except asyncio.CancelledError:
            if not ready.done():
                ready.cancel()
            raise
        except BaseException as exc:  # ExceptionGroups of anyio task groups included
            if not ready.done():
                ready.set_exception(exc if isinstance(exc, Exception) else RuntimeError(describe(exc)))
            else:  # the transport failed under a live session: the next call notices and reconnects
                self.last_error = describe(exc)
                logger.warning("MCP server %s: connection ended: %s", self.name, self.last_error)
            if not isinstance(exc, Exception):
                raise

    def _transport(self) -> AbstractAsyncContextManager[Any]:
        server = self.server
        if server.command is not None:
            from mcp import StdioServerParameters, stdio_client

            program, *args = server.command
            parameters = StdioServerParameters(
                command=program, args=args, env=dict(server.env) or None, cwd=server.cwd
            )
            return stdio_client(parameters)
        return _http_transport(server)

    # -- calls -----------------------------------------------------------------------------------
    async def list_tools(self) -> list[Any]:
        """Every tool the server lists (all pages), as ``mcp.types.Tool``."""
        from mcp.types import PaginatedRequestParams

        session = await self._ensure(None)
        tools: list[Any] = []
        cursor: str | None = None
        for _ in range(1000):  # a server whose cursor never ends must not hang the run
            params = PaginatedRequestParams(cursor=cursor) if cursor else None
            try:
                page = await asyncio.wait_for(
                    session.list_tools(params=params), self.server.connect_timeout_s
                )
            except asyncio.TimeoutError:
                raise self._error(
                    f"did not list its tools within {self.server.connect_timeout_s:g} s"
                ) from None
            except Exception as exc:
                raise self._error(f"cannot list its tools: {describe(exc)}") from exc
            tools.extend(page.tools)
            cursor = page.next_cursor
            if not cursor:
                break
        return tools

    async def call_tool(self, tool: str, arguments: dict[str, Any], *, timeout: float) -> ToolResult | str:
        """Call ``tool`` with ``arguments`` and return its text (or a failed
        :class:`~agent_r1.ToolResult` of kind ``timeout`` after ``timeout`` seconds).

        A dropped connection is reopened first, within ``max_reconnects``; a stateless server's call
        that was cut by the drop is sent again once. Raises :class:`~agent_r1.ToolError` for errors the
        server reports and :class:`McpServerError` when the server cannot be reached.
        """
        retried = False
        while True:
            session = await self._ensure(tool)
            self.calls += 1
            started = time.monotonic()
            try:
                result = await asyncio.wait_for(session.call_tool(tool, arguments), timeout)
            except asyncio.TimeoutError:
                return ToolResult(
                    call_id="",
                    name=tool,
                    content=f"Error: MCP server {self.name!r} tool {tool!r}: no answer within {timeout:g} s",
                    ok=False,
                    error="timeout",
                )
            except Exception as exc:
                if not _connection_lost(exc):
                    raise ToolError(f"MCP server {self.name!r} tool {tool!r}: {describe(exc)}") from exc
                self._dropped(exc)
                if self.server.stateful or retried:
                    state = "the server's session state is gone; " if self.server.stateful else ""
                    after = time.monotonic() - started
                    raise self._error(
                        f"the connection was lost during tool {tool!r} after {after:.1f} s "
                        f"({describe(exc)}); {state}the next call reconnects "
                        f"({self.reconnects} of max_reconnects={self.server.max_reconnects} used)"
                    ) from exc
                retried = True
                continue
            return _result_text(self.name, tool, result)

    async def _ensure(self, tool: str | None) -> Any:
        """The open session, connecting (first time) or reconnecting (counted, bounded) as needed."""
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if self.is_open:
                return self.session
            if self._owner is not None:  # the owner task ended under us: the transport died
                self._dropped(None)
            if self.attempted:
                if self.reconnects >= self.server.max_reconnects:
                    what = f"tool {tool!r}" if tool else "its tools"
                    raise self._error(
                        f"cannot call {what}: the connection is down and all max_reconnects="
                        f"{self.server.max_reconnects} reconnections were used"
                        + (f" (last error: {self.last_error})" if self.last_error else "")
                    )
                self.reconnects += 1
                logger.warning(
                    "MCP server %s: reconnecting (%d of %d)",
                    self.name,
                    self.reconnects,
                    self.server.max_reconnects,
                )
            try:
                await self.connect()
            except McpServerError as exc:
                self.last_error = str(exc)
                if tool is not None:
                    raise McpServerError(f"{exc} (calling tool {tool!r})") from exc
                raise
            return self.session

    def _dropped(self, exc: BaseException | None) -> None:
        self.lost += 1
        if exc is not None:
            self.last_error = describe(exc)
        owner = self._owner
        self.session, self._owner, self._stop = None, None, None
        if owner is not None and not owner.done():
            owner.cancel()  # leaves the dead transport's contexts; reaped by the event loop

    # -- messages --------------------------------------------------------------------------------
    @property
    def name(self) -> str:
        return self.server.name

    def _error(self, problem: str) -> McpServerError:
        advice = (
            "check that the command starts an MCP server on stdin/stdout (run it by hand; its "
            "stderr is shown above)"
            if self.server.transport == "stdio"
            else "check that the server is running and serves MCP (streamable HTTP) at this URL"
        )
        return McpServerError(
            f"MCP server {self.server.describe()}: {problem}. {advice[0].upper()}{advice[1:]}."
        )


@asynccontextmanager
async def _http_transport(server: ServerConfig) -> AsyncIterator[Any]:
    """The streamable HTTP transport, with the configured headers."""
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    assert server.url is not None
    if server.headers:
        async with (
            create_mcp_http_client(headers=dict(server.headers)) as client,
            streamable_http_client(server.url, http_client=client) as streams,
        ):
            yield streams
    else:
        async with streamable_http_client(server.url) as streams:
            yield streams


def _connection_lost(exc: BaseException) -> bool:
    """Whether ``exc`` says the connection is gone (rather than the call failing on its own)."""
    import anyio

    if (
        getattr(exc, "code", None) == _CONNECTION_CLOSED
        or getattr(getattr(exc, "error", None), "code", None) == _CONNECTION_CLOSED
    ):
        return True
    if isinstance(exc, BaseExceptionGroup):
        return any(_connection_lost(inner) for inner in exc.exceptions)
    return isinstance(exc, (anyio.ClosedResourceError, anyio.BrokenResourceError, ConnectionError, OSError))


def _result_text(server: str, tool: str, result: Any) -> str:
    """The text the agent reads: text blocks as they are, other blocks as short placeholders,
    structured content as JSON when there is no text. Raises :class:`~agent_r1.ToolError` for a
    result the server marked as an error."""
    parts = [_block_text(block) for block in result.content or []]
    text = "\n".join(part for part in parts if part)
    if not text and result.structured_content is not None:
        text = json.dumps(result.structured_content, ensure_ascii=False)
    if result.is_error:
        raise ToolError(f"MCP server {server!r} tool {tool!r} failed: {text or '(no message)'}")
    return text


def _block_text(block: Any) -> str:
    kind = getattr(block, "type", "")
    if kind == "text":
        return str(block.text)
    if kind in ("image", "audio"):
        return f"[{kind}: {getattr(block, 'mime_type', '?')}, not shown]"
    if kind == "resource":
        resource = block.resource
        text = getattr(resource, "text", None)
        return str(text) if text is not None else f"[resource {resource.uri}, not shown]"
    if kind == "resource_link":
        return f"[resource link {block.uri}]"
    return f"[{kind or type(block).__name__} content, not shown]"


def describe(exc: BaseException) -> str:
    """``Type: message`` of ``exc``; the leaves of an exception group, joined."""
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(dict.fromkeys(describe(inner) for inner in exc.exceptions))
    message = str(exc)
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__
