"""A short GRPO run whose tools are served by MCP servers, through ``agent_r1.run.training.train``
(the code behind ``agent-r1 train``): the notebook server over stdio (a process per episode) and the
same server over streamable HTTP on 127.0.0.1, both listing a ``note`` tool (so the agent sees
``local__note`` and ``remote__note``), the built-in arithmetic tasks, and a tiny model that calls
the first on its first turn and the second on its next (``noting_model``). A tiny model learns no
arithmetic in two steps, so nothing here asserts learning; the run must get through rollouts whose
calls really reach both servers, one session per episode, rewards, updates and checkpoints, and
leave no server behind.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from mcp_helpers import SERVER_SCRIPT, HttpServer, stdio_server

from agent_r1.testing.pytest_plugin import RolloutRecorder

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

STEPS = 2
TASKS_PER_STEP = 2
GROUP_SIZE = 2
TOOLS = ("local__note", "remote__note")


def environment(http: HttpServer) -> dict[str, Any]:
    return {
        "name": "mcp",
        "servers": [
            stdio_server("local", tools=["note"]),
            http.section("remote", tools=["note"]),
        ],
        "format": "tags",
        "max_turns": 2,
        "call_timeout_s": 20,
    }


def training_config(model_dir: Path, run_dir: Path, http: HttpServer) -> dict[str, Any]:
    return {
        "seed": 0,
        "output_dir": str(run_dir),
        "model": {"path": str(model_dir), "device": "cpu"},
        "data": {"name": "arithmetic", "num_train": 8, "num_eval": 2},
        "environment": environment(http),
        "rollout": {
            "group_size": GROUP_SIZE,
            "max_turns": 2,
            "max_new_tokens": 32,
            "max_context": 1536,
            "temperature": 1.0,
        },
        "rewards": [
            {"name": "answer_match", "weight": 1.0},
            {"name": "tool_call", "weight": 1.0, "only_if_answered": False, "max_rewarded_calls": 2},
        ],
        "algorithm": {"name": "grpo"},
        "trainer": {
            "steps": STEPS,
            "tasks_per_step": TASKS_PER_STEP,
            "micro_batch_size": 4,
            "lr": 1e-3,
            "checkpoint_every": 1,
        },
        "eval": {"num_tasks": 1, "before_training": False},
        "trackers": [{"name": "jsonl"}],
    }


@pytest.fixture(scope="module")
def http(tmp_path_factory: pytest.TempPathFactory) -> Any:
    server = HttpServer(tmp_path_factory.mktemp("mcp-http") / "server.log")
    yield server
    server.kill()


@pytest.fixture(scope="module")
def noting_model(tmp_path_factory: pytest.TempPathFactory, http: HttpServer) -> Path:
    """A tiny model directory whose policy writes ``<local__note>seen</local__note>`` on its first
    turn and ``<remote__note>seen</remote__note>`` after the first result.

    A random tiny model never writes a well-formed call, so its rollouts would never reach the
    servers. This one is that random model after 60 supervised steps on exactly those two turns of
    the real ``mcp`` episodes of arithmetic tasks (the tokens between the turns, result included,
    are taken from one scripted episode against the servers), given whole or cut to their last 24
    or 80 tokens. Sampled at temperature 1 it often writes the calls, sometimes garbled tags; it
    knows no arithmetic.
    """
    import random

    from agent_r1 import TokenSource
    from agent_r1.builtins.calculator import ArithmeticDataset
    from agent_r1.rollout.chat import ChatRenderer
    from agent_r1.testing import scripted_rollout
    from agent_r1.testing.models import completion_sft_step, save_tiny_model, tiny_model, tiny_tokenizer
    from agent_r1_plugin_mcp.env import McpEnv

    tokenizer = tiny_tokenizer()
    model = tiny_model(tokenizer, tie_word_embeddings=False, seed=0)
    renderer = ChatRenderer(tokenizer)
    options = {key: value for key, value in environment(http).items() if key != "name"}
    tasks = ArithmeticDataset({"num_train": 16, "num_eval": 1}).load("train")
    calls = [f"<{tool}>seen</{tool}>" for tool in TOOLS]
    [reference] = scripted_rollout(lambda: McpEnv(options), calls, tasks[0], tokenizer=tokenizer, max_turns=2)
    assert [r.content for s in reference.steps if s.observation for r in s.observation.tool_results] == [
        "saved note 1",
        "saved note 1",
    ]
    segments = reference.segments
    first, second = (i for i, seg in enumerate(segments) if seg.source is TokenSource.POLICY)
    turn_ids = [segments[first].token_ids, segments[second].token_ids]
    between = [token for seg in segments[first + 1 : second] for token in seg.token_ids]
    system = McpEnv(options).system_text()
    examples = []
    for task in tasks:
        prompt = renderer.render_prompt([{"role": "system", "content": system}, *task.messages], [])
        examples.append((prompt, turn_ids[0]))
        examples.append((prompt + turn_ids[0] + between, turn_ids[1]))
    rng = random.Random(0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model.train()
    for _ in range(60):
        # whole contexts and their tails: the call must follow the real context and its ending
        batch = [(p[-rng.choice((24, 80, len(p))) :], a) for p, a in rng.sample(examples, 8)]
        completion_sft_step(model, optimizer, batch, tokenizer.pad_token_id)
    return save_tiny_model(tmp_path_factory.mktemp("noting-model"), model.eval(), tokenizer)


@pytest.fixture
def recorder(agent_r1_rollout_recorder: RolloutRecorder) -> RolloutRecorder:
    return agent_r1_rollout_recorder


def stdio_server_processes() -> list[int]:
    """Pids of notebook servers started over stdio (no ``--http``) that are still running."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            command = (entry / "cmdline").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().split(")")[-1].split()[0]
        except (FileNotFoundError, ProcessLookupError):  # it exited between listing and reading
            continue
        if str(SERVER_SCRIPT).encode() in command and b"--http" not in command and state != "Z":
            found.append(int(entry.name))
    return found


def test_short_grpo_run_with_mcp_tools_over_stdio_and_http(
    noting_model: Path, http: HttpServer, recorder: RolloutRecorder, tmp_path: Path
) -> None:
    from transformers import AutoModelForCausalLM

    from agent_r1.engine.artifacts import checkpoint as ckpt
    from agent_r1.run.training import train

    run_dir = tmp_path / "run"
    config_path = tmp_path / "mcp.yaml"
    config_path.write_text(yaml.safe_dump(training_config(noting_model, run_dir, http)), encoding="utf-8")
    summary = train(config_path, [])

    # -- ran end to end: every step logged, checkpoints written --------------------------------------
    assert summary["steps"] == STEPS
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == list(range(1, STEPS + 1))
    checkpoints = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert checkpoints == [f"step_{step:06d}" for step in range(1, STEPS + 1)]
    for line in lines:
        assert line["tools/calls_mean"] > 0.0 and "reward/tool_call" in line
        assert line["rollout/env_error_rate"] == 0.0

    # -- the calls reached both servers, each episode with sessions of its own -------------------------
    trajectories = recorder.trajectories
    assert len(trajectories) == STEPS * TASKS_PER_STEP * GROUP_SIZE
    # the model was shown the tools it called: the prompt it was trained on names each of them
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(noting_model)
    for trajectory in trajectories:
        prompt = tokenizer.decode(trajectory.token_ids[: trajectory.prompt_length])
        assert all(f"- <{tool}>text</{tool}>" in prompt for tool in TOOLS), prompt
    served = dict.fromkeys(TOOLS, 0)
    for trajectory in trajectories:
        for tool in TOOLS:
            answers = [
                result.content
                for step in trajectory.steps
                if step.observation is not None
                for result in step.observation.tool_results
                if result.name == tool and result.ok
            ]
            # numbered from 1 in every episode: a fresh session (and notebook) per episode and server
            assert answers == [f"saved note {n}" for n in range(1, len(answers) + 1)], answers
            served[tool] += len(answers)
    assert all(count >= 2 for count in served.values()), served
    assert sum(t.metrics.get("tool_calls", 0) for t in trajectories) >= 4

    # -- the updates changed the policy, and no stdio server outlived its episode -----------------------
    before = AutoModelForCausalLM.from_pretrained(noting_model).state_dict()
    after = ckpt.load_checkpoint(run_dir / "checkpoints" / checkpoints[-1])["model"]
    assert [name for name, value in before.items() if not torch.equal(value, after[name])]
    assert stdio_server_processes() == []


def test_a_server_that_cannot_be_reached_stops_the_run_before_the_model_loads(
    noting_model: Path, http: HttpServer, tmp_path: Path
) -> None:
    from agent_r1.run.preflight import PreflightError
    from agent_r1.run.training import train

    config = training_config(noting_model, tmp_path / "run", http)
    config["environment"]["servers"] = [
        {"name": "local", "command": [str(SERVER_SCRIPT) + ".missing"]},
        {"name": "remote", "url": "http://127.0.0.1:9/mcp", "connect_timeout_s": 3},
    ]
    config_path = tmp_path / "broken.yaml"
    config_path.write_text(yaml.safe_dump(config), encoding="utf-8")
    with pytest.raises(PreflightError) as raised:
        train(config_path, [])
    message = str(raised.value)
    assert f"servers[0] 'local' (stdio: {SERVER_SCRIPT}.missing): command " in message
    assert "does not exist" in message
    assert "servers[1] 'remote' (http://127.0.0.1:9/mcp): cannot connect" in message
    assert not (tmp_path / "run").exists()
