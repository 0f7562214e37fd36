"""The bundled plugin: registered through the ``agent_r1`` entry point exactly like a third-party
plugin. Each hook imports its module only when called, so ``import agent_r1`` stays light."""

from __future__ import annotations

from typing import Any

from agent_r1.hookspecs import hookimpl


@hookimpl
def register_tools() -> list[Any]:
    from agent_r1.builtins.calculator import CalculatorTool

    return [CalculatorTool]


@hookimpl
def register_environments() -> list[Any]:
    from agent_r1.builtins.calculator import CalculatorEnv
    from agent_r1.builtins.tool_env import ToolEnv

    return [ToolEnv, CalculatorEnv]


@hookimpl
def register_tool_call_formats() -> list[Any]:
    from agent_r1.builtins.formats import HermesFormat, TagsFormat

    return [HermesFormat, TagsFormat]


@hookimpl
def register_datasets() -> list[Any]:
    from agent_r1.builtins.calculator import ArithmeticDataset
    from agent_r1.builtins.datasets import DATASETS

    return [ArithmeticDataset, *DATASETS]


@hookimpl
def register_reward_shapers() -> list[Any]:
    from agent_r1.builtins import reward_models, rewards

    return [*rewards.SHAPERS, *reward_models.SHAPERS]


@hookimpl
def register_advantage_estimators() -> list[Any]:
    from agent_r1.builtins import estimators, gigpo

    return [*estimators.ESTIMATORS, gigpo.GiGPO]


@hookimpl
def register_policy_losses() -> list[Any]:
    from agent_r1.builtins import losses

    return list(losses.LOSSES)


@hookimpl
def register_algorithms() -> list[Any]:
    from agent_r1.builtins import algorithms

    return list(algorithms.ALGORITHMS)


@hookimpl
def register_rollout_backends() -> list[Any]:
    from agent_r1.builtins.hf_backend import HFBackend
    from agent_r1.builtins.vllm_backend import VLLMBackend  # imports vLLM only when built

    return [HFBackend, VLLMBackend]


@hookimpl
def register_trackers() -> list[Any]:
    from agent_r1.builtins import trackers

    return list(trackers.TRACKERS)
