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
reconnection budget used up. A stdio server that cannot start is described by what happened to
its process: a command not found, an exit code (or signal) before the handshake, a handshake that
did not finish in time; a connection made with ``capture_stderr`` (the one-off listings of
:func:`~agent_r1_plugin_mcp.env.probe_servers`) also quotes the first lines the server wrote to
stderr, which otherwise go to the console. Errors the server reports for a call (``isError``
results, protocol errors such as unknown arguments) are :class:`~agent_r1.ToolError`\\ s, shown to
the agent.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import logging
import os
import signal
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from typing import IO, Any

from agent_r1 import ToolError, ToolResult
from agent_r1.errors import ToolInfrastructureError
from agent_r1_plugin_mcp.config import ServerConfig

if sys.version_info < (3, 11):  # pragma: no cover - a builtin from 3.11 on; anyio brings the backport
    from exceptiongroup import BaseExceptionGroup

logger = logging.getLogger("agent_r1_plugin_mcp")

CLOSE_TIMEOUT_S = 10.0
"""How long :meth:`McpConnection.close` waits for a session to end before cancelling it."""

_CONNECTION_CLOSED = -32000  # JSON-RPC code the SDK gives requests whose connection went away

STDERR_LINES = 5
"""How many first lines of a failed server's stderr a captured error quotes (and the last line
when there are more; each cut to 200 characters)."""


class McpServerError(ToolInfrastructureError):
    """An MCP server could not be started or reached, or its connection dropped; the message names
    the server (and the tool, for a call) and says what to do. ``problem`` is what happened and
    ``advice`` what to do, for callers that name the server their own way (the preflight check
    names its config path)."""

    def __init__(self, message: str, *, problem: str | None = None, advice: str = "") -> None:
        super().__init__(message)
        self.problem = problem if problem is not None else message
        self.advice = advice


class McpConnection:
    """A session with ``server``, opened by :meth:`connect` and reopened (at most
    ``server.max_reconnects`` times) when a call finds it dropped.

    Counters: ``reconnects`` (connection attempts after the first), ``lost`` (connections found
    dropped), ``calls`` (tool calls sent).
    """

    def __init__(self, server: ServerConfig, *, capture_stderr: bool = False) -> None:
        self.server = server
        self.capture_stderr = capture_stderr
        """stdio: the server's stderr goes to a temporary file, quoted when the start fails (instead
        of the console)."""
        self.session: Any = None
        self.reconnects = 0
        self.lost = 0
        self.calls = 0
        self.attempted = False
        self.last_error: str | None = None
        self._owner: asyncio.Task[None] | None = None
        self._stop: asyncio.Event | None = None
        self._lock: asyncio.Lock | None = None
        self._processes: list[Any] = []  # the stdio server process of the current attempt
        self._stderr: IO[bytes] | None = None

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
            stopped = "; it was stopped" if self._processes else ""
            problem = f"did not finish the MCP handshake within {timeout:g} s (connect_timeout_s){stopped}"
            raise self._start_error(problem, started=True, slow=True) from None
        except asyncio.CancelledError:
            await self._abandon()
            self._close_stderr()
            raise
        except Exception as exc:
            await self._abandon()
            raise self._connect_error(exc) from exc

    async def close(self) -> None:
        """End the session (a stdio server is stopped); waits at most :data:`CLOSE_TIMEOUT_S`."""
        owner, stop = self._owner, self._stop
        self.session, self._owner, self._stop = None, None, None
        self._close_stderr()
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

        _spawned.set(self._processes)  # this task's context: the spawn recorder appends to it
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
            self._processes.clear()
            _record_spawns()
            if not self.capture_stderr:
                return stdio_client(parameters)
            self._close_stderr()
            # kept open for the session's life and closed by close() (or quoted, then closed, when
            # the start fails), so no context manager fits
            self._stderr = tempfile.TemporaryFile()  # noqa: SIM115
            return stdio_client(parameters, errlog=self._stderr)  # type: ignore[arg-type]
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

    def _error(self, problem: str, advice: str | None = None) -> McpServerError:
        if advice is None:
            advice = (
                "check that the command starts an MCP server on stdin/stdout (run it by hand)"
                if self.server.transport == "stdio"
                else "check that the server is running and serves MCP (streamable HTTP) at this URL"
            )
        advice = f"{advice[0].upper()}{advice[1:]}." if advice else ""
        return McpServerError(
            f"MCP server {self.server.describe()}: {problem}. {advice}".rstrip(),
            problem=problem,
            advice=advice,
        )

    def _connect_error(self, exc: Exception) -> McpServerError:
        """What kept the server from starting, from the exception and (stdio) its process."""
        server = self.server
        if server.command is None:
            self._close_stderr()
            return self._error(f"cannot connect: {describe(exc)}")
        program = server.command[0]
        missing = _leaf(exc, OSError)
        if isinstance(missing, OSError) and not self._processes:  # the process never started
            self._close_stderr()
            if server.cwd is not None and missing.filename == server.cwd:
                return self._error(
                    f"the working directory {server.cwd!r} does not exist",
                    "fix the server's cwd",
                )
            if isinstance(missing, PermissionError):
                return self._error(f"command {program!r} is not executable", "fix the server's command")
            if isinstance(missing, FileNotFoundError):
                if os.sep in program or (os.altsep and os.altsep in program):
                    return self._error(f"command {program!r} does not exist", "fix the server's command")
                return self._error(
                    f"command {program!r} not found on PATH",
                    "install it, or give the program's full path as the first word of the server's command",
                )
        process = self._processes[-1] if self._processes else None
        code = getattr(process, "returncode", None)
        stopped = code is not None and -code in (signal.SIGTERM, signal.SIGKILL)  # by the SDK's cleanup
        if code is not None and _connection_lost(exc) and not stopped:  # its stdout ended with it
            return self._start_error(f"{_exit(code)} before finishing the MCP handshake", started=True)
        problem = f"cannot connect: {describe(exc)}" + ("; it was stopped" if stopped else "")
        return self._start_error(problem, started=bool(self._processes))

    def _start_error(self, problem: str, *, started: bool, slow: bool = False) -> McpServerError:
        """A server that did not become a session: ``problem``, with (stdio) the first lines of
        its captured stderr, or a pointer to the console where its stderr went."""
        if self.server.transport != "stdio":
            return self._error(problem)
        where = ""
        if self.capture_stderr:
            problem += self._stderr_excerpt()
        elif started:
            where = "; its stderr is shown above"
        advice = f"check that the command starts an MCP server on stdin/stdout (run it by hand{where})"
        if slow:
            advice += ", or raise connect_timeout_s for a server that starts slowly"
        return self._error(problem, advice)

    def _stderr_excerpt(self) -> str:
        """``; its stderr began: ['...', '...']`` (its first non-empty lines, and its last when
        there are more) from the captured file, which is closed afterwards."""
        stream, self._stderr = self._stderr, None
        if stream is None:
            return ""
        try:
            stream.seek(0)
            text = stream.read(64 * 1024).decode("utf-8", errors="replace")
        except OSError as exc:  # the excerpt is a courtesy; say why it is missing
            return f"; its stderr could not be read ({exc})"
        finally:
            stream.close()
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        if not lines:
            return "; it wrote nothing to stderr"
        shown = [line[:200] for line in lines[:STDERR_LINES]]
        more = ""
        if len(lines) > STDERR_LINES:  # a traceback says what went wrong on its last line
            more = f" and {len(lines) - STDERR_LINES} more lines, the last: {lines[-1][:200]!r}"
        return f"; its stderr began: {shown!r}{more}"

    def _close_stderr(self) -> None:
        stream, self._stderr = self._stderr, None
        if stream is not None:
            stream.close()


_spawned: contextvars.ContextVar[list[Any] | None] = contextvars.ContextVar(
    "agent_r1_mcp_spawned", default=None
)
"""The list an :class:`McpConnection`'s owner task collects its stdio server process into."""


def _record_spawns() -> None:
    """Wrap the MCP SDK's stdio process spawner (once) so that a connection learns its server's
    process, whose exit code says why a server ended before the handshake.

    ``stdio_client`` keeps the process to itself; this is the one place it is created. The wrapper
    only records the process into the calling task's :data:`_spawned` list (nothing when unset).
    An SDK without that function leaves exit codes out of the messages (a test pins it)."""
    from mcp.client import stdio

    original = getattr(stdio, "_create_platform_compatible_process", None)
    if original is None or getattr(original, "agent_r1_records", False):
        return

    async def recording(*args: Any, **kwargs: Any) -> Any:
        process = await original(*args, **kwargs)
        sink = _spawned.get()
        if sink is not None:
            sink.append(process)
        return process

    recording.agent_r1_records = True  # type: ignore[attr-defined]
    stdio._create_platform_compatible_process = recording


def _exit(code: int) -> str:
    """``exited with code 3`` or ``was killed by signal SIGKILL``."""
    if code < 0:
        try:
            return f"was killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def _leaf(exc: BaseException, kind: type[BaseException]) -> BaseException | None:
    """``exc`` or the first exception of ``kind`` inside it (exception groups included)."""
    if isinstance(exc, kind):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = _leaf(inner, kind)
            if found is not None:
                return found
    return None


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
