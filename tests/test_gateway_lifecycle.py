"""The policy gateway's episode lifecycle: an episode id is used once (HTTP 409 after it ends), and
an episode left idle is closed as failed, never while one of its calls runs.

A real server on 127.0.0.1 over a tiny random model behind the ``hf`` backend; idle closes are
forced with :meth:`PolicyGateway.close_idle` at a later ``now`` (no long sleeps), except in the
test of the sweep thread itself, which runs with a 0.3 s limit.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from gateway_helpers import start_gateway
from typer.testing import CliRunner

from agent_r1.builtins.formats import HermesFormat
from agent_r1.cli import app
from agent_r1.contracts import SamplingParams
from agent_r1.errors import AgentR1Error
from agent_r1.gateway.protocol import ConflictError
from agent_r1.gateway.recorder import EpisodeRecorder
from agent_r1.gateway.server import GatewaySettings
from agent_r1.gateway.tools import ToolRendering
from agent_r1.mdp import load_trajectories
from agent_r1.rollout.chat import ChatRenderer

CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}


@pytest.fixture(scope="module")
def tiny() -> tuple[Any, Any]:
    from agent_r1.testing.models import tiny_model, tiny_tokenizer

    tokenizer = tiny_tokenizer()
    return tiny_model(tokenizer, seed=0), tokenizer


def _eventually(check: Callable[[], Any], timeout: float = 10.0) -> Any:
    """Poll ``check`` until it returns something truthy. A request holds its episode until the
    server has finished with it, which may be just after the client has read the response."""
    deadline = time.monotonic() + timeout
    while not (result := check()):
        assert time.monotonic() < deadline, "the condition did not hold in time"
        time.sleep(0.01)
    return result


def _ask(client: openai.OpenAI, **extra: Any) -> Any:
    return client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=3, **extra
    )


def _conflict(response: httpx.Response, code: str, param: str = "episode") -> str:
    """The message of a 409 in OpenAI's error format, with ``code`` and ``param``."""
    assert response.status_code == 409, response.text
    body = response.json()
    assert list(body) == ["error"] and set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["type"] == "conflict_error"
    assert (body["error"]["code"], body["error"]["param"]) == (code, param)
    message = str(body["error"]["message"])
    assert "new episode with a new id" in message
    return message


def test_finish_reuse_and_idle_close_leave_one_trajectory_per_id(tiny: Any, tmp_path: Path) -> None:
    out = tmp_path / "episodes.jsonl"
    gateway, backend = start_gateway(*tiny, out=out, episode_idle_s=60.0)
    try:
        root = gateway.url
        finished_client = openai.OpenAI(base_url=f"{root}/episodes/run-a/v1", api_key="x", max_retries=0)
        _ask(finished_client)
        assert httpx.post(f"{root}/episodes/run-a/finish", json={"answer": "a"}).status_code == 200
        with pytest.raises(openai.ConflictError, match="'run-a' was finished"):
            _ask(finished_client)
        _conflict(httpx.post(f"{root}/episodes", json={"id": "run-a"}), "episode_finished", param="id")

        plain_client = openai.OpenAI(base_url=f"{root}/v1", api_key="x", max_retries=0)
        _ask(plain_client, user="run-b")
        assert _eventually(lambda: gateway.close_idle(now=time.monotonic() + 120)) == ["run-b"]
        message = _conflict(
            httpx.post(f"{root}/episodes/run-b/v1/chat/completions", json=CHAT), "episode_idle_closed"
        )
        assert "'run-b' was closed" in message and "s idle" in message and "counted as failed" in message
        with pytest.raises(openai.ConflictError, match="s idle"):
            _ask(plain_client, user="run-b")

        health = httpx.get(f"{root}/health").json()
        assert health["open_episodes"] == 0 and health["counters"]["idle_closed"] == 1
        assert len(backend.record) == 2  # refused calls never reach the model
    finally:
        gateway.stop()
    saved = {t.id: t for t in load_trajectories(out)}
    assert len(saved) == len(load_trajectories(out)) == 2  # no trajectory id twice
    assert not saved["run-a"].errors and saved["run-a"].termination == "agent_done"
    idle = saved["run-b"]
    assert idle.termination == "idle_timeout" and len(idle.steps) == 1
    assert len(idle.errors) == 1 and "was closed after 120" in idle.errors[0]  # failed: never trained


def test_every_request_on_a_finished_id_gets_409_in_openai_format(tiny: Any) -> None:
    gateway, _ = start_gateway(*tiny)
    try:
        episode = f"{gateway.url}/episodes/done"
        assert httpx.post(f"{episode}/v1/chat/completions", json=CHAT).status_code == 200
        assert httpx.post(f"{episode}/finish", json={}).status_code == 200
        message = _conflict(httpx.post(f"{episode}/v1/chat/completions", json=CHAT), "episode_finished")
        assert message.startswith("episode 'done' was finished ") and " s ago" in message
        streamed = httpx.post(f"{episode}/v1/chat/completions", json={**CHAT, "stream": True})
        _conflict(streamed, "episode_finished")
        completion = {"model": "tiny", "prompt": "hi", "max_tokens": 2}
        _conflict(httpx.post(f"{episode}/v1/completions", json=completion), "episode_finished")
        _conflict(httpx.post(f"{episode}/reward", json={"value": 1.0}), "episode_finished")
        _conflict(httpx.post(f"{episode}/finish", json={}), "episode_finished")
        _conflict(httpx.get(episode), "episode_finished")
        _conflict(httpx.post(f"{gateway.url}/episodes", json={"id": "done"}), "episode_finished", param="id")
        never = httpx.get(f"{gateway.url}/episodes/never-opened")
        assert never.status_code == 404 and never.json()["error"]["code"] == "unknown_episode"
    finally:
        gateway.stop()


def test_an_episode_is_not_closed_while_one_of_its_calls_runs(tiny: Any) -> None:
    gateway, backend = start_gateway(*tiny, episode_idle_s=60.0, max_context=64)
    entered, release = threading.Event(), threading.Event()
    generate = backend.generate

    def held_generate(*args: Any, **kwargs: Any) -> Any:  # the real backend, held until released
        entered.set()
        assert release.wait(60)
        return generate(*args, **kwargs)

    backend.generate = held_generate  # type: ignore[method-assign]
    answers: list[httpx.Response] = []
    url = f"{gateway.url}/episodes/busy/v1/chat/completions"
    caller = threading.Thread(target=lambda: answers.append(httpx.post(url, json=CHAT, timeout=120)))
    try:
        caller.start()
        assert entered.wait(60)
        far_later = time.monotonic() + 1000
        assert gateway.close_idle(now=far_later) == []  # generating: held, however long ago it began
        assert httpx.get(f"{gateway.url}/health").json()["open_episodes"] == 1  # a request sweeps too
        release.set()
        caller.join(120)
        assert answers[0].status_code == 200
        assert _eventually(lambda: gateway.close_idle(now=time.monotonic() + 1000)) == ["busy"]

        # a call that fails after naming its episode releases it too
        long_prompt = {**CHAT, "messages": [{"role": "user", "content": "count " * 200}]}
        refused = httpx.post(f"{gateway.url}/episodes/too-long/v1/chat/completions", json=long_prompt)
        assert refused.json()["error"]["code"] == "context_length_exceeded"
        assert _eventually(lambda: gateway.close_idle(now=time.monotonic() + 1000)) == ["too-long"]
        assert gateway.counters["idle_closed"] == 2
    finally:
        release.set()
        gateway.stop()


def test_the_sweep_thread_closes_idle_episodes_and_notes_it_once(
    tiny: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "episodes.jsonl"
    gateway, _ = start_gateway(*tiny, out=out, episode_idle_s=0.3)
    try:
        completion = {"model": "tiny", "prompt": "hi", "max_tokens": 2}
        for number in (1, 2):  # no request in between: only the sweep thread can close them
            url = f"{gateway.url}/episodes/quiet-{number}/v1/completions"
            assert httpx.post(url, json=completion).status_code == 200
            answered = time.monotonic()
            _eventually(lambda: gateway.counters.get("idle_closed") == number)  # noqa: B023 (called now)
            assert 0.25 < time.monotonic() - answered < 5.0  # after 0.3 s, within a wake of 0.075 s
        assert {t.id for t in load_trajectories(out)} == {"quiet-1", "quiet-2"}
        assert all(t.termination == "idle_timeout" and t.errors for t in load_trajectories(out))
    finally:
        gateway.stop()
    assert not [t for t in threading.enumerate() if t.name == "agent-r1-gateway-idle"]
    notes = capsys.readouterr().err
    assert notes.count("had no call, reward or show for 0.3 s and was closed as failed") == 1
    assert "episode 'quiet-1'" in notes and "--episode-idle-s" in notes


def test_an_idle_close_that_cannot_write_out_is_counted_and_shown(
    tiny: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    gateway, _ = start_gateway(*tiny, out=blocker / "episodes.jsonl", episode_idle_s=0.3)
    try:
        assert httpx.post(f"{gateway.url}/episodes/lost/v1/chat/completions", json=CHAT).status_code == 200
        _eventually(lambda: gateway.counters.get("idle_close_errors") == 1)
        health = httpx.get(f"{gateway.url}/health")  # the server goes on
        assert health.status_code == 200 and health.json()["counters"]["idle_closed"] == 1
        _conflict(
            httpx.post(f"{gateway.url}/episodes/lost/v1/chat/completions", json=CHAT), "episode_idle_closed"
        )
    finally:
        gateway.stop()
    notes = capsys.readouterr().err
    assert "closing idle episodes failed" in notes and "may be missing from --out" in notes


def test_a_training_gateway_refuses_ended_ids_and_never_closes_idle_episodes(tiny: Any) -> None:
    gateway, _ = start_gateway(*tiny, open_on_demand=False)
    try:
        episode = gateway.recorder.open(trajectory_id="task@s1/0", group_id="task@s1")
        url = f"{gateway.episode_url(episode.id)}/chat/completions"
        gateway.begin_rollout(SamplingParams(temperature=1.0, max_new_tokens=4), seed=0)
        assert httpx.post(url, json=CHAT).status_code == 200
        [trajectory] = gateway.finish_for_training(episode, answer="x")
        assert trajectory.id == "task@s1/0" and not trajectory.errors
        _conflict(httpx.post(url, json=CHAT), "episode_finished")  # 409, not an unknown episode's 404
        gateway.end_rollout()
        with pytest.raises(ConflictError, match="was finished"):
            gateway.finish_for_training(episode)  # its trajectories are handed out once
        with pytest.raises(ConflictError):
            gateway.recorder.open(episode.id)
        idle = gateway.recorder.open()
        assert gateway.close_idle(now=time.monotonic() + 10_000) == []  # off in training
        assert gateway.recorder.open_ids() == [idle.id]
        assert not [t for t in threading.enumerate() if t.name == "agent-r1-gateway-idle"]
    finally:
        gateway.stop()


def test_the_recorder_remembers_a_bounded_number_of_ended_ids() -> None:
    from agent_r1.testing.models import tiny_tokenizer

    renderer = ChatRenderer(tiny_tokenizer())
    rendering = ToolRendering(renderer, HermesFormat())
    recorder = EpisodeRecorder(renderer, rendering, open_on_demand=True, remember_ended=2)
    for name in ("a", "b", "c"):
        recorder.finish(recorder.get(name))
    assert recorder.get("a").id == "a"  # forgotten: the oldest of three beyond the bound of two
    for name in ("b", "c"):
        with pytest.raises(ConflictError, match=f"episode '{name}' was finished"):
            recorder.get(name)


def test_the_idle_limit_must_be_positive_or_off() -> None:
    with pytest.raises(AgentR1Error, match="episode_idle_s must be a positive number"):
        GatewaySettings(served_model_name="tiny", episode_idle_s=0)
    assert GatewaySettings(served_model_name="tiny").episode_idle_s is None
    result = CliRunner().invoke(
        app, ["serve-policy", "--model", "no-such-model", "--episode-idle-s", "-1"], env={"COLUMNS": "200"}
    )
    assert result.exit_code != 0 and "--episode-idle-s -1 is negative" in result.output
