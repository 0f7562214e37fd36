"""Running tool calls so that a call past its timeout never holds up the rollout.

Python cannot stop a thread, and ``asyncio.to_thread`` runs calls in the event loop's default
executor, which ``asyncio.run`` joins when it finishes (and ``concurrent.futures`` joins again at
interpreter exit). So a synchronous tool that hangs used to stall the rollout, and Ctrl-C, until
it returned. This module offers two ways to run a synchronous call under a timeout instead:

* :func:`run_in_thread` (the default, ``Tool.isolation = "thread"``): a process-wide pool of daemon
  worker threads that nothing ever joins. At the timeout the call is *abandoned*: the caller gets
  :class:`CallTimedOut` at once, the worker finishes the call in the background (its result is
  dropped) and then serves other calls. Abandoned workers do not count against the pool's bound,
  so hung calls cannot starve the others; :data:`MAX_ABANDONED_CALLS` of them still running at
  once means a tool hangs for good, and further calls fail with :class:`TooManyHungCalls`.
* :func:`run_in_process` (``Tool.isolation = "process"``): every call runs in a fresh child
  Python process in its own session (process group). At the timeout, or when the waiting task is
  cancelled (Ctrl-C), the whole group is killed with ``SIGKILL``: the child and every process
  it started (unless one left the group on purpose). The tool instance and the arguments travel
  to the child with :mod:`pickle`, and the result or the exception comes back the same way.

Both raise :class:`CallTimedOut` at the timeout; the time spent waiting for a free worker thread
or process slot counts towards it.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextvars
import os
import pickle
import queue
import signal
import subprocess
import sys
import threading
import traceback
import weakref
from collections import Counter
from collections.abc import Callable
from typing import Any

MAX_WORKER_THREADS = 256
"""Worker threads that run synchronous tool calls at once (per process); more calls wait. Threads
are started on demand, so the bound only matters for large batches: it is four times the 64
trajectories of a common rollout batch, because a smaller bound makes a batch's calls of a slow
synchronous tool wait in waves (128 trajectories of a 200 ms tool took two latencies per turn with
64 workers)."""

MAX_ABANDONED_CALLS = 64
"""Calls past their timeout that may still be running in threads before new calls are refused."""

MAX_CHILD_PROCESSES = max(4, 2 * (os.cpu_count() or 1))
"""Child processes that run ``isolation = "process"`` calls at once (per event loop); more wait."""


class CallTimedOut(Exception):
    """A call ran past its timeout and was abandoned (thread) or killed (process).

    ``started`` is false when the call was still waiting for a free worker and never began.
    """

    def __init__(self, timeout: float, *, started: bool) -> None:
        self.timeout = timeout
        self.started = started
        super().__init__(f"the call took longer than {timeout:g} s")


class TooManyHungCalls(RuntimeError):
    """Too many abandoned calls are still running in worker threads (a tool hangs for good)."""


class CallAborted(RuntimeError):
    """A call ended without a result or an ordinary exception: ``run`` raised ``SystemExit`` or
    ``KeyboardInterrupt``, an ``isolation = "process"`` child died (a crash, a signal), or what it
    raised could not be sent back. The message says which, for the agent to read."""


class ChildProcessSetupFailed(RuntimeError):
    """An ``isolation = "process"`` tool could not be sent to its child process or loaded there
    (it does not pickle, or its class cannot be imported there)."""


# --------------------------------------------------------------------------------------------
# Threads
# --------------------------------------------------------------------------------------------


class _Job:
    __slots__ = ("abandoned", "args", "context", "done", "fn", "future", "label")

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...], label: str) -> None:
        self.fn = fn
        self.args = args
        self.label = label
        # Tools see the caller's context variables, as with asyncio.to_thread.
        self.context = contextvars.copy_context()
        self.future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self.abandoned = False
        self.done = False


class DaemonThreadPool:
    """A bounded pool of daemon worker threads that is never joined (see the module docstring).

    At most ``max_workers`` workers run calls that someone still waits for; a worker whose call
    was abandoned finishes it in the background and rejoins the pool afterwards. Workers are
    created on demand and live as long as the process.
    """

    def __init__(
        self, max_workers: int = MAX_WORKER_THREADS, max_abandoned: int = MAX_ABANDONED_CALLS
    ) -> None:
        self.max_workers = max_workers
        self.max_abandoned = max_abandoned
        self._lock = threading.Lock()
        self._jobs: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        self._workers = 0
        self._waiting = 0  # workers blocked on the queue, or just started (they take a job next)
        self._queued = 0  # jobs in the queue
        self._abandoned: list[_Job] = []

    @property
    def abandoned(self) -> int:
        """Abandoned calls still running."""
        with self._lock:
            return len(self._abandoned)

    def submit(self, fn: Callable[..., Any], *args: Any, label: str = "") -> _Job:
        """Queue ``fn(*args)``; raises :class:`TooManyHungCalls` when the pool is full of hung calls.
        ``label`` (a tool name) identifies the call in that message."""
        job = _Job(fn, args, label or getattr(fn, "__qualname__", repr(fn)))
        with self._lock:
            if len(self._abandoned) >= self.max_abandoned:
                counts = Counter(hung.label for hung in self._abandoned)
                which = ", ".join(f"{label!r} ({count})" for label, count in counts.most_common())
                raise TooManyHungCalls(
                    f"{len(self._abandoned)} calls are still running in threads after their timeout "
                    f"(a thread cannot be stopped): {which}"
                )
            self._jobs.put(job)
            self._queued += 1
            if self._queued > self._waiting and self._workers - len(self._abandoned) < self.max_workers:
                self._workers += 1
                self._waiting += 1
                threading.Thread(
                    target=self._work, name=f"agent-r1-tool-{self._workers}", daemon=True
                ).start()
            # otherwise a waiting worker takes it, or it waits for a busy one (the wait counts
            # towards its timeout)
        return job

    def abandon(self, job: _Job) -> bool:
        """Give up on ``job``: drop it if it has not started, else let it finish unobserved.
        Returns whether it had started."""
        if job.future.cancel():
            return False
        with self._lock:
            if not job.done and not job.abandoned:
                job.abandoned = True
                self._abandoned.append(job)
        return True

    def _work(self) -> None:
        while True:
            job = self._jobs.get()
            with self._lock:
                self._waiting -= 1
                self._queued -= 1
            if job.future.set_running_or_notify_cancel():
                try:
                    result = job.context.run(job.fn, *job.args)
                except Exception as exc:  # handed to the caller, who decides what it means
                    job.future.set_exception(exc)
                except BaseException as exc:  # SystemExit in a tool must not end the worker
                    job.future.set_exception(CallAborted(_describe(exc)))
                else:
                    job.future.set_result(result)
            with self._lock:
                job.done = True
                if job.abandoned:
                    self._abandoned.remove(job)
                self._waiting += 1


_pool: DaemonThreadPool | None = None
_pool_lock = threading.Lock()


def thread_pool() -> DaemonThreadPool:
    """The process-wide pool for synchronous tool calls (created on first use)."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = DaemonThreadPool()
        return _pool


def _forget_pool_in_child() -> None:
    global _pool
    _pool = None  # a forked child has none of the parent's worker threads


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool_in_child)


async def run_in_thread(fn: Callable[..., Any], *args: Any, timeout: float, label: str = "") -> Any:
    """``fn(*args)`` in a daemon worker thread; :class:`CallTimedOut` after ``timeout`` seconds.

    The caller's context variables are visible to ``fn``. When the awaiting task is cancelled the
    call is abandoned the same way. ``label`` names the call in :class:`TooManyHungCalls`.
    """
    pool = thread_pool()
    job = pool.submit(fn, *args, label=label)
    waiter = asyncio.wrap_future(job.future)
    try:
        done, _ = await asyncio.wait({waiter}, timeout=timeout)
    except BaseException:
        pool.abandon(job)
        waiter.cancel()
        raise
    if not done:
        started = pool.abandon(job)
        waiter.cancel()
        raise CallTimedOut(timeout, started=started)
    return waiter.result()


# --------------------------------------------------------------------------------------------
# Processes
# --------------------------------------------------------------------------------------------

_children: set[int] = set()
"""Process-group ids of the children running now (killed at exit, whatever happened)."""

_slots: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = weakref.WeakKeyDictionary()


def _kill_group(pid: int) -> None:
    try:
        if hasattr(os, "killpg"):
            os.killpg(pid, signal.SIGKILL)  # the child leads its own session: pgid == pid
        else:  # pragma: no cover - no process groups on this platform
            os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass  # already gone: nothing to kill
    _children.discard(pid)


@atexit.register
def _kill_children_at_exit() -> None:
    for pid in list(_children):
        _kill_group(pid)


def _process_slots() -> asyncio.Semaphore:
    loop = asyncio.get_running_loop()
    semaphore = _slots.get(loop)
    if semaphore is None:
        semaphore = _slots[loop] = asyncio.Semaphore(MAX_CHILD_PROCESSES)
    return semaphore


def _child_environment() -> dict[str, str]:
    """The parent's environment, with its import path, so the child can unpickle the tool."""
    env = dict(os.environ)
    paths = [os.path.abspath(p) for p in sys.path if p] + [os.getcwd()]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    return env


async def run_in_process(tool: Any, arguments: Any, *, timeout: float) -> Any:
    """``tool.run(arguments)`` in a fresh child process; :class:`CallTimedOut` after ``timeout``.

    The child leads its own session; at the timeout or on cancellation its whole process group is
    killed. What ``run`` returns or raises comes back through :mod:`pickle` (an exception that
    cannot be pickled comes back as :class:`CallAborted` with its type name and message, or as
    the agent-r1 error class it derives from). A child that dies without answering raises
    :class:`CallAborted`; a tool that cannot be sent to the child or loaded there,
    :class:`ChildProcessSetupFailed`.
    """
    try:
        payload = pickle.dumps((tool, arguments))
    except Exception as exc:
        raise ChildProcessSetupFailed(
            f"cannot send the tool to a child process: {type(exc).__name__}: {exc}"
        ) from exc
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    slots = _process_slots()
    try:
        await asyncio.wait_for(slots.acquire(), timeout)
    except asyncio.TimeoutError:
        raise CallTimedOut(timeout, started=False) from None
    try:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            __name__,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=None,  # the tool's own output (stdout is moved there) reaches the console
            start_new_session=True,
            env=_child_environment(),
        )
        _children.add(process.pid)
        exchange = asyncio.ensure_future(process.communicate(payload))
        try:
            done, _ = await asyncio.wait({exchange}, timeout=max(0.0, deadline - loop.time()))
            if not done:
                raise CallTimedOut(timeout, started=True)
            output, _ = exchange.result()
        finally:
            if process.returncode is None:
                _kill_group(process.pid)
                exchange.cancel()
                await process.wait()
            _children.discard(process.pid)
    finally:
        slots.release()
    return _answer(output, process.returncode)


def _answer(output: bytes, returncode: int | None) -> Any:
    try:
        kind, *rest = pickle.loads(output) if output else ("died",)
    except Exception as exc:  # a garbled answer is a dead child as far as the caller can tell
        kind, rest = "died", [f"unreadable answer ({type(exc).__name__}: {exc})"]
    if kind == "ok":
        return rest[0]
    if kind == "raised":
        raise rest[0]
    if kind == "raised_text":
        from agent_r1 import errors

        category, type_name, message = rest
        if category is not None:  # keeps what the environment does with it
            raise getattr(errors, category)(message or type_name)
        raise CallAborted(f"{type_name}: {message}" if message else type_name)
    if kind == "setup":
        raise ChildProcessSetupFailed(rest[0])
    how = (
        f"was killed by signal {signal.Signals(-returncode).name}"
        if returncode and returncode < 0
        else (f"exited with code {returncode}")
    )
    detail = f" ({rest[0]})" if rest else ""
    raise CallAborted(f"the tool's process {how} without an answer{detail}")


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def _die_with_parent() -> None:
    """Ask Linux to kill this child when the thread that started it dies (best effort)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass  # no prctl: the parent still kills the group at its timeout, cancellation or exit


def _child_main() -> None:
    """The child: read ``(tool, arguments)``, run, write ``(kind, ...)`` to the real stdout."""
    parent = os.getppid()
    _die_with_parent()
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)
    answer_fd = os.dup(1)
    os.dup2(2, 1)  # what the tool prints must not corrupt the answer
    sys.stdout = sys.stderr
    answer: tuple[Any, ...]
    raised: Exception | None = None
    try:
        tool, arguments = pickle.loads(sys.stdin.buffer.read())
    except Exception as exc:
        answer = ("setup", f"cannot load the tool in a child process: {type(exc).__name__}: {exc}")
    else:
        try:
            output = tool.run(arguments)
            if asyncio.iscoroutine(output):
                output = asyncio.run(output)
            answer = ("ok", output)
        except Exception as exc:
            raised = exc
            answer = ("raised", exc)
        except BaseException as exc:  # SystemExit, KeyboardInterrupt: must not stop the parent
            answer = ("raised_text", None, type(exc).__name__, str(exc))
    try:
        data = pickle.dumps(answer)
        pickle.loads(data)  # an exception class whose __init__ cannot be replayed fails here
    except Exception as problem:
        if raised is not None:
            traceback.print_exception(raised)  # the full story goes to the console
            data = pickle.dumps(_as_text(raised))
        else:
            what = f"an unpicklable {type(answer[1]).__name__} ({type(problem).__name__}: {problem})"
            data = pickle.dumps(("raised_text", None, "TypeError", f"the tool returned {what}"))
    with os.fdopen(answer_fd, "wb") as channel:
        channel.write(data)


def _as_text(exc: BaseException) -> tuple[Any, ...]:
    """An exception as ``("raised_text", category, type name, message)``; the category is the
    agent-r1 error class that decides how the environment treats it (or None)."""
    from agent_r1.errors import EnvironmentFatalError, ToolError, ToolInfrastructureError

    categories = (EnvironmentFatalError, ToolInfrastructureError, ToolError)
    category = next((c.__name__ for c in categories if isinstance(exc, c)), None)
    return ("raised_text", category, type(exc).__name__, str(exc))


if __name__ == "__main__":
    _child_main()
