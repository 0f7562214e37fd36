"""Shared builders for the policy gateway tests: a backend that keeps what it sampled, a tiny model
taught to call a tool, a gateway on 127.0.0.1, and the agent programs of ``gateway_agent.py``."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from agent_r1.builtins.formats import HermesFormat
from agent_r1.builtins.hf_backend import HFBackend
from agent_r1.contracts import Generation, SamplingParams
from agent_r1.gateway.launcher import AgentLauncher, AgentOutcome
from agent_r1.gateway.server import GatewaySettings, PolicyGateway
from agent_r1.mdp import Task, TokenSource, Trajectory

AGENT = Path(__file__).with_name("gateway_agent.py")
QUESTION = "What is 2+3?"
TOOL_CALL_TEXT = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "2+3"}}\n</tool_call>'
FINAL_TEXT = "The answer is 5."


class RecordingBackend(HFBackend):
    """The real ``hf`` backend, which also keeps every prompt it was given and what it sampled, so
    that tests can compare the gateway's trajectories with the backend's own record."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.record: list[tuple[list[int], Generation]] = []

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        sampling: SamplingParams,
        *,
        max_new_tokens: Sequence[int] | None = None,
    ) -> list[Generation]:
        generations = super().generate(prompts, sampling, max_new_tokens=max_new_tokens)
        for prompt, generation in zip(prompts, generations, strict=True):
            copy = Generation(
                list(generation.token_ids),
                list(generation.logprobs),
                generation.finish_reason,
                generation.stop_sequence,
            )
            self.record.append((list(prompt), copy))
        return generations


def start_gateway(model: Any, tokenizer: Any, **settings: Any) -> tuple[PolicyGateway, RecordingBackend]:
    """A standalone gateway over a recording ``hf`` backend, serving on a free port of 127.0.0.1."""
    backend = RecordingBackend({}, model=model, tokenizer=tokenizer)
    options = {"served_model_name": "tiny", "max_new_tokens": 40, "max_context": 1024, **settings}
    gateway = PolicyGateway(
        backend, tokenizer, HermesFormat({"answer_tag": None}), GatewaySettings(**options)
    )
    gateway.start()
    return gateway, backend


def teach_tool_calls(model: Any, tokenizer: Any, steps: int = 200) -> Any:
    """Fine-tune the tiny model on one calculator episode until greedy decoding reproduces it: the
    call ``TOOL_CALL_TEXT`` after the question, ``FINAL_TEXT`` after the tool's result. The prompts
    are rendered exactly as the gateway renders them (hermes tools through the chat template), so
    the model's own sampled text then holds a real tool call for the gateway to parse."""
    from agent_r1.gateway.tools import ToolRendering
    from agent_r1.rollout.chat import ChatRenderer

    sys.path.insert(0, str(AGENT.parent))
    from gateway_agent import CALCULATOR, SYSTEM

    renderer = ChatRenderer(tokenizer)
    rendering = ToolRendering(renderer, HermesFormat({"answer_tag": None}))
    conversation = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}]
    first, tools = rendering.template_input(conversation, [CALCULATOR])
    prompt = renderer.render_prompt(first, tools)
    call = renderer.encode(TOOL_CALL_TEXT) + renderer.end_of_turn_ids
    follow = renderer.render_observation(
        [{"role": "tool", "content": "5"}], action_ids=call, finish_reason="eos"
    )
    assert follow is not None
    answer = renderer.encode(FINAL_TEXT) + renderer.end_of_turn_ids
    sequence = [*prompt, *call, *follow.token_ids, *answer]
    targets = torch.full((len(sequence),), -100)
    start = len(prompt)
    targets[start : start + len(call)] = torch.tensor(call)
    targets[len(sequence) - len(answer) :] = torch.tensor(answer)
    ids = torch.tensor([sequence])
    optimizer = torch.optim.Adam(model.parameters(), lr=5e-3)
    model.train()
    for _ in range(steps):
        logits = model(input_ids=ids).logits[0, :-1]
        loss = torch.nn.functional.cross_entropy(logits, targets[1:].to(logits.device), ignore_index=-100)
        if loss.item() < 2e-3:  # memorised: greedy decoding reproduces both turns
            break
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
    return model


def run_agents(
    gateway: PolicyGateway, mode: str, tasks: Sequence[Task], *, timeout_s: float = 120.0
) -> list[tuple[Any, AgentOutcome]]:
    """Open one episode per task, run ``gateway_agent.py MODE`` for each (concurrently, through the
    real launcher), and return ``(episode, outcome)`` pairs."""
    from agent_r1.config import AgentProgramConfig

    assert gateway.url is not None
    config = AgentProgramConfig(command=[sys.executable, str(AGENT), mode], timeout_s=timeout_s)
    launcher = AgentLauncher(config, model_name=gateway.settings.served_model_name, gateway_url=gateway.url)
    episodes = [gateway.recorder.open(task=task) for task in tasks]
    jobs = [
        (episode.id, gateway.episode_url(episode.id), task)
        for episode, task in zip(episodes, tasks, strict=True)
    ]
    outcomes = asyncio.run(launcher.run_many(jobs))
    return list(zip(episodes, outcomes, strict=True))


def calls_of(
    trajectory: Trajectory, record: list[tuple[list[int], Generation]]
) -> list[tuple[list[int], Generation]]:
    """The backend calls whose prompt and completion are exactly a prefix of ``trajectory`` ending
    with one of its policy segments, in order (what the trajectory claims was sampled)."""
    tokens = trajectory.token_ids
    ends, position = set(), 0
    for segment in trajectory.segments:
        position += len(segment.token_ids)
        if segment.source is TokenSource.POLICY:
            ends.add(position)
    found = []
    for prompt, generation in record:
        context = [*prompt, *generation.token_ids]
        if len(context) in ends and tokens[: len(context)] == context:
            found.append((prompt, generation))
    return sorted(found, key=lambda item: len(item[0]))
