"""Who owns a sandbox, and sandboxes started ahead of need.

* :class:`SandboxGroup`: the sandboxes of one owner (an episode's tools). Closing the group kills
  every one of them at once, also in the middle of a call, and refuses new ones: whatever ends
  the episode, nothing it started survives it.
* :class:`SandboxPool`: ``warm_pool`` sandboxes of one config, started and waiting for a job (the
  runner, namespaces, root, limits and preloaded modules in place, blocked on the first command).
  Each is handed out once, for one judgement or one episode's session, then discarded; a
  background thread starts the next. :func:`acquire_sandbox` takes from this process's pool for
  the config (made on first use, stopped at exit), or starts a sandbox when there is none.
"""

from __future__ import annotations

import atexit
import os
import threading
import time
from collections import deque

from agent_r1_plugin_code.sandbox import PythonSession, SandboxConfig, SandboxError, check_isolation


class SandboxGroup:
    """The sandboxes of one owner (an episode's tools). :meth:`close` kills every one of them at
    once, also in the middle of a call, and every sandbox adopted afterwards is killed on arrival:
    whatever ends the episode, nothing it started survives it."""

    def __init__(self) -> None:
        self._sessions: set[PythonSession] = set()
        self._lock = threading.Lock()
        self.closed = False

    def adopt(self, session: PythonSession) -> PythonSession:
        with self._lock:
            if not self.closed:
                self._sessions.add(session)
                return session
        session.close()
        raise SandboxError("the episode that owns this sandbox has ended; the sandbox was stopped")

    def release(self, session: PythonSession) -> None:
        """Close ``session`` and forget it."""
        with self._lock:
            self._sessions.discard(session)
        session.close()

    def close(self) -> None:
        with self._lock:
            self.closed = True
            sessions, self._sessions = list(self._sessions), set()
        for session in sessions:
            session.close()

    def __len__(self) -> int:
        return len(self._sessions)


class SandboxPool:
    """``size`` sandboxes of one config, started ahead and waiting for a job (a started runner,
    namespaces, root and limits in place, blocked on its first command). :meth:`take` hands one out
    and a background thread starts its replacement; each is used once, then discarded. When the
    pool is empty, :meth:`take` starts a sandbox itself."""

    def __init__(self, config: SandboxConfig, size: int) -> None:
        self.config = config
        self.size = size
        self._ready: deque[PythonSession] = deque()
        self._cond = threading.Condition()
        self._closed = False
        self.started = 0
        self.taken_warm = 0
        self.taken_cold = 0
        self.failures = 0
        self.last_error: BaseException | None = None
        self._thread = threading.Thread(target=self._fill, name="agent-r1-sandbox-pool", daemon=True)
        self._thread.start()

    def take(self) -> PythonSession:
        with self._cond:
            while self._ready:
                session = self._ready.popleft()
                self._cond.notify_all()
                if session.alive:
                    self.taken_warm += 1
                    return session
                session.close()
        self.taken_cold += 1
        session = PythonSession(self.config)
        session.start()
        return session

    def _fill(self) -> None:
        streak = 0  # failed starts in a row: the wait before the next try grows with it, to 5 s
        while True:
            with self._cond:
                while not self._closed and len(self._ready) >= self.size:
                    self._cond.wait()
                if self._closed:
                    return
            try:
                session = PythonSession(self.config)
                session.start()
            except Exception as exc:  # counted and kept; take() starts its own and raises it there
                self.failures += 1
                self.last_error = exc
                streak += 1
                time.sleep(min(5.0, 0.5 * streak))
                continue
            streak = 0
            self.started += 1
            with self._cond:
                if self._closed:
                    session.close()
                    return
                self._ready.append(session)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            ready = list(self._ready)
            self._ready.clear()
            self._cond.notify_all()
        for session in ready:
            session.close()


_POOLS: dict[tuple[int, str], SandboxPool] = {}
_POOLS_LOCK = threading.Lock()


def sandbox_pool(config: SandboxConfig) -> SandboxPool | None:
    """This process's pool for ``config`` (``None`` with ``warm_pool: 0``)."""
    if config.warm_pool <= 0:
        return None
    key = (os.getpid(), config.model_dump_json())
    with _POOLS_LOCK:
        pool = _POOLS.get(key)
        if pool is None:
            check_isolation(config)  # a machine that cannot sandbox says so here, not in the thread
            pool = _POOLS[key] = SandboxPool(config, config.warm_pool)
    return pool


def close_pools() -> None:
    """Stop this process's pools and their waiting sandboxes (also done at exit)."""
    with _POOLS_LOCK:
        mine = [key for key in _POOLS if key[0] == os.getpid()]
        pools = [_POOLS.pop(key) for key in mine]
    for pool in pools:
        pool.close()


atexit.register(close_pools)


def acquire_sandbox(config: SandboxConfig, group: SandboxGroup | None = None) -> PythonSession:
    """A started sandbox for one job: from the warm pool when there is one, else started now;
    owned by ``group`` when given (then release it with :meth:`SandboxGroup.release`)."""
    pool = sandbox_pool(config)
    if group is not None and group.closed:
        raise SandboxError("the episode that owns this sandbox has ended")
    session = pool.take() if pool is not None else PythonSession(config)
    if pool is None:
        session.start()
    return group.adopt(session) if group is not None else session


__all__ = ["SandboxGroup", "SandboxPool", "acquire_sandbox", "close_pools", "sandbox_pool"]
