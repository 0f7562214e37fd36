"""Hook implementations of agent-r1-plugin-code (entry point ``code`` in group ``agent_r1``).

Each hook imports its module only when called, so loading the plugin stays cheap.
"""

from __future__ import annotations

from typing import Any

from agent_r1 import hookimpl


@hookimpl
def register_tools() -> list[Any]:
    from agent_r1_plugin_code.tools import PythonTool, RunTestsTool

    return [PythonTool, RunTestsTool]


@hookimpl
def register_environments() -> list[Any]:
    from agent_r1_plugin_code.envs import CodeEnv, MathEnv

    return [CodeEnv, MathEnv]


@hookimpl
def register_datasets() -> list[Any]:
    from agent_r1_plugin_code.datasets import DATASETS

    return list(DATASETS)


@hookimpl
def register_reward_shapers() -> list[Any]:
    from agent_r1_plugin_code.rewards import SHAPERS

    return list(SHAPERS)
