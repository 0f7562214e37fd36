"""The ``mcp`` environment against a real MCP server (the notebook of ``notebook_server.py``) over
stdio and over streamable HTTP on 127.0.0.1, through the real rollout engine with a scripted policy:
listing, calls, one session per episode, errors that name server and tool, timeouts, a server
killed mid-episode, reconnections, sessions closed at the end of episodes."""

from __future__ import annotations

import asyncio
import os
import re
import time
from collections.abc import Callable
from typing import Any

import pytest
from mcp_helpers import HttpServer, stdio_server

from agent_r1 import ToolResult, Trajectory
from agent_r1.registry import get_registry

pytestmark = pytest.mark.timeout(120)

ANSWER = "<answer>done</answer>"


def results(trajectory: Trajectory) -> list[ToolResult]:
    return [r for step in trajectory.steps if step.observation for r in step.observation.tool_results]


def server_section(transport: str, request: pytest.FixtureRequest, **options: Any) -> dict[str, Any]:
    if transport == "stdio":
        return stdio_server(**options)
    http: HttpServer = request.getfixturevalue("shared_http_server")
    return http.section(**options)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.parametrize("transport", ["stdio", "http"])
def test_tools_are_listed_and_each_episode_has_its_own_session(
    transport: str, request: pytest.FixtureRequest, rollout: Callable[..., list[Trajectory]]
) -> None:
    options = {"servers": [server_section(transport, request)], "format": "tags", "max_turns": 5}
    script = [
        "<note>alpha</note>",
        "<note>beta</note>",
        "<read_notes>{}</read_notes>",
        "<pid>{}</pid>",
        ANSWER,
    ]
    trajectories = rollout(options, script, group_size=2)  # two episodes side by side

    assert len(trajectories) == 2
    pids = set()
    for trajectory in trajectories:
        notes = [r.content for r in results(trajectory)]
        assert notes[:3] == ["saved note 1", "saved note 2", "alpha\nbeta"]
        pids.add(int(notes[3]))
        assert trajectory.termination == "answer", trajectory.errors
        assert trajectory.metrics["tool_calls"] == 4 and trajectory.metrics["tool_errors"] == 0
        assert trajectory.steps[0].observation.info["mcp"] == {"reconnects": 0, "lost": 0}
    if transport == "stdio":  # a server process per episode, stopped when the episode ended
        assert len(pids) == 2 and not any(alive(pid) for pid in pids)

    # the server's own JSON schemas are what a format that renders schemas shows the model
    env = get_registry().build("environments", "mcp", {**options, "format": "hermes"})
    schemas = {name: type(tool).schema()["function"] for name, tool in env.tools.items()}
    assert set(schemas) == {"note", "read_notes", "add", "fail", "sleep", "pid"}
    assert schemas["add"]["parameters"]["required"] == ["a", "b"]
    assert schemas["add"]["parameters"]["properties"]["a"]["type"] == "integer"
    assert schemas["add"]["description"] == "Add two integers."


def test_server_errors_and_timeouts_name_server_and_tool(
    shared_http_server: HttpServer, rollout: Callable[..., list[Trajectory]]
) -> None:
    options = {
        "servers": [shared_http_server.section("kb", call_timeout_s=1.0)],
        "format": "tags",
        "max_turns": 5,
        "call_timeout_s": 20,
    }
    script = [
        "<fail>disk full</fail>",
        '<add>{"a": 1}</add>',
        '<sleep>{"seconds": 30}</sleep>',
        '<add>{"a": 2, "b": 40}</add>',
        ANSWER,
    ]
    started = time.monotonic()
    [trajectory] = rollout(options, script)
    elapsed = time.monotonic() - started

    failed, slow, added = results(trajectory)
    assert not failed.ok and failed.error == "exception"
    assert (
        failed.content.startswith("Error: MCP server 'kb' tool 'fail' failed:")
        and "disk full" in failed.content
    )
    # arguments that do not fit the server's schema are refused before anything is sent
    assert "missing required argument 'b'" in " ".join(trajectory.steps[1].action.parse_errors)
    assert not slow.ok and slow.error == "timeout"
    assert slow.content == "Error: MCP server 'kb' tool 'sleep': no answer within 1 s"
    assert added.ok and added.content == "42"  # the session survived the abandoned call
    assert trajectory.metrics["tool_errors"] == 2 and trajectory.termination == "answer"
    assert elapsed < 15


def test_environment_timeout_and_engine_cut_episode(rollout: Callable[..., list[Trajectory]]) -> None:
    options = {"servers": [stdio_server()], "format": "tags", "max_turns": 6, "call_timeout_s": 1.0}
    # the engine ends this episode (its max_turns, below the environment's), so the environment
    # never hears of the end: the session ends with the rollout's event loop
    [trajectory] = rollout(options, ['<sleep>{"seconds": 30}</sleep>', "<pid>{}</pid>"], max_turns=2)
    slow, pid = results(trajectory)
    assert slow.error == "timeout"  # the environment's own call timeout, worded with server and tool
    assert slow.content.startswith("Error: MCP server 'notes' tool 'sleep': the call took longer than 1 s")
    assert trajectory.termination == "max_turns"
    assert not alive(int(pid.content)), "the server process outlived its rollout"


def killer(kill: Callable[[str], None], then: str) -> Callable[[str], str]:
    """A script: ask the server's pid; on the next turn kill the server, then say ``then``; answer
    on the turns after."""
    turns = {"n": 0}

    def say(prompt: str) -> str:
        turns["n"] += 1
        if turns["n"] == 1:
            return "<pid>{}</pid>"
        if turns["n"] == 2:
            kill(prompt)
            return then
        return then if turns["n"] <= 4 else ANSWER

    return say


def kill_stdio_server(prompt: str) -> None:
    pid = int(re.findall(r"<result>(\d+)</result>", prompt)[-1])
    os.kill(pid, 9)


@pytest.mark.parametrize("transport", ["stdio", "http"])
def test_a_server_killed_mid_episode_fails_the_step_naming_server_and_tool(
    transport: str, request: pytest.FixtureRequest, rollout: Callable[..., list[Trajectory]]
) -> None:
    if transport == "stdio":
        section, kill = stdio_server(), kill_stdio_server
    else:
        http: HttpServer = request.getfixturevalue("http_server")  # a server of its own: it dies
        section = http.section()

        def kill(prompt: str) -> None:
            http.kill()

    options = {"servers": [section], "format": "tags", "max_turns": 4}
    started = time.monotonic()
    [trajectory] = rollout(options, killer(kill, "<note>after the crash</note>"))
    assert time.monotonic() - started < 30  # an error, not a hang

    # the default (on_server_error: end_episode): an environment error, counted, not trained on
    assert trajectory.termination == "env_error"
    assert trajectory.metrics["env_errors"] == 1
    [error] = trajectory.errors
    assert "MCP server 'notes'" in error and "tool 'note'" in error, error
    assert "ToolInfrastructureError" in error or "McpServerError" in error


def test_observation_mode_shows_the_crash_and_reconnects(rollout: Callable[..., list[Trajectory]]) -> None:
    options = {
        "servers": [stdio_server()],
        "format": "tags",
        "max_turns": 6,
        "on_server_error": "observation",
    }
    [trajectory] = rollout(options, killer(kill_stdio_server, "<note>again</note>"))

    pid, lost, first, second = results(trajectory)
    assert pid.ok
    assert not lost.ok and lost.error == "infrastructure"
    assert "MCP server 'notes'" in lost.content and "lost during tool 'note'" in lost.content
    assert "session state is gone" in lost.content
    # the next call reconnects: a new server process, a new session, so the notebook starts over
    assert (first.content, second.content) == ("saved note 1", "saved note 2")
    assert trajectory.steps[-1].observation.info["mcp"] == {"reconnects": 1, "lost": 1}
    assert trajectory.metrics["tool_errors"] == 1 and trajectory.termination == "answer"
    # logged as the episode's figures: one lost connection, one reconnection, whatever the steps
    assert trajectory.metrics["env/mcp_lost"] == 1 and trajectory.metrics["env/mcp_reconnects"] == 1
    assert [s.observation.metrics["mcp_lost"] for s in trajectory.steps].count(1.0) == 1


def test_reconnections_are_bounded(http_server: HttpServer, rollout: Callable[..., list[Trajectory]]) -> None:
    options = {
        "servers": [http_server.section(max_reconnects=1, connect_timeout_s=3)],
        "format": "tags",
        "max_turns": 6,
        "on_server_error": "observation",
    }
    [trajectory] = rollout(options, killer(lambda prompt: http_server.kill(), "<note>x</note>"))

    _, lost, retry, exhausted = results(trajectory)
    assert "lost during tool 'note'" in lost.content
    assert retry.error == "infrastructure" and "cannot connect" in retry.content
    assert "calling tool 'note'" in retry.content and http_server.url in retry.content
    assert exhausted.error == "infrastructure"
    assert "all max_reconnects=1 reconnections were used" in exhausted.content
    assert trajectory.steps[-1].observation.info["mcp"] == {"reconnects": 1, "lost": 1}


def test_a_stateless_server_shares_one_session_per_rollout(
    shared_http_server: HttpServer, rollout: Callable[..., list[Trajectory]]
) -> None:
    options = {"servers": [shared_http_server.section(stateful=False)], "format": "tags", "max_turns": 2}
    trajectories = rollout(options, ["<note>shared</note>", ANSWER], group_size=3)
    contents = sorted(results(t)[0].content for t in trajectories)
    assert contents == ["saved note 1", "saved note 2", "saved note 3"]  # one notebook for all
    # a new rollout, a new session
    [again] = rollout(options, ["<note>fresh</note>", ANSWER])
    assert results(again)[0].content == "saved note 1"


def test_tools_of_two_servers_and_a_registered_tool(
    shared_http_server: HttpServer, rollout: Callable[..., list[Trajectory]]
) -> None:
    http = shared_http_server  # two server entries, two sessions with one server process
    options = {
        "servers": [http.section("local", tools=["note", "add"]), http.section("remote", tools=["note"])],
        "tools": ["calculator"],
        "format": "tags",
        "max_turns": 4,
    }
    env = get_registry().build("environments", "mcp", options)
    # 'note' is on both servers: prefixed; 'add' is unique: kept as it is
    assert list(env.tools) == ["calculator", "local__note", "add", "remote__note"]
    script = [
        "<local__note>a</local__note>",
        "<remote__note>b</remote__note>",
        "<calculator>6*7</calculator>",
        ANSWER,
    ]
    [trajectory] = rollout(options, script)
    assert [r.content for r in results(trajectory)] == ["saved note 1", "saved note 1", "42"]


def test_preflight_check_names_each_server_that_cannot_be_reached(http_server: HttpServer) -> None:
    from agent_r1_plugin_mcp.env import McpEnv

    http_server.kill()
    config = McpEnv.Config.model_validate(
        {
            "servers": [
                {"name": "gone", "command": ["agent-r1-no-such-mcp-server"]},
                {"name": "down", "url": http_server.url, "connect_timeout_s": 3},
            ]
        }
    )
    problems = asyncio.run(McpEnv.check(config))
    assert len(problems) == 2
    gone, down = problems
    assert gone.startswith(
        "servers[0] 'gone' (stdio: agent-r1-no-such-mcp-server): command 'agent-r1-no-such-mcp-server' "
        "not found on PATH. Install it"
    )
    assert down.startswith(f"servers[1] 'down' ({http_server.url}): cannot connect")
    assert "serves MCP" in down
