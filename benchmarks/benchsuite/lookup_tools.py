"""The tools of the ``tools`` section (given to ``ToolEnv`` by Python path): a lookup that waits like
a slow service, written once as a plain function and once with ``async def``."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from pydantic import Field

from agent_r1.contracts import ComponentConfig, Tool
from benchsuite.codebook import CALLS
from benchsuite.tasks import code_of


class _LookupArguments(Tool.Arguments):
    key: str = Field(description="the key to look up")


class SlowLookup(Tool):
    """A synchronous tool that sleeps ``latency_s`` (a blocking client of a slow service); runs in
    the tool runner's worker threads."""

    name = "slow_lookup"
    description = "Look up the code stored under a key."
    Arguments = _LookupArguments

    class Config(ComponentConfig):
        latency_s: float = Field(0.2, ge=0.0, description="seconds each call sleeps")

    config: Config

    def run(self, arguments: Any) -> str:
        started = time.perf_counter()
        time.sleep(self.config.latency_s)
        CALLS.append((started, time.perf_counter()))
        return f"code {code_of(arguments.key)}"


class AsyncSlowLookup(SlowLookup):
    """The same tool written with ``async def run`` (an asyncio client); runs on the event loop."""

    name = "async_slow_lookup"

    async def run(self, arguments: Any) -> str:  # type: ignore[override]
        started = time.perf_counter()
        await asyncio.sleep(self.config.latency_s)
        CALLS.append((started, time.perf_counter()))
        return f"code {code_of(arguments.key)}"
