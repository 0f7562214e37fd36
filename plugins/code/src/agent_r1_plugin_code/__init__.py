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

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "ExecutionResult": "sandbox",
    "PythonSession": "sandbox",
    "SandboxConfig": "sandbox",
    "SandboxEnded": "sandbox",
    "SandboxError": "sandbox",
    "SandboxGroup": "pool",
    "SandboxPool": "pool",
    "SandboxUnavailable": "sandbox",
    "TestPlan": "split",
    "acquire_sandbox": "pool",
    "judge_solution": "harness",
    "namespace_prefix": "sandbox",
    "plan_tests": "split",
    "run_python": "sandbox",
    "run_tests": "sandbox",
}

__all__ = [*sorted(_EXPORTS), "__version__"]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'agent_r1_plugin_code' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"agent_r1_plugin_code.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
