"""agent-r1: end-to-end reinforcement learning for LLM agents that act over many turns with tools.

Plugin authors import everything they need from here::

    from agent_r1 import hookimpl, Tool, RewardShaper, RewardSignal

Importing this package loads no plugin and no torch.
"""

from __future__ import annotations

from agent_r1 import lazy
from agent_r1.contracts import (
    AdvantageEstimator,
    AdvantageInput,
    Algorithm,
    Component,
    ComponentConfig,
    Dataset,
    Environment,
    EpisodeStart,
    Generation,
    LossInput,
    ParsedAction,
    PolicyLoss,
    Provenance,
    RewardShaper,
    RolloutBackend,
    SamplingParams,
    Tool,
    ToolCallFormat,
    Tracker,
)
from agent_r1.errors import (
    AgentR1Error,
    ComponentConflict,
    ComponentNotFound,
    ConfigError,
    ModelNotFound,
    PluginError,
    ToolError,
    TrajectoryError,
)
from agent_r1.hookspecs import hookimpl
from agent_r1.mdp import (
    SCHEMA_VERSION,
    Action,
    Observation,
    RewardSignal,
    Segment,
    Step,
    Task,
    TokenSource,
    ToolCall,
    ToolResult,
    Trajectory,
    load_trajectories,
    save_trajectories,
)

__version__ = "0.1.0"

# Bases that plugins subclass but that live in heavier modules, imported on first use.
__getattr__ = lazy.lazy_getattr(
    "agent_r1",
    {
        "agent_r1.contracts": ("ComponentSpec", "RewardSpec"),
        "agent_r1.builtins.tool_env": ("ToolEnv", "ToolEnvConfig"),
    },
)


__all__ = [
    "SCHEMA_VERSION",
    "Action",
    "AdvantageEstimator",
    "AdvantageInput",
    "AgentR1Error",
    "Algorithm",
    "Component",
    "ComponentConfig",
    "ComponentConflict",
    "ComponentNotFound",
    "ComponentSpec",
    "ConfigError",
    "Dataset",
    "Environment",
    "EpisodeStart",
    "Generation",
    "LossInput",
    "ModelNotFound",
    "Observation",
    "ParsedAction",
    "PluginError",
    "PolicyLoss",
    "Provenance",
    "RewardShaper",
    "RewardSignal",
    "RolloutBackend",
    "SamplingParams",
    "Segment",
    "Step",
    "Task",
    "TokenSource",
    "Tool",
    "ToolCall",
    "ToolCallFormat",
    "ToolError",
    "ToolResult",
    "Tracker",
    "Trajectory",
    "TrajectoryError",
    "__version__",
    "hookimpl",
    "load_trajectories",
    "save_trajectories",
]
