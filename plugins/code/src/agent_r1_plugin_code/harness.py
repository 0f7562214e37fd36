"""The trusted side of judging: the tests run here, the solution runs in the sandbox.

A judgement takes a solution and a :class:`TestPlan` (the task's test code, split with ``ast``) and
returns one verdict per test. The solution is loaded in a sandbox; the test code runs in this
process, in a namespace of its own, where every name the solution defines stands for the sandbox:

* a **region** is a sub-expression of a test that calls the solution (``candidate(x)``,
  ``Pair(1, 2).a``, ``solve([Node(1)], k=2)[0]``): a chain of calls, attributes and subscripts that
  starts at a name of the solution (with a conversion around it: ``list(gen(3))``). It is rewritten
  into a request: the sandbox evaluates it as ``lambda a0, a1, ...: <the expression>``, the
  arguments being the values of its trusted sub-expressions (``x``, ``copy.deepcopy(coeffs)``),
  computed here and sent as plain data. The reply is the region's value, as plain data
  (:func:`~agent_r1_plugin_code._runner.to_plain`: exact builtin types only; an object of the
  solution's classes, or a subclass of ``int``, cannot cross), or what it raised;
* everything else (the comparisons, ``abs``, ``math.isclose``, ``all``, loops, the setup code,
  helper functions of the task's prompt such as HumanEval's ``encode_shift``) runs here, on the
  decoded values. ``assert`` decides here. The solution can choose the values its code returns and
  nothing else.

Requests go one at a time, each with a fresh id that its reply must repeat; a reply is exactly
``{"id", "value"}`` or ``{"id", "raised", "error"}``. Anything else (an unsolicited line, a wrong
id, a "passed" marker, a value that is not plain data) ends the sandbox: the test in progress and
every later one fail. There is no message that means "passed": a verdict is only ever computed here.

What cannot be split: an argument whose value cannot be sent as data. An object built by the
test's setup (a tree of ``Node`` objects) is sent by reference: the setup then runs in the sandbox
too and the sandbox uses its own copy. Any other such value (a function of the test's setup, an
open file), and a test that keeps an object of the solution in a variable to use it later (seen
in the test's text), makes the whole test statement run in the sandbox, where only a plain
``True`` counts as a pass; these tests are counted (``ExecutionResult.sandbox_verdicts``),
because a solution can fake them. stdin/stdout tests (``{"stdin": ..., "stdout": ...}``) run the
solution as a program in a fresh sandbox each and compare its output here, line by line with
trailing whitespace ignored.
"""

from __future__ import annotations

import builtins
import ctypes
import importlib
import importlib.util
import threading
import time
import traceback
import types
from collections.abc import Sequence
from typing import Any

from agent_r1_plugin_code._runner import NotPlainData, from_plain, to_plain
from agent_r1_plugin_code.pool import SandboxGroup, acquire_sandbox
from agent_r1_plugin_code.sandbox import ExecutionResult, PythonSession, SandboxConfig, SandboxEnded
from agent_r1_plugin_code.split import CALL, PARAM, PlannedTest, Region, TestPlan, cached_plan

GRACE_S = 1.0
"""How long past a test's time the trusted side waits for the sandbox's answer before stopping it
(the sandbox's own timer raises ``TimeoutError`` in the solution at the test's time)."""


# --------------------------------------------------------------------------------------------
# Running a plan
# --------------------------------------------------------------------------------------------


class SolutionError(Exception):
    """The solution raised something that is not a builtin ``Exception`` (``SystemExit``, its own
    class): the trusted side sees this instead (test code may catch it like any error)."""


class _Stop(BaseException):
    """A test cannot go on (the sandbox ended, its time ran out, it cannot be split). A
    ``BaseException``, so that test code's ``except Exception`` does not swallow it; the judgement
    also remembers it, in case a bare ``except`` did."""


class _Unsplittable(_Stop):
    pass


class _Overrun(_Stop):
    """Raised into a judging thread whose test code runs past its time without calling the
    solution (a loop of the test itself)."""


class _Watchdog:
    """Stops trusted test code that runs past its time: a test's own loop never reaches the
    deadline checks of the requests. One thread for the process; it raises :class:`_Overrun` in
    the judging thread (``PyThreadState_SetAsyncExc``, at most once per watch, never while the
    thread waits for the sandbox, which has its own deadline). A single C call that runs for long
    (``sum(range(10**12))``) is interrupted only when it returns."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._watched: dict[int, _Judgement] = {}
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def watch(self, judgement: _Judgement) -> None:
        with self._lock:
            self._watched[threading.get_ident()] = judgement
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="agent-r1-judge-watchdog", daemon=True)
                self._thread.start()
        self._wake.set()

    def unwatch(self) -> None:
        """End the watch; a pending interruption that has not been raised yet is withdrawn."""
        ident = threading.get_ident()
        with self._lock:
            if self._watched.pop(ident, None) is None:  # it fired: withdraw it if still pending
                ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(ident), None)

    def _run(self) -> None:
        while True:
            self._wake.wait(0.1)
            self._wake.clear()
            now = time.monotonic()
            with self._lock:
                for ident, judgement in list(self._watched.items()):
                    if not judgement.in_request and now > judgement.test_deadline + GRACE_S:
                        judgement.stop = judgement.stop or "timeout"
                        del self._watched[ident]
                        ctypes.pythonapi.PyThreadState_SetAsyncExc(
                            ctypes.c_ulong(ident), ctypes.py_object(_Overrun)
                        )


_WATCHDOG = _Watchdog()


def _remote_exception(name: str, text: str) -> Exception:
    """What the trusted side raises for an exception of the solution: the builtin class of that
    name when it is an ``Exception`` (so that ``except ValueError`` in a test works), else
    :class:`SolutionError`. Only the name and the text cross, never the object."""
    last = text.strip().splitlines()[-1] if text.strip() else name
    cls = getattr(builtins, name, None)
    exc: Exception
    try:
        if not (isinstance(cls, type) and issubclass(cls, Exception)):
            raise TypeError(name)
        exc = cls(last)
    except Exception:  # a builtin class that wants other arguments (UnicodeDecodeError)
        exc = SolutionError(last)
    exc.remote_traceback = text  # type: ignore[attr-defined]
    return exc


def _describe(exc: BaseException) -> str:
    remote = getattr(exc, "remote_traceback", None)
    if remote:
        return str(remote)
    return "".join(traceback.format_exception_only(type(exc), exc)).strip()


_PRIVATE_RANDOM: types.ModuleType | None = None
_PRIVATE_LOCK = threading.Lock()


def _private_random() -> types.ModuleType:
    """A copy of ``random`` for test code: tests drawing their inputs never touch the trainer's."""
    global _PRIVATE_RANDOM
    with _PRIVATE_LOCK:
        if _PRIVATE_RANDOM is None:
            spec = importlib.util.find_spec("random")
            assert spec is not None and spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            _PRIVATE_RANDOM = module
    return _PRIVATE_RANDOM


def _trusted_import(
    name: str, globals: Any = None, locals: Any = None, fromlist: Any = (), level: int = 0
) -> Any:
    if name == "random" and level == 0:
        return _private_random()
    return importlib.__import__(name, globals, locals, fromlist, level)


_TRUSTED_BUILTINS = {**builtins.__dict__, "__import__": _trusted_import}


class RemoteFunction:
    """A name of the solution, used as a callable by test code (``map(candidate, xs)``): each
    call is one request, its arguments and its value plain data."""

    __slots__ = ("_judgement", "_name")

    def __init__(self, judgement: _Judgement, name: str) -> None:
        self._judgement = judgement
        self._name = name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        code = f"lambda {PARAM}0, {PARAM}1: {self._name}(*{PARAM}0, **{PARAM}1)"
        return self._judgement.call(Region(code=code, names=(None, None)), (args, kwargs))

    def __repr__(self) -> str:
        return f"<the solution's {self._name}>"


def _output_lines(text: str) -> list[str]:
    lines = [line.rstrip() for line in text.replace("\r\n", "\n").split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    return lines


class _Judgement:
    """One solution against one plan, on one sandbox (stdin/stdout tests: one sandbox each)."""

    def __init__(
        self,
        plan: TestPlan,
        config: SandboxConfig,
        per_test_timeout_s: float | None,
        group: SandboxGroup | None,
    ) -> None:
        self.plan = plan
        self.config = config
        self.per_test = per_test_timeout_s or config.timeout_s
        self.group = group
        self.started = time.monotonic()
        self.deadline = self.started + config.timeout_s
        self.test_deadline = self.deadline
        self.session: PythonSession | None = None
        self.ended: SandboxEnded | None = None
        self.stop: str | None = None
        self.sandbox_setup = False
        self.sandbox_verdicts = 0
        self.namespace: dict[str, Any] = {}
        self.in_request = False

    # -- the channel ---------------------------------------------------------------------------
    def _ask(self, command: dict[str, Any], wait_s: float) -> dict[str, Any]:
        """One request; the reply checked to be exactly a value or an error (else the sandbox is
        stopped and the test fails)."""
        if self.ended is not None or self.session is None:
            self.stop = "ended"
            raise _Stop
        self.in_request = True
        try:
            reply = self.session.request(command, wait_s)
        except SandboxEnded as ended:
            self.ended, self.stop = ended, "ended"
            raise _Stop from None
        finally:
            self.in_request = False
        keys = set(reply)
        if keys == {"id", "value"}:
            return reply
        if keys == {"id", "raised", "error"} and type(reply["raised"]) is str and type(reply["error"]) is str:
            return reply
        self._violation("a reply that is neither a value nor an error")
        raise _Stop

    def _violation(self, what: str) -> None:
        assert self.session is not None
        self.session.close()
        self.ended = SandboxEnded(
            "crashed", f"the sandbox broke the protocol ({what}); stopped, counts as failed"
        )
        self.stop = "ended"

    def _remaining(self) -> float:
        remaining = min(self.test_deadline, self.deadline) - time.monotonic()
        if remaining <= 0:
            self.stop = self.stop or "timeout"
            raise _Stop
        return remaining

    def _argument(self, value: Any, name: str | None) -> Any:
        try:
            return to_plain(value)
        except NotPlainData:
            pass  # not data: it may still cross by name (a module) or by reference (a setup object)
        if isinstance(value, types.ModuleType) and name:
            return {"module": value.__name__}
        refs = {
            id(self.namespace[n]): {"ref": n}
            for n in self.plan.setup_names
            if n in self.namespace and not isinstance(self.namespace[n], types.ModuleType)
        }
        try:
            data = to_plain(value, refs=refs)
        except NotPlainData:
            self.stop = "unsplittable"
            raise _Unsplittable from None
        self._sandbox_setup()
        return data

    def _sandbox_setup(self) -> None:
        if self.sandbox_setup:
            return
        reply = self._ask(
            {"op": "setup", "sources": list(self.plan.setup_sources), "timeout_s": self.per_test},
            self.per_test + GRACE_S,
        )
        if "raised" in reply:
            raise _remote_exception(reply["raised"], reply["error"])
        self.sandbox_setup = True

    def call(self, region: Region, values: tuple[Any, ...]) -> Any:
        """Evaluate ``region`` in the sandbox on ``values``; its value, decoded here."""
        remaining = self._remaining()
        args = [self._argument(value, name) for value, name in zip(values, region.names, strict=True)]
        reply = self._ask(
            {"op": "call", "code": region.code, "args": args, "timeout_s": remaining}, remaining + GRACE_S
        )
        if "raised" in reply:
            raise _remote_exception(reply["raised"], reply["error"])
        try:
            return from_plain(reply["value"])
        except NotPlainData as exc:
            self._violation(str(exc))
            raise _Stop from None

    def region(self, index: int, values: tuple[Any, ...]) -> Any:
        return self.call(self.plan.regions[index], values)

    # -- the judgement ----------------------------------------------------------------------------
    def run(self, solution: str) -> ExecutionResult:
        tests: list[dict[str, Any]] = []
        setup_error = None
        if self.plan.has_statements:
            self.session = acquire_sandbox(self.config, self.group)
            try:
                setup_error = self._load(solution)
                for test in self.plan.tests:
                    if test.stdin is not None:
                        tests.append(self._program(solution, test))
                    elif setup_error is not None:
                        tests.append({"passed": False, "error": "not run: the solution failed to load"})
                    else:
                        tests.append(self._statement(test))
            finally:
                self._release(self.session)
        else:
            tests = [self._program(solution, test) for test in self.plan.tests]
        return self._result(tests, setup_error)

    def _load(self, solution: str) -> str | None:
        try:
            reply = self._ask(
                {"op": "load", "solution": solution, "aliases": self.plan.aliases},
                max(self.deadline - time.monotonic(), 0.1),
            )
        except _Stop:
            return f"the solution did not load: {self.ended.message if self.ended else 'stopped'}"
        if "raised" in reply:
            return reply["error"]
        namespace: dict[str, Any] = {"__name__": "__agent_r1_test__", "__builtins__": _TRUSTED_BUILTINS}
        for module in self.plan.modules:
            try:
                namespace[module] = importlib.import_module(module)
            except ImportError:
                continue  # the name stays unbound: the test fails with NameError, as it would anyway
        self.namespace = namespace
        try:
            if self.plan.prompt is not None:
                exec(self.plan.prompt, namespace)
            for name in self.plan.user_names:
                namespace[name] = RemoteFunction(self, name)
            namespace[CALL] = self.region
            for code in self.plan.setup:
                self.test_deadline = time.monotonic() + self.per_test
                self._trusted(code)
        except _Stop:
            return f"the test's setup did not finish: {self._stop_message()}"
        except Exception as exc:
            return f"the test's setup failed: {_describe(exc)}"
        return None

    def _stop_message(self) -> str:
        if self.stop == "timeout":
            return f"TimeoutError: the test took longer than {self.per_test:g} s"
        if self.ended is not None:
            return f"not run: the sandbox ended ({self.ended.message})"
        return "stopped"

    def _statement(self, test: PlannedTest) -> dict[str, Any]:
        if test.error is not None or test.code is None:
            return {"passed": False, "error": test.error}
        if self.ended is not None:
            return {"passed": False, "error": f"not run: the sandbox ended ({self.ended.message})"}
        if time.monotonic() >= self.deadline:
            return {
                "passed": False,
                "error": f"not run: judging took longer than {self.config.timeout_s:g} s",
            }
        self.stop = None
        self.test_deadline = time.monotonic() + self.per_test
        if test.in_sandbox:
            return self._in_sandbox(test)
        error = None
        try:
            self._trusted(test.code)
        except _Stop:
            pass  # self.stop says why
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # what the test raised (AssertionError, the solution's error)
            error = _describe(exc)
        if self.stop == "unsplittable" and self.ended is None:
            return self._in_sandbox(test)
        if self.stop is not None:
            return {"passed": False, "error": self._stop_message()}
        return {"passed": error is None, "error": error}

    def _trusted(self, code: types.CodeType) -> None:
        """Run test code here, watched (see :class:`_Watchdog`)."""
        _WATCHDOG.watch(self)
        try:
            exec(code, self.namespace)
        finally:
            _WATCHDOG.unwatch()

    def _in_sandbox(self, test: PlannedTest) -> dict[str, Any]:
        """A test that cannot be split: the sandbox runs the statement; only ``True`` passes."""
        self.sandbox_verdicts += 1
        self.stop = None
        try:
            self._sandbox_setup()
            remaining = self._remaining()
            reply = self._ask(
                {"op": "test", "source": test.source, "timeout_s": remaining}, remaining + GRACE_S
            )
        except _Stop:
            return {"passed": False, "error": self._stop_message()}
        except Exception as exc:
            return {"passed": False, "error": _describe(exc)}
        if "raised" in reply:
            return {"passed": False, "error": reply["error"]}
        return {"passed": reply["value"] is True, "error": None if reply["value"] is True else "not True"}

    def _program(self, solution: str, test: PlannedTest) -> dict[str, Any]:
        """A stdin/stdout test: the solution as a program in a sandbox of its own; the output is
        compared here."""
        if time.monotonic() >= self.deadline:
            return {
                "passed": False,
                "error": f"not run: judging took longer than {self.config.timeout_s:g} s",
            }
        session = acquire_sandbox(self.config, self.group)
        try:
            session.reset_output(keep_bytes=self.config.max_output_bytes)
            wait = min(self.per_test, self.deadline - time.monotonic())
            try:
                reply = session.request(
                    {"op": "program", "source": solution, "stdin": test.stdin, "timeout_s": wait},
                    wait + GRACE_S,
                )
            except SandboxEnded as ended:
                return {"passed": False, "error": ended.message}
            if set(reply) == {"id", "raised", "error"}:
                return {"passed": False, "error": str(reply["error"])}
            got = session.output_text("stdout", limit=None)
            if _output_lines(got) == _output_lines(test.stdout or ""):
                return {"passed": True, "error": None}
            return {"passed": False, "error": f"wrong output: {got[:200]!r}"}
        finally:
            self._release(session)

    def _release(self, session: PythonSession) -> None:
        if self.group is not None:
            self.group.release(session)
        else:
            session.close()

    def _result(self, tests: list[dict[str, Any]], setup_error: str | None) -> ExecutionResult:
        session = self.session
        output: dict[str, Any] = {}
        if session is not None:
            output = session.output_fields()
        status, error, exit_code = "ok", None, None
        if self.ended is not None:
            status, error, exit_code = self.ended.status, self.ended.message, self.ended.exit_code
        return ExecutionResult(
            status=status,
            error=error,
            exit_code=exit_code,
            tests=tests,
            setup_error=setup_error,
            duration_s=time.monotonic() - self.started,
            isolation=session.isolation if session is not None else "",
            sandbox_verdicts=self.sandbox_verdicts,
            **output,
        )


def judge_solution(
    solution: str,
    plan: TestPlan,
    config: SandboxConfig | dict[str, Any] | None = None,
    *,
    per_test_timeout_s: float | None = 3.0,
    group: SandboxGroup | None = None,
) -> ExecutionResult:
    """Judge ``solution`` on ``plan``: ``result.tests`` holds ``{"passed", "error"}`` per test.

    ``config.timeout_s`` bounds the whole judgement, ``per_test_timeout_s`` each test. Tests passed
    before the sandbox ended (the solution crashed, exited, broke the protocol, ran out of time)
    count; the rest fail. ``group`` owns the sandboxes while they run (closing it stops them)."""
    if config is None:
        config = SandboxConfig()
    elif isinstance(config, dict):
        config = SandboxConfig.model_validate(config)
    return _Judgement(plan, config, per_test_timeout_s, group).run(solution)


def run_tests_in_sandbox(
    solution: str,
    tests: Sequence[str | dict[str, str]],
    config: SandboxConfig | dict[str, Any] | None = None,
    *,
    setup: str = "",
    check_setup: Sequence[str] | None = None,
    candidate: str | None = None,
    per_test_timeout_s: float | None = None,
    group: SandboxGroup | None = None,
) -> ExecutionResult:
    """:func:`judge_solution` on tests given directly (``candidate``: the function the tests call
    as ``candidate``)."""
    plan = cached_plan(
        list(tests),
        setup=setup,
        check_setup=tuple(check_setup or ()),
        entry_point=candidate,
        candidate=candidate is not None,
    )
    return judge_solution(solution, plan, config, per_test_timeout_s=per_test_timeout_s, group=group)


__all__ = ["RemoteFunction", "SolutionError", "judge_solution", "run_tests_in_sandbox"]
