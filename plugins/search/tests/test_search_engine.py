"""``search_qa`` inside agent-r1's real rollout engine: a scripted policy (the core's
ScriptedBackend, real tokenizer and chat template) drives multi-turn episodes with real BM25
searches, in both formats; then the trajectories are scored by the plugin's reward shapers."""

from __future__ import annotations

import json

import pytest

from agent_r1 import TokenSource
from agent_r1.registry import get_registry
from agent_r1.rollout.loop import RolloutEngine
from agent_r1.testing.models import tiny_tokenizer
from agent_r1.testing.scripted import ScriptedBackend
from agent_r1_plugin_search.datasets import HotpotQADataset

CALL = json.dumps({"name": "search", "arguments": {"query": "Tinted Windows band first performance"}})
SCRIPTS = {
    "tags": [
        "<think>Find the band.</think><search>Tinted Windows debut album band</search>",
        "<search>Tinted Windows band first performance city</search>",
        "<answer>Tulsa</answer>",
    ],
    "hermes": [f"<tool_call>\n{CALL}\n</tool_call>", "<answer>Tulsa</answer>"],
}
WRAPPERS = {
    "tags": "<|im_start|>user\n<information>Doc 1 (Title: ",
    "hermes": "<|im_start|>tool\nDoc 1 (Title: ",
}


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer()


@pytest.mark.parametrize("fmt", ["tags", "hermes"])
def test_scripted_rollout_through_the_engine(tokenizer, fmt: str) -> None:
    task = HotpotQADataset().load("all")[0]
    registry = get_registry()
    backend = ScriptedBackend(tokenizer=tokenizer, responses=SCRIPTS[fmt])
    engine = RolloutEngine(
        backend,
        tokenizer,
        lambda: registry.build("environments", "search_qa", {"format": fmt}),
        max_turns=4,
        max_new_tokens=64,
        max_context=4096,
    )
    [trajectory] = engine.collect([task], group_size=1, seed=0)
    assert trajectory.termination == "answer"
    assert [step.action.text for step in trajectory.steps] == SCRIPTS[fmt]
    env_tokens = [t for s in trajectory.segments if s.source is TokenSource.ENV for t in s.token_ids]
    env_text = tokenizer.decode(env_tokens)
    assert env_text.startswith(WRAPPERS[fmt])
    assert "Tinted Windows (band)" in env_text
    assert sum(trajectory.loss_mask) == trajectory.num_policy_tokens  # observations carry no loss
    records = [
        r for step in trajectory.steps if step.observation for r in step.observation.info.get("search", [])
    ]
    assert len(records) == len(SCRIPTS[fmt]) - 1
    scores = {}
    for name in ("qa_em", "qa_format", "search_valid", "search_gold"):
        signals = registry.build("reward_shapers", name, {}).score(trajectory, task)
        scores[name] = sum(s.value for s in signals)
    assert scores == {
        "qa_em": 1.0,
        "qa_format": 1.0,
        "search_valid": float(len(SCRIPTS[fmt]) - 1),
        "search_gold": 1.0,
    }
