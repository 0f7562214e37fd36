"""The gateway's pieces without a server: episode assembly (a property test against a naive
reference), tools through chat templates that do and do not render them, and tool calls read
back from text with the bundled formats. Real tokenizers throughout."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent_r1.builtins.formats import HermesFormat, TagsFormat
from agent_r1.contracts import Generation
from agent_r1.gateway.protocol import RequestError, canonical_messages
from agent_r1.gateway.recorder import EpisodeRecorder
from agent_r1.gateway.tools import ToolRendering, tool_class
from agent_r1.mdp import TokenSource
from agent_r1.rollout.chat import ChatRenderer
from agent_r1.testing.models import tiny_tokenizer

CALCULATOR = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string"}, "precision": {"type": "integer"}},
            "required": ["expression"],
        },
    },
}
PLAIN_CHATML = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
"""ChatML that knows nothing of tools (as SmolLM2's template)."""


@pytest.fixture(scope="module")
def renderer() -> ChatRenderer:
    return ChatRenderer(tiny_tokenizer())


@pytest.fixture(scope="module")
def plain_renderer() -> ChatRenderer:
    tokenizer = tiny_tokenizer()
    tokenizer.chat_template = PLAIN_CHATML
    return ChatRenderer(tokenizer)


# --------------------------------------------------------------------------------------------
# Assembly: a property test against a naive reference
# --------------------------------------------------------------------------------------------

_call = st.tuples(
    st.integers(min_value=-1, max_value=30),  # which earlier call to extend (-1 or too large: none)
    st.lists(st.integers(min_value=3, max_value=60), min_size=0, max_size=5),  # inserted tokens
    st.lists(st.integers(min_value=3, max_value=60), min_size=1, max_size=6),  # sampled tokens
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(calls=st.lists(_call, min_size=1, max_size=12))
def test_assembly_matches_a_naive_reference(renderer: ChatRenderer, calls: list[Any]) -> None:
    """Calls that extend earlier calls' tokens (or not) in any order: every trajectory holds exactly
    its calls' prompts and samples, the samples (and only they) carry loss with their
    log-probabilities, and the calls fall into the segments a naive reference predicts (a call
    continues the segment of the earlier call with the longest ``prompt + completion`` that
    starts its prompt, when that call is still the segment's latest)."""
    recorder = EpisodeRecorder(renderer, ToolRendering(renderer, HermesFormat()), open_on_demand=True)
    episode = recorder.open("e")
    contexts: list[list[int]] = []
    samples: list[tuple[list[int], list[int], list[float]]] = []
    for choice, inserted, sampled in calls:
        base = contexts[choice] if 0 <= choice < len(contexts) else []
        prompt = [*base, *inserted] or [7]
        logprobs = [-0.01 * (i + 1) - len(samples) for i in range(len(sampled))]
        plan = recorder.plan_tokens(episode, prompt)
        recorder.record(
            episode,
            plan,
            Generation(list(sampled), logprobs, "eos"),
            text="",
            reply=None,
            completion_id=f"c{len(samples)}",
            generation_s=0.0,
        )
        contexts.append([*prompt, *sampled])
        samples.append((prompt, list(sampled), logprobs))

    # The naive reference: longest earlier context that prefixes the prompt; extend when latest.
    segments: list[list[int]] = []
    segment_of: list[int] = []
    for index, (prompt, _, _) in enumerate(samples):
        best = None
        for earlier in range(index):
            context = contexts[earlier]
            fits = len(context) <= len(prompt) and prompt[: len(context)] == context
            if fits and (best is None or len(context) > len(contexts[best])):
                best = earlier
        if best is not None and segments[segment_of[best]][-1] == best:
            segments[segment_of[best]].append(index)
            segment_of.append(segment_of[best])
        else:
            segment_of.append(len(segments))
            segments.append([index])

    trajectories = recorder.finish(episode)
    assert len(trajectories) == len(segments)
    for trajectory, members in zip(trajectories, segments, strict=True):
        tokens, mask, logprobs = trajectory.token_ids, trajectory.loss_mask, trajectory.logprobs
        assert tokens == contexts[members[-1]]
        policy: set[int] = set()
        for index in members:
            prompt, sampled, lps = samples[index]
            assert tokens[: len(prompt) + len(sampled)] == [*prompt, *sampled]
            span = range(len(prompt), len(prompt) + len(sampled))
            assert [logprobs[i] for i in span] == lps
            policy.update(span)
        assert {i for i, m in enumerate(mask) if m} == policy
        assert trajectory.num_turns == len(members)
        assert [s.action.token_ids for s in trajectory.steps] == [samples[i][1] for i in members]
    assert sum(t.num_policy_tokens for t in trajectories) == sum(len(s[1]) for s in samples)


def test_a_chat_call_that_extends_the_last_reply_appends_closure_observation_and_header(
    renderer: ChatRenderer,
) -> None:
    recorder = EpisodeRecorder(renderer, ToolRendering(renderer, HermesFormat()), open_on_demand=True)
    episode = recorder.open("e")
    first = canonical_messages([{"role": "user", "content": "hi"}])
    plan = recorder.plan_chat(episode, first, None)
    assert plan.how == "fresh" and plan.prompt_ids == renderer.render_prompt(first)
    sampled = [*renderer.encode("hello"), *renderer.end_of_turn_ids]
    reply = recorder.rendering.parse("hello", None)
    recorder.record(
        episode, plan, Generation(sampled, [-1.0] * len(sampled), "eos"), text="hello", reply=reply,
        completion_id="c0", generation_s=0.0,
    )  # fmt: skip
    sent_back = {"role": "assistant", "content": "hello", "refusal": None, "audio": None}
    second = canonical_messages([*first, sent_back, {"role": "user", "content": "again"}])
    plan = recorder.plan_chat(episode, second, None)
    assert plan.how == "extended" and plan.base is episode.calls[0]
    assert plan.closure == renderer.closure_ids(sampled, "eos")  # "\n": the policy sampled <|im_end|>
    assert renderer.tokenizer.decode(plan.env) == "<|im_start|>user\nagain<|im_end|>\n"
    assert plan.prompt_ids == [*episode.calls[0].context, *plan.closure, *plan.env, *plan.header]
    edited = canonical_messages(
        [*first, {**sent_back, "content": "hello!"}, {"role": "user", "content": "again"}]
    )
    assert recorder.plan_chat(episode, edited, None).how == "fresh"  # not what the policy said


# --------------------------------------------------------------------------------------------
# Tools through the chat template
# --------------------------------------------------------------------------------------------

CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What is 1+2?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_a",
                "type": "function",
                "function": {"name": "calculator", "arguments": '{"expression": "1+2"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_a", "content": "3"},
]


def test_a_template_that_renders_tools_gets_them_as_structured_data(renderer: ChatRenderer) -> None:
    rendering = ToolRendering(renderer, HermesFormat({"answer_tag": None}))
    assert rendering.native
    messages, tools = rendering.template_input(canonical_messages(CONVERSATION), [CALCULATOR])
    assert tools == [CALCULATOR] and messages[0] == {"role": "system", "content": "Be brief."}
    assert messages[2]["tool_calls"][0]["function"] == {
        "name": "calculator",
        "arguments": {"expression": "1+2"},
    }
    assert messages[3] == {"role": "tool", "name": "calculator", "content": "3"}
    text = renderer.render_text(messages, tools, add_generation_prompt=True)
    assert (
        '"name": "calculator"' in text
        and '<tool_call>\n{"name": "calculator", "arguments": {"expression"' in text
    )


def test_a_template_without_tools_gets_them_in_the_system_message_and_calls_as_text(
    plain_renderer: ChatRenderer,
) -> None:
    rendering = ToolRendering(plain_renderer, HermesFormat({"answer_tag": None}))
    assert not rendering.native and not rendering.template_renders_tools
    messages, tools = rendering.template_input(canonical_messages(CONVERSATION), [CALCULATOR])
    assert tools is None
    system = messages[0]["content"]
    assert system.startswith("# Tools\n") and system.endswith("\n\nBe brief.")
    assert json.dumps(CALCULATOR["function"]) in system
    assert '<tool_call>\n{"name": "calculator", "arguments": {"expression": "..."}}\n</tool_call>' in system
    assert messages[2] == {
        "role": "assistant",
        "content": '<tool_call>\n{"name": "calculator", "arguments": {"expression": "1+2"}}\n</tool_call>',
    }
    reply = rendering.parse(
        'Let me see.\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "4*5"}}\n</tool_call>',
        [CALCULATOR],
    )
    assert reply.content == "Let me see." and not reply.errors
    [call] = reply.tool_calls
    assert (call.name, call.arguments) == ("calculator", {"expression": "4*5"}) and call.id.startswith(
        "call_"
    )
    broken = rendering.parse(
        '<tool_call>\n{"name": "calculator", "arguments": {"expression": 4\n</tool_call>', [CALCULATOR]
    )
    assert broken.tool_calls == [] and broken.errors and broken.content.startswith("<tool_call>")
    wrong = rendering.parse(
        '<tool_call>{"name": "calculator", "arguments": {"precision": 2}}</tool_call>', [CALCULATOR]
    )
    assert wrong.tool_calls == [] and "missing required argument 'expression'" in wrong.errors[0]
    assert (
        rendering.parse("<tool_call>x</tool_call>", [CALCULATOR], allow_calls=False).content
        == "<tool_call>x</tool_call>"
    )


def test_the_tags_format_describes_its_tools_and_reads_tag_calls(plain_renderer: ChatRenderer) -> None:
    rendering = ToolRendering(plain_renderer, TagsFormat({"tool_tags": {"calculator": "calc"}}))
    assert not rendering.native and rendering.stop_sequences([CALCULATOR]) == ["</calc>"]
    messages, _ = rendering.template_input(canonical_messages(CONVERSATION), [CALCULATOR])
    assert "<calc>" in messages[0]["content"] and "Be brief." in messages[0]["content"]
    assert messages[2]["content"] == "<calc>1+2</calc>"
    assert messages[3] == {"role": "user", "content": "<result>3</result>"}
    [call] = rendering.parse("I will compute. <calc>6*7</calc>", [CALCULATOR]).tool_calls
    assert (call.name, call.arguments) == ("calculator", {"expression": "6*7"})
    spaced = {"type": "function", "function": {"name": "look up", "parameters": {}}}
    with pytest.raises(RequestError, match="cannot use these tools: tool 'look up' cannot be called"):
        rendering.tool_classes([spaced])
    with pytest.raises(RequestError, match="two tools share a name"):
        rendering.tool_classes([CALCULATOR, CALCULATOR])


def test_tool_classes_follow_the_json_schema() -> None:
    cls = tool_class(CALCULATOR)
    assert cls.name == "calculator" and cls.schema() == CALCULATOR
    assert set(cls.Arguments.model_fields) == {"expression", "precision"}
    cls.Arguments.model_validate({"expression": "1", "precision": "3", "extra": True})  # lenient
    odd = tool_class(
        {"type": "function", "function": {"name": "f", "parameters": {"properties": {"a-b": {}}}}}
    )
    odd.Arguments.model_validate({"a-b": 1, "anything": 2})  # names pydantic cannot take: unchecked
    strict = {
        **CALCULATOR["function"],
        "parameters": {**CALCULATOR["function"]["parameters"], "additionalProperties": False},
    }
    with pytest.raises(ValueError):
        tool_class({"type": "function", "function": strict}).Arguments.model_validate(
            {"expression": "1", "x": 1}
        )


def test_canonical_messages_refuse_what_they_cannot_carry() -> None:
    assert canonical_messages(
        [{"role": "developer", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]
    ) == [{"role": "system", "content": "ab"}]
    bad = [
        ([{"role": "assistant", "content": "", "function_call": {"name": "f"}}], "function_call"),
        ([{"role": "user", "content": "x", "tool_calls": [{"function": {"name": "f"}}]}], "only assistant"),
        (
            [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{oops"}}]}],
            "not valid JSON",
        ),
        ([{"role": "assistant", "tool_calls": [{"function": {}}]}], "function.name is missing"),
        (["hello"], "must be an object"),
    ]
    for messages, words in bad:
        with pytest.raises(RequestError) as info:
            canonical_messages(messages)
        assert words in info.value.message


def test_segments_of_a_fresh_prompt_are_prompt_then_policy(renderer: ChatRenderer) -> None:
    recorder = EpisodeRecorder(renderer, ToolRendering(renderer, HermesFormat()), open_on_demand=False)
    episode = recorder.open("e")
    plan = recorder.plan_tokens(episode, [5, 6, 7])
    recorder.record(
        episode, plan, Generation([8, 9], [-0.5, -0.25], "length"), text="", reply=None, completion_id="c",
        generation_s=0.1,
    )  # fmt: skip
    [trajectory] = recorder.finish(episode, answer="x", termination="agent_done")
    assert [(s.source, s.token_ids) for s in trajectory.segments] == [
        (TokenSource.PROMPT, [5, 6, 7]),
        (TokenSource.POLICY, [8, 9]),
    ]
    assert trajectory.truncated and trajectory.metrics["length_cuts"] == 1.0
    with pytest.raises(Exception, match="episode 'e' was finished"):
        recorder.get("e")  # finished episodes are closed, and their ids never reopened
