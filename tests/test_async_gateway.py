"""Asynchronous rollouts through the policy gateway (``rollout.source: gateway`` with
``rollout.mode: async``): the rollout copy's own gateway over the backend replica, a weight push in
the middle of an episode reaching its next call (tokens, log-probabilities and recorded versions),
the version an agent program sees, and a short training run within the staleness bound.

The agent programs are written to a temporary folder: one with the ``openai`` client (the
fingerprint as the SDK exposes it), one with the standard library alone (fast to start, for the
training run's twelve episodes).
"""

from __future__ import annotations

import copy
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from trainer_helpers import toy_config

from agent_r1.config import RunConfig, validate_components
from agent_r1.engine import train_step
from agent_r1.engine.asynchrony import async_source, rollout_replica
from agent_r1.errors import AgentR1Error
from agent_r1.gateway.protocol import policy_fingerprint
from agent_r1.mdp import Trajectory
from agent_r1.rollout.generation import RolloutRequest

AGENT = '''
"""Two chat calls (the second after "Once more."); prints the system_fingerprint of each reply as
its answer. With GATE_DIR set, it writes GATE_DIR/between-<episode> after the first call and waits
for GATE_DIR/go before the second."""
import json, os, sys, time
from pathlib import Path

task = json.loads(os.environ["AGENT_R1_TASK"])
model = os.environ["AGENT_R1_MODEL"]
gate = os.environ.get("GATE_DIR")

if sys.argv[1] == "openai":
    import openai

    client = openai.OpenAI(max_retries=0)

    def chat(messages):
        reply = client.chat.completions.create(model=model, messages=messages, max_tokens=6)
        return reply.system_fingerprint, reply.choices[0].message
else:
    import urllib.request

    def chat(messages):
        body = json.dumps({"model": model, "messages": messages, "max_tokens": 6}).encode()
        request = urllib.request.Request(
            os.environ["OPENAI_BASE_URL"] + "/chat/completions", body, {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=60) as response:
            reply = json.load(response)
        return reply["system_fingerprint"], reply["choices"][0]["message"]

messages = list(task["messages"])
fingerprints = []
for turn in range(2):
    if turn:
        if gate:
            Path(gate, "between-" + os.environ["AGENT_R1_EPISODE_ID"]).touch()
            deadline = time.monotonic() + 60
            while not Path(gate, "go").exists():
                if time.monotonic() > deadline:
                    sys.exit("no go within 60 s")
                time.sleep(0.01)
        messages.append({"role": "user", "content": "Once more."})
    fingerprint, message = chat(messages)
    fingerprints.append(fingerprint)
    messages.append(message)
print(json.dumps({"answer": " ".join(fingerprints)}))
'''


def _config(model_dir: Path, tmp_path: Path, client: str, **rollout: Any) -> dict[str, Any]:
    script = tmp_path / "two_calls_agent.py"
    script.write_text(AGENT)
    agent = {"command": [sys.executable, str(script), client], "timeout_s": 120, "env": {}}
    return toy_config(
        model_dir,
        tmp_path / "run",
        rollout={
            "group_size": 2,
            "max_new_tokens": 6,
            "source": "gateway",
            "agent": agent,
            "mode": "async",
            "max_staleness": 1,
            **rollout,
        },
        trainer={"steps": 3, "tasks_per_step": 2, "micro_batch_size": 4, "lr": 3e-2, "checkpoint_every": 0},
        eval={"num_tasks": 2, "before_training": False},
    )


def _session(config: dict[str, Any], registry: Any) -> Any:
    from agent_r1.engine.session import build_session
    from agent_r1.gateway.training import GatewaySource

    run = RunConfig.model_validate(config)
    components = validate_components(run, registry)
    return build_session(run, components, Path(run.output_dir), registry=registry, source=GatewaySource)


def _gateway_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("agent-r1-gateway")]


def _seen_versions(trajectory: Trajectory) -> list[int]:
    """The versions the agent program saw, from the fingerprints it printed as its answer."""
    answer = trajectory.steps[-1].action.answer or ""
    return [int(f.removeprefix("agent-r1-policy-v")) for f in answer.split()]


def _turn_of_tokens(trajectories: list[Trajectory], like: torch.Tensor) -> torch.Tensor:
    """The turn index of every token of the collated batch ``[B, T]``."""
    turn = torch.zeros_like(like, dtype=torch.long)
    for row, trajectory in enumerate(trajectories):
        position = 0
        for segment in trajectory.segments:
            turn[row, position : position + len(segment.token_ids)] = segment.turn
            position += len(segment.token_ids)
    return turn


def test_a_push_between_two_calls_of_an_episode_reaches_the_second_call(
    registry: Any, model_dir: Path, tmp_path: Path
) -> None:
    """The rollout copy's source, built as AsyncRollouts builds it, runs one task twice with the
    ``openai``-client agent; new weights are pushed while both episodes wait between their calls.
    The second calls then come from the new weights (their log-probabilities recomputed under the
    new model match, under the old one they do not), record version 1 on turn 1, and the agent saw
    the versions in ``system_fingerprint``. Closing the session stops the copy's gateway."""
    from agent_r1.engine.learner.batch import collate
    from agent_r1.engine.learner.packing import no_grad_logprobs

    gate = tmp_path / "gate"
    gate.mkdir()
    config = _config(model_dir, tmp_path, "openai")
    config["rollout"]["agent"]["env"] = {"GATE_DIR": str(gate)}
    session = _session(config, registry)
    try:
        backend, weights = rollout_replica(session.backend, session.step)
        source = async_source(session.source, backend, weights)
        gateway = source.own_gateway
        assert gateway.backend is backend and gateway.weights is weights and gateway.url is not None
        assert session.gateway is None  # the session's gateway (evaluation) is another one, not started
        old = copy.deepcopy(session.unwrapped)
        new = copy.deepcopy(session.unwrapped)
        generator = torch.Generator().manual_seed(5)
        with torch.no_grad():
            for parameter in new.parameters():
                parameter.add_(0.3 * torch.randn(parameter.shape, generator=generator))

        assert session.stream is not None
        request = RolloutRequest(session.stream.take(1), 2, seed=3, temperature=1.0, salt="s0")
        out: dict[str, Any] = {}

        def roll_out() -> None:
            try:
                out["trajectories"] = source.rollout(request)
            except BaseException as exc:  # handed to the test's thread
                out["error"] = exc

        thread = threading.Thread(target=roll_out)
        thread.start()
        deadline = time.monotonic() + 60
        while len(list(gate.glob("between-*"))) < 2 and thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(list(gate.glob("between-*"))) == 2, out
        weights.push(new, 1)  # the trainer finished update 1 while both episodes wait
        (gate / "go").touch()
        thread.join(60)
        assert "error" not in out, out
        trajectories: list[Trajectory] = out["trajectories"]
        assert len(trajectories) == 2 and not any(t.errors for t in trajectories)
        for trajectory in trajectories:
            assert trajectory.turn_versions == {0: 0, 1: 1} and trajectory.versions() == [0, 1]
            assert _seen_versions(trajectory) == [0, 1]
        assert weights.version == 1 and weights.applied == 1

        batch = collate(trajectories, session.pad_id)
        turn = _turn_of_tokens(trajectories, batch.loss_mask)
        first, second = batch.loss_mask & (turn == 0), batch.loss_mask & (turn == 1)
        assert first.any() and second.any()
        under_old = no_grad_logprobs(old, batch, 1.0, 8)
        under_new = no_grad_logprobs(new, batch, 1.0, 8)
        assert (under_old - batch.rollout_logprobs)[first].abs().max() < 1e-4
        assert (under_new - batch.rollout_logprobs)[second].abs().max() < 1e-4
        assert (under_old - batch.rollout_logprobs)[second].abs().max() > 1e-2  # not the old weights'
    finally:
        session.close()
    assert _gateway_threads() == []  # the copy's gateway stopped with the session's source
    with pytest.raises(AgentR1Error, match="was closed"):
        source.rollout(request)


def test_a_gateway_without_a_weights_guard_shows_its_backends_version_and_records_none(
    tiny_tokenizer: Any,
) -> None:
    """Sync mode and ``serve-policy``: the fingerprint is the backend's ``policy_version`` (what the
    trainer's weight sync sets), in responses and stream chunks alike, and the trajectories keep
    ``turn_versions`` empty (every turn is the episode's ``policy_version``)."""
    import json

    import httpx
    from gateway_helpers import start_gateway

    from agent_r1.testing.models import tiny_model

    gateway, backend = start_gateway(tiny_model(tiny_tokenizer, seed=1), tiny_tokenizer)
    try:
        url = gateway.episode_url("e1") + "/chat/completions"
        body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
        first = httpx.post(url, json=body, timeout=30).json()
        assert first["system_fingerprint"] == policy_fingerprint(0) == "agent-r1-policy-v0"
        backend.sync_weights(backend.model, 4)
        streamed = httpx.post(url, json={**body, "stream": True}, timeout=30).text
        chunks = [json.loads(line[6:]) for line in streamed.splitlines() if line[6:].startswith("{")]
        assert chunks and {c["system_fingerprint"] for c in chunks} == {"agent-r1-policy-v4"}
        completion = httpx.post(
            gateway.url + "/episodes/e2/v1/completions", json={"model": "tiny", "prompt": "hi"}, timeout=30
        ).json()
        assert completion["system_fingerprint"] == "agent-r1-policy-v4"
        finished = httpx.post(gateway.url + "/episodes/e1/finish", json={}, timeout=30).json()
        # the same messages twice: two segments, neither with versions of its own
        assert [t["turn_versions"] for t in finished["trajectories"]] == [{}, {}]
    finally:
        gateway.stop()


def test_async_gateway_training_stays_within_the_bound_and_loses_nothing(
    registry: Any, model_dir: Path, tmp_path: Path
) -> None:
    """Three steps at ``max_staleness: 1`` with the standard-library agent: every step trains all
    ``tasks_per_step x group_size`` episodes, each with a version per call that the agent saw
    too, none more than one update behind."""
    session = _session(_config(model_dir, tmp_path, "urllib"), registry)
    try:
        for update in range(3):
            result = train_step(session)
            metrics = result.metrics
            assert metrics["async/staleness_max"] <= 1
            assert result.failed == [] and metrics["errors/failed_episodes"] == 0
            assert len(result.trajectories) == 2 * 2 == metrics["gateway/episodes"]
            assert metrics["gateway/calls"] == 8
            for trajectory in result.trajectories:
                versions = trajectory.versions()
                assert sorted(trajectory.turn_versions) == [0, 1]
                assert _seen_versions(trajectory) == versions  # what the agent saw is what was recorded
                assert update - 1 <= versions[0] <= versions[1] <= update
        assert session.gateway is None  # training went through the rollout copy's gateway only
    finally:
        session.close()
    assert _gateway_threads() == []
