"""agent-r1-plugin-code: sandboxed Python, code and math environments for agent-r1.

The public names below are imported lazily (on first attribute access), so that loading the plugin
through its entry point stays cheap::

    from agent_r1_plugin_code import PythonSession, run_python

    print(run_python("sum(range(10))").value)       # '45'
    with PythonSession() as session:                 # state survives between runs
        session.run("x = 6 * 7")
        print(session.run("x").value)                # '42'
"""

from __future__ import annotations

from agent_r1.lazy import lazy_dir, lazy_getattr

__version__ = "0.1.0"

_EXPORTS: dict[str, tuple[str, ...]] = {  # module → the names it gives this package
    ".sandbox": (
        "ExecutionResult",
        "PythonSession",
        "SandboxConfig",
        "SandboxEnded",
        "SandboxError",
        "SandboxUnavailable",
        "namespace_prefix",
        "run_python",
        "run_tests",
    ),
    ".pool": ("SandboxGroup", "SandboxPool", "acquire_sandbox"),
    ".split": ("TestPlan", "plan_tests"),
    ".harness": ("judge_solution",),
}

__all__ = [*sorted(name for names in _EXPORTS.values() for name in names), "__version__"]
__getattr__ = lazy_getattr(__name__, _EXPORTS)
__dir__ = lazy_dir(__name__, _EXPORTS)
