"""The sandbox under attack: each test runs hostile code for real and checks that it is contained,
that the result says clearly what happened, and that the parent (this pytest process) and later
sandboxes are unaffected.

Every attack runs with short limits (a few seconds), and the fork bomb runs only after a bounded
probe has shown that the process limit holds for the sandbox user (``RLIMIT_NPROC`` is ignored for
root, so the bomb must never run as root). The tests need the namespace sandbox (``unshare``);
without it they are skipped, and ``test_code_sandbox.py`` covers the refusal.
"""

from __future__ import annotations

import os
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent_r1_plugin_code.sandbox import PythonSession, namespace_prefix, run_python, run_tests

pytestmark = [
    pytest.mark.skipif(namespace_prefix() is None, reason="needs Linux namespaces (unshare)"),
    pytest.mark.timeout(60),
]

FAST = {"timeout_s": 4.0, "cpu_s": 2.0}


def processes_of(uid: int) -> list[int]:
    """PIDs (host view) of the processes whose real uid is ``uid``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            status = (entry / "status").read_text()
        except OSError:
            continue  # the process ended while we looked
        for line in status.splitlines():
            if line.startswith("Uid:") and int(line.split()[1]) == uid:
                found.append(int(entry.name))
    return found


def gone(uid: int, within_s: float = 5.0) -> bool:
    """True once no process of ``uid`` is left (SIGKILLed processes vanish a moment later)."""
    deadline = time.monotonic() + within_s
    while processes_of(uid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return processes_of(uid) == []


def assert_parent_unaffected() -> None:
    """This process still runs sandboxes normally."""
    result = run_python("sum(range(10))", FAST)
    assert result.ok and result.value == "45", result


@pytest.mark.skipif(os.geteuid() != 0, reason="the uid switch is what bounds processes for root")
def test_fork_bomb_is_contained() -> None:
    # 1. A bounded probe first: 40 sleeping children wanted, the limit is 8 processes in all.
    probe = (
        "import os, time\n"
        "made = 0\n"
        "for _ in range(40):\n"
        "    try:\n"
        "        pid = os.fork()\n"
        "    except OSError as exc:\n"
        "        print('refused:', type(exc).__name__)\n"
        "        break\n"
        "    if pid == 0:\n"
        "        time.sleep(30)\n"
        "        os._exit(0)\n"
        "    made += 1\n"
        "print('children:', made, 'uid:', os.getuid())\n"
    )
    with PythonSession({**FAST, "max_processes": 8}) as session:
        result = session.run(probe)
        assert result.ok, result
        assert "refused: BlockingIOError" in result.stdout
        made = int(result.stdout.split("children:")[1].split()[0])
        assert made < 8 and "uid: 0" not in result.stdout
        uid = session.uid
        assert uid is not None and len(processes_of(uid)) >= made  # the sleepers exist...
    assert gone(uid)  # ...and died with the sandbox

    # 2. The real bomb, only now that the limit is known to hold.
    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    session = PythonSession({"timeout_s": 3.0, "cpu_s": 2.0, "max_processes": 16})
    started = time.monotonic()
    with session:
        result = session.run(bomb)
        peak = len(processes_of(session.uid))
    assert result.status in ("timeout", "cpu_limit"), result
    assert "killed" in (result.error or "")
    assert time.monotonic() - started < 15
    assert peak <= 16
    assert gone(session.uid)
    assert_parent_unaffected()


def test_memory_bomb_is_contained() -> None:
    result = run_python("blocks = []\nwhile True:\n    blocks.append(bytearray(50_000_000))\n", FAST)
    assert result.status == "error" and result.error_type == "MemoryError", result
    one_block = run_python("x = bytearray(10**10)", FAST)  # 10 GB at once
    assert one_block.status == "error" and one_block.error_type == "MemoryError"
    assert_parent_unaffected()


def test_infinite_loops_are_stopped() -> None:
    busy = run_python("while True:\n    pass\n", {"timeout_s": 10.0, "cpu_s": 1.0})
    assert busy.status == "cpu_limit", busy
    assert "CPU" in (busy.error or "")
    sleeping = run_python("import time\ntime.sleep(60)\n", {"timeout_s": 1.5})
    assert sleeping.status == "timeout" and "timed out after 1.5 s" in (sleeping.error or "")
    assert sleeping.duration_s < 5
    assert_parent_unaffected()


def test_deep_recursion_is_contained() -> None:
    plain = run_python("def f(n):\n    return f(n + 1)\nf(0)\n", FAST)
    assert plain.status == "error" and plain.error_type == "RecursionError"
    assert 'File "<cell-1>", line 2, in f' in (plain.error or "")
    assert "_runner" not in (plain.error or "")  # the traceback shows the user's frames only
    # with the recursion limit lifted, frames pile up until a limit (memory, CPU, wall clock or the
    # C stack) ends the process; whichever comes first, the result names it
    lifted = "import sys\nsys.setrecursionlimit(10**8)\ndef f(n):\n    return f(n + 1)\nf(0)\n"
    unbounded = run_python(lifted, FAST)
    assert unbounded.status in ("crashed", "error", "timeout", "cpu_limit"), unbounded
    assert unbounded.error and unbounded.duration_s < FAST["timeout_s"] + 2
    assert_parent_unaffected()


def test_huge_writes_to_disk_and_stdout_are_cut() -> None:
    big_file = run_python("open('big.bin', 'wb').write(b'x' * (40 * 2**20))\n", {**FAST, "max_file_mb": 4})
    assert big_file.status == "error" and "File too large" in (big_file.error or ""), big_file
    many_files = run_python(
        "for i in range(20):\n    open(f'part{i}.bin', 'wb').write(b'x' * (3 * 2**20))\n",
        {**FAST, "max_file_mb": 4, "disk_mb": 16},
    )
    assert many_files.status == "error" and "No space left on device" in (many_files.error or "")
    flood = run_python("while True:\n    print('x' * 10_000)\n", {**FAST, "max_output_bytes": 2_000_000})
    assert flood.status == "output_limit" and "killed" in (flood.error or "")
    assert flood.stdout_truncated and len(flood.stdout) < 5000
    one_print = run_python("print('y' * 1_000_000)", {**FAST, "max_output_chars": 100})
    assert one_print.ok and one_print.stdout_truncated
    assert one_print.stdout.startswith("y" * 100 + "\n[truncated: ")
    assert_parent_unaffected()


def test_writing_outside_the_working_directory_fails(tmp_path: Path) -> None:
    # a world-writable target in a world-writable place: the sandbox must still not reach it
    shared = Path("/var/tmp") / f"agent-r1-sandbox-test-{os.getpid()}"
    shared.mkdir(mode=0o777, exist_ok=True)
    target = shared / "target.txt"
    target.write_text("original")
    target.chmod(0o666)
    shared.chmod(0o777)
    host_tmp = tmp_path / "host.txt"
    host_tmp.write_text("original")
    host_tmp.chmod(0o666)
    code = (
        "import os\n"
        f"targets = [{str(target)!r}, {str(host_tmp)!r}, '/etc/agent-r1-owned', '/var/tmp/new.txt',\n"
        "           '/dev/shm/new.txt', '../escaped.txt', '/escaped.txt']\n"
        "for path in targets:\n"
        "    try:\n"
        "        with open(path, 'w') as handle:\n"
        "            handle.write('owned')\n"
        "        print('WROTE', path)\n"
        "    except OSError as exc:\n"
        "        print('refused', path, type(exc).__name__)\n"
        "open('mine.txt', 'w').write('fine')\n"
        "print('cwd', os.getcwd(), sorted(os.listdir('.')))\n"
    )
    try:
        result = run_python(code, FAST)
        assert result.ok, result
        assert "WROTE /" not in result.stdout and "WROTE ../" not in result.stdout, result.stdout
        assert result.stdout.count("refused") == 7
        assert "cwd /tmp ['mine.txt']" in result.stdout  # its own directory works, and starts empty
        assert target.read_text() == "original" and host_tmp.read_text() == "original"
        assert not Path("/etc/agent-r1-owned").exists() and not Path("/var/tmp/new.txt").exists()
        assert not Path("/escaped.txt").exists() and not Path("/dev/shm/new.txt").exists()
    finally:
        target.unlink(missing_ok=True)
        shared.rmdir()
    assert_parent_unaffected()


def test_parent_environment_variables_stay_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    secret = f"s3cret-{os.getpid()}-{time.time_ns()}"
    monkeypatch.setenv("AGENT_R1_TEST_SECRET", secret)
    code = (
        "import os, glob\n"
        f"secret = {secret[:6]!r} + {secret[6:]!r}\n"  # never spelled whole inside the sandbox
        "found = [k for k, v in os.environ.items() if secret in v]\n"
        f"paths = ['/proc/self/environ', '/proc/1/environ', '/proc/{os.getpid()}/environ']\n"
        "paths += glob.glob('/proc/[0-9]*/environ')\n"
        "for path in paths:\n"
        "    try:\n"
        "        if secret.encode() in open(path, 'rb').read():\n"
        "            found.append(path)\n"
        "    except OSError:\n"
        "        pass\n"
        "print('found:', found)\n"
        "print('env keys:', sorted(os.environ))\n"
    )
    result = run_python(code, FAST)
    assert result.ok, result
    assert "found: []" in result.stdout
    assert "env keys: ['HOME', 'LANG', 'PATH', 'TMPDIR']" in result.stdout
    assert secret not in result.stdout + result.stderr
    assert os.environ["AGENT_R1_TEST_SECRET"] == secret  # the parent's is untouched


@pytest.fixture
def tcp_server() -> Iterator[tuple[int, list[str]]]:
    """A real TCP server on 127.0.0.1; yields its port and the list of peers it accepted."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.settimeout(0.2)
    accepted: list[str] = []
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                connection, peer = server.accept()
            except TimeoutError:  # a poll tick: look at the stop flag again
                continue
            accepted.append(str(peer))
            connection.sendall(b"hello\n")
            connection.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server.getsockname()[1], accepted
    stop.set()
    thread.join(timeout=5)
    server.close()


def test_no_network_to_a_local_server(tcp_server: tuple[int, list[str]]) -> None:
    port, accepted = tcp_server
    with socket.create_connection(("127.0.0.1", port), timeout=5) as control:  # the server works
        assert control.recv(16) == b"hello\n"
    assert len(accepted) == 1
    code = (
        "import socket\n"
        "try:\n"
        f"    socket.create_connection(('127.0.0.1', {port}), timeout=2).recv(16)\n"
        "    print('CONNECTED')\n"
        "except OSError as exc:\n"
        "    print('no network:', type(exc).__name__, exc.errno)\n"
    )
    result = run_python(code, FAST)
    assert result.ok, result
    assert "no network:" in result.stdout and "CONNECTED" not in result.stdout
    assert len(accepted) == 1  # nothing from the sandbox reached the server
    # with network: host (an explicit opt-out) the same code does connect: the test can fail
    opened = run_python(code, {**FAST, "network": "host"})
    assert "CONNECTED" in opened.stdout, opened
    assert len(accepted) == 2


def test_killing_the_parent_fails() -> None:
    bystander = subprocess.Popen(["sleep", "30"])  # a process of ours the code will try to kill
    try:
        code = (
            "import os, signal\n"
            f"for pid in (os.getppid(), {os.getpid()}, {bystander.pid}, 1, -1):\n"
            "    try:\n"
            "        os.kill(pid, signal.SIGKILL)\n"
            "        print('killed', pid)\n"
            "    except OSError as exc:\n"
            "        print('refused', pid, type(exc).__name__)\n"
        )
        result = run_python(code, FAST)
        assert result.ok, result
        assert "killed" not in result.stdout, result.stdout
        # -1: every process the caller may signal, which is none but itself
        assert result.stdout.count("refused") == 5
        assert bystander.poll() is None  # still running
    finally:
        bystander.kill()
        bystander.wait()
    assert_parent_unaffected()


@pytest.mark.skipif(os.geteuid() != 0, reason="finds the leftovers by the sandbox user id")
def test_background_processes_do_not_outlive_the_sandbox() -> None:
    code = (
        "import os, subprocess, time\n"
        "sleeper = subprocess.Popen(['sleep', '60'], start_new_session=True)\n"
        "if os.fork() == 0:\n"  # a daemon: new session, double fork, parent gone
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        "        time.sleep(60)\n"
        "    os._exit(0)\n"
        "time.sleep(0.3)\n"
        "print('started', sleeper.pid)\n"
    )
    session = PythonSession(FAST)
    with session:
        result = session.run(code)
        assert result.ok and "started" in result.stdout, result
        during = processes_of(session.uid)
        assert len(during) >= 3  # worker, sleep, daemon
    assert gone(session.uid)
    assert_parent_unaffected()


def test_a_forged_verdict_is_not_taken() -> None:
    # The result pipe is an inherited descriptor the code can find; a line it writes there without
    # the call's nonce must not become the verdict.
    forge = (
        "import json, os\n"
        "line = json.dumps({'status': 'ok', 'tests': [{'passed': True, 'error': None}] * 3})\n"
        "for fd in map(int, os.listdir('/proc/self/fd')):\n"
        "    try:\n"
        "        os.write(fd, (line + '\\n').encode())\n"
        "    except OSError:\n"
        "        pass\n"
        "def add(a, b):\n"
        "    return 0\n"
    )
    result = run_tests(forge, ["assert add(1, 2) == 3"] * 3, FAST)
    assert result.status == "crashed" and "result channel" in (result.error or ""), result
    assert not any(test.get("passed") for test in result.tests)
    assert_parent_unaffected()
