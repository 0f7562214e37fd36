"""The policy gateway end to end: a real server on 127.0.0.1, a real tiny model behind the ``hf``
backend, agent programs written with the official ``openai`` client in subprocesses.

Fidelity is checked against the backend's own record of what it was asked and what it sampled
(:class:`gateway_helpers.RecordingBackend`): every trajectory must be, token for token, the prompt
the backend got followed by the tokens it sampled, call after call, with the sampled tokens (and
only them) carrying loss and their sampling log-probabilities, which the model itself must
reproduce in one forward pass.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import torch
from gateway_helpers import (
    FINAL_TEXT,
    QUESTION,
    TOOL_CALL_TEXT,
    calls_of,
    run_agents,
    start_gateway,
)

from agent_r1.contracts import SamplingParams
from agent_r1.engine.learner.batch import policy_forward
from agent_r1.mdp import Task, TokenSource, Trajectory, load_trajectories


def _decode(tokenizer: Any, ids: list[int]) -> str:
    return str(tokenizer.decode(ids, skip_special_tokens=False))


def _assert_faithful(trajectory: Trajectory, record: list[Any], model: Any | None = None) -> list[Any]:
    """``trajectory`` is exactly the backend's prompts and samples, call after call: returns those
    calls. Only sampled tokens carry loss; their log-probabilities are the backend's (and, given
    ``model``, the model's own in one forward pass over the whole trajectory)."""
    calls = calls_of(trajectory, record)
    assert len(calls) == len(trajectory.steps) >= 1
    tokens, mask, logprobs = trajectory.token_ids, trajectory.loss_mask, trajectory.logprobs
    sampled: set[int] = set()
    for prompt, generation in calls:
        span = range(len(prompt), len(prompt) + len(generation.token_ids))
        assert tokens[: len(prompt)] == prompt
        assert [tokens[i] for i in span] == generation.token_ids
        assert [logprobs[i] for i in span] == generation.logprobs
        sampled.update(span)
    assert {i for i, m in enumerate(mask) if m} == sampled
    assert calls[-1][0] + calls[-1][1].token_ids == tokens  # nothing after the last sample
    for step, (_, generation) in zip(trajectory.steps, calls, strict=True):
        assert step.action.token_ids == generation.token_ids
    if model is not None:
        ids = torch.tensor([tokens])
        with torch.no_grad():
            recomputed = policy_forward(model, ids, torch.ones_like(ids, dtype=torch.bool)).logprobs[0]
        for i in sampled:
            assert abs(float(recomputed[i]) - logprobs[i]) < 1e-4, i
    return calls


# --------------------------------------------------------------------------------------------
# Token fidelity with real agent programs
# --------------------------------------------------------------------------------------------


def test_react_agent_trajectory_is_exactly_what_the_backend_sampled(gateway: Any, tool_model: Any) -> None:
    gateway, backend = gateway
    model, tokenizer = tool_model
    task = Task(id="calc", messages=[{"role": "user", "content": QUESTION}], answer=5)
    [(episode, outcome)] = run_agents(gateway, "react", [task])
    assert outcome.error is None, outcome.stderr_tail
    [trajectory] = gateway.recorder.finish(episode, answer=outcome.answer, termination=outcome.termination)

    # The model's own sampled text held a tool call; the agent got it as OpenAI tool_calls, ran its
    # calculator and sent the result back; the model then answered.
    first, last = trajectory.steps[0].action, trajectory.steps[-1].action
    assert first.text == TOOL_CALL_TEXT
    assert [(c.name, c.arguments) for c in first.tool_calls] == [("calculator", {"expression": "2+3"})]
    observation = trajectory.steps[0].observation
    assert observation is not None and [r.content for r in observation.tool_results] == ["5"]
    assert "tool calls ['calculator']" in outcome.stderr_tail
    assert outcome.answer == last.answer == FINAL_TEXT

    calls = _assert_faithful(trajectory, backend.record, model)
    assert len(calls) == 2
    # Between the two samples: the closure of the assistant turn and the next header (template
    # tokens) around the tool's result (environment tokens), none of them trained on.
    between = [s for s in trajectory.segments if s.turn == 0 and s.source is not TokenSource.POLICY][1:]
    between += [s for s in trajectory.segments if s.turn == 1 and s.source is TokenSource.TEMPLATE]
    assert [s.source for s in between] == [TokenSource.TEMPLATE, TokenSource.ENV, TokenSource.TEMPLATE]
    env = next(s for s in between if s.source is TokenSource.ENV)
    assert _decode(tokenizer, env.token_ids) == "<|im_start|>tool\n5<|im_end|>\n"
    assert trajectory.metrics["template_drift_tokens"] == 0.0  # this template re-renders it alike
    assert trajectory.metrics["gateway_segments"] == 1.0 and trajectory.termination == "agent_done"


def test_an_agent_that_rewrites_its_history_gets_separate_faithful_segments(
    gateway: Any, tool_model: Any
) -> None:
    gateway, backend = gateway
    model, tokenizer = tool_model
    task = Task(id="chat", messages=[{"role": "user", "content": "Hello there."}])
    [(episode, outcome)] = run_agents(gateway, "rewrite", [task])
    assert outcome.error is None, outcome.stderr_tail
    trajectories = gateway.recorder.finish(episode, answer=outcome.answer, termination=outcome.termination)

    assert [t.id for t in trajectories] == [episode.trajectory_id, f"{episode.trajectory_id}~seg1"]
    for trajectory in trajectories:
        assert len(_assert_faithful(trajectory, backend.record, model)) == 2
        assert trajectory.steps[-1].action.answer == outcome.answer
        assert trajectory.metrics["gateway_segments"] == 2.0
    before, after = (_decode(tokenizer, t.token_ids) for t in trajectories)
    assert "Hello there." in before and "Summary" not in before
    assert "Summary: we talked." in after and "Hello there." not in after
    assert [t.termination for t in trajectories] == ["superseded", "agent_done"]
    assert len(backend.record) == 4  # each sample is in exactly one segment


def test_concurrent_episodes_are_batched_and_kept_apart(tool_model: Any) -> None:
    gateway, backend = start_gateway(*tool_model, batch_wait_s=0.5)
    try:
        episodes = [gateway.recorder.open() for _ in range(4)]
        barrier = threading.Barrier(len(episodes))
        errors: list[BaseException] = []

        def agent(index: int) -> None:
            try:
                client = openai.OpenAI(
                    base_url=gateway.episode_url(episodes[index].id), api_key="x", max_retries=0
                )
                messages: list[Any] = [{"role": "user", "content": f"Episode number {index}."}]
                for _ in range(2):
                    barrier.wait()
                    reply = client.chat.completions.create(model="tiny", messages=messages, max_tokens=5)
                    messages += [reply.choices[0].message, {"role": "user", "content": f"More {index}."}]
            except BaseException as exc:  # re-raised in the test thread below
                errors.append(exc)

        threads = [threading.Thread(target=agent, args=(i,)) for i in range(len(episodes))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        assert not errors, errors
        assert gateway.scheduler.stats["max_batch"] >= 2  # concurrent calls went to the backend together
        _, tokenizer = tool_model
        for index, episode in enumerate(episodes):
            [trajectory] = gateway.recorder.finish(episode)
            _assert_faithful(trajectory, backend.record)
            text = _decode(tokenizer, trajectory.token_ids)
            assert f"Episode number {index}." in text and f"More {index}." in text
            assert all(f"number {other}." not in text for other in range(4) if other != index)
    finally:
        gateway.stop()


def test_completions_with_token_prompts_extend_one_segment(gateway: Any, tool_model: Any) -> None:
    gateway, backend = gateway
    _, tokenizer = tool_model
    episode = gateway.recorder.open()
    url = f"{gateway.episode_url(episode.id)}/completions"
    prompt = tokenizer.encode("The quick brown fox", add_special_tokens=False)
    first = httpx.post(url, json={"model": "tiny", "prompt": prompt, "max_tokens": 4, "logprobs": 0}).json()
    sampled = backend.record[-1][1]
    assert first["choices"][0]["logprobs"]["token_logprobs"] == sampled.logprobs
    follow = [*prompt, *sampled.token_ids, *tokenizer.encode(" and the dog", add_special_tokens=False)]
    httpx.post(url, json={"model": "tiny", "prompt": follow, "max_tokens": 4}).raise_for_status()
    [trajectory] = gateway.recorder.finish(episode)
    _assert_faithful(trajectory, backend.record)
    assert [s.source for s in trajectory.segments] == [
        TokenSource.PROMPT,
        TokenSource.POLICY,
        TokenSource.ENV,
        TokenSource.POLICY,
    ]
    assert _decode(tokenizer, trajectory.segments[2].token_ids) == " and the dog"


# --------------------------------------------------------------------------------------------
# The OpenAI surface: streaming, errors, episode endpoints
# --------------------------------------------------------------------------------------------


def test_streaming_gives_the_same_reply_in_chunks(gateway: Any) -> None:
    gateway, _ = gateway
    from gateway_agent import CALCULATOR

    client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="x", max_retries=0)
    messages = [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": QUESTION},
    ]
    plain = client.chat.completions.create(model="tiny", messages=messages, tools=[CALCULATOR], temperature=0)
    stream = client.chat.completions.create(
        model="tiny",
        messages=messages,
        tools=[CALCULATOR],
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    calls = [call for c in chunks if c.choices for call in c.choices[0].delta.tool_calls or []]
    assert plain.choices[0].finish_reason == "tool_calls"
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [
        (plain.choices[0].message.tool_calls[0].function.name, {"expression": "2+3"})
    ]
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    assert (
        chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == plain.usage.completion_tokens
    )

    messages = [{"role": "user", "content": "Tell me a story."}]
    plain = client.chat.completions.create(model="tiny", messages=messages, temperature=0, max_tokens=12)
    pieces = [
        c.choices[0].delta.content
        for c in client.chat.completions.create(
            model="tiny", messages=messages, temperature=0, max_tokens=12, stream=True
        )
        if c.choices and c.choices[0].delta.content
    ]
    assert len(pieces) > 1 and "".join(pieces) == plain.choices[0].message.content


@pytest.mark.parametrize(
    ("body", "param", "words"),
    [
        ({"n": 2, "logit_bias": {"5": 1.0}}, "n", ["n, logit_bias", "one completion per call"]),
        ({"frobnicate": True}, "frobnicate", ["unrecognized request argument", "frobnicate"]),
        ({"model": "gpt-4o"}, "model", ["'gpt-4o' does not exist", "'tiny'"]),
        ({"presence_penalty": 0.5}, "presence_penalty", ["presence_penalty=0.5"]),
        ({"top_logprobs": 3, "logprobs": True}, "top_logprobs", ["top_logprobs"]),
        ({"response_format": {"type": "json_object"}}, "response_format", ["unconstrained"]),
        (
            {"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": {"type": "function"}},
            "tool_choice",
            ["cannot be forced"],
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
            "messages[0].content[0]",
            ["'image_url' are not supported"],
        ),
        ({"messages": [{"role": "function", "content": "x"}]}, "messages[0].role", ["'function'"]),
        ({"temperature": 3}, "temperature", ["temperature"]),
    ],
)
def test_requests_the_gateway_cannot_serve_get_an_openai_400_naming_the_parameter(
    gateway: Any, body: dict[str, Any], param: str, words: list[str]
) -> None:
    gateway, backend = gateway
    request = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], **body}
    response = httpx.post(f"{gateway.url}/v1/chat/completions", json=request)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param
    for word in words:
        assert word in error["message"]
    assert backend.record == []  # refused before anything was generated


def test_other_refusals(gateway: Any, tool_model: Any) -> None:
    gateway, _ = gateway
    post = httpx.post
    bad_json = post(f"{gateway.url}/v1/chat/completions", content=b"{not json")
    assert bad_json.status_code == 400 and "not valid JSON" in bad_json.json()["error"]["message"]
    echo = post(
        f"{gateway.url}/v1/completions", json={"model": "tiny", "prompt": "a", "echo": True, "best_of": 3}
    )
    assert echo.status_code == 400 and echo.json()["error"]["message"].count("echo") >= 1
    assert "best_of" in echo.json()["error"]["message"]
    vocab = len(tool_model[1])
    ids = post(f"{gateway.url}/v1/completions", json={"model": "tiny", "prompt": [1, vocab + 5]})
    assert ids.status_code == 400 and str(vocab + 5) in ids.json()["error"]["message"]
    long = post(
        f"{gateway.url}/v1/completions", json={"model": "tiny", "prompt": [5] * 1030, "max_tokens": 2}
    )
    assert long.status_code == 400 and long.json()["error"]["code"] == "context_length_exceeded"
    assert post(f"{gateway.url}/episodes/nope/reward", json={"value": 1}).status_code == 404
    models = httpx.get(f"{gateway.url}/episodes/anything/v1/models").json()
    assert [m["id"] for m in models["data"]] == ["tiny"]
    # an unknown route answers in OpenAI's error format, not the framework's {"detail": ...}
    missing = post(f"{gateway.url}/v1/embeddings", json={"model": "tiny", "input": "a"})
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"
    assert "POST /v1/embeddings" in missing.json()["error"]["message"]


def test_parameters_that_do_not_change_sampling_are_accepted_and_ignored(gateway: Any) -> None:
    from agent_r1.gateway.protocol import IGNORED_PARAMETERS

    gateway, backend = gateway
    request = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 2,
        "seed": 1,
        "temperature": 0,
    }
    plain = httpx.post(f"{gateway.url}/v1/chat/completions", json=request)
    extras = {
        "prompt_cache_key": "agent-7",
        "safety_identifier": "user-123",
        "stream_options": {"include_obfuscation": False},
        "store": False,
        "service_tier": "auto",
        "parallel_tool_calls": True,
    }
    assert {k.split(".")[0] for k in IGNORED_PARAMETERS} >= set(extras)
    ignored = httpx.post(f"{gateway.url}/v1/chat/completions", json={**request, **extras})
    assert plain.status_code == ignored.status_code == 200, ignored.text
    assert ignored.json()["choices"][0]["message"] == plain.json()["choices"][0]["message"]
    assert backend.record[-1][0] == backend.record[-2][0]  # the same prompt reached the model
    still_refused = httpx.post(f"{gateway.url}/v1/chat/completions", json={**request, "logit_bias": {"5": 3}})
    assert still_refused.status_code == 400 and "logit_bias" in still_refused.json()["error"]["message"]


def test_a_training_gateway_serves_only_its_episodes_and_only_during_rollouts(tool_model: Any) -> None:
    gateway, backend = start_gateway(*tool_model, open_on_demand=False)
    try:
        request = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        unknown = httpx.post(f"{gateway.url}/episodes/ep-x/v1/chat/completions", json=request)
        assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "unknown_episode"
        anonymous = httpx.post(f"{gateway.url}/v1/chat/completions", json=request)
        assert anonymous.status_code == 400 and anonymous.json()["error"]["code"] == "no_episode"
        episode = gateway.recorder.open()
        url = f"{gateway.episode_url(episode.id)}/chat/completions"
        paused = httpx.post(url, json=request)
        assert paused.status_code == 503 and "updating the policy" in paused.json()["error"]["message"]
        gateway.begin_rollout(SamplingParams(temperature=1.0, max_new_tokens=8), seed=3)
        assert httpx.post(url, json={**request, "temperature": 0.2}).status_code == 200
        figures = gateway.end_rollout()
        assert figures["gateway/calls"] == 1 and figures["gateway/sampling_overrides"] == 1
        assert figures["gateway/rejected_calls"] == 0  # counters restart with each rollout
        assert httpx.post(url, json=request).status_code == 503
        assert len(backend.record) == 1
    finally:
        gateway.stop()


def test_rewards_and_finish_through_the_episode_endpoints(tool_model: Any, tmp_path: Path) -> None:
    out = tmp_path / "episodes.jsonl"
    gateway, backend = start_gateway(*tool_model, out=out)
    try:
        opened = httpx.post(f"{gateway.url}/episodes", json={"id": "my-episode"}).json()
        assert opened["base_url"] == f"{gateway.url}/episodes/my-episode/v1"
        client = openai.OpenAI(base_url=opened["base_url"], api_key="x", max_retries=0)
        messages: list[Any] = [{"role": "user", "content": "Count with me."}]
        ids = []
        for _ in range(2):
            reply = client.chat.completions.create(model="tiny", messages=messages, max_tokens=4)
            ids.append(reply.id)
            messages += [reply.choices[0].message, {"role": "user", "content": "Next."}]
        reward = f"{gateway.url}/episodes/my-episode/reward"
        assert httpx.post(reward, json={"value": 1.0, "name": "solved"}).json() == {"ok": True}
        process = {"value": 0.5, "name": "step_ok", "kind": "process", "completion_id": ids[0]}
        assert httpx.post(reward, json=process).status_code == 200
        missing = httpx.post(reward, json={"value": 0.5, "kind": "process"})
        assert missing.status_code == 400 and missing.json()["error"]["param"] == "completion_id"
        assert httpx.post(reward, json={"value": 1, "bonus": 2}).json()["error"]["param"] == "bonus"
        shown = httpx.get(f"{gateway.url}/episodes/my-episode").json()
        assert shown["calls"] == 2 and shown["segments"] == 1
        finished = httpx.post(f"{gateway.url}/episodes/my-episode/finish", json={"answer": "42"}).json()
        [trajectory] = [Trajectory.model_validate(t) for t in finished["trajectories"]]
        assert [(r.name, r.kind, r.turn) for r in trajectory.rewards] == [
            ("solved", "outcome", None),
            ("step_ok", "process", 0),
        ]
        token_rewards = trajectory.token_rewards()
        assert token_rewards[trajectory.last_policy_index(0) or 0] == 0.5
        assert token_rewards[trajectory.last_policy_index() or 0] == 1.0
        [saved] = load_trajectories(out)
        assert saved.token_ids == trajectory.token_ids and saved.steps[-1].action.answer == "42"
        assert len(backend.record) == 2
        with pytest.raises(openai.ConflictError, match="was finished"):  # an id is used once
            client.chat.completions.create(
                model="tiny", messages=[{"role": "user", "content": "x"}], max_tokens=1
            )
        assert httpx.get(f"{gateway.url}/health").json()["open_episodes"] == 0
        assert len(load_trajectories(out)) == 1 and len(backend.record) == 2
    finally:
        gateway.stop()


def test_a_call_past_the_request_timeout_gets_504(tool_model: Any) -> None:
    gateway, backend = start_gateway(*tool_model, request_timeout_s=0.3)
    slow = backend.generate

    def generate(*args: Any, **kwargs: Any) -> Any:  # the real backend, made slow on purpose
        time.sleep(1.0)
        return slow(*args, **kwargs)

    backend.generate = generate  # type: ignore[method-assign]
    try:
        episode = gateway.recorder.open()
        request = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        response = httpx.post(f"{gateway.episode_url(episode.id)}/chat/completions", json=request)
        assert (
            response.status_code == 504 and "request timeout of 0.3 s" in response.json()["error"]["message"]
        )
        assert gateway.counters["timeouts"] == 1
        time.sleep(1.0)  # the abandoned generation finishes; it is not recorded
        assert gateway.recorder.finish(episode)[0].errors  # no call: the episode has nothing
    finally:
        gateway.stop()


# --------------------------------------------------------------------------------------------
# The launcher: failures are episodes, not dead runs
# --------------------------------------------------------------------------------------------


def test_crashing_hanging_and_silent_agents_are_failed_episodes(gateway: Any) -> None:
    gateway, _ = gateway
    task = Task(id="t", messages=[{"role": "user", "content": "hi"}])
    [(crashed, crash)] = run_agents(gateway, "crash", [task])
    assert crash.exit_code == 1 and not crash.timed_out
    assert (
        "exited with status 1" in (crash.error or "")
        and "RuntimeError: the agent program broke" in crash.error
    )
    [trajectory] = gateway.recorder.finish(crashed, error=crash.error, termination=crash.termination)
    assert trajectory.errors == [crash.error] and trajectory.termination == "agent_error"

    started = time.monotonic()
    [(hung, hang)] = run_agents(gateway, "hang", [task], timeout_s=6.0)
    assert hang.timed_out and hang.exit_code is None and time.monotonic() - started < 30
    assert "rollout.agent.timeout_s=6 s and was killed" in (hang.error or "")
    child = int(hang.stderr_tail.split("child ")[1].split()[0])
    time.sleep(0.5)
    state = Path(f"/proc/{child}/status")
    assert not state.exists() or "zombie" in state.read_text()  # the agent's child was killed too
    assert gateway.recorder.finish(hung, error=hang.error)[0].errors == [hang.error]

    [(silent, quiet)] = run_agents(gateway, "silent", [task])
    assert quiet.error is None and quiet.answer == "no model call"
    [empty] = gateway.recorder.finish(silent, answer=quiet.answer)
    assert "made no model call" in empty.errors[0] and len(empty) == 0


def test_a_python_callable_agent(gateway: Any, tmp_path: Path) -> None:
    from agent_r1.config import AgentProgramConfig
    from agent_r1.gateway.launcher import AgentLauncher

    gateway, backend = gateway
    (tmp_path / "my_agent.py").write_text(
        "import openai, os\n"
        "async def solve(task):\n"
        "    client = openai.AsyncOpenAI(max_retries=0)\n"
        "    reply = await client.chat.completions.create(model=os.environ['AGENT_R1_MODEL'],\n"
        "        messages=task['messages'], max_tokens=3)\n"
        "    return {'text': reply.choices[0].message.content, 'task': task['id']}\n"
    )
    config = AgentProgramConfig(callable="my_agent:solve", cwd=str(tmp_path), timeout_s=60)
    launcher = AgentLauncher(config, model_name="tiny", gateway_url=gateway.url)
    episode = gateway.recorder.open()
    task = Task(id="c1", messages=[{"role": "user", "content": "hi"}], answer="secret")
    import asyncio

    outcome = asyncio.run(launcher.run(episode.id, gateway.episode_url(episode.id), task))
    assert outcome.error is None, outcome.stderr_tail
    answer = json.loads(outcome.answer or "{}")
    assert answer["task"] == "c1" and isinstance(answer["text"], str)
    assert len(backend.record) == 1
    assert "secret" not in json.dumps(launcher.environment("e", "u", "{}")["AGENT_R1_TASK"])


def test_agent_program_checks_name_what_is_wrong(tmp_path: Path) -> None:
    from agent_r1.config import AgentProgramConfig
    from agent_r1.errors import AgentR1Error
    from agent_r1.gateway.launcher import check_agent_program, final_answer_of

    assert "python" in check_agent_program(AgentProgramConfig(command=[sys.executable, "-c", "0"]))
    cases = [
        (AgentProgramConfig(command=["no-such-agent-binary"]), "is not on PATH"),
        (
            AgentProgramConfig(command=[sys.executable, "missing.py"], cwd=str(tmp_path)),
            "missing.py' does not exist",
        ),
        (AgentProgramConfig(command=["./agent.sh"], cwd=str(tmp_path)), "does not exist"),
        (AgentProgramConfig(callable="no_such_module_xyz:run", cwd=str(tmp_path)), "cannot be found"),
        (AgentProgramConfig(callable="nocolon"), "is not 'module:function'"),
    ]
    for config, words in cases:
        with pytest.raises(AgentR1Error, match=r"rollout\.agent") as info:
            check_agent_program(config)
        assert words in str(info.value)
    script = tmp_path / "agent.sh"
    script.write_text("#!/bin/sh\necho hi\n")
    with pytest.raises(AgentR1Error, match="not executable"):
        check_agent_program(AgentProgramConfig(command=["./agent.sh"], cwd=str(tmp_path)))
    os.chmod(script, 0o755)
    assert "agent.sh" in check_agent_program(AgentProgramConfig(command=["./agent.sh"], cwd=str(tmp_path)))
    assert final_answer_of("log\n  42  \n\n") == "42"
    assert final_answer_of('x\n{"answer": "a\\nb"}\n') == "a\nb"
    assert final_answer_of('{"answer": 7}') == "7" and final_answer_of('{"other": 1}') == '{"other": 1}'
    assert final_answer_of("") is None


# --------------------------------------------------------------------------------------------
# agent-r1 serve-policy
# --------------------------------------------------------------------------------------------


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_serve_policy_command_serves_a_model_and_writes_finished_episodes(tmp_path: Path) -> None:
    import signal
    import subprocess

    from trainer_helpers import write_tiny_checkpoint

    model_dir = write_tiny_checkpoint(tmp_path / "tiny")
    out, port = tmp_path / "episodes.jsonl", _free_port()
    command = [sys.executable, "-m", "agent_r1.cli", "serve-policy", "--model", str(model_dir)]
    command += ["--port", str(port), "--out", str(out), "--max-new-tokens", "8"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    server = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env=env)
    root = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert server.poll() is None, server.communicate()[1]
            try:
                if httpx.get(f"{root}/health").json()["status"] == "ok":
                    break
            except httpx.TransportError:
                assert time.monotonic() < deadline, "the server did not come up"
                time.sleep(0.5)
        client = openai.OpenAI(base_url=f"{root}/episodes/cli-episode/v1", api_key="x", max_retries=0)
        reply = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}])
        assert reply.usage is not None and 1 <= reply.usage.completion_tokens <= 8
        finished = httpx.post(f"{root}/episodes/cli-episode/finish", json={"answer": "done"}).json()
        assert len(finished["trajectories"]) == 1
        [saved] = load_trajectories(out)
        assert saved.id == "cli-episode" and saved.steps[-1].action.answer == "done"
    finally:
        server.send_signal(signal.SIGINT)
        _, stderr = server.communicate(timeout=60)
    assert "agent-r1 policy gateway: model 'tiny' (hf backend, hermes tool calls)" in stderr
