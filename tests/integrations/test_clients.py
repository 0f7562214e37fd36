"""The policy gateway driven by the clients people use: the official ``openai`` client, the OpenAI
Agents SDK, pydantic-ai, LangChain (+ LangGraph) and smolagents, each in every mode it offers
(chat completions, streaming, a tool loop, the Responses API, structured output).

The gateway, its chat template, tool-call format, episode recorder and HTTP server are real; the
policy is :class:`~agent_r1.testing.scripted.ScriptedBackend`, which says a fixed reply for what
the prompt holds (a tool call when a calculator is offered, the answer after the tool's result,
JSON when the system message asks for it). A tiny random model would not write a tool call in
every framework's prompt; token fidelity with a real model is covered by tests/test_gateway.py and
tests/test_gateway_responses.py. Each run must end as one trajectory whose later prompts extend
the earlier calls' tokens (one segment), so the framework's way of re-sending its history did not
make the gateway re-render it.

The results are the table "Agent frameworks" in docs/gateway.md; a refusal there is tested here
as a refusal.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from pydantic import BaseModel

SYSTEM = "You are a helpful assistant."
QUESTION = "What is 2+3?"
ANSWER = "The answer is 5."


def _call(name: str, arguments: dict[str, Any]) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def script(prompt: str) -> str:
    """The scripted policy: what it says for a decoded prompt."""
    last_user = prompt.rfind("<|im_start|>user")
    latest = prompt[last_user:]  # smolagents sends tool results as a user message ("Observation:")
    after_tool = prompt.rfind("<|im_start|>tool") > last_user or any(
        mark in latest for mark in ("<tool_response>", "Observation:")
    )
    wants_json = "JSON" in prompt
    if after_tool:
        if "final_answer" in prompt:  # smolagents ends a run with its final_answer tool
            return _call("final_answer", {"answer": "5"})
        return '{"answer": 5}' if wants_json else ANSWER
    if "calculator" in prompt:
        return _call("calculator", {"expression": "2+3"})
    return '{"answer": 5}' if wants_json else "Hello there."


class Sum(BaseModel):
    answer: int


def calculate(expression: str) -> str:
    left, right = expression.split("+")
    return str(int(left) + int(right))


@pytest.fixture(scope="module")
def gateway() -> Iterator[Any]:
    from agent_r1.builtins.formats import HermesFormat
    from agent_r1.gateway.server import GatewaySettings, PolicyGateway
    from agent_r1.testing.models import tiny_tokenizer
    from agent_r1.testing.scripted import ScriptedBackend

    tokenizer = tiny_tokenizer()
    backend = ScriptedBackend(tokenizer=tokenizer, responses=script)
    settings = GatewaySettings(
        served_model_name="tiny", max_new_tokens=64, max_context=4096, structured_output="prompted"
    )
    gateway = PolicyGateway(backend, tokenizer, HermesFormat({"answer_tag": None}), settings)
    gateway.start()
    yield gateway
    gateway.stop()


REWRITES_HISTORY = {"test_smolagents_tool_calling_agent"}
"""Frameworks that re-send their history in another shape: smolagents writes its earlier tool calls
as text ("Calling tools: [...]") and tool results as user messages ("Observation: ..."), so the
conversation no longer continues the reply the gateway returned; every call then starts a segment
of its own (each one exactly what was sampled, in the context the policy was given)."""


@pytest.fixture
def episode(gateway: Any, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh episode's base URL; after the test its trajectories must hold exactly the calls'
    prompts and completions, in one segment unless the framework rewrites its history."""
    name = f"ep-{uuid.uuid4().hex[:8]}"
    yield gateway.episode_url(name)
    episode = gateway.recorder.find(name)
    trajectories = gateway.recorder.finish(episode)
    assert episode.calls, "the framework made no call through the gateway"
    if request.node.originalname in REWRITES_HISTORY:
        assert len(trajectories) == len(episode.calls) > 1
    else:  # later prompts extended the earlier calls' tokens: only the first was rendered whole
        assert len(trajectories) == 1 and episode.counters.get("plan_fresh", 0.0) == 1.0, episode.counters
    for call in episode.calls:  # every prompt + completion is a prefix of its segment
        assert trajectories[call.chain].token_ids[: len(call.context)] == call.context
    api = getattr(request.node, "callspec", None) and request.node.callspec.params.get("api")
    if api is not None:  # the framework really used the API the test asked for
        prefix = "resp-" if api == "responses" else "chatcmpl-"
        assert all(call.completion_id.startswith(prefix) for call in episode.calls)


# -- openai ---------------------------------------------------------------------------------------------
def _openai(url: str) -> Any:
    import openai

    return openai.OpenAI(base_url=url, api_key="none", max_retries=0)


def _chat_tool() -> dict[str, Any]:
    parameters = {
        "type": "object",
        "properties": {"expression": {"type": "string"}},
        "required": ["expression"],
    }
    return {"type": "function", "function": {"name": "calculator", "parameters": parameters}}


def test_openai_chat_tool_loop(episode: str) -> None:
    client = _openai(episode)
    messages: list[Any] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}]
    first = client.chat.completions.create(model="tiny", messages=messages, tools=[_chat_tool()])
    [call] = first.choices[0].message.tool_calls
    messages += [first.choices[0].message, {"role": "tool", "tool_call_id": call.id, "content": "5"}]
    second = client.chat.completions.create(model="tiny", messages=messages, tools=[_chat_tool()])
    assert first.choices[0].finish_reason == "tool_calls" and second.choices[0].message.content == ANSWER


def test_openai_chat_streaming(episode: str) -> None:
    chunks = list(
        _openai(episode).chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hi"}], stream=True
        )
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "Hello there."


def test_openai_chat_structured_output(episode: str) -> None:
    parsed = _openai(episode).chat.completions.parse(
        model="tiny", messages=[{"role": "user", "content": QUESTION}], response_format=Sum
    )
    assert parsed.choices[0].message.parsed == Sum(answer=5)


def test_openai_responses_tool_loop_and_stream(episode: str) -> None:
    client = _openai(episode)
    tool = {"type": "function", **_chat_tool()["function"]}
    first = client.responses.create(model="tiny", instructions=SYSTEM, input=QUESTION, tools=[tool])
    [call] = [item for item in first.output if item.type == "function_call"]
    output = {"type": "function_call_output", "call_id": call.call_id, "output": "5"}
    with client.responses.stream(
        model="tiny", instructions=SYSTEM, previous_response_id=first.id, input=[output], tools=[tool]
    ) as stream:
        text = "".join(e.delta for e in stream if e.type == "response.output_text.delta")
        final = stream.get_final_response()
    assert text == final.output_text == ANSWER


def test_openai_responses_structured_output(episode: str) -> None:
    parsed = _openai(episode).responses.parse(model="tiny", input=QUESTION, text_format=Sum)
    assert parsed.output_parsed == Sum(answer=5)


# -- OpenAI Agents SDK ------------------------------------------------------------------------------
def _agents_model(url: str, api: str) -> Any:
    from agents import OpenAIChatCompletionsModel, OpenAIResponsesModel, set_tracing_disabled
    from openai import AsyncOpenAI

    set_tracing_disabled(True)
    client = AsyncOpenAI(base_url=url, api_key="none", max_retries=0)
    cls = OpenAIResponsesModel if api == "responses" else OpenAIChatCompletionsModel
    return cls(model="tiny", openai_client=client)


@pytest.mark.parametrize("api", ["responses", "chat"])
def test_openai_agents_tool_loop(episode: str, api: str) -> None:
    from agents import Agent, Runner, function_tool

    @function_tool
    def calculator(expression: str) -> str:
        """Evaluate an arithmetic expression."""
        return calculate(expression)

    agent = Agent(name="calc", instructions=SYSTEM, tools=[calculator], model=_agents_model(episode, api))
    result = asyncio.run(Runner.run(agent, QUESTION))
    assert result.final_output == ANSWER


@pytest.mark.parametrize("api", ["responses", "chat"])
def test_openai_agents_streaming(episode: str, api: str) -> None:
    from agents import Agent, Runner

    async def run() -> str:
        result = Runner.run_streamed(Agent(name="a", model=_agents_model(episode, api)), "hi")
        async for _ in result.stream_events():
            pass
        return str(result.final_output)

    assert asyncio.run(run()) == "Hello there."


@pytest.mark.parametrize("api", ["responses", "chat"])
def test_openai_agents_structured_output(episode: str, api: str) -> None:
    from agents import Agent, Runner

    agent = Agent(name="a", output_type=Sum, model=_agents_model(episode, api))
    assert asyncio.run(Runner.run(agent, QUESTION)).final_output == Sum(answer=5)


# -- pydantic-ai ------------------------------------------------------------------------------------
def _pydantic_model(url: str, api: str) -> Any:
    from pydantic_ai.models.openai import OpenAIChatModel, OpenAIResponsesModel
    from pydantic_ai.providers.openai import OpenAIProvider

    provider = OpenAIProvider(base_url=url, api_key="none")
    cls = OpenAIResponsesModel if api == "responses" else OpenAIChatModel
    return cls("tiny", provider=provider)


@pytest.mark.parametrize("api", ["responses", "chat"])
def test_pydantic_ai_tool_loop(episode: str, api: str) -> None:
    from pydantic_ai import Agent

    agent = Agent(_pydantic_model(episode, api), instructions=SYSTEM)

    @agent.tool_plain
    def calculator(expression: str) -> str:
        """Evaluate an arithmetic expression."""
        return calculate(expression)

    assert agent.run_sync(QUESTION).output == ANSWER


@pytest.mark.parametrize("api", ["responses", "chat"])
def test_pydantic_ai_streaming(episode: str, api: str) -> None:
    from pydantic_ai import Agent

    async def run() -> str:
        async with Agent(_pydantic_model(episode, api)).run_stream("hi") as result:
            return await result.get_output()

    assert asyncio.run(run()) == "Hello there."


@pytest.mark.parametrize("api", ["responses", "chat"])
@pytest.mark.parametrize("mode", ["prompted", "native"])
def test_pydantic_ai_structured_output(episode: str, api: str, mode: str) -> None:
    from pydantic_ai import Agent, NativeOutput, PromptedOutput

    output = PromptedOutput(Sum) if mode == "prompted" else NativeOutput(Sum)
    assert Agent(_pydantic_model(episode, api), output_type=output).run_sync(QUESTION).output == Sum(answer=5)


# -- LangChain and LangGraph ------------------------------------------------------------------------
def _chat_openai(url: str, api: str) -> Any:
    from langchain_openai import ChatOpenAI

    return ChatOpenAI(
        model="tiny", base_url=url, api_key="none", max_retries=0, use_responses_api=api == "responses"
    )


def _lc_calculator() -> Any:
    from langchain_core.tools import tool

    @tool
    def calculator(expression: str) -> str:
        """Evaluate an arithmetic expression."""
        return calculate(expression)

    return calculator


@pytest.mark.parametrize("api", ["responses", "chat"])
def test_langgraph_react_agent_tool_loop(episode: str, api: str) -> None:
    from langgraph.prebuilt import create_react_agent

    agent = create_react_agent(_chat_openai(episode, api), [_lc_calculator()], prompt=SYSTEM)
    state = agent.invoke({"messages": [("user", QUESTION)]})
    assert state["messages"][-1].text == ANSWER


@pytest.mark.parametrize("api", ["responses", "chat"])
def test_langchain_streaming(episode: str, api: str) -> None:
    text = "".join(chunk.text for chunk in _chat_openai(episode, api).stream("hi"))
    assert text == "Hello there."


@pytest.mark.parametrize("api", ["responses", "chat"])
def test_langchain_structured_output(episode: str, api: str) -> None:
    assert _chat_openai(episode, api).with_structured_output(Sum).invoke(QUESTION) == Sum(answer=5)


# -- smolagents -------------------------------------------------------------------------------------
@pytest.mark.parametrize("stream", [False, True])
def test_smolagents_tool_calling_agent(episode: str, stream: bool) -> None:
    from smolagents import OpenAIServerModel, ToolCallingAgent, tool

    @tool
    def calculator(expression: str) -> str:
        """Evaluate an arithmetic expression.

        Args:
            expression: the expression, e.g. 2+3
        """
        return calculate(expression)

    model = OpenAIServerModel(model_id="tiny", api_base=episode, api_key="none")
    agent = ToolCallingAgent(tools=[calculator], model=model, max_steps=3, stream_outputs=stream)
    assert str(agent.run(QUESTION)) == "5"


# -- refused by default ---------------------------------------------------------------------------
def test_structured_output_is_refused_unless_the_gateway_is_prompted(gateway: Any) -> None:
    gateway.settings.structured_output = "refuse"
    try:
        response = httpx.post(
            f"{gateway.url}/v1/responses",
            json={"model": "tiny", "input": QUESTION, "text": {"format": {"type": "json_object"}}},
        )
    finally:
        gateway.settings.structured_output = "prompted"
    assert response.status_code == 400 and "structured_output=prompted" in response.json()["error"]["message"]
