"""Shared builders for the trainer tests: a tiny checkpoint on disk, a registry with the toy plugin,
and a run config for the toy task."""

from __future__ import annotations

import socket
import sys
from pathlib import Path
from typing import Any

import torch
import yaml

from agent_r1.mdp import RewardSignal, TokenSource, Trajectory
from agent_r1.testing.plugins import write_plugin_distribution
from agent_r1.testing.pytest_plugin import toy_registry, write_tiny_checkpoint

__all__ = [
    "fixed_trajectories",
    "toy_config",
    "toy_registry",
    "write_config",
    "write_tiny_checkpoint",
]


def toy_config(model_dir: Path, run_dir: Path, **sections: Any) -> dict[str, Any]:
    """A run config for the toy target-character task on the tiny model."""
    config: dict[str, Any] = {
        "seed": 0,
        "output_dir": str(run_dir),
        "model": {"path": str(model_dir)},
        "data": {"name": "toy_target", "num_train": 16, "num_eval": 4},
        "environment": {"name": "toy_single_turn"},
        "rollout": {
            "group_size": 4,
            "max_turns": 1,
            "max_new_tokens": 6,
            "max_context": 256,
            "temperature": 1.0,
        },
        "rewards": [{"name": "target_char", "weight": 1.0}],
        "algorithm": {"name": "grpo"},
        "trainer": {
            "steps": 4,
            "tasks_per_step": 4,
            "micro_batch_size": 8,
            "lr": 3e-2,
            "checkpoint_every": 1,
        },
        "eval": {"num_tasks": 4, "before_training": False},
        "trackers": [{"name": "jsonl"}],
    }
    for key, value in sections.items():
        if isinstance(value, dict) and isinstance(config.get(key), dict):
            config[key] = {**config[key], **value}
        else:
            config[key] = value
    return config


def write_config(path: Path, config: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return path


def fixed_trajectories(tokenizer: Any, count: int = 8, shared_prompt: int = 0) -> list[Trajectory]:
    """Hand-built scored trajectories: two groups with different rewards, varied lengths; with
    ``shared_prompt`` every prompt starts with the same that many tokens (a system prompt)."""
    generator = torch.Generator().manual_seed(0)
    vocab = len(tokenizer)
    common = torch.randint(5, vocab, (shared_prompt,), generator=generator).tolist()
    out = []
    for i in range(count):
        trajectory = Trajectory(
            id=f"t{i}", task_id=f"task{i // 4}", group_id=f"g{i // 4}", sample_index=i % 4
        )
        prompt = common + torch.randint(5, vocab, (10,), generator=generator).tolist()
        action = torch.randint(5, vocab, (3 + i % 4,), generator=generator).tolist()
        trajectory.append(TokenSource.PROMPT, 0, prompt)
        trajectory.append(TokenSource.POLICY, 0, action, [-1.0] * len(action))
        trajectory.append(TokenSource.ENV, 0, torch.randint(5, vocab, (4,), generator=generator).tolist())
        trajectory.append(TokenSource.POLICY, 1, action[:2], [-1.0, -1.0])
        trajectory.rewards.append(RewardSignal(name="answer_match", value=float(i % 3 == 0)))
        trajectory.rewards.append(RewardSignal(name="step", value=0.1 * (i % 2), kind="process", turn=0))
        out.append(trajectory)
    return out


# --------------------------------------------------------------------------------------------
# Runs in subprocesses (the CLI, torchrun launches)
# --------------------------------------------------------------------------------------------

PACING = """
import os, time
from agent_r1 import hookimpl

@hookimpl
def on_update_end(step, metrics):
    # Paces the run so that a kill lands mid-run whatever the machine's speed.
    time.sleep(float(os.environ.get("TOY_STEP_DELAY", "0")))
"""


def write_toy_plugin(root: Path) -> Path:
    """A distribution in ``root`` (put it on ``PYTHONPATH``) whose entry points are the toy plugin
    and a pacing observer (each update sleeps ``TOY_STEP_DELAY`` seconds), so that a subprocess
    discovers both."""
    write_plugin_distribution(
        root,
        "agent-r1-toy-plugin",
        files={"agent_r1_toy_pace.py": PACING},
        entry_points={"toy": "agent_r1.testing.toy", "toy_pace": "agent_r1_toy_pace"},
    )
    return root


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def torchrun(nproc: int, *args: str, port: int | None = None) -> list[str]:
    """The command that runs ``args`` on ``nproc`` local processes with torchrun."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc_per_node={nproc}",
        "--master_addr=127.0.0.1",
        f"--master_port={port or free_port()}",
        *args,
    ]


def process_tree(pid: int) -> list[int]:
    """``pid`` and every process below it (torchrun starts its workers in sessions of their own)."""
    import psutil

    return [child.pid for child in psutil.Process(pid).children(recursive=True)] + [pid]
