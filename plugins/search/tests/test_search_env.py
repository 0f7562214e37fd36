"""The ``search_qa`` environment stepping with real tool calls (tags and hermes formats), built
through the real registry from the installed plugin, with in-process BM25 and with the HTTP server;
then the trajectories are scored by the plugin's reward shapers."""

from __future__ import annotations

import asyncio
import json

import pytest

from agent_r1 import Action, Step, Task, Trajectory
from agent_r1.registry import get_registry

TASK = Task(
    id="5a8ce55f554299441c6b9f62",
    messages=[
        {
            "role": "user",
            "content": 'The band who released the debut album "Tinted Windows" had their first '
            "performance in what city?",
        }
    ],
    answer=["Tulsa"],
    category="hotpotqa/bridge",
    metadata={"supporting_titles": ["Tinted Windows (album)", "Tinted Windows (band)"]},
)


def _env(**config):
    return get_registry().build("environments", "search_qa", config)


def _episode(env, texts: list[str]) -> Trajectory:
    """Play ``texts`` as the agent's actions; returns the trajectory (steps only)."""

    async def play() -> Trajectory:
        await env.reset(TASK)
        steps = []
        for turn, text in enumerate(texts):
            action = Action(text=text, finish_reason="stop")
            observation = await env.step(action, turn)
            # as the engine does: what the environment parsed is recorded on the action
            parsed = {
                name: getattr(observation, name)
                for name in ("tool_calls", "answer", "parse_errors")
                if getattr(observation, name) is not None
            }
            action = action.model_copy(update=parsed)
            steps.append(Step(turn=turn, action=action, observation=observation))
            if observation.done:
                break
        return Trajectory(id="t", task_id=TASK.id, steps=steps)

    return asyncio.run(play())


def _scores(trajectory: Trajectory) -> dict[str, list[tuple[int | None, float]]]:
    registry = get_registry()
    out = {}
    for name in ("qa_em", "qa_f1", "qa_substring", "qa_format", "search_valid", "search_gold"):
        shaper = registry.build("reward_shapers", name, {})
        out[name] = [(signal.turn, signal.value) for signal in shaper.score(trajectory, TASK)]
    return out


def test_tags_episode_with_bm25() -> None:
    env = _env(topk=3, retriever={"corpus": "hotpotqa"})
    assert env.stop_sequences == ["</search>"]
    start = asyncio.run(env.reset(TASK))
    assert start.tools == []  # tags: the tools are described in the system message
    assert "<search>query</search>" in start.messages[0]["content"]
    assert "<information>...</information>" in start.messages[0]["content"]
    assert start.messages[1] == {"role": "user", "content": "Question: " + TASK.messages[0]["content"]}

    trajectory = _episode(
        env,
        [
            "<think>Find the album first.</think><search>Tinted Windows debut album band</search>",
            "<think>Now the first show.</think><search>Tinted Windows band first performance city</search>",
            "<think>Cain's Ballroom is in Tulsa.</think><answer>Tulsa</answer>",
        ],
    )
    first, second, last = trajectory.steps
    shown = first.observation.messages[0]["content"]
    assert first.observation.messages[0]["role"] == "user"
    assert shown.startswith("<information>Doc 1 (Title: Tinted Windows") and shown.endswith("</information>")
    assert shown.count("\nDoc ") == 2  # three passages
    record = first.observation.info["search"][0]
    assert record["query"] == "Tinted Windows debut album band"
    assert len(record["titles"]) == 3 and record["ids"] == record["titles"]  # hotpot ids are titles
    assert "Tinted Windows (band)" in second.observation.info["search"][0]["titles"]
    assert last.observation.done and last.observation.termination == "answer"
    assert last.action.answer == "Tulsa"

    scores = _scores(trajectory)
    assert scores["qa_em"] == [(None, 1.0)] and scores["qa_f1"] == [(None, 1.0)]
    assert scores["qa_substring"] == [(None, 1.0)] and scores["qa_format"] == [(None, 1.0)]
    assert scores["search_valid"] == [(0, 1.0), (1, 1.0)]
    gold_found = sum(value for _, value in scores["search_gold"])
    assert gold_found == 1.0  # both gold paragraphs were retrieved over the two searches
    assert scores["search_gold"][0][0] == 0


def test_hermes_episode_with_http_retriever(search_server: str) -> None:
    env = _env(format="hermes", retriever={"kind": "http", "url": search_server}, topk=1)
    start = asyncio.run(env.reset(TASK))
    assert [tool["function"]["name"] for tool in start.tools] == ["search"]
    assert start.tools[0]["function"]["parameters"]["required"] == ["query"]
    assert "<answer>" in start.messages[0]["content"]
    call = json.dumps({"name": "search", "arguments": {"query": "Tinted Windows band first performance"}})
    trajectory = _episode(
        env,
        [
            f"I should search.\n<tool_call>\n{call}\n</tool_call>",
            "The band played first at Cain's Ballroom. <answer>Tulsa, Oklahoma</answer>",
        ],
    )
    first, _ = trajectory.steps
    (message,) = first.observation.messages
    assert message["role"] == "tool" and message["name"] == "search"
    assert message["content"].startswith("Doc 1 (Title: Tinted Windows (band))")
    assert "\nDoc " not in message["content"]  # topk 1
    assert first.observation.info["search"][0]["titles"][0] == "Tinted Windows (band)"
    scores = _scores(trajectory)
    assert scores["qa_em"] == [(None, 0.0)]  # "Tulsa, Oklahoma" is not exactly "Tulsa"
    assert scores["qa_f1"][0][1] == pytest.approx(2 / 3)
    assert scores["qa_substring"] == [(None, 1.0)]
    assert scores["search_gold"] == [(0, 0.5)]


def test_bad_calls_are_shown_to_the_agent() -> None:
    env = _env()
    trajectory = _episode(
        env,
        [
            "<search>   </search>",  # empty query: the tool refuses with a readable error
            "<lookup>x</lookup>",  # unknown tool tag
            "<answer>Tulsa</answer>",
        ],
    )
    empty, unknown, _ = trajectory.steps
    (result,) = empty.observation.tool_results
    assert not result.ok and result.content == "Error: the search query is empty: write what to search for"
    assert empty.observation.info["search"] == []
    assert "unknown tool <lookup>" in unknown.observation.messages[0]["content"]
    scores = _scores(trajectory)
    assert scores["search_valid"] == []  # no search ran
    assert scores["qa_format"] == [(None, 0.0)]  # a malformed turn
    assert scores["qa_em"] == [(None, 1.0)]


def test_retrieval_failure_aborts_the_run_by_default(closed_port: int) -> None:
    """``on_retrieval_error: raise`` (the default) raises EnvironmentFatalError, which the engine turns
    into an abort whatever its own on_env_error says."""
    from agent_r1.errors import EnvironmentFatalError

    retriever = {"kind": "http", "url": f"http://127.0.0.1:{closed_port}", "retries": 0}
    with pytest.raises(EnvironmentFatalError) as error:
        _episode(_env(retriever=retriever), ["<search>Tinted Windows</search>"])
    message = str(error.value)
    assert message.startswith("search_qa turn 0: the search tool failed and environment.on_retrieval_error")
    assert (
        f"retrieval server http://127.0.0.1:{closed_port}/retrieve is unreachable after 1 attempts" in message
    )
    assert "'env_error'" in message and "'show'" in message  # what to do instead


def test_retrieval_failure_as_environment_error_or_shown(closed_port: int) -> None:
    from agent_r1.errors import EnvironmentFatalError, ToolInfrastructureError

    retriever = {"kind": "http", "url": f"http://127.0.0.1:{closed_port}", "retries": 0}
    action = "<search>Tinted Windows</search>"
    with pytest.raises(ToolInfrastructureError, match="is unreachable after 1 attempts") as error:
        _episode(_env(retriever=retriever, on_retrieval_error="env_error"), [action])
    assert not isinstance(error.value, EnvironmentFatalError)
    trajectory = _episode(_env(retriever=retriever, on_retrieval_error="show"), [action])
    (result,) = trajectory.steps[0].observation.tool_results
    assert not result.ok and result.content.startswith("Error: search failed: retrieval server")
    assert "is unreachable after 1 attempts" in result.content


def test_missing_corpus_is_an_infrastructure_error_not_an_observation(tmp_path) -> None:
    """In the generic tool_env (no on_retrieval_error of its own) the search tool's infrastructure
    failure is not shown to the policy: the step raises ToolInfrastructureError."""
    from agent_r1.errors import ToolInfrastructureError

    missing = tmp_path / "gone.jsonl"
    env = get_registry().build(
        "environments", "tool_env", {"tools": [{"name": "search", "retriever": {"corpus": str(missing)}}]}
    )
    with pytest.raises(ToolInfrastructureError, match=r"corpus file '.*gone.jsonl' does not exist"):
        _episode(env, ["<search>Tinted Windows</search>"])


def test_search_tool_raises_infrastructure_error_itself(closed_port: int) -> None:
    from agent_r1 import ToolError
    from agent_r1.errors import ToolInfrastructureError
    from agent_r1_plugin_search.tool import SearchTool

    retriever = {"kind": "http", "url": f"http://127.0.0.1:{closed_port}", "retries": 0}
    with pytest.raises(ToolInfrastructureError, match="search tool: retrieval failed: retrieval server"):
        asyncio.run(SearchTool({"retriever": retriever}).run({"query": "x"}))
    with pytest.raises(ToolError, match="search failed: retrieval server") as shown:
        asyncio.run(SearchTool({"retriever": retriever, "show_errors": True}).run({"query": "x"}))
    assert not isinstance(shown.value, ToolInfrastructureError)


def test_search_tool_in_the_generic_tool_env() -> None:
    """Rewards still see retrieved titles when another environment runs the tool (text fallback)."""
    env = get_registry().build(
        "environments", "tool_env", {"tools": [{"name": "search", "topk": 5}], "format": "tags"}
    )
    trajectory = _episode(env, ["<search>Tinted Windows band album</search>", "<answer>Tulsa</answer>"])
    assert "search" not in trajectory.steps[0].observation.info
    assert trajectory.steps[0].observation.messages[0]["content"].startswith("<result>Doc 1 (Title: ")
    assert _scores(trajectory)["search_gold"] == [(0, 1.0)]


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"tools": ["calculator"]}, "tools must include the search tool"),
        ({"topk": 2, "tools": [{"name": "search", "topk": 3}]}, "topk is given both"),
        ({"question_template": "Q: {q}"}, "must use only the field {question}"),
        ({"question_template": "no field"}, "must contain {question}"),
        ({"retriever": {"kind": "http"}}, "kind='http' needs url"),
        ({"retriever": {"corpus": "hotpotqa", "kx": 1}}, "kx"),
    ],
)
def test_config_errors(config: dict, message: str) -> None:
    from agent_r1 import ConfigError

    with pytest.raises((ConfigError, ValueError), match=message):
        _env(**config)


def test_requires_lists_the_configured_search_tool() -> None:
    cls = get_registry().get("environments", "search_qa")
    config = cls.Config.model_validate({"topk": 4, "retriever": {"corpus": "wiki"}, "format": "tags"})
    required = [tuple(item[:3]) for item in cls.requires(config)]  # (kind, name, options[, path])
    assert ("tools", "search", {"topk": 4, "retriever": {"corpus": "wiki"}}) in required
    assert ("tool_call_formats", "tags", {"result_tag": "information"}) in required


def test_example_run_config_validates() -> None:
    """The example run config's data, environment and reward sections resolve and validate against
    the installed plugin (the trainer-side sections are the core's business)."""
    from pathlib import Path

    from agent_r1.config import component_sections, load_config, validation_error_message

    path = Path(__file__).resolve().parents[1] / "configs" / "hotpotqa_bm25.yaml"
    config = load_config(path)
    registry = get_registry()
    ours = {"datasets", "environments", "reward_shapers"}
    checked = []
    for where, kind, spec in component_sections(config):
        if kind not in ours:
            continue
        cls = registry.get(kind, spec.name)
        options = {k: v for k, v in spec.options.items() if k != "weight"}
        try:
            validated = cls.Config.model_validate(options)
        except Exception as exc:  # pragma: no cover - the failure message is the point
            pytest.fail(f"{where}: {validation_error_message(exc, prefix=where)}")
        for sub_kind, sub_name, sub_options, *_ in cls.requires(validated):
            registry.get(sub_kind, sub_name).Config.model_validate(dict(sub_options))
        checked.append(spec.name)
    assert checked == ["hotpotqa", "search_qa", "qa_em", "qa_f1", "qa_format", "search_gold"]
    assert config.eval.success_signal == "qa_em"  # eval success is the plugin's exact match
    env = registry.build("environments", "search_qa", config.environment.options)
    assert env.tools["search"].config.topk == 3


@pytest.mark.parametrize("mode", ["raise", "env_error"])
def test_retrieval_failure_through_the_rollout_engine(closed_port: int, mode: str) -> None:
    """The real rollout engine, a scripted policy and a dead retrieval server: ``raise`` aborts the
    rollout even under the engine's lenient ``on_env_error='end'``; ``env_error`` ends the episode
    as an environment error and the policy never reads the failure."""
    from agent_r1.errors import EnvironmentFatalError
    from agent_r1.rollout.loop import RolloutEngine
    from agent_r1.testing.models import tiny_tokenizer
    from agent_r1.testing.scripted import ScriptedBackend

    retriever = {"kind": "http", "url": f"http://127.0.0.1:{closed_port}", "retries": 0}
    tokenizer = tiny_tokenizer()
    backend = ScriptedBackend(
        tokenizer=tokenizer, responses=["<search>Tinted Windows</search>", "<answer>x</answer>"]
    )
    engine = RolloutEngine(
        backend,
        tokenizer,
        lambda: _env(retriever=retriever, on_retrieval_error=mode),
        max_turns=2,
        on_env_error="end",
    )
    if mode == "raise":
        with pytest.raises(EnvironmentFatalError, match="on_retrieval_error is 'raise', so the run stops"):
            engine.collect([TASK], group_size=1, seed=0)
        return
    (trajectory,) = engine.collect([TASK], group_size=1, seed=0)
    (step,) = trajectory.steps
    assert step.observation.termination == "env_error" and step.observation.messages == []
    assert "is unreachable after 1 attempts" in trajectory.errors[0]


def test_search_r1_layout() -> None:
    """Search-R1's prompt as the whole user message, its result lines in <information>, and a turn
    with neither a search nor an answer goes on (Search-R1 answers it and continues)."""
    from agent_r1_plugin_search.env import SEARCH_R1_TEMPLATE

    env = _env(layout="search_r1")
    start = asyncio.run(env.reset(TASK))
    question = TASK.messages[0]["content"]
    assert start.messages == [{"role": "user", "content": SEARCH_R1_TEMPLATE.format(question=question)}]
    assert start.messages[0]["content"].startswith("Answer the given question. You must conduct reasoning")
    assert start.messages[0]["content"].endswith(f"Question: {question}\n")
    trajectory = _episode(
        env, ["<think>hm</think>", "<search> Tinted Windows band </search>", "<answer> Tulsa </answer>"]
    )
    wandering, searched, answered = trajectory.steps
    assert not wandering.observation.done  # no search, no answer: the episode goes on
    from agent_r1_plugin_search.env import SEARCH_R1_INVALID_ACTION

    assert wandering.observation.continuation == SEARCH_R1_INVALID_ACTION
    assert searched.observation.messages == []  # no chat message: the assistant's turn goes on
    continuation = searched.observation.continuation
    assert continuation.startswith("\n\n<information>") and continuation.endswith("</information>\n\n")
    body = continuation.strip()
    assert body.startswith('<information>Doc 1(Title: "Tinted Windows') and body.endswith("</information>")
    assert body.count('\nDoc 2(Title: "') == 1 and body.count('\nDoc 3(Title: "') == 1
    titles = searched.observation.info["search"][0]["titles"]
    from agent_r1_plugin_search.tool import titles_from_text

    assert titles_from_text(searched.observation.tool_results[0].content) == titles  # both styles parse
    assert answered.observation.termination == "answer" and _scores(trajectory)["qa_em"] == [(None, 1.0)]
    from agent_r1 import ConfigError

    with pytest.raises((ConfigError, ValueError), match="layout 'search_r1' needs the tags format"):
        _env(layout="search_r1", format="hermes")


def test_search_r1_layout_tokens_continue_the_assistant_turn() -> None:
    """Through the real engine: after '<search> q </search>' come exactly the tokens of
    '\n\n<information>...</information>\n\n' (tokenised on their own, as Search-R1 does), no
    end-of-turn and no new assistant header, and the answer follows in the same assistant turn."""
    from agent_r1.mdp import TokenSource
    from agent_r1.testing import scripted_rollout
    from agent_r1.testing.models import tiny_tokenizer

    tokenizer = tiny_tokenizer()
    (trajectory,) = scripted_rollout(
        lambda: _env(layout="search_r1"),
        ["<search> Tinted Windows band </search>", "<answer> Tulsa </answer>"],
        TASK,
        tokenizer=tokenizer,
    )
    sources = [segment.source for segment in trajectory.segments]
    assert sources == [TokenSource.PROMPT, TokenSource.POLICY, TokenSource.ENV, TokenSource.POLICY]
    env_ids = trajectory.segments[2].token_ids
    assert env_ids == tokenizer.encode(trajectory.steps[0].observation.continuation, add_special_tokens=False)
    assert tokenizer.decode(trajectory.segments[1].token_ids).endswith("</search>")
    assert trajectory.steps[-1].action.answer == "Tulsa" and trajectory.termination == "answer"
