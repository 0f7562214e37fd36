"""The ``mcp`` environment's config, tool naming and argument models, without a server: the
listings are real ``mcp.types.Tool`` values as a server would send them."""

from __future__ import annotations

from typing import Any

import pytest
from mcp.types import Tool as ListedTool
from pydantic import ValidationError

from agent_r1 import ConfigError
from agent_r1.json_schema import arguments_model
from agent_r1.registry import get_registry
from agent_r1_plugin_mcp.config import ServerConfig
from agent_r1_plugin_mcp.env import McpEnvConfig, build_catalog


def listed(
    name: str, properties: dict[str, Any] | None = None, required: list[str] | None = None
) -> ListedTool:
    schema: dict[str, Any] = {"type": "object", "properties": properties or {}}
    if required is not None:
        schema["required"] = required
    return ListedTool(name=name, description=f"the {name} tool", input_schema=schema)


def config(**options: Any) -> McpEnvConfig:
    servers = options.pop(
        "servers", [{"name": "a", "command": "python a.py"}, {"name": "b", "url": "http://h/mcp"}]
    )
    return McpEnvConfig.model_validate({"servers": servers, **options})


def test_a_server_needs_exactly_one_transport_and_a_usable_name() -> None:
    assert ServerConfig(name="a", command="python -m srv --flag 'two words'").command == [
        "python",
        "-m",
        "srv",
        "--flag",
        "two words",
    ]
    assert ServerConfig(name="w", url="http://127.0.0.1:1/mcp").transport == "http"
    with pytest.raises(ValidationError, match="set exactly one of 'command'"):
        ServerConfig(name="a", command=["x"], url="http://h/mcp")
    with pytest.raises(ValidationError, match="set exactly one of 'command'"):
        ServerConfig(name="a")
    with pytest.raises(ValidationError, match="must start with http:// or https://"):
        ServerConfig(name="a", url="127.0.0.1:8000/mcp")
    with pytest.raises(ValidationError, match="server name 'my server' must start with a letter"):
        ServerConfig(name="my server", command=["x"])
    with pytest.raises(ValidationError, match="servers lists 'a' more than once"):
        config(servers=[{"name": "a", "command": ["x"]}, {"name": "a", "command": ["y"]}])


def test_unknown_keys_are_errors_naming_the_key_and_the_environment() -> None:
    with pytest.raises(ConfigError) as raised:
        get_registry().build("environments", "mcp", {"servers": [{"name": "a", "comand": ["x"]}]})
    message = str(raised.value)
    assert "servers[0].comand" in message and "unknown key 'comand'" in message
    assert "Did you mean 'command'?" in message


def test_names_stay_unless_they_collide() -> None:
    listings = {"a": [listed("search"), listed("add")], "b": [listed("search"), listed("fetch")]}
    names = [cls.name for cls in build_catalog(config(), listings, ["calculator"]).classes]
    assert names == ["a__search", "add", "b__search", "fetch"]
    # a registered tool's name counts too
    names = [cls.name for cls in build_catalog(config(), listings, ["fetch"]).classes]
    assert names == ["a__search", "add", "b__search", "b__fetch"]
    prefixed = build_catalog(config(tool_names="prefixed"), listings, []).classes
    assert [cls.name for cls in prefixed] == ["a__search", "a__add", "b__search", "b__fetch"]
    assert prefixed[0].remote_name == "search" and prefixed[0].server.name == "a"


def test_a_tool_list_names_tools_the_server_has() -> None:
    servers = [{"name": "a", "command": ["x"], "tools": ["add", "mul"]}]
    with pytest.raises(
        ConfigError, match=r"servers\[0\] \('a'\): the server lists no tool 'mul'; it lists 'add'"
    ):
        build_catalog(config(servers=servers), {"a": [listed("add")]}, [])
    only = build_catalog(
        config(servers=[{"name": "a", "command": ["x"], "tools": ["add"]}]),
        {"a": [listed("add"), listed("x")]},
        [],
    )
    assert [cls.name for cls in only.classes] == ["add"]


def test_a_prefixed_name_that_is_taken_is_an_error() -> None:
    # 'x' is on both servers, so a's becomes 'a__x', which a already lists under that very name
    listings = {"a": [listed("a__x"), listed("x")], "b": [listed("x")]}
    servers = [{"name": "a", "command": ["x"]}, {"name": "b", "command": ["y"]}]
    with pytest.raises(ConfigError, match="would be exposed as 'a__x', a name already taken"):
        build_catalog(config(servers=servers), listings, [])


def test_the_schema_shown_is_the_servers_own() -> None:
    tool = listed("add", {"a": {"type": "integer", "minimum": 0}, "b": {"type": "integer"}}, ["a", "b"])
    [cls] = build_catalog(config(servers=[{"name": "m", "command": ["x"]}]), {"m": [tool]}, []).classes
    function = cls.schema()["function"]
    assert function["name"] == "add" and function["description"] == "the add tool"
    assert function["parameters"]["properties"]["a"] == {"type": "integer", "minimum": 0}
    assert function["parameters"]["required"] == ["a", "b"]


def test_arguments_models_follow_the_json_schema() -> None:
    schema = {
        "type": "object",
        "properties": {
            "query": {"type": "string", "description": "what to look for"},
            "limit": {"type": "integer"},
            "tags": {"type": "array", "items": {"type": "string"}},
            "filter": {"type": "object"},
            "mode": {"enum": ["a", "b"]},
            "class": {"type": "string"},  # a Python keyword
            "max-hits": {"type": "number"},  # not an identifier
            "json": {"type": "boolean"},  # a pydantic method name
        },
        "required": ["query"],
    }
    model = arguments_model("search", schema)
    parsed = model.model_validate({"query": "q", "class": "c", "max-hits": 2.5, "json": True, "mode": "a"})
    assert parsed.model_dump(by_alias=True, exclude_unset=True) == {
        "query": "q",
        "class": "c",
        "max-hits": 2.5,
        "json": True,
        "mode": "a",
    }
    with pytest.raises(ValidationError, match="query"):
        model.model_validate({"limit": 3})
    with pytest.raises(ValidationError, match="limit"):
        model.model_validate({"query": "q", "limit": "many"})
    with pytest.raises(ValidationError, match="extra"):
        model.model_validate({"query": "q", "unknown": 1})
    # a schema that allows more keys lets them through to the server
    open_model = arguments_model("open", {**schema, "additionalProperties": True})
    assert (
        open_model.model_validate({"query": "q", "unknown": 1}).model_dump(exclude_unset=True)["unknown"] == 1
    )
    # the tags format maps a bare tag body to the only required string field
    from agent_r1.builtins.formats import single_string_field

    tool = build_catalog(
        config(servers=[{"name": "m", "command": ["x"]}]),
        {"m": [listed("search", schema["properties"], ["query"])]},
        [],
    ).classes[0]
    assert single_string_field(tool) == "query"
