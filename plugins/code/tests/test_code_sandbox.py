"""The sandbox's ordinary behaviour: sessions keep their state, results carry values and trimmed
tracebacks, limits end a session (and the next call says its state is gone), test runs report each
test, and a machine without namespaces is refused or warned about as configured."""

from __future__ import annotations

import threading

import pytest

from agent_r1_plugin_code import sandbox as sandbox_module
from agent_r1_plugin_code.sandbox import (
    PythonSession,
    SandboxConfig,
    SandboxUnavailable,
    check_isolation,
    namespace_prefix,
    run_python,
    run_tests,
)

needs_namespaces = pytest.mark.skipif(namespace_prefix() is None, reason="needs Linux namespaces (unshare)")


@needs_namespaces
def test_a_session_keeps_its_state_between_runs() -> None:
    with PythonSession({"timeout_s": 5}) as session:
        first = session.run("import math\nradius = 2\nprint('area', round(math.pi * radius**2, 3))")
        assert first.ok and first.stdout == "area 12.566\n" and first.value is None
        second = session.run("radius * 10")
        assert second.ok and second.value == "20" and second.isolation == "namespaces"
        third = session.run("def double(x):\n    return 2 * x\ndouble(radius)")
        assert third.value == "4"
        assert session.run("double(21)").value == "42"


@needs_namespaces
def test_errors_name_the_users_line_only() -> None:
    with PythonSession({"timeout_s": 5}) as session:
        session.run("def inner(x):\n    return x['missing']\n")
        result = session.run("data = {}\ninner(data)")
        assert result.status == "error" and result.error_type == "KeyError"
        lines = result.error.splitlines()
        assert lines[0] == "Traceback (most recent call last):"
        assert 'File "<cell-2>", line 2, in <module>' in result.error
        assert 'File "<cell-1>", line 2, in inner' in result.error
        assert lines[-1] == "KeyError: 'missing'"
        assert "_runner.py" not in result.error
        syntax = session.run("def broken(:\n    pass")
        assert syntax.status == "error" and syntax.error_type == "SyntaxError"
        assert session.run("1 + 1").value == "2"  # errors do not end the session


@needs_namespaces
def test_a_limit_ends_the_session_and_the_next_run_says_so() -> None:
    with PythonSession({"timeout_s": 1.5}) as session:
        session.run("kept = 1")
        stuck = session.run("import time\ntime.sleep(30)")
        assert stuck.status == "timeout"
        after = session.run("print('back')\n'kept' in globals()")
        assert after.ok and after.stdout == "back\n" and after.value == "False"
        assert "earlier variables are gone" in after.stderr
        assert session.starts == 2


@needs_namespaces
def test_code_cannot_read_the_command_channel_and_output_is_cut() -> None:
    result = run_python("import sys\nprint(repr(sys.stdin.read()))", {"timeout_s": 5})
    assert result.stdout == "''\n"
    long = run_python(
        "print('a' * 50)\nimport sys\nprint('b' * 50, file=sys.stderr)", {"max_output_chars": 10}
    )
    assert long.stdout == "aaaaaaaaaa\n[truncated: 41 more bytes]" and long.stdout_truncated
    assert long.stderr.startswith("bbbbbbbbbb\n[truncated: ") and long.stderr_truncated


@needs_namespaces
def test_run_tests_reports_every_test() -> None:
    solution = "def add(a, b):\n    return a + b if a < 10 else 0\n"
    tests = ["assert add(1, 2) == 3", "assert add(20, 1) == 21", "import time\nwhile True:\n    pass"]
    result = run_tests(solution, tests, {"timeout_s": 10}, per_test_timeout_s=0.5)
    assert result.ok and [t["passed"] for t in result.tests] == [True, False, False]
    assert result.tests[1]["error"].splitlines()[-1] == "AssertionError"
    assert "TimeoutError: the test took longer than 0.5 s" in result.tests[2]["error"]
    broken = run_tests("def add(a, b)\n    return 1", tests[:1], {"timeout_s": 5})
    assert broken.setup_error and "SyntaxError" in broken.setup_error
    assert broken.tests == [{"passed": False, "error": "not run: the solution failed to load"}]
    with_candidate = run_tests(
        "def f(x):\n    return x * 2\n",
        ["assert candidate(2) == 4", "assert helper(3) == 6"],
        {"timeout_s": 5},
        setup="def helper(x):\n    return candidate(x)",
        candidate="f",
    )
    assert [t["passed"] for t in with_candidate.tests] == [True, True]


@needs_namespaces
def test_sessions_run_side_by_side() -> None:
    results: dict[int, str | None] = {}

    def work(n: int) -> None:
        with PythonSession({"timeout_s": 10}) as session:
            session.run(f"value = {n}")
            results[n] = session.run("value * 3").value

    threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert results == {n: str(3 * n) for n in range(4)}


def test_process_isolation_still_limits(tmp_path) -> None:
    # isolation: process (chosen explicitly): no namespaces, the rlimits and the timeout still hold
    config = {"isolation": "process", "timeout_s": 3, "memory_mb": 256}
    ok = run_python("import os\nprint(len(os.listdir('.')))\n21 * 2", config)
    assert ok.ok and ok.value == "42" and ok.stdout == "0\n" and ok.isolation == "process"
    bomb = run_python("x = bytearray(2 * 1024**3)", config)
    assert bomb.status == "error" and bomb.error_type == "MemoryError"
    assert run_python("while True:\n    pass", {**config, "cpu_s": 1, "timeout_s": 10}).status == "cpu_limit"


def test_a_machine_without_namespaces_is_refused_or_warned_about(monkeypatch: pytest.MonkeyPatch) -> None:
    # Stands in for a machine where `unshare` fails (this one allows namespaces): the probe's answer
    # is replaced, everything after it runs for real.
    monkeypatch.setattr(sandbox_module, "namespace_prefix", lambda: None)
    monkeypatch.setattr(sandbox_module, "_warned_unisolated", False)
    with pytest.raises(SandboxUnavailable, match="on_unavailable: warn"):
        check_isolation(SandboxConfig())
    with pytest.raises(SandboxUnavailable):
        check_isolation(SandboxConfig(isolation="namespaces", on_unavailable="warn"))
    with pytest.warns(RuntimeWarning, match="resource limits only"):
        assert check_isolation(SandboxConfig(on_unavailable="warn")) == "process"
    result = run_python("6 * 7", {"on_unavailable": "warn"})
    assert result.ok and result.value == "42" and result.isolation == "process"
    from agent_r1.registry import get_registry

    with pytest.raises(SandboxUnavailable):  # the tool refuses when it is built, before any episode
        get_registry().build("tools", "python", {})


def test_a_machine_without_the_minimal_root_is_refused_or_warned_about(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Namespaces work but the runner cannot build its own root (say, /proc cannot be mounted in a
    # container): refused by default; with warn, namespaces over the host's file system.
    if namespace_prefix() is None:
        pytest.skip("needs Linux namespaces (unshare)")
    monkeypatch.setattr(sandbox_module, "minimal_root_problem", lambda python=None: "mount proc: denied")
    monkeypatch.setattr(sandbox_module, "_warned_unisolated", False)
    with pytest.raises(SandboxUnavailable, match="own root file system here \\(mount proc: denied\\)"):
        check_isolation(SandboxConfig())
    with pytest.warns(RuntimeWarning, match="the host's file system"):
        assert check_isolation(SandboxConfig(on_unavailable="warn")) == "namespaces"
    assert check_isolation(SandboxConfig(filesystem="host")) == "namespaces"  # asked for: no warning
    result = run_python(
        "import os\nprint('work' in os.listdir('/'))", {"on_unavailable": "warn", "warm_pool": 0}
    )
    assert result.ok and result.stdout == "True\n"


def test_config_errors_name_the_option() -> None:
    with pytest.raises(ValueError, match="uid_range"):
        SandboxConfig(uid_range=(10, 5))
    with pytest.raises(ValueError, match="timeout_s"):
        SandboxConfig(timeout_s=0)
    with pytest.raises(ValueError, match="filesystem"):
        SandboxConfig(filesystem="everything")
    with pytest.raises(ValueError, match="warm_pool"):
        SandboxConfig(warm_pool=-1)
