"""Run an agent given as a Python function: ``python run_callable.py module:function``.

The launcher of ``rollout.agent.callable`` runs this file as a script in a fresh process per
episode (as a script, not with ``-m``, so that the agent's process does not import agent-r1 and
starts fast; ``python -m agent_r1.gateway.run_callable`` works too). It imports ``module`` (from
the working directory or the Python path), reads the task JSON from
``AGENT_R1_TASK`` (or stdin), calls ``function(task)`` (awaiting it when it is ``async``) and
prints its return value as the final answer: one JSON line ``{"answer": ...}``. The function
reaches the policy with the ``openai`` client, which reads ``OPENAI_BASE_URL`` and
``OPENAI_API_KEY`` from the environment by itself.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import json
import os
import sys


def main(argv: list[str] | None = None) -> int:
    """Run the function named by ``argv[0]``; returns the exit status."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or ":" not in args[0]:
        print("usage: python -m agent_r1.gateway.run_callable module:function", file=sys.stderr)
        return 2
    module_name, _, attribute = args[0].partition(":")
    here = os.path.dirname(os.path.abspath(__file__))
    if sys.path and os.path.abspath(sys.path[0] or ".") == here:  # run as a script: not the agent's path
        sys.path.pop(0)
    sys.path.insert(0, os.getcwd())  # a my_agent.py next to the run config, as the run's components
    module = importlib.import_module(module_name)
    function = module
    for part in attribute.split("."):
        function = getattr(function, part)
    raw = os.environ.get("AGENT_R1_TASK") or sys.stdin.read()
    task = json.loads(raw)
    result = function(task)  # type: ignore[operator]
    if inspect.isawaitable(result):
        result = asyncio.run(result)  # type: ignore[arg-type]
    sys.stdout.write(json.dumps({"answer": result}, ensure_ascii=False, default=str) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":  # pragma: no cover - run as a module by the launcher
    sys.exit(main())
