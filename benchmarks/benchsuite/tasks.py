"""The tasks, shared by both arms of the ``trl`` section and by the scaling runs: plain data, so that
a subprocess in another environment (the TRL arm) rebuilds exactly the same list from the same
arguments."""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence
from typing import Any

from agent_r1.mdp import Message, Task

KEY_ALPHABET = "abcdefghjkmnpqrstuvwxyz"


def code_of(key: str) -> int:
    """The code :class:`CodeBook` stores under ``key``: three digits, fixed by the key."""
    return int(hashlib.sha1(key.encode("utf-8")).hexdigest()[:6], 16) % 900 + 100


def tool_call_message(key: str) -> Message:
    """An assistant message calling ``lookup(key)`` (the chat template writes it as Hermes)."""
    call = {"type": "function", "function": {"name": "lookup", "arguments": {"key": key}}}
    return {"role": "assistant", "content": "", "tool_calls": [call]}


def _tool_task_request(keys: Sequence[str]) -> str:
    return f"Look up the codes of {keys[0]} and {keys[1]}, one call each, then say done."


ONE_SHOT_KEYS = ("zq4", "mm2")
ONE_SHOT: list[Message] = [
    {"role": "user", "content": _tool_task_request(ONE_SHOT_KEYS)},
    tool_call_message(ONE_SHOT_KEYS[0]),
    {"role": "tool", "name": "lookup", "content": f"code {code_of(ONE_SHOT_KEYS[0])}"},
    tool_call_message(ONE_SHOT_KEYS[1]),
    {"role": "tool", "name": "lookup", "content": f"code {code_of(ONE_SHOT_KEYS[1])}"},
    {"role": "assistant", "content": "done"},
]
"""The tool task's worked example, put before every request: SmolLM2-135M-Instruct writes no tool
call without one."""

FILLER = [
    *("river", "stone", "cloud", "lamp", "seven", "orange", "garden", "window", "paper", "bridge"),
    *("quiet", "candle", "silver", "forest", "number", "table", "winter", "market", "yellow", "engine"),
]


def make_tasks(kind: str, count: int, seed: int, *, prompt_words: int = 0) -> list[dict[str, Any]]:
    """``count`` tasks of ``kind`` as plain dicts (``id``, ``messages``, ``answer``, ``metadata``):

    * ``single``: "What is a + b?" (two-digit numbers), answered in one turn;
    * ``tools``: the :class:`CodeBook` task, after the worked example :data:`ONE_SHOT`;
    * ``turns``: "Write numbers." after ``prompt_words`` filler words, for the scaling runs (the
      environment keeps the episode going until ``max_turns``).
    """
    rng = random.Random(f"{kind}-{seed}")
    tasks = []
    for index in range(count):
        metadata: dict[str, Any] = {}
        if kind == "single":
            a, b = rng.randint(10, 99), rng.randint(10, 99)
            messages: list[Message] = [
                {"role": "user", "content": f"What is {a} + {b}? Reply with the number."}
            ]
            answer: Any = str(a + b)
        elif kind == "tools":
            keys: list[str] = []
            while len(keys) < 2:
                key = "".join(rng.choice(KEY_ALPHABET) for _ in range(2)) + str(rng.randint(1, 9))
                if key not in keys and key not in ONE_SHOT_KEYS:
                    keys.append(key)
            messages = [*ONE_SHOT, {"role": "user", "content": _tool_task_request(keys)}]
            answer = " ".join(str(code_of(key)) for key in keys)
            metadata = {"keys": keys}
        elif kind == "turns":
            filler = " ".join(rng.choice(FILLER) for _ in range(prompt_words))
            messages = [{"role": "user", "content": f"{filler}\nWrite numbers.".strip()}]
            answer = str(rng.randint(10, 99))
        else:
            raise ValueError(f"unknown task kind {kind!r} (single, tools, turns)")
        tasks.append(
            {"id": f"{kind}-{seed}-{index}", "messages": messages, "answer": answer, "metadata": metadata}
        )
    return tasks


def bench_tasks(
    split: str, kind: str = "single", count: int = 8, seed: int = 0, prompt_words: int = 0
) -> list[Task]:
    """The agent-r1 dataset (a Python-path dataset function) of :func:`make_tasks`."""
    return [Task(**task) for task in make_tasks(kind, count, seed, prompt_words=prompt_words)]
