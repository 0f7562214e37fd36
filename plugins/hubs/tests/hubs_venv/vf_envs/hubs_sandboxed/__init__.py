"""A verifiers 0.4 environment agent-r1 cannot play (the hubs tests check that ``agent-r1 check``
refuses it and says why): its task needs a container, its setup and one reward need a runtime,
and a ``@vf.stop`` acts on the model's responses."""

from __future__ import annotations

import verifiers.v1 as vf


class BoxTask(vf.Task[vf.TaskData]):
    NEEDS_CONTAINER = True

    async def setup(self, trace: vf.Trace, runtime: vf.Runtime) -> None:
        await runtime.run(["true"], {})

    @vf.reward
    async def tests_pass(self, trace: vf.Trace, runtime: vf.Runtime) -> float:
        return 1.0

    @vf.stop
    async def refused(self, response: vf.Response) -> bool:
        return False


class BoxTaskset(vf.Taskset[BoxTask, vf.TasksetConfig]):
    def load(self) -> list[BoxTask]:
        return [BoxTask(vf.TaskData(prompt="Fix the bug."))]


__all__ = ["BoxTaskset"]
