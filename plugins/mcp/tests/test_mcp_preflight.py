"""The ``mcp`` environment in the run's preflight (``agent_r1.run.preflight``, what ``agent-r1
check`` and ``agent-r1 train`` run before a model loads), with real subprocess servers: each server
is started once for the whole preflight, and one that does not start gets one error saying why (a
command not found, its exit code and first stderr lines, a handshake that timed out). Every server
command appends a line to a file of its own when it starts, so the tests count starts, not
seconds. Also the tutorial's config (docs/mcp.md): its tools reach SmolLM2's prompt."""

from __future__ import annotations

import asyncio
import re
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from mcp_helpers import SERVER_SCRIPT, task

from agent_r1.config import RunConfig, validate_components
from agent_r1.registry import get_registry
from agent_r1.run.preflight import PreflightReport, preflight

pytestmark = pytest.mark.timeout(180)

TUTORIAL = Path(__file__).resolve().parents[3] / "docs" / "mcp.md"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from agent_r1.testing.pytest_plugin import write_tiny_checkpoint

    return write_tiny_checkpoint(tmp_path_factory.mktemp("tiny-model"))


def counted(starts: Path, code: str) -> list[str]:
    """A ``python -c`` server command that first appends a line to ``starts``, then runs ``code``."""
    return [sys.executable, "-c", f"open({str(starts)!r}, 'a').write('start\\n')\n{code}"]


def starts(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def run_config(model: str | Path, run_dir: Path, environment: dict[str, Any]) -> dict[str, Any]:
    return {
        "seed": 0,
        "output_dir": str(run_dir),
        "model": {"path": str(model), "device": "cpu"},
        "data": {"name": "arithmetic", "num_train": 4, "num_eval": 2},
        "environment": environment,
        "rollout": {"group_size": 2, "max_turns": 2, "max_new_tokens": 32, "max_context": 2048},
        "rewards": [{"name": "answer_match", "weight": 1.0}],
        "algorithm": {"name": "grpo"},
        "trainer": {"steps": 1, "tasks_per_step": 2},
    }


def run_preflight(raw: dict[str, Any]) -> PreflightReport:
    config = RunConfig.model_validate(raw)
    return preflight(config, validate_components(config, get_registry()))


def messages(report: PreflightReport, name: str, status: str) -> list[str]:
    return [c.message for c in report.checks if c.name == name and c.status == status]


def test_a_server_is_started_once_by_the_whole_preflight(model_dir: Path, tmp_path: Path) -> None:
    log = tmp_path / "notes.starts"
    script = f"import runpy, sys\nsys.argv = [{str(SERVER_SCRIPT)!r}]\n" + (
        "runpy.run_path(sys.argv[0], run_name='__main__')"
    )
    environment = {
        "name": "mcp",
        "servers": [{"name": "notes", "command": counted(log, script)}],
        "format": "hermes",
    }
    report = run_preflight(run_config(model_dir, tmp_path / "run", environment))
    assert report.ok, report.as_dicts()
    assert messages(report, "component", "ok") == ["environment (mcp): check passed"]
    # listed once by the check; the prompt and tool checks render 4 episodes without a process
    assert starts(log) == 1
    [shown] = messages(report, "tools", "ok")
    assert shown.startswith("environment (mcp): the first prompt shows its 6 tools")


def test_each_server_that_does_not_start_is_one_error_saying_why_and_is_started_once(
    model_dir: Path, tmp_path: Path
) -> None:
    logs = {name: tmp_path / f"{name}.starts" for name in ("crashing", "hanging")}
    crash = (
        "import sys\nprint('config file servers.toml missing', file=sys.stderr)\n"
        "print('giving up', file=sys.stderr)\nsys.exit(3)"
    )
    hang = "import sys, time\nprint('starting up', file=sys.stderr, flush=True)\ntime.sleep(120)"
    servers = [
        {"name": "time", "command": ["agent-r1-no-such-mcp-server", "--local"]},
        {"name": "local", "command": [str(tmp_path / "no-such-server")]},
        {"name": "crashing", "command": counted(logs["crashing"], crash)},
        {"name": "hanging", "command": counted(logs["hanging"], hang), "connect_timeout_s": 2},
    ]
    environment = {"name": "mcp", "servers": servers, "format": "hermes"}
    report = run_preflight(run_config(model_dir, tmp_path / "run", environment))

    failures = [(c.name, c.message) for c in report.failures]
    assert [name for name, _ in failures] == ["component"] * 4, failures  # one per server, nothing twice
    missing, absent, crashed, hung = (message for _, message in failures)
    assert missing == (
        "environment (mcp): servers[0] 'time' (stdio: agent-r1-no-such-mcp-server --local): command "
        "'agent-r1-no-such-mcp-server' not found on PATH. Install it, or give the program's full path as "
        "the first word of the server's command."
    )
    assert absent.endswith(
        f"command {str(tmp_path / 'no-such-server')!r} does not exist. Fix the server's command."
    )
    assert crashed.startswith("environment (mcp): servers[2] 'crashing' (stdio: ")
    assert (
        "exited with code 3 before finishing the MCP handshake; its stderr began: "
        "['config file servers.toml missing', 'giving up']. Check that the command starts an MCP server "
        "on stdin/stdout (run it by hand)." in crashed
    )
    assert hung.startswith("environment (mcp): servers[3] 'hanging' (stdio: ")
    assert (
        "did not finish the MCP handshake within 2 s (connect_timeout_s); it was stopped; its stderr "
        "began: ['starting up']. Check that the command starts an MCP server on stdin/stdout (run it by "
        "hand), or raise connect_timeout_s for a server that starts slowly." in hung
    )
    for message in (missing, absent, crashed, hung):
        assert "shown above" not in message  # the stderr is in the message, not on the console
    assert {name: starts(log) for name, log in logs.items()} == {"crashing": 1, "hanging": 1}
    # the prompts are not rendered with an environment that cannot be built
    assert messages(report, "prompts", "warn") == [
        "not checked: the environment (mcp) failed its own check above; the prompts and the tools "
        "they show are checked once it passes"
    ]


def test_a_run_connection_keeps_the_console_stderr_and_reports_the_exit_code(tmp_path: Path) -> None:
    """Outside the preflight's listing, a server's stderr goes to the console (it is not captured),
    and the error still says how the process ended."""
    from agent_r1_plugin_mcp.config import ServerConfig
    from agent_r1_plugin_mcp.connection import McpConnection, McpServerError

    server = ServerConfig(name="crashing", command=[sys.executable, "-c", "import os; os._exit(5)"])

    async def connect() -> McpServerError:
        with pytest.raises(McpServerError) as raised:
            await McpConnection(server).connect()
        return raised.value

    error = asyncio.run(connect())
    assert error.problem == "exited with code 5 before finishing the MCP handshake"
    assert str(error).endswith("(run it by hand; its stderr is shown above).")


# --------------------------------------------------------------------------------------------
# The tutorial's config with the real SmolLM2 chat template
# --------------------------------------------------------------------------------------------


def tutorial_blocks() -> tuple[str, dict[str, Any]]:
    """The tutorial's ``notes_server.py`` and its run config (docs/mcp.md, sections 1 and 2)."""
    if not TUTORIAL.is_file():
        pytest.skip("docs/mcp.md is not here (the plugin is tested outside the agent-r1 repository)")
    text = TUTORIAL.read_text(encoding="utf-8")
    server = next(
        b for b in re.findall(r"```python\n(.*?)```", text, re.S) if b.startswith("# notes_server.py")
    )
    config = next(
        b for b in re.findall(r"```yaml\n(.*?)```", text, re.S) if "name: mcp" in b and "model:" in b
    )
    return server, yaml.safe_load(config)


@pytest.fixture(scope="module")
def smollm2() -> Path:
    from agent_r1.testing.pytest_plugin import prepared_smollm2

    return prepared_smollm2()


def test_the_tutorial_config_shows_its_tools_to_smollm2(smollm2: Path, tmp_path: Path) -> None:
    from agent_r1.rollout.chat import ChatRenderer
    from agent_r1.testing.models import smollm2_tokenizer

    server_code, raw = tutorial_blocks()
    (tmp_path / "notes_server.py").write_text(server_code, encoding="utf-8")
    assert raw["model"]["path"] == "smollm2-135m-instruct"
    [section] = raw["environment"]["servers"]
    assert section["command"] == ["python", "notes_server.py"]
    section["command"] = [sys.executable, str(tmp_path / "notes_server.py")]  # this interpreter, this folder
    raw["output_dir"] = str(tmp_path / "run")

    report = run_preflight(raw)
    assert report.ok, [c for c in report.checks if c.status != "ok"]
    assert messages(report, "tools", "ok") == [
        "environment (mcp): the first prompt shows its 3 tools (the system message names them)"
    ]
    # the first prompt as SmolLM2 reads it: every tool's schema in the system message
    options = {key: value for key, value in raw["environment"].items() if key != "name"}
    env = get_registry().build("environments", "mcp", options)
    start = asyncio.run(env.reset(task()))
    text = ChatRenderer(smollm2_tokenizer()).render_text(
        start.messages, start.tools, add_generation_prompt=True
    )
    assert text.startswith("<|im_start|>system\n# Tools\n")
    for name in ("calculator", "note", "read_notes"):
        assert f'{{"name": "{name}", "description": ' in text

    # without tool_schemas: system, SmolLM2's template drops the schemas: refused before the model loads
    del raw["environment"]["tool_schemas"]
    [refused] = messages(run_preflight(raw), "tools", "fail")
    assert "rendered with the chat template of tokenizer " in refused and "smollm2-135m-instruct" in refused
    assert "does not show the tool(s) 'calculator', 'note', 'read_notes'" in refused
    assert "ignores its tools argument" in refused and "environment.tool_schemas: system" in refused
