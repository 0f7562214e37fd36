"""The program that runs inside the sandbox (standard library only; started as ``python -I -S``).

It is not imported by the plugin to run code: :mod:`agent_r1_plugin_code.sandbox` starts it as a
script, inside ``unshare`` when namespaces are available. (The trusted side imports it only for
:func:`to_plain` and :func:`from_plain`, the codec of the values that cross.) Its process has two
roles:

1. **Supervisor** (the process started, and PID 1 of the new PID namespace when there is one). It
   prepares the file system: with ``root`` (the default with namespaces) a new, minimal root of its
   own: a small ``tmpfs`` holding read-only bind mounts of the system directories (``/usr``,
   ``/lib*``, ``/bin``, ``/sbin``), the interpreter and what the config adds, a few files of
   ``/etc``, device nodes, a fresh ``/proc`` and a size-limited ``tmpfs`` as ``/tmp`` (the working
   directory); then ``pivot_root`` into it and detach the host's tree, so that nothing else of the
   host (home directories, the project, datasets, other processes) exists for the code. Without
   ``root`` (``filesystem: host``) it only covers ``/tmp`` and the other world-writable directories
   with ``tmpfs``. It imports the standard modules in ``PRELOAD``, forks the worker and waits for
   it. When the worker ends, the supervisor exits, and the kernel kills every process left in the
   namespace.
2. **Worker** (the forked child). It drops every capability, switches to the sandbox user (when
   started as root), sets the resource limits and answers commands read as JSON lines from stdin,
   one result line each on the result pipe. Output of the code goes to the real stdout and stderr
   (so that subprocesses are captured too); the parent drains both pipes.

Commands (each carries an ``id`` that its reply repeats):

* ``{"op": "exec", "code": ...}``: runs a cell in the session's namespace (a final expression's
  ``repr`` is the result, as in a REPL);
* ``{"op": "load", "solution": ..., "aliases": {...}}``: runs a solution in a fresh namespace (the
  start of a judgement); ``{"op": "call", "code": "lambda ...: ...", "args": [...]}`` evaluates one
  expression of a test that calls the solution, the arguments given as plain data, and replies with
  its value as plain data; ``{"op": "setup", "sources": [...]}`` and ``{"op": "test", "source": ...}``
  run test code in the sandbox for the tests that cannot be split (see ``harness.py``);
  ``{"op": "program", "source": ..., "stdin": ...}`` runs a whole program on an input.

A judging reply is ``{"id", "value"}`` (the value as plain data, see :func:`to_plain`) or ``{"id",
"raised", "error"}``. The verdict is never computed here: the trusted side compares the values.
"""

from __future__ import annotations

import ast
import base64
import builtins
import contextlib
import ctypes
import ctypes.util
import io
import json
import linecache
import math
import os
import resource
import signal
import sys
import time
import traceback

PRELOAD = [
    "abc",
    "array",
    "bisect",
    "collections",
    "collections.abc",
    "copy",
    "dataclasses",
    "datetime",
    "decimal",
    "enum",
    "fractions",
    "functools",
    "hashlib",
    "heapq",
    "itertools",
    "math",
    "operator",
    "random",
    "re",
    "statistics",
    "string",
    "typing",
    "encodings.idna",
    "encodings.ascii",
    "encodings.latin_1",
]
"""Standard modules imported before the code runs, so that the commonest imports cost nothing."""
HOST_PRELOAD = [
    "argparse",
    "ast",
    "base64",
    "binascii",
    "calendar",
    "cmath",
    "contextlib",
    "csv",
    "difflib",
    "errno",
    "fnmatch",
    "gc",
    "glob",
    "inspect",
    "ipaddress",
    "json",
    "keyword",
    "locale",
    "numbers",
    "pathlib",
    "pprint",
    "queue",
    "select",
    "shlex",
    "shutil",
    "socket",
    "sqlite3",
    "tempfile",
    "struct",
    "subprocess",
    "textwrap",
    "threading",
    "time",
    "timeit",
    "unicodedata",
    "uuid",
    "warnings",
    "zlib",
    "encodings.utf_16",
    "encodings.utf_32",
    "encodings.cp1252",
    "encodings.unicode_escape",
    "encodings.raw_unicode_escape",
]
"""Imported too when the code sees the host's file system (``filesystem: host``, ``isolation:
process``): there the sandbox user may not be able to read the interpreter's library after the
drop (an interpreter under a private home). In its own root every module stays importable."""

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_NOATIME, MS_NODIRATIME, MS_BIND, MS_REC = 32, 1024, 2048, 4096, 16384
MS_PRIVATE, MS_RELATIME = 1 << 18, 1 << 21
MNT_DETACH = 2
PR_CAPBSET_DROP, PR_SET_SECUREBITS, PR_SET_NO_NEW_PRIVS = 24, 28, 38
SECURE_BITS = 0x23
"""SECBIT_NOROOT and its lock (an ``execve`` as uid 0 grants no capabilities), and KEEP_CAPS locked
off (a uid switch clears them). NO_SETUID_FIXUP stays off: the switch must drop them."""
PIVOT_ROOT_SYSCALL = {"x86_64": 155, "aarch64": 41, "riscv64": 41, "ppc64le": 203, "s390x": 217}
CELL_PREFIX = "<cell-"
SOLUTION_FILE = "<solution>"
TEST_FILE = "<test>"
SYSTEM_DIRS = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32")
STAGING_DIRS = ("/tmp", "/mnt", "/media", "/srv", "/opt", "/var", "/home")
DEVICES = ("null", "zero", "full", "random", "urandom")
SITE_GLOBS = ("/usr/lib/python3*/*-packages", "/usr/local/lib/python3*/*-packages")
"""System site directories hidden unless ``site_packages`` (the interpreter runs with ``-S``)."""


# --------------------------------------------------------------------------------------------
# Plain data: the only values that cross between the sandbox and the trusted side
# --------------------------------------------------------------------------------------------


class NotPlainData(TypeError):
    """A value that is not plain data (see :func:`to_plain`)."""


MAX_DEPTH = 100
MAX_ITEMS = 1_000_000


def to_plain(value: object, *, refs: dict[int, dict] | None = None) -> object:
    """``value`` as JSON data with exact type tags, or :class:`NotPlainData`.

    Plain data is ``None``, ``bool``, ``int``, ``float``, ``str``, ``bytes``, ``complex`` and
    ``list``, ``tuple``, ``dict``, ``set``, ``frozenset`` of plain data, each of exactly that type
    (a subclass, even of ``int``, is not plain: its methods are code). ``None``, booleans, integers,
    finite floats, strings and lists are JSON's own; the rest are one-key objects: ``{"tuple":
    [...]}``, ``{"set": [...]}``, ``{"frozenset": [...]}``, ``{"dict": [[key, value], ...]}``,
    ``{"float": "nan" | "inf" | "-inf"}``, ``{"bytes": base64}``, ``{"complex": [re, im]}``.
    ``refs`` maps ``id(obj)`` of values that are not plain to the reference to send instead (the
    trusted side names objects of the test's setup this way).
    """
    items = [0]

    def encode(item: object, depth: int) -> object:
        kind = type(item)
        items[0] += 1
        if items[0] > MAX_ITEMS:
            raise NotPlainData(f"more than {MAX_ITEMS} items")
        if item is None or kind is bool or kind is str or kind is int:
            return item
        if kind is float:
            return item if math.isfinite(item) else {"float": repr(item)}
        if depth > MAX_DEPTH:
            raise NotPlainData(f"nested deeper than {MAX_DEPTH} levels")
        if kind is list:
            return [encode(x, depth + 1) for x in item]
        if kind is tuple:
            return {"tuple": [encode(x, depth + 1) for x in item]}
        if kind is dict:
            return {"dict": [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in item.items()]}
        if kind is set or kind is frozenset:
            return {kind.__name__: [encode(x, depth + 1) for x in item]}
        if kind is bytes:
            return {"bytes": base64.b64encode(item).decode("ascii")}
        if kind is complex:
            return {"complex": [encode(item.real, depth + 1), encode(item.imag, depth + 1)]}
        if refs is not None and id(item) in refs:
            return refs[id(item)]
        raise NotPlainData(f"a value of type {kind.__module__}.{kind.__qualname__} is not plain data")

    return encode(value, 0)


_FLOATS = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


def from_plain(data: object, *, resolve: object = None) -> object:
    """The value that :func:`to_plain` encoded as ``data`` (strict: anything else raises
    :class:`NotPlainData`). ``resolve(reference)`` turns ``{"ref": ...}`` / ``{"module": ...}``
    objects into values; without it they are refused. Every value made here is of a builtin type,
    whatever ``data`` says, so decoding cannot run code of the solution."""

    def decode(item: object, depth: int) -> object:
        kind = type(item)
        if item is None or kind is bool or kind is str or kind is int or kind is float:
            return item
        if depth > MAX_DEPTH:
            raise NotPlainData(f"nested deeper than {MAX_DEPTH} levels")
        if kind is list:
            return [decode(x, depth + 1) for x in item]
        if kind is not dict or len(item) != 1:
            raise NotPlainData(f"not plain data: {type(item).__name__}")
        [(tag, body)] = item.items()
        try:
            if tag == "tuple" and type(body) is list:
                return tuple(decode(x, depth + 1) for x in body)
            if tag in ("set", "frozenset") and type(body) is list:
                return (set if tag == "set" else frozenset)(decode(x, depth + 1) for x in body)
            if tag == "dict" and type(body) is list:
                pairs = [(decode(p[0], depth + 1), decode(p[1], depth + 1)) for p in body if _pair(p)]
                if len(pairs) != len(body):
                    raise NotPlainData("a dict entry is not a [key, value] pair")
                return dict(pairs)
            if tag == "float" and body in _FLOATS:
                return _FLOATS[body]
            if tag == "bytes" and type(body) is str:
                return base64.b64decode(body.encode("ascii"), validate=True)
            if tag == "complex" and type(body) is list and len(body) == 2:
                real, imag = decode(body[0], depth + 1), decode(body[1], depth + 1)
                if type(real) is float and type(imag) is float:
                    return complex(real, imag)
            if tag in ("ref", "module") and type(body) is str and resolve is not None:
                return resolve(tag, body)  # type: ignore[operator]
        except (TypeError, ValueError) as exc:  # unhashable set members or keys, bad base64
            raise NotPlainData(f"not plain data: {exc}") from None
        raise NotPlainData(f"not plain data: an object tagged {tag!r}")

    return decode(data, 0)


def _pair(item: object) -> bool:
    return type(item) is list and len(item) == 2


def _reject_constant(name: str) -> float:
    raise NotPlainData(f"{name} is not JSON")


def loads_plain(text: str | bytes) -> object:
    """``json.loads`` that refuses ``NaN``/``Infinity`` literals (non-finite floats are tagged)."""
    return json.loads(text, parse_constant=_reject_constant)


# --------------------------------------------------------------------------------------------
# The file system
# --------------------------------------------------------------------------------------------


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def _mount(
    libc: ctypes.CDLL, source: str | None, target: str, fstype: str | None, flags: int, data: str = ""
) -> None:
    encode = lambda text: text.encode() if text else None  # noqa: E731 - four arguments alike
    if libc.mount(encode(source), target.encode(), encode(fstype), flags, encode(data)) != 0:
        error = ctypes.get_errno()
        raise OSError(error, f"mount {source or ''} on {target}: {os.strerror(error)}")


def _mount_tmpfs(libc: ctypes.CDLL, target: str, options: str, flags: int) -> None:
    _mount(libc, "tmpfs", target, "tmpfs", flags | MS_NOSUID | MS_NODEV, options)


def prepare_filesystem(config: dict) -> None:
    """``filesystem: host``: a fresh tmpfs as the working directory; read-only empty tmpfs over the
    other writable places. The host's files stay visible with their ordinary permissions."""
    libc = _libc()
    uid, gid = config.get("uid"), config.get("gid")
    owner = f",uid={uid},gid={gid}" if uid is not None else ""
    workdir = config["workdir"]
    _mount_tmpfs(libc, workdir, f"size={config['disk_bytes']},mode=0700{owner}", 0)
    for path in config.get("hide_dirs", []):
        if os.path.isdir(path) and os.path.realpath(path) != os.path.realpath(workdir):
            _mount_tmpfs(libc, path, "size=4k,mode=0555", MS_RDONLY)


def _kept_flags(path: str) -> int:
    """The flags of the mount holding ``path`` that a read-only remount must keep (in a user
    namespace the kernel refuses to clear them)."""
    found = os.statvfs(path).f_flag
    pairs = (
        (os.ST_NOSUID, MS_NOSUID),
        (os.ST_NODEV, MS_NODEV),
        (os.ST_NOEXEC, MS_NOEXEC),
        (os.ST_NOATIME, MS_NOATIME),
        (os.ST_NODIRATIME, MS_NODIRATIME),
        (os.ST_RELATIME, MS_RELATIME),
    )
    return sum(flag for bit, flag in pairs if found & bit)


def _bind_read_only(libc: ctypes.CDLL, source: str, target: str, *, devices: bool = False) -> None:
    if os.path.isdir(source):
        os.makedirs(target, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with open(target, "a"):
            pass  # a file to mount over
    try:
        _mount(libc, source, target, None, MS_BIND)
    except OSError:  # a tree with locked sub-mounts (user namespace) binds only recursively
        _mount(libc, source, target, None, MS_BIND | MS_REC)
    flags = MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | (0 if devices else MS_NODEV)
    _mount(libc, None, target, None, flags | _kept_flags(source))


def _covered(path: str, mounted: list[str]) -> bool:
    return any(path == top or path.startswith(top.rstrip("/") + "/") for top in mounted)


def _covered_any(directory: str, paths: list[str]) -> bool:
    return any(_covered(path, [directory]) for path in paths)


def _interpreter_paths(site_packages: bool) -> list[str]:
    """What the interpreter needs: its prefixes (standard library, shared libraries) and binary;
    with ``site_packages`` also its site directories and the environment it was started from."""
    paths = [sys.base_prefix, sys.base_exec_prefix, os.path.dirname(os.path.realpath(sys.executable))]
    if site_packages:
        paths += [sys.prefix, sys.exec_prefix, *(p for p in sys.path if p)]
    return paths


def _site_directories() -> list[str]:
    import glob
    import site

    found = [*site.getsitepackages(), site.getusersitepackages()]
    for pattern in SITE_GLOBS:
        found += glob.glob(pattern)
    return found


def _pivot_root(libc: ctypes.CDLL, new_root: str, put_old: str) -> None:
    if hasattr(libc, "pivot_root"):
        done = libc.pivot_root(new_root.encode(), put_old.encode())
    else:
        number = PIVOT_ROOT_SYSCALL.get(os.uname().machine)
        if number is None:
            raise OSError(0, f"pivot_root: no system call number known for {os.uname().machine}")
        done = libc.syscall(number, new_root.encode(), put_old.encode())
    if done != 0:
        error = ctypes.get_errno()
        raise OSError(error, f"pivot_root: {os.strerror(error)}")


def _write(path: str, text: str) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(text)


def build_root(config: dict) -> None:
    """Make a minimal root and ``pivot_root`` into it (see the module docstring). Every path keeps
    its host name, so the interpreter and its library are found where they were."""
    libc = _libc()
    spec = config["root"]
    uid, gid = config.get("uid"), config.get("gid")
    _mount(libc, None, "/", None, MS_REC | MS_PRIVATE)
    wanted = _interpreter_paths(bool(spec.get("site_packages"))) + list(spec.get("read_only_paths", []))
    wanted = sorted({os.path.realpath(p) for p in wanted}, key=len)
    # the new root is assembled on a tmpfs of this namespace only (nothing is written to the host),
    # mounted on a directory that holds none of the paths to bind
    staging = next((d for d in STAGING_DIRS if os.path.isdir(d) and not _covered_any(d, wanted)), None)
    if staging is None:
        raise OSError(
            0, f"no directory to build the sandbox's root on: each of {STAGING_DIRS} holds the interpreter"
        )
    _mount_tmpfs(libc, staging, "size=1m,mode=0755", 0)
    new = f"{staging}/root"
    os.mkdir(new, 0o755)
    _mount_tmpfs(libc, new, "size=2m,mode=0755", 0)
    mounted: list[str] = []
    for top in SYSTEM_DIRS:
        host = f"/{top}"
        if os.path.islink(host):
            os.symlink(os.readlink(host), new + host)
        elif os.path.isdir(host):
            _bind_read_only(libc, host, new + host)
            mounted.append(host)
    for path in wanted:
        if os.path.exists(path) and not _covered(path, mounted) and path != "/":
            _bind_read_only(libc, path, new + path)
            mounted.append(path)
    hidden = list(spec.get("hidden_paths", []))
    if not spec.get("site_packages"):
        hidden += _site_directories()
    for path in sorted({os.path.realpath(p) for p in hidden}):
        target = new + path
        if os.path.isdir(target) and _covered(path, mounted):
            _mount_tmpfs(libc, target, "size=4k,mode=0555", MS_RDONLY)
        elif os.path.isfile(target) and _covered(path, mounted):
            _mount(libc, "/dev/null", target, None, MS_BIND)
    os.mkdir(f"{new}/etc", 0o755)
    user = f"{uid if uid is not None else 0}:{gid if gid is not None else 0}"
    _write(
        f"{new}/etc/passwd", f"root:x:0:0::/:/usr/sbin/nologin\nsandbox:x:{user}::/tmp:/usr/sbin/nologin\n"
    )
    _write(f"{new}/etc/group", f"root:x:0:\nsandbox:x:{gid if gid is not None else 0}:\n")
    _write(f"{new}/etc/hosts", "127.0.0.1 localhost\n::1 localhost\n")
    for name in ("ld.so.cache", "localtime"):
        if os.path.isfile(f"/etc/{name}"):
            _bind_read_only(libc, f"/etc/{name}", f"{new}/etc/{name}")
    os.mkdir(f"{new}/dev", 0o755)
    for device in DEVICES:
        if os.path.exists(f"/dev/{device}"):
            _bind_read_only(libc, f"/dev/{device}", f"{new}/dev/{device}", devices=True)
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0")):
        os.symlink(target, f"{new}/dev/{name}")
    os.symlink("/proc/self/fd/1", f"{new}/dev/stdout")
    os.symlink("/proc/self/fd/2", f"{new}/dev/stderr")
    os.mkdir(f"{new}/proc", 0o555)
    _mount(libc, "proc", f"{new}/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    os.mkdir(f"{new}/tmp", 0o755)
    owner = f",uid={uid},gid={gid}" if uid is not None else ""
    _mount_tmpfs(libc, f"{new}/tmp", f"size={config['disk_bytes']},mode=0700{owner}", 0)
    os.mkdir(f"{new}/.old")
    _pivot_root(libc, new, f"{new}/.old")
    os.chdir("/")
    if libc.umount2(b"/.old", MNT_DETACH) != 0:
        error = ctypes.get_errno()
        raise OSError(error, f"detaching the host's root: {os.strerror(error)}")
    os.rmdir("/.old")
    _mount(libc, None, "/", None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)


# --------------------------------------------------------------------------------------------
# Privileges and limits
# --------------------------------------------------------------------------------------------


def _last_capability() -> int:
    try:
        with open("/proc/sys/kernel/cap_last_cap", encoding="ascii") as handle:
            return int(handle.read())
    except (OSError, ValueError):
        return 40  # the kernel's list as of Linux 5.9; an unknown higher one stays in the set


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    ]


def drop_privileges(config: dict) -> None:
    """No capabilities, now or after an ``execve`` (bounding set emptied, root's exec-time
    capabilities switched off), the sandbox user's id when started as root, ``no_new_privs``. In a
    user namespace the code stays uid 0 there, but without capabilities it cannot mount, unmount
    or ptrace the supervisor."""
    libc = _libc()
    for capability in range(int(config.get("last_cap", 40)) + 1):
        libc.prctl(PR_CAPBSET_DROP, capability, 0, 0, 0)  # fails without CAP_SETPCAP: nothing to drop
    libc.prctl(PR_SET_SECUREBITS, SECURE_BITS, 0, 0, 0)  # likewise
    uid, gid = config.get("uid"), config.get("gid")
    if uid is not None:
        os.setgroups([])
        os.setresgid(gid, gid, gid)
        os.setresuid(uid, uid, uid)
    else:
        header = _CapHeader(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3
        empty = (_CapData * 2)()
        libc.capset(ctypes.byref(header), empty)  # an unprivileged process has none to clear
    libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)


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


def _builtin_type_name(exc: BaseException) -> str:
    """The first builtin exception class ``exc`` is an instance of (what ``except`` could match)."""
    for cls in type(exc).__mro__:
        if getattr(builtins, cls.__name__, None) is cls:
            return cls.__name__
    return "BaseException"


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


def _expired(seconds: float) -> object:
    def handler(signum: int, frame: object) -> None:
        raise TimeoutError(f"the test took longer than {seconds:g} s")

    return handler


class Worker:
    """Answers commands; keeps one namespace for the whole session."""

    def __init__(self, result_fd: int, limits: dict) -> None:
        self.result = os.fdopen(result_fd, "w", encoding="utf-8", buffering=1)
        self.limits = limits
        self.namespace: dict = {"__name__": "__main__", "__builtins__": builtins}
        self.scope: dict = {}
        self.compiled: dict[str, object] = {}
        self.cells = 0
        self.pid = os.getpid()

    def reply(self, payload: dict) -> None:
        self.result.write(json.dumps(payload) + "\n")
        self.result.flush()

    def serve(self) -> None:
        stdin = sys.stdin
        # The code must not read our commands by accident: it gets an empty stdin.
        command_fd = os.dup(0)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        commands = os.fdopen(command_fd, "r", encoding="utf-8")
        sys.stdin = stdin
        handlers = {
            "exec": lambda c: self.run_cell(c["code"]),
            "load": self.load,
            "call": self.call,
            "setup": self.setup,
            "test": self.test,
            "program": self.program,
        }
        for line in commands:
            if not line.strip():
                continue
            command = json.loads(line)
            arm_cpu_limit(command.get("cpu_s", self.limits.get("cpu_s")))
            started = time.perf_counter()
            payload = handlers[command["op"]](command)
            _flush()
            if os.getpid() != self.pid:  # a child the code forked came back here: it must not reply
                os._exit(0)
            if command["op"] == "exec":
                payload["duration_s"] = time.perf_counter() - started
            payload["id"] = command["id"]
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

    # -- judging: every answer is a value (plain data) or what was raised ------------------------
    def _judged(self, work: object, timeout_s: float | None, *, plain: bool = True) -> dict:
        """Run ``work()`` under the test's timer; its value as plain data, or what it raised."""
        previous = signal.signal(signal.SIGALRM, _expired(timeout_s or 0))
        if timeout_s:
            signal.setitimer(signal.ITIMER_REAL, timeout_s)
        try:
            value = work()  # type: ignore[operator]
            data = to_plain(value) if plain else None
            text = json.dumps(data)
            if len(text) > self.limits.get("value_bytes", 1_000_000):
                raise NotPlainData(f"the value takes more than {self.limits.get('value_bytes')} bytes")
            return {"value": data}
        except BaseException as exc:  # what the solution raised is the answer to this request
            try:
                return {"raised": _builtin_type_name(exc), "error": format_error(exc)[-4000:]}
            except BaseException:  # formatting can fail too (a hostile __str__, the timer)
                return {"raised": "BaseException", "error": "the error could not be described"}
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)

    def load(self, command: dict) -> dict:
        """A fresh namespace with the solution in it, and the test scope over it."""
        source = command["solution"]
        solution: dict = {"__name__": "__solution__", "__builtins__": builtins}
        self.scope, self.compiled = {}, {}
        _register_source(SOLUTION_FILE, source)

        def run() -> None:
            exec(compile(source, SOLUTION_FILE, "exec"), solution)
            self.scope = dict(solution)
            for alias, name in (command.get("aliases") or {}).items():
                if name not in solution:
                    raise NameError(f"the solution does not define {name!r}")
                self.scope[alias] = solution[name]

        return self._judged(run, command.get("timeout_s"), plain=False)

    def _resolve(self, tag: str, name: str) -> object:
        if tag == "module":
            return __import__(name, fromlist=["_"])
        if name not in self.scope:
            raise NameError(f"{name!r} is not defined by the test's setup")
        return self.scope[name]

    def call(self, command: dict) -> dict:
        """One expression of a test (a ``lambda`` over its arguments), evaluated on plain data."""
        code = command["code"]

        def run() -> object:
            function = self.compiled.get(code)
            if function is None:
                _register_source(TEST_FILE, code)
                function = eval(compile(code, TEST_FILE, "eval"), self.scope)
                self.compiled[code] = function
            args = from_plain(command.get("args") or [], resolve=self._resolve)
            return function(*args)  # type: ignore[operator]

        return self._judged(run, command.get("timeout_s"))

    def setup(self, command: dict) -> dict:
        def run() -> None:
            for source in command.get("sources") or []:
                _register_source(TEST_FILE, source)
                exec(compile(source, TEST_FILE, "exec"), self.scope)

        return self._judged(run, command.get("timeout_s"), plain=False)

    def test(self, command: dict) -> dict:
        def run() -> bool:
            _register_source(TEST_FILE, command["source"])
            exec(compile(command["source"], TEST_FILE, "exec"), self.scope)
            return True

        return self._judged(run, command.get("timeout_s"))

    def program(self, command: dict) -> dict:
        """The solution as a program: ``command["stdin"]`` on its standard input, ``__main__``."""
        data = command.get("stdin", "").encode("utf-8")
        if hasattr(os, "memfd_create"):
            fd = os.memfd_create("stdin")
        else:  # pragma: no cover - other systems run with isolation: process only
            fd = os.open(".stdin", os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.lseek(fd, 0, os.SEEK_SET)
        os.dup2(fd, 0)
        os.close(fd)
        sys.stdin = io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "r", closefd=False)), encoding="utf-8")
        source = command["source"]
        _register_source(SOLUTION_FILE, source)

        def run() -> None:
            namespace = {"__name__": "__main__", "__builtins__": builtins}
            try:
                exec(compile(source, SOLUTION_FILE, "exec"), namespace)
            except SystemExit as exc:
                if exc.code not in (None, 0):
                    raise

        return self._judged(run, command.get("timeout_s"), plain=False)


# --------------------------------------------------------------------------------------------
# Supervisor
# --------------------------------------------------------------------------------------------


def _exit_code(status: int) -> int:
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1


def main() -> None:
    config = json.loads(sys.argv[1])
    if config.get("probe"):  # can this machine build the sandbox's root? (asked once per process)
        try:
            build_root(config)
            sys.stdout.write(
                "root: ok\n" if os.listdir("/") and os.path.isdir(os.path.dirname(os.__file__)) else ""
            )
        except OSError as exc:
            sys.stdout.write(f"root: {exc}\n")
        sys.stdout.flush()
        os._exit(0)
    result_fd = int(config["result_fd"])
    try:
        if config.get("root") is not None:
            build_root(config)
        elif config.get("mount"):
            prepare_filesystem(config)
        config["last_cap"] = _last_capability()
        extra = [] if config.get("root") is not None else HOST_PRELOAD
        for name in PRELOAD + extra + list(config.get("preload", [])):
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
