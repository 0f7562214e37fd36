"""The program that runs inside the sandbox (standard library only; started as ``python -I -S``).

It is not imported by the plugin: :mod:`agent_r1_plugin_code.sandbox` starts it as a script, inside
``unshare`` when namespaces are available. Its process has two roles:

1. **Supervisor** (the process started, and PID 1 of the new PID namespace when there is one). It
   prepares the file system (a fresh size-limited ``tmpfs`` as the working directory and ``/tmp``,
   read-only empty ``tmpfs`` over the other world-writable directories), imports the standard
   modules that model-written code commonly needs (the unprivileged user may not be able to read
   the interpreter's library later), then forks the worker and waits for it. When the worker ends,
   the supervisor exits, and the kernel kills every process left in the namespace.
2. **Worker** (the forked child). It drops to the sandbox user (when started as root), sets the
   resource limits, and answers commands read as JSON lines from stdin, one result line each on the
   result pipe. Output of the code goes to the real stdout and stderr (so that subprocesses are
   captured too); the parent drains both pipes.

Commands: ``{"op": "exec", "code": ...}`` runs a cell in the session's namespace (a final
expression's ``repr`` is the result, as in a REPL); ``{"op": "tests", "solution": ..., "setup": ...,
"tests": [...], "check_setup": [...], "candidate": ...}`` runs a solution and then each test
statement in a fresh namespace, reporting every test's outcome.
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import ctypes
import ctypes.util
import json
import linecache
import os
import resource
import signal
import sys
import time
import traceback

PRELOAD = [
    "abc",
    "argparse",
    "array",
    "ast",
    "base64",
    "binascii",
    "bisect",
    "calendar",
    "cmath",
    "collections",
    "collections.abc",
    "contextlib",
    "copy",
    "csv",
    "dataclasses",
    "datetime",
    "decimal",
    "difflib",
    "enum",
    "errno",
    "fnmatch",
    "fractions",
    "functools",
    "gc",
    "glob",
    "hashlib",
    "heapq",
    "inspect",
    "io",
    "ipaddress",
    "itertools",
    "json",
    "keyword",
    "locale",
    "math",
    "numbers",
    "operator",
    "pathlib",
    "pprint",
    "queue",
    "random",
    "re",
    "select",
    "shlex",
    "shutil",
    "socket",
    "sqlite3",
    "tempfile",
    "statistics",
    "string",
    "struct",
    "subprocess",
    "textwrap",
    "threading",
    "time",
    "timeit",
    "typing",
    "unicodedata",
    "uuid",
    "warnings",
    "zlib",
    "encodings.idna",
    "encodings.ascii",
    "encodings.latin_1",
    "encodings.utf_16",
    "encodings.utf_32",
    "encodings.cp1252",
    "encodings.unicode_escape",
    "encodings.raw_unicode_escape",
]
"""Standard modules imported before the privilege drop (see the module docstring)."""

MS_RDONLY, MS_NOSUID, MS_NODEV = 1, 2, 4
PR_SET_NO_NEW_PRIVS = 38
CELL_PREFIX = "<cell-"
SOLUTION_FILE = "<solution>"
TEST_FILE = "<test>"


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def _mount_tmpfs(libc: ctypes.CDLL, target: str, options: str, flags: int) -> None:
    flags |= MS_NOSUID | MS_NODEV
    if libc.mount(b"tmpfs", target.encode(), b"tmpfs", flags, options.encode()) != 0:
        error = ctypes.get_errno()
        raise OSError(error, f"mount tmpfs on {target}: {os.strerror(error)}")


def prepare_filesystem(config: dict) -> None:
    """Fresh tmpfs for the working directory; read-only empty tmpfs over the other writable places."""
    libc = _libc()
    uid, gid = config.get("uid"), config.get("gid")
    owner = f",uid={uid},gid={gid}" if uid is not None else ""
    workdir = config["workdir"]
    _mount_tmpfs(libc, workdir, f"size={config['disk_bytes']},mode=0700{owner}", 0)
    for path in config.get("hide_dirs", []):
        if os.path.isdir(path) and os.path.realpath(path) != os.path.realpath(workdir):
            _mount_tmpfs(libc, path, "size=4k,mode=0555", MS_RDONLY)


def drop_privileges(config: dict) -> None:
    uid, gid = config.get("uid"), config.get("gid")
    if uid is not None:
        os.setgroups([])
        os.setresgid(gid, gid, gid)
        os.setresuid(uid, uid, uid)
    _libc().prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)


def set_limits(limits: dict) -> None:
    def limit(kind: int, value: int | None) -> None:
        if value is not None:
            resource.setrlimit(kind, (value, value))

    limit(resource.RLIMIT_AS, limits.get("address_space_bytes"))
    limit(resource.RLIMIT_FSIZE, limits.get("file_size_bytes"))
    limit(resource.RLIMIT_NPROC, limits.get("processes"))
    limit(resource.RLIMIT_NOFILE, limits.get("open_files"))
    limit(resource.RLIMIT_CORE, 0)
    session_cpu = limits.get("session_cpu_s")
    if session_cpu is not None:
        resource.setrlimit(resource.RLIMIT_CPU, (session_cpu, session_cpu))


def _cpu_used() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def arm_cpu_limit(cpu_s: float | None) -> None:
    """Soft CPU limit = CPU used so far + this command's share (the hard limit caps the session)."""
    if cpu_s is None:
        return
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)
    soft = int(_cpu_used() + cpu_s + 1)
    if hard != resource.RLIM_INFINITY:
        soft = min(soft, hard)
    resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))


# --------------------------------------------------------------------------------------------
# Running code
# --------------------------------------------------------------------------------------------


def _user_frame(filename: str) -> bool:
    return filename.startswith(CELL_PREFIX) or filename in (SOLUTION_FILE, TEST_FILE)


def format_error(exc: BaseException) -> str:
    """The traceback cut to the frames of the user's code (the runner's own frames are left out)."""
    te = traceback.TracebackException.from_exception(exc, capture_locals=False)
    te.stack = traceback.StackSummary.from_list([f for f in te.stack if _user_frame(f.filename)])
    for chained in (te.__cause__, te.__context__):
        if chained is not None:
            chained.stack = traceback.StackSummary.from_list(
                [f for f in chained.stack if _user_frame(f.filename)]
            )
    return "".join(te.format()).rstrip()


def _register_source(filename: str, source: str) -> None:
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)


def _compile_cell(source: str, filename: str) -> tuple[object | None, object | None]:
    """(statements, final expression) compiled; the final expression is evaluated for its repr."""
    tree = ast.parse(source, filename, "exec")
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
    body = compile(tree, filename, "exec") if tree.body else None
    return body, (compile(last, filename, "eval") if last is not None else None)


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        # the code may have closed or replaced the stream; then there is nothing to flush
        with contextlib.suppress(Exception):
            stream.flush()


class Worker:
    """Answers commands; keeps one namespace for the whole session."""

    def __init__(self, result_fd: int, limits: dict) -> None:
        self.result = os.fdopen(result_fd, "w", encoding="utf-8", buffering=1)
        self.limits = limits
        self.namespace: dict = {"__name__": "__main__", "__builtins__": builtins}
        self.cells = 0
        self.pid = os.getpid()

    def reply(self, payload: dict) -> None:
        self.result.write(json.dumps(payload) + "\n")
        self.result.flush()

    def serve(self) -> None:
        stdin = sys.stdin
        # The code must not read our commands: it gets an empty stdin.
        command_fd = os.dup(0)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        commands = os.fdopen(command_fd, "r", encoding="utf-8")
        sys.stdin = stdin
        for line in commands:
            if not line.strip():
                continue
            command = json.loads(line)
            arm_cpu_limit(command.get("cpu_s", self.limits.get("cpu_s")))
            started = time.perf_counter()
            if command["op"] == "exec":
                payload = self.run_cell(command["code"])
            else:
                payload = self.run_tests(command)
            _flush()
            if os.getpid() != self.pid:  # a child the code forked came back here: it must not reply
                os._exit(0)
            payload["duration_s"] = time.perf_counter() - started
            payload["nonce"] = command.get("nonce")
            self.reply(payload)

    def run_cell(self, source: str) -> dict:
        self.cells += 1
        filename = f"{CELL_PREFIX}{self.cells}>"
        _register_source(filename, source)
        try:
            body, last = _compile_cell(source, filename)
            if body is not None:
                exec(body, self.namespace)
            value = eval(last, self.namespace) if last is not None else None
        except BaseException as exc:  # everything the code raises is its result (SystemExit too)
            return {"status": "error", "error": format_error(exc), "error_type": type(exc).__name__}
        shown = None
        if value is not None:
            try:
                shown = repr(value)
            except BaseException as exc:  # a broken __repr__ is the code's problem, reported as such
                shown = f"<repr failed: {type(exc).__name__}: {exc}>"
        return {"status": "ok", "value": shown}

    def run_tests(self, command: dict) -> dict:
        """Solution, then each test statement; a test passes when its statement raises nothing."""
        namespace: dict = {"__name__": "__solution__", "__builtins__": builtins}
        tests = command.get("tests", [])
        outcome: dict = {"status": "ok", "tests": [], "setup_error": None}
        for filename, source in ((SOLUTION_FILE, command.get("solution", "")), (TEST_FILE, "")):
            _register_source(filename, source)
        try:
            exec(compile(command.get("solution", ""), SOLUTION_FILE, "exec"), namespace)
            scope = dict(namespace)
            if command.get("setup"):
                exec(compile(command["setup"], TEST_FILE, "exec"), scope)
            candidate = command.get("candidate")
            if candidate:
                if candidate not in namespace:
                    raise NameError(f"the solution does not define {candidate!r}")
                scope["candidate"] = namespace[candidate]
            for statement in command.get("check_setup", []):
                exec(compile(statement, TEST_FILE, "exec"), scope)
        except BaseException as exc:  # a solution that does not even load fails every test
            outcome["setup_error"] = format_error(exc)
            outcome["tests"] = [{"passed": False, "error": "not run: the solution failed to load"}] * len(
                tests
            )
            return outcome
        per_test = command.get("per_test_timeout_s")
        for statement in tests:
            outcome["tests"].append(self._one_test(statement, scope, per_test))
        return outcome

    @staticmethod
    def _one_test(statement: str, scope: dict, timeout_s: float | None) -> dict:
        def expired(signum: int, frame: object) -> None:
            raise TimeoutError(f"the test took longer than {timeout_s:g} s")

        previous = signal.signal(signal.SIGALRM, expired)
        if timeout_s:
            signal.setitimer(signal.ITIMER_REAL, timeout_s)
        try:
            _register_source(TEST_FILE, statement)
            exec(compile(statement, TEST_FILE, "exec"), scope)
            return {"passed": True, "error": None}
        except BaseException as exc:  # a failing or crashing test is an outcome, not our error
            return {"passed": False, "error": format_error(exc)}
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)


# --------------------------------------------------------------------------------------------
# Supervisor
# --------------------------------------------------------------------------------------------


def _exit_code(status: int) -> int:
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1


def main() -> None:
    config = json.loads(sys.argv[1])
    result_fd = int(config["result_fd"])
    try:
        if config.get("mount"):
            prepare_filesystem(config)
        for name in PRELOAD + list(config.get("preload", [])):
            # a module this interpreter lacks stays missing for the code too
            with contextlib.suppress(ImportError):
                __import__(name)
    except OSError as exc:
        os.write(result_fd, (json.dumps({"status": "setup_failed", "error": str(exc)}) + "\n").encode())
        sys.exit(70)
    os.write(result_fd, (json.dumps({"status": "ready", "pid": os.getpid()}) + "\n").encode())
    worker = os.fork()
    if worker == 0:
        try:
            drop_privileges(config)
            set_limits(config["limits"])
            os.chdir(config["workdir"])
            os.environ.clear()
            os.environ.update(config["env"])
            Worker(result_fd, config["limits"]).serve()
            _flush()
            os._exit(0)
        except BaseException:  # the worker must never return into the supervisor's code
            traceback.print_exc()
            _flush()
            os._exit(71)
    # Supervisor: hold no pipe end the parent waits on, reap every orphan, end with the worker.
    os.close(result_fd)
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    while True:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            sys.exit(1)
        if pid == worker:
            os._exit(_exit_code(status))


if __name__ == "__main__":
    main()
