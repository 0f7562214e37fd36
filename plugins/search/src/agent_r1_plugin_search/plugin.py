"""Hook implementations of agent-r1-plugin-search (entry point ``search`` in group ``agent_r1``).

Each hook imports its module only when called, so loading the plugin stays cheap and a missing
optional dependency shows up only for the component that needs it.
"""

from __future__ import annotations

from typing import Any

from agent_r1 import hookimpl


@hookimpl
def register_tools() -> list[Any]:
    from agent_r1_plugin_search.tool import SearchTool

    return [SearchTool]


@hookimpl
def register_environments() -> list[Any]:
    from agent_r1_plugin_search.env import SearchQAEnv

    return [SearchQAEnv]


@hookimpl
def register_datasets() -> list[Any]:
    from agent_r1_plugin_search.datasets import DATASETS, QAMixDataset

    return [*DATASETS, QAMixDataset]


@hookimpl
def register_reward_shapers() -> list[Any]:
    from agent_r1_plugin_search.rewards import SHAPERS

    return list(SHAPERS)
