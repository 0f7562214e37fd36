"""A small verifiers 0.4 (v1) environment for the hubs tests: arithmetic questions, a notebook
tool server per rollout and a calculator server shared by the taskset's rollouts, both keeping
what they did in the rollout's shared state, two weighted rewards and a stop.

It is what an environment installed from the Environments Hub looks like (a package exporting its
``Taskset`` through ``__all__``), kept in the tests because the Hub cannot be reached offline: the
tests put this folder on ``sys.path`` and load it by id, ``hubs-notebook-arith``, exactly as
``vf-eval hubs-notebook-arith`` would.
"""

from __future__ import annotations

import verifiers.v1 as vf


class ArithData(vf.TaskData):
    answer: str
    """The reference answer."""
    broken: bool = False
    """Make ``Task.setup`` raise (the tests' failing environment)."""


class NotebookState(vf.State):
    notes: list[str] = []
    additions: int = 0


class NotebookToolset(vf.Toolset[vf.ToolsetConfig, NotebookState]):
    TOOL_PREFIX = "notebook"

    @vf.tool
    def note(self, text: str) -> str:
        """Write a note in the notebook."""
        self.state.notes.append(text)
        return f"saved note {len(self.state.notes)}"


class CalcToolset(vf.Toolset[vf.SharedToolsetConfig, NotebookState]):
    TOOL_PREFIX = "calc"

    @vf.tool
    def add(self, a: int, b: int) -> int:
        """Add two integers."""
        self.state.additions += 1
        return a + b


class ArithTaskConfig(vf.TaskConfig):
    tools: vf.ToolsetConfig = vf.ToolsetConfig()


class ArithTask(vf.Task[ArithData, NotebookState, ArithTaskConfig]):
    @classmethod
    def toolsets(cls, config: ArithTaskConfig) -> list[vf.Toolset]:
        return [NotebookToolset(config.tools)]

    async def setup(self, trace: vf.Trace) -> None:
        if self.data.broken:
            raise RuntimeError(f"task {self.data.idx} cannot be set up")

    @vf.reward(weight=1.0)
    async def correct(self, trace: vf.Trace) -> float:
        return 1.0 if self.data.answer in trace.last_reply else 0.0

    @vf.reward(weight=0.5)
    async def took_notes(self, trace: vf.Trace) -> float:
        return min(len(trace.state.notes), 2) / 2

    @vf.stop
    async def notebook_full(self, trace: vf.Trace) -> bool:
        return len(trace.state.notes) >= 2


class ArithConfig(vf.TasksetConfig):
    num_tasks: int = 8
    broken_every: int = 0
    """Every n-th task (n > 0) has a ``setup`` that raises."""
    task: ArithTaskConfig = ArithTaskConfig()


class ArithTaskset(vf.Taskset[ArithTask, ArithConfig]):
    @classmethod
    def toolsets(cls, config: ArithConfig) -> list[vf.Toolset]:
        return [CalcToolset(vf.SharedToolsetConfig())]

    def load(self) -> list[ArithTask]:
        tasks = []
        for i in range(self.config.num_tasks):
            a, b = 3 + i, 4 + 2 * i
            broken = (
                self.config.broken_every > 0 and i % self.config.broken_every == self.config.broken_every - 1
            )
            data = ArithData(
                id=f"arith-{i}",
                prompt=f"What is {a} + {b}? Take a note, then answer.",
                system_prompt="You are a careful calculator.",
                answer=str(a + b),
                broken=broken,
            )
            tasks.append(ArithTask(data, self.config.task))
        return tasks


__all__ = ["ArithTaskset"]
