"""Testing helpers for plugin authors and for agent-r1's own tests.

``from agent_r1.testing import check_tool, PluginDistribution, plugin_path`` gives the contract
checkers and the plugin-distribution harness of :mod:`agent_r1.testing.plugins`. The tiny models
and tokenizers (:mod:`agent_r1.testing.models`) and the toy task (:mod:`agent_r1.testing.toy`)
need torch and are imported from their own modules.
"""

from __future__ import annotations

from agent_r1.testing.plugins import (
    DEFAULT_TASK,
    ContractViolation,
    PluginDistribution,
    check_advantage_estimator,
    check_algorithm,
    check_component,
    check_dataset,
    check_environment,
    check_plugin,
    check_policy_loss,
    check_reward_shaper,
    check_tool,
    check_tool_call_format,
    check_tracker,
    example_trajectory,
    plugin_path,
    write_plugin_distribution,
)

__all__ = [
    "DEFAULT_TASK",
    "ContractViolation",
    "PluginDistribution",
    "check_advantage_estimator",
    "check_algorithm",
    "check_component",
    "check_dataset",
    "check_environment",
    "check_plugin",
    "check_policy_loss",
    "check_reward_shaper",
    "check_tool",
    "check_tool_call_format",
    "check_tracker",
    "example_trajectory",
    "plugin_path",
    "write_plugin_distribution",
]
