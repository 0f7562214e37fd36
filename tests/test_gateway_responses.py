"""The policy gateway's Responses API (``/v1/responses``) and structured output, end to end: a real
server on 127.0.0.1, the tiny model taught to call the calculator, the official ``openai`` client.

A Responses tool loop must record the same tokens a chat tool loop does (one segment, the second
prompt extending the first call's tokens), whether the client continues with
``previous_response_id`` or re-sends the whole input; the stream of events must carry the same
response; everything the gateway cannot honour is an OpenAI-format 400 before anything is
generated. Structured output is refused by default and, in the ``prompted`` mode, is an
instruction recorded in the prompt.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest
from gateway_agent import CALCULATOR, SYSTEM
from gateway_helpers import (  # the fixtures gateway and tool_model are in conftest.py
    FINAL_TEXT,
    QUESTION,
    TOOL_CALL_TEXT,
    calls_of,
    start_gateway,
)

from agent_r1.mdp import TokenSource

TOOL = {"type": "function", **CALCULATOR["function"]}
"""The calculator as a Responses API tool (flat)."""


def _client(gateway: Any, episode: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.episode_url(episode), api_key="none", max_retries=0)


def _function_call(response: Any) -> Any:
    [call] = [item for item in response.output if item.type == "function_call"]
    return call


def test_a_responses_tool_loop_records_what_the_backend_sampled_either_way_it_continues(
    gateway: Any,
) -> None:
    gateway, backend = gateway
    trajectories = {}
    for how in ("previous_response_id", "full_input"):
        backend.record.clear()  # the two runs sample the same tokens: keep each run's calls apart
        client = _client(gateway, how)
        first = client.responses.create(
            model="tiny", instructions=SYSTEM, input=QUESTION, tools=[TOOL], temperature=0
        )
        assert first.status == "completed"
        call = _function_call(first)
        assert (call.name, json.loads(call.arguments)) == ("calculator", {"expression": "2+3"})
        result = {"type": "function_call_output", "call_id": call.call_id, "output": "5"}
        if how == "previous_response_id":
            second = client.responses.create(
                model="tiny",
                instructions=SYSTEM,
                previous_response_id=first.id,
                input=[result],
                tools=[TOOL],
                temperature=0,
            )
        else:  # the client keeps the history itself and re-sends the first response's items
            history = [{"role": "user", "content": QUESTION}, *(i.model_dump() for i in first.output)]
            second = client.responses.create(
                model="tiny", instructions=SYSTEM, input=[*history, result], tools=[TOOL], temperature=0
            )
        assert second.output_text == FINAL_TEXT and second.status == "completed"
        assert second.usage.input_tokens > first.usage.input_tokens
        episode = gateway.recorder.find(how)
        [trajectory] = gateway.recorder.finish(episode, answer=second.output_text)
        trajectories[how] = trajectory

        # one segment: the second prompt extended the first call's tokens (nothing re-rendered)
        assert trajectory.metrics["gateway_segments"] == 1.0
        assert episode.counters.get("plan_extended") == 1.0
        calls = calls_of(trajectory, backend.record)
        assert len(calls) == len(trajectory.steps) == 2
        assert calls[-1][0] + calls[-1][1].token_ids == trajectory.token_ids
        assert trajectory.steps[0].action.text == TOOL_CALL_TEXT
        sampled = [i for i, m in enumerate(trajectory.loss_mask) if m]
        assert sampled == [
            i for p, g in calls for i in range(len(p), len(p) + len(g.token_ids))
        ]  # only what the backend sampled carries loss
        env = [s for s in trajectory.segments if s.source is TokenSource.ENV]
        assert [r.content for r in trajectory.steps[0].observation.tool_results] == ["5"]
        assert len(env) == 1
    a, b = trajectories.values()
    assert a.token_ids == b.token_ids and a.loss_mask == b.loss_mask


def test_streamed_responses_carry_the_same_response_as_events(gateway: Any) -> None:
    gateway, backend = gateway
    client = _client(gateway, "stream")
    whole = client.responses.create(model="tiny", input="Say something.", temperature=0, max_output_tokens=12)
    stream = client.responses.create(
        model="tiny", input="Say something.", temperature=0, max_output_tokens=12, stream=True
    )
    events = list(stream)
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == f"response.{whole.status}"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == whole.output_text and len(whole.output_text) > 0
    final = events[-1].response
    assert final.output_text == whole.output_text and final.usage.output_tokens == whole.usage.output_tokens
    # cut by max_output_tokens: incomplete, as OpenAI reports it
    cut = client.responses.create(model="tiny", input="Say something.", temperature=0, max_output_tokens=1)
    assert backend.record[-1][1].finish_reason == "length" and cut.usage.output_tokens == 1
    assert cut.status == "incomplete" and cut.incomplete_details.reason == "max_output_tokens"
    assert whole.status == "completed" or whole.usage.output_tokens == 12

    # a streamed tool call: added, arguments, done
    tools_stream = client.responses.create(
        model="tiny", instructions=SYSTEM, input=QUESTION, tools=[TOOL], temperature=0, stream=True
    )
    events = list(tools_stream)
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert [json.loads(e.arguments) for e in done] == [{"expression": "2+3"}]
    assert events[-1].type == "response.completed"
    assert events[-1].response.output[-1].type == "function_call"


def test_stored_responses_can_be_fetched_deleted_and_not_stored(gateway: Any) -> None:
    gateway, _ = gateway
    client = _client(gateway, "stored")
    response = client.responses.create(model="tiny", input="Hi", max_output_tokens=3)
    assert client.responses.retrieve(response.id).output_text == response.output_text
    client.responses.delete(response.id)
    with pytest.raises(openai.NotFoundError) as missing:
        client.responses.retrieve(response.id)
    assert missing.value.body["code"] == "response_not_found"
    unstored = client.responses.create(model="tiny", input="Hi", max_output_tokens=3, store=False)
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="tiny", input="more", previous_response_id=unstored.id)
    # a previous response of another episode is refused, not silently mixed in
    other = _client(gateway, "other").responses.create(model="tiny", input="Hi", max_output_tokens=3)
    with pytest.raises(openai.BadRequestError) as mixed:
        client.responses.create(model="tiny", input="more", previous_response_id=other.id)
    assert "belongs to episode 'other'" in mixed.value.body["message"]


@pytest.mark.parametrize(
    ("body", "param", "words"),
    [
        ({"tools": [{"type": "web_search"}]}, "tools[0]", ["only function tools"]),
        (
            {"tools": [TOOL], "tool_choice": {"type": "function", "name": "calculator"}},
            "tool_choice",
            ["forced"],
        ),
        ({"background": True}, "background", ["background"]),
        ({"truncation": "auto"}, "truncation", ["'auto'"]),
        ({"reasoning": {"effort": "high"}}, "reasoning", ["no reasoning settings"]),
        ({"top_logprobs": 2}, "top_logprobs", ["sampled token"]),
        ({"text": {"format": {"type": "json_object"}}}, "text.format", ["prompted", "unconstrained"]),
        ({"conversation": "conv_1"}, "conversation", ["previous_response_id"]),
        ({"frobnicate": 1}, "frobnicate", ["unrecognized request argument"]),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
            "input[0].content[0]",
            ["'input_image'"],
        ),
        ({"input": [{"type": "web_search_call", "id": "ws_1"}]}, "input[0]", ["'web_search_call'"]),
        ({"input": ""}, "input", ["empty"]),
    ],
)
def test_responses_the_gateway_cannot_serve_get_an_openai_400_naming_the_parameter(
    gateway: Any, body: dict[str, Any], param: str, words: list[str]
) -> None:
    gateway, backend = gateway
    response = httpx.post(f"{gateway.url}/v1/responses", json={"model": "tiny", "input": "hi", **body})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param
    for word in words:
        assert word in error["message"]
    assert backend.record == []  # refused before anything was generated


def test_responses_parameters_that_do_not_change_sampling_are_accepted(gateway: Any) -> None:
    gateway, backend = gateway
    request = {"model": "tiny", "input": "hi", "max_output_tokens": 2, "temperature": 0}
    extras = {
        "include": ["reasoning.encrypted_content"],
        "store": True,
        "parallel_tool_calls": False,
        "prompt_cache_key": "k",
        "safety_identifier": "u",
        "service_tier": "auto",
        "truncation": "disabled",
        "reasoning": {"effort": None},
        "text": {"format": {"type": "text"}, "verbosity": "medium"},
        "max_tool_calls": 3,
    }
    from agent_r1.gateway.responses import RESPONSES_IGNORED_PARAMETERS

    documented = {k.split(".")[0] for k in RESPONSES_IGNORED_PARAMETERS}
    assert documented >= set(extras) - {"truncation", "reasoning", "text"}  # accepted values only
    plain = httpx.post(f"{gateway.url}/v1/responses", json=request)
    ignored = httpx.post(f"{gateway.url}/v1/responses", json={**request, **extras})
    assert plain.status_code == ignored.status_code == 200, ignored.text
    assert (
        ignored.json()["output"][0]["content"][0]["text"] == plain.json()["output"][0]["content"][0]["text"]
    )
    assert backend.record[-1][0] == backend.record[-2][0]
    with_logprobs = httpx.post(
        f"{gateway.url}/v1/responses", json={**request, "include": ["message.output_text.logprobs"]}
    ).json()
    part = with_logprobs["output"][0]["content"][0]
    assert [t["logprob"] for t in part["logprobs"]] == backend.record[-1][1].logprobs


SCHEMA = {"type": "object", "properties": {"answer": {"type": "integer"}}, "required": ["answer"]}


def test_structured_output_in_prompted_mode_is_an_instruction_recorded_in_the_prompt(tool_model: Any) -> None:
    gateway, backend = start_gateway(*tool_model, structured_output="prompted")
    try:
        tokenizer = tool_model[1]
        chat = httpx.post(
            f"{gateway.url}/episodes/s1/v1/chat/completions",
            json={
                "model": "tiny",
                "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}],
                "response_format": {"type": "json_schema", "json_schema": {"name": "Sum", "schema": SCHEMA}},
                "max_tokens": 4,
            },
        )
        assert chat.status_code == 200, chat.text
        prompt = tokenizer.decode(backend.record[-1][0])
        assert "follows the JSON schema 'Sum'" in prompt and '"required": ["answer"]' in prompt
        assert prompt.index(SYSTEM) < prompt.index("JSON schema") < prompt.index(QUESTION)
        responses = httpx.post(
            f"{gateway.url}/episodes/s2/v1/responses",
            json={
                "model": "tiny",
                "input": QUESTION,
                "text": {"format": {"type": "json_schema", "name": "Sum", "schema": SCHEMA}},
                "max_output_tokens": 4,
            },
        )
        assert responses.status_code == 200, responses.text
        assert "follows the JSON schema 'Sum'" in tokenizer.decode(backend.record[-1][0])
        # the recorded trajectory holds the prompt with the instruction: it is what was sampled from
        [trajectory] = gateway.recorder.finish(gateway.recorder.find("s2"))
        assert trajectory.token_ids[: len(backend.record[-1][0])] == backend.record[-1][0]
        # the tiny model does not write JSON: counted, not hidden
        assert gateway.counters["structured_output_prompted"] == 2
        assert gateway.counters["structured_output_invalid"] == 2
        bad = httpx.post(
            f"{gateway.url}/v1/chat/completions",
            json={
                "model": "tiny",
                "messages": [{"role": "user", "content": "x"}],
                "response_format": {"type": "xml"},
            },
        )
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "response_format.type"
    finally:
        gateway.stop()
