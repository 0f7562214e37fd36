"""Every component of the plugin against agent-r1's contract checkers (agent_r1.testing)."""

from __future__ import annotations

import pytest

from agent_r1 import Task
from agent_r1.testing import (
    check_dataset,
    check_environment,
    check_plugin,
    check_reward_shaper,
    check_tool,
    example_trajectory,
)
from agent_r1_plugin_search import plugin
from agent_r1_plugin_search.datasets import DATASETS
from agent_r1_plugin_search.env import SearchQAEnv
from agent_r1_plugin_search.rewards import SHAPERS
from agent_r1_plugin_search.tool import SearchTool

HOTPOT_TASK = Task(
    id="h",
    messages=[{"role": "user", "content": "Where did the band Tinted Windows first perform?"}],
    answer=["Tulsa"],
    metadata={"supporting_titles": ["Tinted Windows (band)"]},
)


def test_plugin_loads_cleanly() -> None:
    info = check_plugin(plugin, "search")
    assert info.components["tools"] == ["search"]
    assert info.components["environments"] == ["search_qa"]
    assert sorted(info.components["datasets"]) == ["2wikimultihopqa", "hotpotqa", "musique", "nq", "qa_mix"]
    assert len(info.components["reward_shapers"]) == 6


def test_tool_contract() -> None:
    tool = check_tool(SearchTool, config={"topk": 2}, calls=[{"query": "Tinted Windows"}])
    assert tool.schema()["function"]["parameters"]["required"] == ["query"]


@pytest.mark.parametrize("fmt", ["tags", "hermes"])
def test_environment_contract(fmt: str) -> None:
    if fmt == "tags":
        actions = ["<search>Tinted Windows band</search>", "<answer>Tulsa</answer>"]
    else:
        call = '<tool_call>{"name": "search", "arguments": {"query": "Tinted Windows band"}}</tool_call>'
        actions = [call, "<answer>Tulsa</answer>"]
    observations = check_environment(SearchQAEnv, config={"format": fmt}, task=HOTPOT_TASK, actions=actions)
    assert len(observations) == 2 and observations[-1].termination == "answer"
    assert "Tinted Windows (band)" in observations[0].info["search"][0]["titles"]


@pytest.mark.parametrize("shaper", SHAPERS, ids=lambda cls: cls.name)
def test_reward_shaper_contract(shaper) -> None:
    signals = check_reward_shaper(shaper)  # the checker's calculator trajectory: answer "391"
    if shaper.name in {"qa_em", "qa_f1", "qa_substring"}:
        assert [s.value for s in signals] == [1.0]
    wrong = check_reward_shaper(shaper, trajectory=example_trajectory("392"))
    if shaper.name in {"qa_em", "qa_f1", "qa_substring"}:
        assert [s.value for s in wrong] == [0.0]


@pytest.mark.parametrize("dataset", DATASETS, ids=lambda cls: cls.name)
def test_dataset_contract(dataset) -> None:
    splits = check_dataset(dataset, splits=("train", "eval"))
    train_ids = {t.id for t in splits["train"]}
    assert splits["eval"] and not train_ids & {t.id for t in splits["eval"]}
    assert all(isinstance(t.answer, list) and t.answer for t in splits["train"])


def test_qa_mix_dataset_contract() -> None:
    from agent_r1_plugin_search.datasets import QAMixDataset

    config = {"datasets": [{"name": "hotpotqa"}, {"name": "nq"}]}
    splits = check_dataset(QAMixDataset, config=config, splits=("train", "eval"))
    assert len(splits["train"]) == 150 + 12 and len(splits["eval"]) == 50 + 5
    assert not {t.id for t in splits["train"]} & {t.id for t in splits["eval"]}
