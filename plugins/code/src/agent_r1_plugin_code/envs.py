"""The ``code`` and ``math`` environments (``tool_env`` presets with sandboxed Python).

``code``: the agent gets a programming task (HumanEval, MBPP), may run code (``<python>``, a session
whose state survives between turns) and test a complete solution against the visible tests
(``<run_tests>``) over several turns, then submits ``<answer>complete code</answer>`` (an empty
answer submits the last tested code). The reward shapers ``code_tests`` / ``code_solved`` judge the
submission on the hidden tests; ``code_runs`` and ``test_progress`` reward turns whose code ran and
whose tests improved, reading ``observation.info["code"]``::

    environment:
      name: code
      max_turns: 6
      sandbox: {timeout_s: 10, memory_mb: 1024}   # shortcut: the sandbox of both tools

``math``: a grade-school word problem, the ``python`` tool and the core's ``calculator``
(``<calc>``), final answer ``<answer>number</answer>``; ``math_correct`` compares numbers.

Each episode's sandboxes (the python session, a judgement of ``run_tests`` still running) are
killed when the episode ends in the environment (answer, or the environment's ``max_turns``) and in
:meth:`aclose`, which the engine awaits for every episode whatever ended it (its own turn or token
budget, an error, the run stopping): a call the engine abandoned at ``call_timeout_s`` is stopped
then too, and a late call of that episode is refused. The instance's garbage collection closes
them as a last resort.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from typing import Any

from pydantic import Field, model_validator

from agent_r1 import (
    Action,
    ComponentConfig,
    ComponentSpec,
    EpisodeStart,
    Observation,
    Task,
    ToolCall,
    ToolEnv,
    ToolEnvConfig,
    ToolResult,
)
from agent_r1_plugin_code.sandbox import SandboxConfig
from agent_r1_plugin_code.tools import PythonTool, RunTestsTool

CODE_PROMPT = (
    "You solve Python programming tasks. Run code with <python>code</python> (a Python session whose "
    "variables persist; print what you want to see). Test a complete solution against the visible "
    "tests with <run_tests>complete code</run_tests>. When the tests pass, submit the complete "
    "solution as <answer>complete code</answer>; an empty <answer></answer> submits the code you "
    "tested last."
)
MATH_PROMPT = (
    "Solve the math word problem. Compute with Python, <python>print(12 * 7)</python>, or with the "
    "calculator, <calc>12*7</calc>. Give the final answer as a number: <answer>84</answer>."
)


def _spec(item: str | ComponentSpec) -> ComponentSpec:
    return ComponentSpec(name=item) if isinstance(item, str) else item


def _short(name: str) -> str:
    return name.rpartition(":")[2]


class _SandboxedConfig(ToolEnvConfig):
    sandbox: SandboxConfig | None = Field(
        None, description="shortcut: the sandbox options of the python and run_tests tools"
    )

    @model_validator(mode="after")
    def _one_sandbox(self) -> _SandboxedConfig:
        if self.sandbox is not None:
            for spec in (_spec(item) for item in self.tools):
                if _short(spec.name) in ("python", "run_tests") and "sandbox" in spec.options:
                    raise ValueError(f"sandbox is given both for the environment and in tools[{spec.name}]")
        return self

    def tool_specs(self) -> list[ComponentSpec]:
        specs = [_spec(item) for item in self.tools]
        if self.sandbox is None:
            return specs
        shortcut = self.sandbox.model_dump(exclude_unset=True)
        return [
            ComponentSpec(name=s.name, **{**s.options, "sandbox": shortcut})
            if _short(s.name) in ("python", "run_tests")
            else s
            for s in specs
        ]


def _close_tools(tools: list[Any]) -> None:
    for tool in tools:
        close = getattr(tool, "close", None)
        if close is not None:
            close()


class _SandboxedEnv(ToolEnv):
    """Shared part: records of the code tools in ``observation.info["code"]``; sessions closed."""

    def __init__(self, config: ComponentConfig | Mapping[str, Any] | None = None) -> None:
        super().__init__(config)
        self._finalizer = weakref.finalize(self, _close_tools, list(self.tools.values()))

    def _code_tools(self) -> list[Any]:
        return [tool for tool in self.tools.values() if isinstance(tool, (PythonTool, RunTestsTool))]

    async def reset(self, task: Task) -> EpisodeStart:
        for tool in self._code_tools():
            tool.reopen()  # an instance used for another episode gets fresh sandbox groups
        return await super().reset(task)

    async def step(self, action: Action, turn: int) -> Observation:
        tools = self._code_tools()
        seen = [len(tool.records) for tool in tools]
        observation = await super().step(action, turn)
        records = [record for tool, start in zip(tools, seen, strict=True) for record in tool.records[start:]]
        observation.info["code"] = records
        if observation.done:
            self.close()
        return observation

    def close(self) -> None:
        """Kill the episode's sandboxes now (also done on garbage collection)."""
        _close_tools(list(self.tools.values()))

    async def aclose(self) -> None:
        """The engine's end-of-episode hook: kill the sandboxes now, whatever ended the episode.
        Killing does not wait for a call in progress (it ends with the sandbox)."""
        self.close()


class CodeEnvConfig(_SandboxedConfig):
    """:class:`ToolEnvConfig` with the code defaults and the ``sandbox`` shortcut."""

    tools: list[str | ComponentSpec] = Field(
        default_factory=lambda: list[str | ComponentSpec](["python", "run_tests"]),
        description="the code tools (run_tests gets the task's visible tests)",
    )
    system_prompt: str | None = CODE_PROMPT
    max_turns: int = Field(6, ge=1, description="actions per episode at most")
    max_result_chars: int | None = Field(3000, ge=1, description="longer tool outputs are cut")
    call_timeout_s: float = Field(60.0, gt=0, description="a call running longer fails with 'timeout'")


class CodeEnv(_SandboxedEnv):
    """Write, run, test and submit a Python solution (see the module docstring)."""

    name = "code"
    Config = CodeEnvConfig
    config: CodeEnvConfig

    async def reset(self, task: Task) -> EpisodeStart:
        for tool in self.tools.values():
            if isinstance(tool, RunTestsTool):
                tool.bind_task(task)
        return await super().reset(task)


FEW_SHOT: tuple[tuple[str, str, str], ...] = (
    ("A box holds 12 pens. How many pens are in 7 boxes and 5 loose pens?", "print(12 * 7 + 5)", "89"),
    (
        "Tom had 50 apples. He gave away 18 and then bought 6 more. How many apples does he have?",
        "print(50 - 18 + 6)",
        "38",
    ),
)
"""Worked math examples (question, python code, answer) shown as earlier turns."""


class MathEnvConfig(_SandboxedConfig):
    """:class:`ToolEnvConfig` with the math defaults (python and calculator, ``<calc>`` tag)."""

    tools: list[str | ComponentSpec] = Field(
        default_factory=lambda: list[str | ComponentSpec](["python", "calculator"]),
        description="python (sandboxed) and the core calculator",
    )
    format: str | ComponentSpec = Field(
        default_factory=lambda: ComponentSpec(name="tags", tool_tags={"calculator": "calc"}),
        description="tool-call format; the default calls the calculator with <calc>...</calc>",
    )
    system_prompt: str | None = MATH_PROMPT
    max_turns: int = Field(4, ge=1, description="actions per episode at most")
    call_timeout_s: float = Field(60.0, gt=0, description="a call running longer fails with 'timeout'")
    few_shot: int = Field(
        0,
        ge=0,
        le=len(FEW_SHOT),
        description="worked examples (python call, result, answer) as earlier turns",
    )


class MathEnv(_SandboxedEnv):
    """Grade-school math with sandboxed Python and the calculator (see the module docstring)."""

    name = "math"
    Config = MathEnvConfig
    config: MathEnvConfig

    def few_shot_messages(self) -> list[dict[str, Any]]:
        """The worked examples as messages written by the format itself (question, python call,
        its result, answer); empty without the python tool or with a format that cannot write calls.
        Small models follow demonstrations given as real turns far better than described ones."""
        if "python" not in self.tools or not self.config.few_shot:
            return []
        messages: list[dict[str, Any]] = []
        for index, (question, code, answer) in enumerate(FEW_SHOT[: self.config.few_shot]):
            call = ToolCall(id=f"example-{index}", name="python", arguments={"code": code})
            try:
                written_call = self.format.render_call(call, self.tool_classes)
                written_answer = self.format.render_answer(answer)
            except NotImplementedError:
                return []  # a format that cannot write calls gets no examples
            result = ToolResult(call_id=call.id, name="python", content=f"stdout:\n{answer}")
            messages.append({"role": "user", "content": question})
            messages.append({"role": "assistant", "content": written_call})
            messages.extend(self.format.render_results([result]))
            messages.append({"role": "assistant", "content": written_answer})
        return messages


__all__ = ["CODE_PROMPT", "MATH_PROMPT", "CodeEnv", "MathEnv"]
