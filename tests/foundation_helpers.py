"""Test plugin distributions for the foundation tests (registry, config, CLI, hook coverage).

Each distribution is written by :class:`agent_r1.testing.PluginDistribution` into its own
directory, with a real ``.dist-info``; a test puts the directories it needs on ``sys.path``
(:func:`agent_r1.testing.plugin_path`) or on ``PYTHONPATH`` (subprocesses), and
``importlib.metadata`` discovers them like any installed plugin.

* ``acme`` (agent-r1-plugin-acme): one valid component of every kind, a command ``acme-hello`` and
  every observer hook. Imports write ``$ACME_MARKER``; observers append to ``$ACME_EVENTS``.
* ``other`` (agent-r1-plugin-other): provides tool ``echo`` and environment ``echo_env`` too
  (a name conflict with acme) and a command ``acme-hello`` (a command conflict).
* ``broken_import`` (agent-r1-plugin-broken-import): writes ``$BROKEN_MARKER`` and raises on import.
* ``bad_class`` (agent-r1-plugin-bad-class): a tool that does not subclass ``Tool``, an
  environment without a name, a reward-shaper hook that raises, and an observer that raises.
* ``typo`` (agent-r1-plugin-typo): a hookimpl whose name is not a hook.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from agent_r1.testing import PluginDistribution, plugin_path

ACME_SOURCE = '''
"""agent-r1-plugin-acme: one small component of every kind, a command and observers."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from pydantic import Field

from agent_r1 import (
    AdvantageEstimator,
    Algorithm,
    ComponentConfig,
    Dataset,
    Environment,
    EpisodeStart,
    Generation,
    ParsedAction,
    PolicyLoss,
    RewardShaper,
    RewardSignal,
    RolloutBackend,
    Task,
    Tool,
    ToolCall,
    ToolCallFormat,
    Tracker,
    hookimpl,
)
from agent_r1.mdp import Observation

if os.environ.get("ACME_MARKER"):
    Path(os.environ["ACME_MARKER"]).write_text("imported", encoding="utf-8")

LOGGED: list[tuple[int, dict[str, float]]] = []


class EchoTool(Tool):
    """Repeats its text."""

    name = "echo"
    description = "Repeat the given text back."

    class Arguments(Tool.Arguments):
        text: str

    def run(self, arguments: Any) -> str:
        return arguments.text


class EchoEnv(Environment):
    """Echoes each action back as a user message until max_turns."""

    name = "echo_env"

    class Config(ComponentConfig):
        max_turns: int = Field(2, ge=1, description="actions per episode")
        greeting: str = "hi"

    async def reset(self, task: Task) -> EpisodeStart:
        return EpisodeStart(messages=[{"role": "system", "content": self.config.greeting}, *task.messages])

    async def step(self, action: Any, turn: int) -> Observation:
        done = turn + 1 >= self.config.max_turns
        return Observation(
            messages=[] if done else [{"role": "user", "content": action.text}],
            rewards=[RewardSignal(name="turn", value=0.1, kind="process", turn=turn)],
            done=done,
            termination="max_turns" if done else None,
        )


class LineFormat(ToolCallFormat):
    """Tool calls are lines ``call <tool> <text>``."""

    name = "line"

    def parse(self, text: str, tools: Any) -> ParsedAction:
        calls = []
        for i, line in enumerate(text.splitlines()):
            parts = line.split(" ", 2)
            if len(parts) == 3 and parts[0] == "call":
                calls.append(ToolCall(id=f"c{i}", name=parts[1], arguments={"text": parts[2]}, raw=line))
        return ParsedAction(tool_calls=calls)

    def render_results(self, results: Any, errors: Any = ()) -> list[dict[str, Any]]:
        return [{"role": "tool", "content": r.content} for r in results] + [
            {"role": "user", "content": e} for e in errors
        ]


class LengthShaper(RewardShaper):
    """Rewards actions whose policy-token count is close to a target."""

    name = "length"

    class Config(ComponentConfig):
        target: int = Field(5, ge=0)

    def score(self, trajectory: Any, task: Task) -> list[RewardSignal]:
        gap = abs(trajectory.num_policy_tokens - self.config.target)
        return [RewardSignal(name="length", value=-float(gap), source=self.name)]


class ConstantEstimator(AdvantageEstimator):
    """Every policy token gets the same advantage."""

    name = "constant"

    class Config(ComponentConfig):
        value: float = 1.0

    def compute(self, batch: Any) -> Any:
        advantages = batch.loss_mask.float() * self.config.value
        return advantages, advantages.clone()


class SignLoss(PolicyLoss):
    """Plain policy gradient: -advantage * logprob."""

    name = "sign"

    def token_loss(self, inputs: Any) -> Any:
        return -inputs.advantages * inputs.logprobs, {}


class AcmePG(Algorithm):
    """The constant estimator with the plain policy-gradient loss."""

    name = "acme_pg"
    estimator = "constant"
    loss = "sign"


class NoopBackend(RolloutBackend):
    """Generates nothing (ends every turn at once)."""

    name = "noop"

    def generate(self, prompts: Any, sampling: Any) -> list[Generation]:
        return [Generation(token_ids=[], logprobs=[], finish_reason="eos") for _ in prompts]


class MemoryTracker(Tracker):
    """Keeps logged metrics in a module-level list."""

    name = "memory"

    def log(self, metrics: Any, step: int) -> None:
        LOGGED.append((step, dict(metrics)))


class CountingDataset(Dataset):
    """Tasks 'count to i'."""

    name = "counting"

    class Config(ComponentConfig):
        num_tasks: int = Field(3, ge=1)

    def load(self, split: str) -> list[Task]:
        return [
            Task(id=f"{split}-{i}", messages=[{"role": "user", "content": f"count to {i}"}], answer=str(i))
            for i in range(self.config.num_tasks)
        ]


@hookimpl
def register_tools() -> list[Any]:
    return [EchoTool]


@hookimpl
def register_environments() -> list[Any]:
    return [EchoEnv]


@hookimpl
def register_tool_call_formats() -> list[Any]:
    return [LineFormat]


@hookimpl
def register_reward_shapers() -> list[Any]:
    return [LengthShaper]


@hookimpl
def register_advantage_estimators() -> list[Any]:
    return [ConstantEstimator]


@hookimpl
def register_policy_losses() -> list[Any]:
    return [SignLoss]


@hookimpl
def register_algorithms() -> list[Any]:
    return [AcmePG]


@hookimpl
def register_rollout_backends() -> list[Any]:
    return [NoopBackend]


@hookimpl
def register_trackers() -> list[Any]:
    return [MemoryTracker]


@hookimpl
def register_datasets() -> list[Any]:
    return [CountingDataset]


@hookimpl
def register_commands() -> list[Any]:
    import typer

    app = typer.Typer()

    @app.command("acme-hello")
    def hello(name: str = typer.Option("world", help="who to greet")) -> None:
        """Greet someone (a command from the acme plugin)."""
        typer.echo(f"hello {name} from acme")

    return [app]


def _event(hook: str, **data: Any) -> None:
    path = os.environ.get("ACME_EVENTS")
    if path:
        with open(path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps({"hook": hook, **data}, default=str) + "\\n")


@hookimpl
def on_train_start(run_dir: Path, config: dict[str, Any]) -> None:
    _event("on_train_start", run_dir=str(run_dir), seed=config.get("seed"))


@hookimpl
def on_rollout_end(step: int, trajectories: list[Any]) -> None:
    _event("on_rollout_end", step=step, count=len(trajectories))


@hookimpl
def on_update_end(step: int, metrics: dict[str, float]) -> None:
    _event("on_update_end", step=step, metrics=metrics)


@hookimpl
def on_eval_end(step: int, report: dict[str, Any]) -> None:
    _event("on_eval_end", step=step, success=report.get("success"))


@hookimpl
def on_checkpoint(step: int, path: Path) -> None:
    _event("on_checkpoint", step=step, path=str(path))


@hookimpl
def on_train_end(run_dir: Path, metrics: dict[str, float]) -> None:
    _event("on_train_end", run_dir=str(run_dir), metrics=metrics)
'''

OTHER_SOURCE = '''
"""agent-r1-plugin-other: provides names that acme provides too."""

from typing import Any

from agent_r1 import Environment, Tool, hookimpl


class OtherEcho(Tool):
    """Echo, shouting."""

    name = "echo"
    description = "Repeat the text in capitals."

    class Arguments(Tool.Arguments):
        text: str

    def run(self, arguments: Any) -> str:
        return arguments.text.upper()


class OtherEnv(Environment):
    """Another echo environment."""

    name = "echo_env"


@hookimpl
def register_tools() -> list[Any]:
    return [OtherEcho]


@hookimpl
def register_environments() -> list[Any]:
    return [OtherEnv]


@hookimpl
def register_commands() -> list[Any]:
    import typer

    app = typer.Typer()

    @app.command("acme-hello")
    def hello() -> None:
        typer.echo("hello from other")

    return [app]
'''

BROKEN_IMPORT_SOURCE = '''
"""agent-r1-plugin-broken-import: fails on import (after leaving a marker)."""

import os
from pathlib import Path

if os.environ.get("BROKEN_MARKER"):
    Path(os.environ["BROKEN_MARKER"]).write_text("imported", encoding="utf-8")

raise RuntimeError("boom: the broken plugin cannot start")
'''

BAD_CLASS_SOURCE = '''
"""agent-r1-plugin-bad-class: registration mistakes of every sort."""

from typing import Any

from agent_r1 import ComponentConfig, Environment, hookimpl


class NotATool:
    """Has a name but does not subclass agent_r1.Tool."""

    name = "bad_tool"


class NamelessEnv(Environment):
    """Subclasses Environment but sets no name."""


class LooseConfigEnv(Environment):
    """Valid, except that its Config accepts unknown keys (plugins doctor reports it)."""

    name = "loose_env"

    class Config(ComponentConfig):
        model_config = {"extra": "allow"}


@hookimpl
def register_tools() -> list[Any]:
    return [NotATool]


@hookimpl
def register_environments() -> list[Any]:
    return [NamelessEnv, LooseConfigEnv]


@hookimpl
def register_reward_shapers() -> list[Any]:
    raise ValueError("reward table is missing")


@hookimpl
def on_update_end(step: int, metrics: dict) -> None:
    raise RuntimeError(f"observer failed at step {step}")
'''

TYPO_SOURCE = '''
"""agent-r1-plugin-typo: implements a hook that does not exist."""

from agent_r1 import hookimpl


@hookimpl
def register_toolz() -> list:
    return []
'''

DISTRIBUTIONS: dict[str, PluginDistribution] = {
    "acme": PluginDistribution(
        "agent-r1-plugin-acme",
        {"acme_agent_plugin.py": ACME_SOURCE},
        {"acme": "acme_agent_plugin"},
        version="1.2.3",
    ),
    "other": PluginDistribution(
        "agent-r1-plugin-other", {"other_agent_plugin.py": OTHER_SOURCE}, {"other": "other_agent_plugin"}
    ),
    "broken_import": PluginDistribution(
        "agent-r1-plugin-broken-import",
        {"broken_import_plugin.py": BROKEN_IMPORT_SOURCE},
        {"broken_import": "broken_import_plugin"},
        version="0.0.1",
    ),
    "bad_class": PluginDistribution(
        "agent-r1-plugin-bad-class",
        {"bad_class_plugin.py": BAD_CLASS_SOURCE},
        {"bad_class": "bad_class_plugin"},
    ),
    "typo": PluginDistribution(
        "agent-r1-plugin-typo", {"typo_plugin.py": TYPO_SOURCE}, {"typo": "typo_plugin"}
    ),
}

ISOLATE = "builtins,search,code,mcp,hubs"
"""Plugins installed in the development environment that these tests leave out (for speed and
so that only the test distributions decide the outcome)."""


@dataclass
class Sites:
    """One directory per test distribution, each holding the modules and the ``.dist-info``."""

    root: Path

    def __getitem__(self, name: str) -> Path:
        return self.root / name

    @contextmanager
    def on_path(self, *names: str) -> Iterator[None]:
        """Put the named distributions on ``sys.path`` for the duration."""
        with plugin_path(*(self[name] for name in names)):
            yield


def write_sites(root: Path) -> Sites:
    """Write every test distribution under ``root`` (one directory each)."""
    for name, distribution in DISTRIBUTIONS.items():
        distribution.write(root / name)
    return Sites(root)


def agent_r1_command() -> list[str]:
    """The installed ``agent-r1`` console script (next to this interpreter)."""
    script = Path(sys.executable).parent / "agent-r1"
    return [str(script)] if script.exists() else [sys.executable, "-m", "agent_r1.cli"]


def run_cli(
    args: Sequence[str],
    *,
    sites: Sequence[Path] = (),
    env: Mapping[str, str] | None = None,
    isolate: bool = True,
    cwd: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``agent-r1 <args>`` in a subprocess with ``sites`` on ``PYTHONPATH``."""
    return run_python_or_cli(agent_r1_command() + list(args), sites=sites, env=env, isolate=isolate, cwd=cwd)


def run_python_or_cli(
    command: Sequence[str],
    *,
    sites: Sequence[Path] = (),
    env: Mapping[str, str] | None = None,
    isolate: bool = True,
    cwd: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``command`` with ``sites`` on ``PYTHONPATH``, plugin env vars cleared, ``COLUMNS`` wide."""
    full = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_R1_")}
    full["PYTHONPATH"] = os.pathsep.join(str(s) for s in sites)
    full["COLUMNS"] = "200"
    full["NO_COLOR"] = "1"
    full["TERM"] = "dumb"
    if isolate:
        full["AGENT_R1_DISABLE_PLUGINS"] = ISOLATE
    full.update(env or {})
    return subprocess.run(
        list(command), capture_output=True, text=True, env=full, cwd=cwd, timeout=120, check=False
    )
