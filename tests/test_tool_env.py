"""The generic tool environment (agent_r1.builtins.tool_env), with real tools registered through an
in-process plugin: tools that sleep, hang, raise and flood."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from typing import Any, ClassVar

import pytest
from pydantic import BaseModel, ConfigDict, ValidationError

from agent_r1 import hookimpl
from agent_r1.builtins.formats import HermesFormat, TagsFormat
from agent_r1.builtins.tool_env import NO_CALL_MESSAGE, ToolEnv, ToolError
from agent_r1.contracts import ComponentConfig, Tool
from agent_r1.errors import ComponentNotFound, ConfigError
from agent_r1.mdp import Action, Task, ToolCall, ToolResult
from agent_r1.registry import Registry, get_registry, reset_registry

# --------------------------------------------------------------------------------------------
# Test tools
# --------------------------------------------------------------------------------------------


class Echo(Tool):
    """Sync; returns its text (times ``repeat`` from the tool config)."""

    name = "echo"
    description = "Repeat the text."

    class Config(ComponentConfig):
        repeat: int = 1

    class Arguments(BaseModel):
        model_config = ConfigDict(extra="forbid")
        text: str

    def run(self, arguments: Arguments) -> str:
        return arguments.text * self.config.repeat


class Nap(Tool):
    """Async; sleeps ``seconds`` then reports."""

    name = "nap"
    description = "Sleep asynchronously."

    class Arguments(BaseModel):
        model_config = ConfigDict(extra="forbid")
        seconds: float

    async def run(self, arguments: Arguments) -> str:
        await asyncio.sleep(arguments.seconds)
        return f"slept {arguments.seconds}"


class Doze(Tool):
    """Sync; blocks its thread with ``time.sleep``."""

    name = "doze"
    description = "Sleep in a thread."
    threads: set[str] = set()

    class Arguments(BaseModel):
        model_config = ConfigDict(extra="forbid")
        seconds: float

    def run(self, arguments: Arguments) -> str:
        Doze.threads.add(threading.current_thread().name)
        time.sleep(arguments.seconds)
        return "awake"


class Boom(Tool):
    name = "boom"
    description = "Always fails."

    class Arguments(BaseModel):
        model_config = ConfigDict(extra="forbid")
        friendly: bool = False

    def run(self, arguments: Arguments) -> str:
        if arguments.friendly:
            raise ToolError("the service is down, try again later")
        raise RuntimeError("kaboom")


class Flood(Tool):
    name = "flood"
    description = "Returns a very long text."

    class Arguments(BaseModel):
        model_config = ConfigDict(extra="forbid")
        size: int

    def run(self, arguments: Arguments) -> str:
        return "x" * arguments.size


class Rich(Tool):
    """Returns a full ToolResult (with a wrong call id that the environment must fix)."""

    name = "rich"
    description = "Returns a ToolResult."

    class Arguments(BaseModel):
        model_config = ConfigDict(extra="forbid")

    def run(self, arguments: Arguments) -> ToolResult:
        return ToolResult(
            call_id="whatever", name="whatever", content="not found", ok=False, error="not_found"
        )


class Counted(Tool):
    """Counts its constructions (a stand-in for a tool that loads an index when built)."""

    name = "counted"
    description = "Say how many instances exist."
    built: ClassVar[int] = 0

    class Config(ComponentConfig):
        label: str = ""

    class Arguments(BaseModel):
        model_config = ConfigDict(extra="forbid")

    def __init__(self, config: Any = None) -> None:
        super().__init__(config)
        Counted.built += 1

    def run(self, arguments: Arguments) -> str:
        return f"{self.config.label}{Counted.built}"


class Notebook(Tool):
    """Keeps per-episode state, and says so with ``per_episode``."""

    name = "notebook"
    description = "Write a note; returns every note of this episode."
    per_episode = True
    built: ClassVar[int] = 0

    class Arguments(BaseModel):
        model_config = ConfigDict(extra="forbid")
        note: str

    def __init__(self, config: Any = None) -> None:
        super().__init__(config)
        Notebook.built += 1
        self.notes: list[str] = []

    def run(self, arguments: Arguments) -> str:
        self.notes.append(arguments.note)
        return ", ".join(self.notes)


class Unpicklable(Tool):
    """Asks for process isolation but holds a lock, which cannot travel to a child process."""

    name = "unpicklable"
    description = "Cannot be pickled."
    isolation = "process"

    class Arguments(BaseModel):
        model_config = ConfigDict(extra="forbid")

    def __init__(self, config: Any = None) -> None:
        super().__init__(config)
        self.lock = threading.Lock()

    def run(self, arguments: Arguments) -> str:
        return "never"


class ToolsPlugin:
    @hookimpl
    def register_tools(self) -> list[type[Tool]]:
        return [Echo, Nap, Doze, Boom, Flood, Rich, Counted, Notebook, Unpicklable]


@pytest.fixture
def registry(monkeypatch: pytest.MonkeyPatch) -> Iterator[Registry]:
    """The bundled plugins plus the test tools, as the process-wide registry for the test."""
    monkeypatch.setenv("AGENT_R1_LOAD_PLUGINS", "builtins")  # third-party plugins stay out
    previous = get_registry()
    registry = Registry(entry_points=True)
    registry.register_plugin(ToolsPlugin(), "test_tools")
    reset_registry(registry)
    registry.load()
    yield registry
    reset_registry(previous)


ALL_TOOLS = ["echo", "nap", "doze", "boom", "flood", "rich"]


def make_env(**options: Any) -> ToolEnv:
    options.setdefault("tools", ALL_TOOLS)
    return get_registry().build("environments", "tool_env", options)


def step(env: ToolEnv, text: str, turn: int = 0, **action: Any) -> tuple[Action, Any]:
    act = Action(text=text, **action)
    return act, asyncio.run(env.step(act, turn))


TASK = Task(id="t1", messages=[{"role": "user", "content": "Hello?"}])


# --------------------------------------------------------------------------------------------
# Configuration
# --------------------------------------------------------------------------------------------


def test_tool_env_is_registered_and_builds_its_tools_and_format(registry: Registry) -> None:
    assert registry.get("environments", "tool_env") is ToolEnv
    env = make_env(tools=["echo", {"name": "flood"}], format={"name": "hermes", "stop_on_call_end": True})
    assert list(env.tools) == ["echo", "flood"]
    assert isinstance(env.format, HermesFormat)
    assert env.stop_sequences == ["</tool_call>"]
    assert isinstance(make_env(tools=["echo"]).format, TagsFormat)  # the default format
    assert make_env(tools=["echo"], format="hermes").format.name == "hermes"


def test_requires_lists_tools_and_format_for_the_run_check(registry: Registry) -> None:
    config = ToolEnv.Config.model_validate({"tools": ["echo", {"name": "nap"}], "format": {"name": "tags"}})
    assert ToolEnv.requires(config) == [
        ("tools", "echo", {}, "tools[0]"),
        ("tools", "nap", {}, "tools[1]"),
        ("tool_call_formats", "tags", {}, "format"),
    ]
    config = ToolEnv.Config.model_validate(
        {"tools": [{"name": "echo", "repeat": 2}], "format": {"name": "hermes", "answer_tag": None}}
    )
    assert ToolEnv.requires(config) == [
        ("tools", "echo", {"repeat": 2}, "tools[0]"),
        ("tool_call_formats", "hermes", {"answer_tag": None}, "format"),
    ]
    for kind, name, options, _path in ToolEnv.requires(config):  # each resolves and validates
        registry.build(kind, name, options)


def test_tool_options_are_passed_and_validated(registry: Registry) -> None:
    env = make_env(tools=[{"name": "echo", "repeat": 3}])
    _, observation = step(env, "<echo>ab</echo>")
    assert observation.tool_results[0].content == "ababab"
    with pytest.raises(ConfigError, match=r"tool 'echo'.*unknown key 'repat'.*Did you mean 'repeat'"):
        make_env(tools=[{"name": "echo", "repat": 3}])
    with pytest.raises(ComponentNotFound, match=r"unknown tool 'ecco'. Did you mean 'echo'"):
        make_env(tools=["ecco"])
    with pytest.raises(ConfigError, match=r"tool-call format 'tags'.*unknown key 'result'"):
        make_env(tools=["echo"], format={"name": "tags", "result": "info"})


def test_bad_environment_options_are_errors(registry: Registry) -> None:
    with pytest.raises(ValidationError, match="'echo' more than once"):
        ToolEnv.Config.model_validate({"tools": ["echo", {"name": "echo", "repeat": 2}]})
    with pytest.raises(ConfigError, match="unknown key 'max_turn'"):
        make_env(max_turn=3)
    with pytest.raises(ConfigError, match="tools 'echo' and 'nap' both use the tag <x>"):
        make_env(tools=["echo", "nap"], format={"name": "tags", "tool_tags": {"echo": "x", "nap": "x"}})


def test_episodes_share_tools_built_once_per_configuration(registry: Registry) -> None:
    Counted.built = Notebook.built = 0
    config = ToolEnv.Config.model_validate({"tools": ["counted", "notebook", "echo"]})
    envs = [ToolEnv(config) for _ in range(5)]  # what the engine does: one per episode
    envs.append(make_env(tools=["counted", {"name": "notebook"}, "echo"]))  # same config, other spelling
    assert Counted.built == 1
    assert all(env.tools["counted"] is envs[0].tools["counted"] for env in envs)
    assert all(env.format is envs[0].format for env in envs)
    assert list(envs[0].tools) == ["counted", "notebook", "echo"]
    # a per-episode tool is built for every episode and keeps its state to itself
    assert Notebook.built == 6
    assert len({id(env.tools["notebook"]) for env in envs}) == 6
    assert step(envs[0], "<notebook>a</notebook>")[1].tool_results[0].content == "a"
    assert step(envs[0], "<notebook>b</notebook>")[1].tool_results[0].content == "a, b"
    assert step(envs[1], "<notebook>c</notebook>")[1].tool_results[0].content == "c"
    # other tool options are another configuration; a new registry builds anew
    make_env(tools=[{"name": "counted", "label": "x"}])
    assert Counted.built == 2
    reset_registry(Registry(entry_points=True)).register_plugin(ToolsPlugin(), "test_tools")
    ToolEnv(config)
    assert Counted.built == 3


def test_a_process_isolated_tool_that_cannot_be_pickled_is_a_config_error(registry: Registry) -> None:
    with pytest.raises(
        ConfigError,
        match=r"tool_env.tools\[0\]: tool 'unpicklable' \(test_tool_env.Unpicklable\) has isolation "
        r"'process' but cannot be pickled to its child process \(TypeError: cannot pickle '_thread.lock'",
    ):
        make_env(tools=["unpicklable"])


# --------------------------------------------------------------------------------------------
# reset
# --------------------------------------------------------------------------------------------


def test_reset_adds_prompt_and_instructions_to_a_new_system_message(registry: Registry) -> None:
    env = make_env(tools=["echo"], system_prompt="Be brief.")
    start = asyncio.run(env.reset(TASK))
    system, user = start.messages
    assert system["role"] == "system"
    assert system["content"].startswith("Be brief.\n\nTo use a tool, write its tag and stop")
    assert "- <echo>text</echo>: Repeat the text." in system["content"]
    assert user == {"role": "user", "content": "Hello?"}
    assert start.tools == []  # tags: the tools are described in the prompt


def test_reset_merges_into_an_existing_system_message_without_mutating_the_task(registry: Registry) -> None:
    task = Task(
        id="t", messages=[{"role": "system", "content": "Task rules."}, {"role": "user", "content": "Q"}]
    )
    env = make_env(tools=["echo"], system_prompt="Be brief.", include_format_instructions=False)
    start = asyncio.run(env.reset(task))
    assert start.messages[0] == {"role": "system", "content": "Be brief.\n\nTask rules."}
    assert task.messages[0]["content"] == "Task rules."
    bare = make_env(
        tools=["echo"], format={"name": "hermes", "answer_tag": None}, include_format_instructions=True
    )
    assert asyncio.run(bare.reset(TASK)).messages == TASK.messages  # nothing to add: no system message


def test_reset_gives_tool_schemas_when_the_format_uses_the_template(registry: Registry) -> None:
    env = make_env(tools=["echo", "nap"], format="hermes")
    start = asyncio.run(env.reset(TASK))
    assert [tool["function"]["name"] for tool in start.tools] == ["echo", "nap"]
    assert start.tools[0] == Echo.schema()
    assert (
        start.messages[0]["content"] == "When you have the final answer, write it as <answer>answer</answer>."
    )


def test_tool_schemas_system_writes_the_schemas_into_the_system_message(registry: Registry) -> None:
    env = make_env(tools=["echo", "nap"], format="hermes", tool_schemas="system", system_prompt="Be brief.")
    start = asyncio.run(env.reset(TASK))
    assert start.tools == []  # nothing for the chat template to drop
    system = start.messages[0]["content"]
    assert system.startswith(
        "Be brief.\n\n# Tools\nYou may call one or more of these tools (JSON schemas):\n"
    )
    lines = system.splitlines()
    for tool in (Echo, Nap):  # each schema whole, as JSON on a line of its own
        assert (
            json.loads(next(line for line in lines if f'"name": "{tool.name}"' in line))
            == (tool.schema()["function"])
        )
    # an example written exactly as the format parses it, then the answer convention
    example = system.split("To call a tool, write:\n", 1)[1].split("\nWhen you have", 1)[0]
    [call] = env.format.parse(example, env.tool_classes).tool_calls
    assert (call.name, call.arguments) == ("echo", {"text": "..."})
    assert system.endswith("When you have the final answer, write it as <answer>answer</answer>.")
    # the calls the model writes are read as before
    _, observation = step(env, '<tool_call>{"name": "echo", "arguments": {"text": "hi"}}</tool_call>')
    assert observation.tool_results[0].content == "hi"
    # a format that describes its tools itself has nothing to move: tags is the same either way
    tags = [
        asyncio.run(make_env(tools=["echo"], tool_schemas=where).reset(TASK))
        for where in ("system", "template")
    ]
    assert tags[0].messages == tags[1].messages and tags[0].tools == tags[1].tools == []
    with pytest.raises(ValidationError, match="tool_schemas"):
        ToolEnv.Config.model_validate({"tools": ["echo"], "tool_schemas": "prompt"})


# --------------------------------------------------------------------------------------------
# step: calls
# --------------------------------------------------------------------------------------------


def test_step_runs_calls_and_renders_results(registry: Registry) -> None:
    env = make_env()
    _, observation = step(env, "First <echo>hi</echo>", turn=2)
    assert [c.id for c in observation.tool_calls] == ["call_2_0"]
    assert observation.answer is None and observation.parse_errors == []
    (result,) = observation.tool_results
    assert (result.call_id, result.name, result.content, result.ok) == ("call_2_0", "echo", "hi", True)
    assert observation.messages == [{"role": "user", "content": "<result>hi</result>"}]
    assert not observation.done and observation.termination is None
    assert observation.info == {"tool_calls": 1, "tool_errors": 0, "format_errors": 0}
    assert observation.rewards == []


def test_calls_of_one_turn_run_concurrently(registry: Registry) -> None:
    env = make_env()
    Doze.threads.clear()
    started = time.monotonic()
    _, observation = step(env, '<nap>{"seconds": 0.3}</nap>' * 2 + '<doze>{"seconds": 0.3}</doze>' * 2)
    elapsed = time.monotonic() - started
    assert [r.ok for r in observation.tool_results] == [True] * 4
    assert elapsed < 0.9, f"4 calls of 0.3 s took {elapsed:.2f} s: they did not overlap"
    latest_start = max(r.started_at for r in observation.tool_results)
    earliest_end = min(r.finished_at for r in observation.tool_results)
    assert latest_start < earliest_end  # all four were running at the same moment
    assert len(Doze.threads) == 2  # sync tools ran in worker threads, one each


def test_steps_of_different_episodes_overlap(registry: Registry) -> None:
    envs = [make_env() for _ in range(3)]

    async def episodes() -> list[Any]:
        return await asyncio.gather(
            *(env.step(Action(text='<nap>{"seconds": 0.25}</nap>'), 0) for env in envs)
        )

    started = time.monotonic()
    observations = asyncio.run(episodes())
    assert time.monotonic() - started < 0.6
    results = [o.tool_results[0] for o in observations]
    assert max(r.started_at for r in results) < min(r.finished_at for r in results)


def test_every_result_has_timestamps(registry: Registry) -> None:
    env = make_env(call_timeout_s=0.1, max_result_chars=10, max_calls_per_turn=5)
    text = '<echo>a</echo><boom>{}</boom><nap>{"seconds": 1}</nap><flood>{"size": 50}</flood><rich>{}</rich>'
    _, observation = step(env, text)
    assert [r.error for r in observation.tool_results] == [None, "exception", "timeout", None, "not_found"]
    for result in observation.tool_results:
        assert result.started_at is not None and result.finished_at is not None
        assert result.finished_at >= result.started_at
        assert result.duration_s >= 0


def test_exceptions_become_error_results(registry: Registry) -> None:
    env = make_env()
    _, observation = step(env, '<boom>{}</boom><boom>{"friendly": true}</boom>')
    crash, friendly = observation.tool_results
    assert (crash.ok, crash.error, crash.content) == (False, "exception", "Error: RuntimeError: kaboom")
    assert (friendly.ok, friendly.error) == (False, "exception")
    assert friendly.content == "Error: the service is down, try again later"
    assert observation.info["tool_errors"] == 2
    assert observation.messages[0]["content"] == (
        "<result>Error: RuntimeError: kaboom</result>\n"
        "<result>Error: the service is down, try again later</result>"
    )


def test_async_and_sync_calls_time_out(registry: Registry) -> None:
    env = make_env(call_timeout_s=0.2)
    started = time.monotonic()
    _, observation = step(env, '<nap>{"seconds": 5}</nap><doze>{"seconds": 0.6}</doze><echo>ok</echo>')
    assert time.monotonic() - started < 1.5  # the 5 s nap was cancelled
    nap, doze, echo = observation.tool_results
    for result in (nap, doze):
        assert (result.ok, result.error) == (False, "timeout")
        assert result.content == "Error: the call took longer than 0.2 s and was stopped"
        assert 0.15 < result.duration_s < 0.5
    assert echo.ok and echo.content == "ok"


def test_long_results_are_truncated_with_a_marker(registry: Registry) -> None:
    env = make_env(max_result_chars=100)
    _, observation = step(env, '<flood>{"size": 250}</flood><flood>{"size": 100}</flood>')
    long, exact = observation.tool_results
    assert long.truncated and long.content == "x" * 100 + "\n[truncated: 150 more characters]"
    assert not exact.truncated and exact.content == "x" * 100
    unlimited = make_env(max_result_chars=None)
    assert step(unlimited, '<flood>{"size": 9000}</flood>')[1].tool_results[0].content == "x" * 9000


def test_a_tool_result_returned_by_the_tool_is_kept_with_the_right_ids(registry: Registry) -> None:
    _, observation = step(make_env(), "<rich>{}</rich>", turn=1)
    (result,) = observation.tool_results
    assert (result.call_id, result.name, result.ok, result.error) == ("call_1_0", "rich", False, "not_found")
    assert result.started_at is not None


# --------------------------------------------------------------------------------------------
# step: malformed actions
# --------------------------------------------------------------------------------------------


def test_malformed_calls_are_shown_to_the_agent(registry: Registry) -> None:
    env = make_env(format="hermes")
    text = (
        '<tool_call>{"name": "echo", "arguments": {"text": "fine"}}</tool_call>'
        '<tool_call>{"name": "echo", "arguments": {"text": 5}}</tool_call>'
        '<tool_call>{"name": "ehco", "arguments": {}}</tool_call>'
        '<tool_call>{"name": "echo" "arguments"}</tool_call>'
    )
    _, observation = step(env, text)
    assert [c.arguments for c in observation.tool_calls] == [{"text": "fine"}]
    assert observation.parse_errors == [
        "tool call 2 (echo): argument 'text': Input should be a valid string (got 5).",
        "tool call 3: unknown tool 'ehco'. Did you mean 'echo'? Known tools: 'echo', 'nap', 'doze', 'boom', "
        "'flood', 'rich'.",
        "tool call 4: invalid JSON at line 1, column 17 (char 16): Expecting ',' delimiter. "
        'Write <tool_call>{"name": "<tool>", "arguments": {...}}</tool_call>.',
    ]
    assert observation.info == {"tool_calls": 1, "tool_errors": 0, "format_errors": 3}
    assert observation.messages[0] == {"role": "tool", "name": "echo", "content": "fine"}
    assert [m["content"] for m in observation.messages[1:]] == [
        f"Error: {e}" for e in observation.parse_errors
    ]
    assert not observation.done


def test_too_many_calls_are_capped_by_the_environment(registry: Registry) -> None:
    env = make_env(max_calls_per_turn=2)
    _, observation = step(env, "<echo>1</echo><echo>2</echo><echo>3</echo>")
    assert [r.content for r in observation.tool_results] == ["1", "2"]
    assert [c.id for c in observation.tool_calls] == ["call_0_0", "call_0_1"]
    assert observation.parse_errors == [
        "too many tool calls in one turn: 3 given, at most 2 allowed. Calls 3-3 (echo) were not run; "
        "make at most 2 calls per turn."
    ]
    assert observation.messages[0]["content"].endswith(
        f"<result>Error: {observation.parse_errors[0]}</result>"
    )


def test_a_turn_with_only_a_broken_call_gets_feedback_instead_of_ending(registry: Registry) -> None:
    env = make_env()
    _, observation = step(env, "<echo>unfinished")
    assert not observation.done
    assert observation.parse_errors == ["tool call 1 <echo>: the tag is not closed: write <echo>...</echo>."]
    assert observation.messages == [
        {"role": "user", "content": f"<result>Error: {observation.parse_errors[0]}</result>"}
    ]


def test_calls_the_format_let_through_are_checked_again(registry: Registry) -> None:
    env = make_env()
    unknown = asyncio.run(env.call(ToolCall(id="c", name="nope", arguments={})))
    assert (unknown.ok, unknown.error) == (False, "unknown_tool")
    assert unknown.content.startswith("Error: unknown tool 'nope'. Known tools: 'echo'")
    bad = asyncio.run(env.call(ToolCall(id="c", name="echo", arguments={"text": 1})))
    assert (bad.ok, bad.error) == (False, "bad_arguments")
    assert bad.content == "Error: argument 'text': Input should be a valid string (got 1)"


def test_a_stop_sequence_missing_from_the_text_is_restored(registry: Registry) -> None:
    env = make_env(tools=["echo"])
    _, observation = step(env, "Let me echo <echo>hi", finish_reason="stop")
    assert observation.parse_errors == [] and [r.content for r in observation.tool_results] == ["hi"]
    _, cut = step(env, "Let me echo <echo>hi", finish_reason="length")  # really cut off: an error
    assert cut.tool_calls == [] and cut.parse_errors


# --------------------------------------------------------------------------------------------
# step: termination and process rewards
# --------------------------------------------------------------------------------------------


def test_an_answer_ends_the_episode_without_running_tools(registry: Registry) -> None:
    env = make_env()
    _, observation = step(env, "<echo>x</echo> <answer> 42 </answer>")
    assert observation.answer == "42" and len(observation.tool_calls) == 1
    assert observation.done and observation.termination == "answer"
    assert observation.tool_results == [] and observation.messages == []
    assert observation.info["ignored_tool_calls"] == 1


def test_end_on_answer_false_runs_the_calls_and_goes_on(registry: Registry) -> None:
    env = make_env(end_on_answer=False)
    _, observation = step(env, "<echo>x</echo> <answer>42</answer>")
    assert observation.answer == "42" and not observation.done
    assert [r.content for r in observation.tool_results] == ["x"]
    _, last = step(env, "<answer>42</answer>", turn=1)
    assert last.done and last.termination == "answer"


def test_a_turn_without_call_or_answer_ends_or_nudges(registry: Registry) -> None:
    _, observation = step(make_env(), "I do not know.")
    assert observation.done and observation.termination == "no_tool_call"
    _, nudged = step(make_env(end_on_no_tool_call=False), "I do not know.")
    assert not nudged.done
    assert nudged.parse_errors == [NO_CALL_MESSAGE]
    assert nudged.messages == [{"role": "user", "content": f"<result>Error: {NO_CALL_MESSAGE}</result>"}]
    assert nudged.info["format_errors"] == 1


def test_max_turns_ends_after_running_the_last_calls(registry: Registry) -> None:
    env = make_env(max_turns=2)
    assert not step(env, "<echo>a</echo>", turn=0)[1].done
    _, observation = step(env, "<echo>b</echo>", turn=1)
    assert observation.done and observation.termination == "max_turns"
    assert [r.content for r in observation.tool_results] == ["b"]  # logged, though never shown
    assert observation.messages == []
    _, broken = step(env, "<echo>b", turn=1)
    assert broken.done and broken.termination == "max_turns"


def test_process_rewards_are_emitted_per_turn_when_configured(registry: Registry) -> None:
    env = make_env(tool_success_reward=0.1, tool_failure_reward=-0.2, format_error_reward=-0.5)
    _, observation = step(env, "<echo>a</echo><echo>b</echo><boom>{}</boom><ehco>x</ehco>", turn=3)
    rewards = {r.name: r for r in observation.rewards}
    assert set(rewards) == {"tool_success", "tool_failure", "format_error"}
    assert rewards["tool_success"].value == pytest.approx(0.2)
    assert rewards["tool_failure"].value == pytest.approx(-0.2)
    assert rewards["format_error"].value == pytest.approx(-0.5)
    for reward in observation.rewards:
        assert (reward.kind, reward.turn, reward.source) == ("process", 3, "tool_env")
    assert step(make_env(), "<echo>a</echo><boom>{}</boom><ehco>x</ehco>")[1].rewards == []
    clean = step(env, "<echo>a</echo>")[1]
    assert [r.name for r in clean.rewards] == ["tool_success"]


def test_parse_results_come_back_in_the_observation_and_the_action_is_left_alone(
    registry: Registry,
) -> None:
    env = make_env(format="hermes")
    call = {"name": "echo", "arguments": {"text": "a"}}
    action, observation = step(env, f"<tool_call>{json.dumps(call)}</tool_call><answer>b</answer>", turn=5)
    assert observation.tool_calls == [
        ToolCall(
            id="call_5_0",
            name="echo",
            arguments={"text": "a"},
            raw=f"<tool_call>{json.dumps(call)}</tool_call>",
        )
    ]
    assert (observation.answer, observation.parse_errors) == ("b", [])
    assert observation.model_dump()["tool_calls"][0]["id"] == "call_5_0"  # what the engine records
    untouched = Action(text=action.text)
    assert action == untouched  # tool_calls, answer and parse_errors stay as the engine made them
