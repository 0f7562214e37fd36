"""The bundled tool-call formats: ``hermes`` and ``tags`` (agent_r1.builtins.formats)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ConfigDict, Field

from agent_r1.builtins.formats import HermesFormat, TagsFormat, single_string_field
from agent_r1.contracts import Tool
from agent_r1.mdp import ToolCall, ToolResult
from agent_r1.registry import Registry


class Calc(Tool):
    name = "calculator"
    description = "Evaluate an arithmetic expression."

    class Arguments(BaseModel):
        model_config = ConfigDict(extra="forbid")
        expression: str

    def run(self, arguments: Arguments) -> str:
        return "0"


class Search(Tool):
    name = "search"
    description = "Search the web."

    class Arguments(BaseModel):
        model_config = ConfigDict(extra="forbid")
        query: str
        top_k: int = 3

    def run(self, arguments: Arguments) -> str:
        return ""


class Lookup(Tool):
    name = "lookup"
    description = "Look a key up in a table."

    class Arguments(BaseModel):
        model_config = ConfigDict(extra="forbid")
        table: str
        key: int = Field(ge=0)
        exact: bool = True

    def run(self, arguments: Arguments) -> str:
        return ""


TOOLS: dict[str, type[Tool]] = {"calculator": Calc, "search": Search, "lookup": Lookup}


def hermes(**options: Any) -> HermesFormat:
    return HermesFormat(options)


def tags(**options: Any) -> TagsFormat:
    return TagsFormat({"tool_tags": {"calculator": "calc"}, **options})


def call_json(name: str, **arguments: Any) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


def test_both_formats_are_registered_under_their_names(builtin_registry: Registry) -> None:
    assert builtin_registry.get("tool_call_formats", "hermes") is HermesFormat
    assert builtin_registry.get("tool_call_formats", "tags") is TagsFormat
    assert HermesFormat.tools_in_template and not TagsFormat.tools_in_template


def test_tool_schema_has_the_openai_function_shape() -> None:
    schema = Lookup.schema()
    assert schema["type"] == "function"
    function = schema["function"]
    assert function["name"] == "lookup" and function["description"] == "Look a key up in a table."
    parameters = function["parameters"]
    assert parameters["type"] == "object" and "title" not in parameters
    assert parameters["required"] == ["table", "key"]
    assert parameters["properties"]["key"]["type"] == "integer"


# --------------------------------------------------------------------------------------------
# hermes
# --------------------------------------------------------------------------------------------


def test_hermes_parses_several_calls_and_keeps_the_raw_span() -> None:
    text = "Let me compute.\n" + call_json("calculator", expression="2+3") + call_json("search", query="x")
    parsed = hermes().parse(text, TOOLS)
    assert parsed.errors == []
    assert [(c.name, c.arguments) for c in parsed.tool_calls] == [
        ("calculator", {"expression": "2+3"}),
        ("search", {"query": "x"}),
    ]
    assert [c.id for c in parsed.tool_calls] == ["call_0", "call_1"]
    assert parsed.tool_calls[0].raw == call_json("calculator", expression="2+3")
    assert parsed.answer is None


def test_hermes_closing_tag_inside_a_json_string_does_not_end_the_call() -> None:
    text = call_json("search", query="what is </tool_call>?")
    parsed = hermes().parse(text, TOOLS)
    assert parsed.errors == []
    assert parsed.tool_calls[0].arguments == {"query": "what is </tool_call>?"}


def test_hermes_bad_json_reports_the_position_and_the_expected_shape() -> None:
    parsed = hermes().parse('<tool_call>{"name": "calculator" "arguments": {}}</tool_call>', TOOLS)
    assert parsed.tool_calls == []
    (error,) = parsed.errors
    assert error.startswith(
        "tool call 1: invalid JSON at line 1, column 23 (char 22): Expecting ',' delimiter"
    )
    assert '{"name": "<tool>", "arguments": {...}}' in error


def test_hermes_a_bad_call_does_not_hide_the_good_ones() -> None:
    text = "<tool_call>{oops}</tool_call>" + call_json("calculator", expression="1")
    parsed = hermes().parse(text, TOOLS)
    assert [c.name for c in parsed.tool_calls] == ["calculator"]
    assert parsed.tool_calls[0].id == "call_1"
    assert len(parsed.errors) == 1 and parsed.errors[0].startswith("tool call 1: invalid JSON")


def test_hermes_missing_name_and_non_object_payloads() -> None:
    parsed = hermes().parse('<tool_call>{"arguments": {}}</tool_call><tool_call>[1, 2]</tool_call>', TOOLS)
    assert parsed.tool_calls == []
    assert (
        parsed.errors[0]
        == 'tool call 1: missing "name" (the tool to call). Known tools: calculator, search, lookup.'
    )
    assert parsed.errors[1] == "tool call 2: expected a JSON object, got list."


def test_hermes_unknown_tool_suggests_the_closest_and_lists_all() -> None:
    parsed = hermes().parse(call_json("serch", query="x"), TOOLS)
    assert parsed.errors == [
        "tool call 1: unknown tool 'serch'. Did you mean 'search'? "
        "Known tools: 'calculator', 'search', 'lookup'."
    ]


def test_hermes_arguments_are_validated_against_the_tool_model() -> None:
    text = (
        call_json("lookup", table="t", key="three")
        + call_json("lookup", key=1)
        + call_json("lookup", table="t", key=1, colour="red")
        + call_json("lookup", table="t", key=-1)
    )
    parsed = hermes().parse(text, TOOLS)
    assert parsed.tool_calls == []
    assert parsed.errors == [
        "tool call 1 (lookup): argument 'key': Input should be a valid integer, unable to parse string as an "
        "integer (got 'three').",
        "tool call 2 (lookup): missing required argument 'table'.",
        "tool call 3 (lookup): unexpected argument 'colour' (accepted: table, key, exact).",
        "tool call 4 (lookup): argument 'key': Input should be greater than or equal to 0 (got -1).",
    ]


def test_hermes_accepts_arguments_as_a_json_string_and_the_parameters_key() -> None:
    text = (
        '<tool_call>{"name": "calculator", "arguments": "{\\"expression\\": \\"1+1\\"}"}</tool_call>'
        '<tool_call>{"name": "search", "parameters": {"query": "q"}}</tool_call>'
        '<tool_call>{"name": "search", "arguments": "{bad"}</tool_call>'
    )
    parsed = hermes().parse(text, TOOLS)
    assert [c.arguments for c in parsed.tool_calls] == [{"expression": "1+1"}, {"query": "q"}]
    assert len(parsed.errors) == 1
    assert parsed.errors[0].startswith(
        'tool call 3 (search): "arguments" is a string with invalid JSON at line 1'
    )


def test_hermes_unclosed_call_is_an_error_and_not_run() -> None:
    parsed = hermes().parse(call_json("calculator", expression="1").removesuffix("</tool_call>"), TOOLS)
    assert parsed.tool_calls == []
    assert parsed.errors == ["tool call 1: <tool_call> is not closed with </tool_call>."]
    cut = hermes().parse('<tool_call>{"name": "calcul', TOOLS)
    assert cut.errors == ["tool call 1: <tool_call> is not closed with </tool_call>."]


def test_hermes_text_between_json_and_closing_tag_is_an_error() -> None:
    parsed = hermes().parse('<tool_call>{"name": "calculator", "arguments": {}} extra</tool_call>', TOOLS)
    assert parsed.tool_calls == []
    assert parsed.errors[0].startswith(
        "tool call 1: expected </tool_call> right after the JSON object, found 'extra"
    )


def test_hermes_too_many_calls_are_dropped_with_an_error() -> None:
    text = "".join(call_json("calculator", expression=str(i)) for i in range(5))
    parsed = hermes(max_calls_per_turn=2).parse(text, TOOLS)
    assert [c.arguments["expression"] for c in parsed.tool_calls] == ["0", "1"]
    assert parsed.errors == [
        "too many tool calls in one turn: 5 given, at most 2 allowed. Calls 3-5 (calculator, calculator, "
        "calculator) were not run; make at most 2 calls per turn."
    ]
    assert len(hermes().parse(text, TOOLS).tool_calls) == 5


def test_hermes_answer_tag_and_whole_text_answers() -> None:
    assert hermes().parse("So it is <answer> 42 </answer>.", TOOLS).answer == "42"
    assert hermes().parse("It is 42.", TOOLS).answer is None
    unclosed = hermes().parse("<answer>42", TOOLS)
    assert unclosed.answer is None
    assert unclosed.errors == ["<answer> is not closed: write the final answer as <answer>...</answer>."]
    whole = hermes(answer_tag=None)
    assert whole.parse("  It is 42.\n", TOOLS).answer == "It is 42."
    assert whole.parse(call_json("calculator", expression="1"), TOOLS).answer is None
    assert whole.parse("<tool_call>{bad}</tool_call>", TOOLS).answer is None
    # an answer tag inside a call's JSON is not the answer
    assert hermes().parse(call_json("search", query="<answer>1</answer>"), TOOLS).answer is None


def test_hermes_ignores_thinking() -> None:
    thought = "<think>maybe " + call_json("calculator", expression="9") + " <answer>9</answer></think>"
    parsed = hermes().parse(thought + call_json("calculator", expression="1"), TOOLS)
    assert [c.arguments for c in parsed.tool_calls] == [{"expression": "1"}]
    assert parsed.answer is None
    # Qwen3 thinking templates put <think> in the prompt: only the closing tag is generated
    assert hermes().parse("reasoning...</think><answer>7</answer>", TOOLS).answer == "7"
    assert (
        hermes().parse("<think>never finished " + call_json("calculator", expression="1"), TOOLS).tool_calls
        == []
    )
    kept = hermes(ignore_think=False).parse(thought, TOOLS)
    assert [c.arguments for c in kept.tool_calls] == [{"expression": "9"}] and kept.answer == "9"


def test_hermes_stop_sequences_instructions_and_results() -> None:
    assert hermes().stop_sequences == []
    assert hermes(stop_on_call_end=True).stop_sequences == ["</tool_call>"]
    assert hermes(stop_on_call_end=True).stop_sequences_for([Calc]) == ["</tool_call>"]
    assert (
        hermes().instructions([Calc])
        == "When you have the final answer, write it as <answer>answer</answer>."
    )
    assert hermes(answer_tag=None).instructions([Calc]) == ""
    results = [
        ToolResult(call_id="a", name="calculator", content="5"),
        ToolResult(call_id="b", name="search", content="Error: timeout", ok=False, error="timeout"),
    ]
    assert hermes().render_results(results, ["tool call 3: bad"]) == [
        {"role": "tool", "name": "calculator", "content": "5"},
        {"role": "tool", "name": "search", "content": "Error: timeout"},
        {"role": "tool", "content": "Error: tool call 3: bad"},
    ]


def test_hermes_rejects_an_invalid_answer_tag_option() -> None:
    with pytest.raises(ValueError, match="not a valid tag name"):
        HermesFormat({"answer_tag": "my answer"})


# --------------------------------------------------------------------------------------------
# tags
# --------------------------------------------------------------------------------------------


def test_tags_single_string_tools_take_the_body_and_aliases_apply() -> None:
    parsed = tags().parse("I will compute. <calc> 347 * 29 </calc>", TOOLS)
    assert parsed.errors == []
    (call,) = parsed.tool_calls
    assert (call.name, call.arguments, call.raw) == (
        "calculator",
        {"expression": "347 * 29"},
        "<calc> 347 * 29 </calc>",
    )
    assert tags().parse("<search>capital of France</search>", TOOLS).tool_calls[0].arguments == {
        "query": "capital of France"
    }


def test_tags_single_field_detection() -> None:
    assert single_string_field(Calc) == "expression"
    assert single_string_field(Search) == "query"  # top_k has a default
    assert single_string_field(Lookup) is None


def test_tags_multi_field_tools_take_a_json_object() -> None:
    parsed = tags().parse('<lookup>{"table": "people", "key": 3}</lookup>', TOOLS)
    assert parsed.tool_calls[0].arguments == {"table": "people", "key": 3}
    bad = tags().parse("<lookup>people, 3</lookup><lookup>[1]</lookup>", TOOLS)
    assert bad.tool_calls == []
    assert bad.errors[0].startswith("tool call 1 <lookup>: invalid JSON at line 1, column 1 (char 0)")
    assert bad.errors[0].endswith("The body must be a JSON object of the arguments.")
    assert bad.errors[1] == "tool call 2 <lookup>: the body must be a JSON object of the arguments, got list."
    typed = tags().parse('<lookup>{"table": "t"}</lookup>', TOOLS)
    assert typed.errors == ["tool call 1 <lookup>: missing required argument 'key'."]


def test_tags_single_string_tool_also_accepts_a_json_object_naming_its_field() -> None:
    parsed = tags().parse('<search>{"query": "q", "top_k": 5}</search><search>{not json}</search>', TOOLS)
    assert [c.arguments for c in parsed.tool_calls] == [{"query": "q", "top_k": 5}, {"query": "{not json}"}]


def test_tags_answer_unknown_tags_and_prose() -> None:
    parsed = tags().parse("<think>plan</think> a <b>bold</b> claim: 3 < 4 > 2 <answer> 84 </answer>", TOOLS)
    assert parsed.answer == "84"
    assert parsed.errors == ["unknown tool <b>. Known tools: <calc>, <search>, <lookup>."]
    assert tags(report_unknown_tags=False).parse("<b>bold</b>", TOOLS).errors == []
    alias = tags().parse("<calculator>1+1</calculator>", TOOLS)
    assert alias.errors == [
        "unknown tool <calculator>. Did you mean <calc>? Known tools: <calc>, <search>, <lookup>."
    ]
    assert tags().parse("<serch>x</serch>", TOOLS).errors == [
        "unknown tool <serch>. Did you mean <search>? Known tools: <calc>, <search>, <lookup>."
    ]
    assert tags().parse("a lone <br> and <calc", TOOLS).errors == []


def test_tags_calls_inside_think_count_and_results_written_by_the_model_are_ignored() -> None:
    parsed = tags().parse("<think>use <calc>2*3</calc></think>", TOOLS)
    assert [c.arguments for c in parsed.tool_calls] == [{"expression": "2*3"}]
    assert tags().parse("<result>6</result>", TOOLS).errors == []


def test_tags_unclosed_tags_are_errors() -> None:
    parsed = tags().parse("<calc>12*7", TOOLS)
    assert parsed.tool_calls == []
    assert parsed.errors == ["tool call 1 <calc>: the tag is not closed: write <calc>...</calc>."]
    answer = tags().parse("<answer>12", TOOLS)
    assert answer.answer is None
    assert answer.errors == ["<answer> is not closed: write the final answer as <answer>...</answer>."]


def test_tags_too_many_calls() -> None:
    text = "".join(f"<calc>{i}</calc>" for i in range(4))
    parsed = tags(max_calls_per_turn=3).parse(text, TOOLS)
    assert len(parsed.tool_calls) == 3
    assert parsed.errors == [
        "too many tool calls in one turn: 4 given, at most 3 allowed. Calls 4-4 (calculator) were not run; "
        "make at most 3 calls per turn."
    ]


def test_tags_stop_sequences_are_the_closing_tool_tags() -> None:
    assert tags().stop_sequences_for([Calc, Search]) == ["</calc>", "</search>"]
    assert tags(stop_on_call=False).stop_sequences_for([Calc]) == []
    assert tags().stop_sequences == []  # needs the tools: use stop_sequences_for


def test_tags_instructions_describe_every_tag() -> None:
    text = tags(result_tag="information").instructions([Calc, Lookup])
    assert text.splitlines() == [
        "To use a tool, write its tag and stop; the result comes back as <information>...</information>.",
        "Tools:",
        "- <calc>expression</calc>: Evaluate an arithmetic expression.",
        '- <lookup>{"table": string, "key": integer, "exact": boolean}</lookup>: Look a key up in a table.',
        "Give the final answer as <answer>answer</answer>.",
    ]
    assert tags().instructions([]) == "Give the final answer as <answer>answer</answer>."


def test_tags_results_are_one_message_in_the_result_tag() -> None:
    results = [
        ToolResult(call_id="a", name="search", content="Paris is the capital."),
        ToolResult(call_id="b", name="search", content="Error: timeout", ok=False, error="timeout"),
    ]
    fmt = tags(result_tag="information")
    assert fmt.render_results(results, ["unknown tool <b>."]) == [
        {
            "role": "user",
            "content": "<information>Paris is the capital.</information>\n"
            "<information>Error: timeout</information>\n"
            "<information>Error: unknown tool <b>.</information>",
        }
    ]
    assert tags(result_role="tool").render_results(results[:1])[0]["role"] == "tool"
    assert fmt.render_results([]) == []


def test_tags_conflicting_tags_are_reported() -> None:
    with pytest.raises(ValueError, match="tools 'calculator' and 'search' both use the tag <calc>"):
        tags(tool_tags={"calculator": "calc", "search": "calc"}).stop_sequences_for([Calc, Search])
    with pytest.raises(ValueError, match="uses the tag <answer>, which is the answer tag"):
        tags(tool_tags={"calculator": "answer"}).instructions([Calc])
    with pytest.raises(ValueError, match="not a valid tag name"):
        TagsFormat({"tool_tags": {"calculator": "my calc"}})
    with pytest.raises(ValueError, match="not a valid tag name"):
        TagsFormat({"result_tag": "<result>"})


# --------------------------------------------------------------------------------------------
# Round trips: rendering a call then parsing it gives it back
# --------------------------------------------------------------------------------------------

json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**12), 10**12),
    st.text(max_size=20),
    st.floats(allow_nan=False, allow_infinity=False),
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)


class Anything(Tool):
    name = "anything"

    class Arguments(BaseModel):
        model_config = ConfigDict(extra="allow")

    def run(self, arguments: Arguments) -> str:
        return ""


ROUND_TRIP_TOOLS: dict[str, type[Tool]] = {**TOOLS, "anything": Anything}
plain_text = (
    st.text(
        alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="<>"),
        min_size=1,
        max_size=40,
    )
    .map(str.strip)
    .filter(bool)
)


@st.composite
def calls(draw: st.DrawFn) -> ToolCall:
    name = draw(st.sampled_from(sorted(ROUND_TRIP_TOOLS)))
    if name == "calculator":
        arguments: dict[str, Any] = {"expression": draw(plain_text)}
    elif name == "search":
        arguments = {"query": draw(plain_text)}
        if draw(st.booleans()):
            arguments["top_k"] = draw(st.integers(-5, 50))
    elif name == "lookup":
        arguments = {"table": draw(st.text(max_size=20)), "key": draw(st.integers(0, 10**6))}
    else:
        arguments = draw(st.dictionaries(st.text(max_size=10), json_values, max_size=4))
    return ToolCall(id="x", name=name, arguments=arguments)


@settings(max_examples=150, deadline=None)
@given(st.lists(calls(), min_size=1, max_size=4), st.text(max_size=30).filter(lambda s: "<" not in s))
def test_hermes_round_trip(sent: list[ToolCall], prose: str) -> None:
    fmt = hermes()
    text = prose + "".join(fmt.render_call(call, ROUND_TRIP_TOOLS) + prose for call in sent)
    parsed = fmt.parse(text, ROUND_TRIP_TOOLS)
    assert parsed.errors == []
    assert [(c.name, c.arguments) for c in parsed.tool_calls] == [(c.name, c.arguments) for c in sent]
    assert [c.raw for c in parsed.tool_calls] == [fmt.render_call(c, ROUND_TRIP_TOOLS) for c in sent]


@settings(max_examples=150, deadline=None)
@given(
    st.lists(calls(), min_size=1, max_size=4),
    st.text(max_size=30).filter(lambda s: "<" not in s),
    st.none() | plain_text,
)
def test_tags_round_trip(sent: list[ToolCall], prose: str, answer: str | None) -> None:
    fmt = tags(max_calls_per_turn=None)
    text = prose + "".join(fmt.render_call(call, ROUND_TRIP_TOOLS) + prose for call in sent)
    if answer is not None:
        text += fmt.render_answer(answer)
    parsed = fmt.parse(text, ROUND_TRIP_TOOLS)
    assert parsed.errors == []
    assert [(c.name, c.arguments) for c in parsed.tool_calls] == [(c.name, c.arguments) for c in sent]
    assert parsed.answer == answer


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=200))
def test_parsers_never_raise_on_arbitrary_text(text: str) -> None:
    for fmt in (hermes(), hermes(answer_tag=None), tags()):
        parsed = fmt.parse(text, TOOLS)
        assert all(isinstance(error, str) and error for error in parsed.errors)


def test_tags_json_bodies_escape_closing_tags_inside_strings() -> None:
    fmt = tags()
    call = ToolCall(id="x", name="lookup", arguments={"table": "a</lookup><calc>1</calc>", "key": 1})
    text = fmt.render_call(call, TOOLS)
    assert "</lookup><calc>" not in text
    parsed = fmt.parse(text, TOOLS)
    assert parsed.errors == [] and [c.arguments for c in parsed.tool_calls] == [call.arguments]


def test_formats_pass_the_plugin_contract_checks() -> None:
    from agent_r1.testing import check_tool_call_format

    texts = ["", "I do not know.", call_json("calculator", expression="1"), "<calc>1</calc>", "<tool_call>{"]
    check_tool_call_format(HermesFormat, tools=[Calc, Search], texts=texts)
    check_tool_call_format(
        TagsFormat, config={"tool_tags": {"calculator": "calc"}}, tools=[Calc], texts=texts
    )
