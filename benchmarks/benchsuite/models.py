"""The models the sections use: the tiny random model, the same model fine-tuned on the tool task,
and SmolLM2-135M-Instruct."""

from __future__ import annotations

import json
import random
import re
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agent_r1.mdp import Message
from benchsuite.codebook import CodeBook
from benchsuite.tasks import code_of, make_tasks, tool_call_message

SFT_VERSION = 1  # bump when the tool model's recipe changes, so that cached copies are rebuilt


def prepare_models(work: Path, names: Sequence[str], *, smoke: bool) -> dict[str, dict[str, Any]]:
    """Checkpoint directories (and chat templates) of the models the sections use:

    * ``tiny``: the random tiny Llama-shaped model of the tests;
    * ``tiny-tools``: the same model fine-tuned for a few seconds on the tool task's conversations
      (a random model never writes a tool call, so the multi-turn path would not run);
    * ``smollm2``: SmolLM2-135M-Instruct, prepared offline by ``agent-r1 models prepare``. Its own
      chat template cannot render tools, so the tool task gives it the tiny tokenizer's ChatML
      template (the same special tokens), on both sides.
    """
    from agent_r1.testing.models import CHATML_TEMPLATE, save_tiny_model

    models: dict[str, dict[str, Any]] = {}
    for name in names:
        if name == "tiny":
            directory = work / "models" / "tiny"
            if not (directory / "config.json").exists():
                save_tiny_model(directory, seed=0)
            models[name] = {
                "dir": str(directory),
                "tools_template": None,
                "label": "tiny random Llama (~0.2M)",
            }
        elif name == "tiny-tools":
            steps = 20 if smoke else 150
            directory = work / "models" / f"tiny-tools-v{SFT_VERSION}-{steps}"
            info = directory / "sft.json"
            if not info.exists():
                sft_tool_model(directory, steps=steps)
            models[name] = {
                "dir": str(directory),
                "tools_template": None,
                "label": "tiny Llama fine-tuned on tool calls",
                "sft": json.loads(info.read_text(encoding="utf-8")),
            }
        elif name == "smollm2":
            from agent_r1.models.paths import resolve_model_path

            models[name] = {
                "dir": str(resolve_model_path("smollm2-135m-instruct")),
                "tools_template": CHATML_TEMPLATE,
                "label": "SmolLM2-135M-Instruct",
            }
        else:
            raise ValueError(f"unknown model {name!r} (tiny, tiny-tools, smollm2)")
    return models


def sft_tool_model(directory: Path, *, steps: int, seed: int = 0) -> dict[str, Any]:
    """Fine-tune the tiny model on complete tool-task conversations (two lookups, their results,
    "done"), the loss on the request's answer turns only; save it with ``sft.json`` (loss, and the
    share of sampled first replies that hold a well-formed ``lookup`` call)."""
    from transformers.utils import get_json_schema

    from agent_r1.testing.models import save_tiny_model, tiny_model, tiny_tokenizer

    tokenizer = tiny_tokenizer()
    model = tiny_model(tokenizer, seed=0)
    tools = [get_json_schema(CodeBook().lookup)]
    losses = _fine_tune(model, _sft_rows(tokenizer, tools, seed), steps=steps, seed=seed)
    info = {
        "steps": steps,
        "loss_first": losses[0],
        "loss_last": statistics.fmean(losses[-10:]),
        "probe_call_rate": _probe_call_rate(model, tokenizer, tools, seed),
    }
    save_tiny_model(directory, model, tokenizer)
    (directory / "sft.json").write_text(json.dumps(info, indent=2), encoding="utf-8")
    return info


def _sft_rows(tokenizer: Any, tools: list[Any], seed: int) -> list[tuple[list[int], int]]:
    """``(token ids, prompt length)`` of 256 whole tool-task conversations."""
    rows: list[tuple[list[int], int]] = []
    for task in make_tasks("tools", 256, seed=10_000 + seed):
        keys = task["metadata"]["keys"]
        answer_turns: list[Message] = []
        for key in keys:
            answer_turns += [
                tool_call_message(key),
                {"role": "tool", "name": "lookup", "content": f"code {code_of(key)}"},
            ]
        answer_turns.append({"role": "assistant", "content": "done"})
        prompt = tokenizer.apply_chat_template(
            task["messages"], tools=tools, add_generation_prompt=True, return_dict=False
        )
        full = tokenizer.apply_chat_template(task["messages"] + answer_turns, tools=tools, return_dict=False)
        rows.append((list(full), len(prompt)))
    return rows


def _fine_tune(model: Any, rows: list[tuple[list[int], int]], *, steps: int, seed: int) -> list[float]:
    """``steps`` AdamW steps on batches of 8 rows, the loss on the tokens after the prompt; the
    losses."""
    import torch

    torch.manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-3)
    model.train()
    batch, losses = 8, []
    rng = random.Random(seed)
    for _ in range(steps):
        chosen = rng.sample(rows, batch)
        width = max(len(ids) for ids, _ in chosen)
        input_ids = torch.zeros(batch, width, dtype=torch.long)
        labels = torch.full((batch, width), -100, dtype=torch.long)
        attention = torch.zeros(batch, width, dtype=torch.long)
        for i, (ids, prompt_length) in enumerate(chosen):
            input_ids[i, : len(ids)] = torch.tensor(ids)
            labels[i, prompt_length : len(ids)] = torch.tensor(ids[prompt_length:])
            attention[i, : len(ids)] = 1
        loss = model(input_ids=input_ids, attention_mask=attention, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    model.eval()
    return losses


def _probe_call_rate(model: Any, tokenizer: Any, tools: list[Any], seed: int) -> float:
    """The share of 8 sampled first replies to new tool tasks that hold a well-formed ``lookup``
    call."""
    import torch

    probe = make_tasks("tools", 8, seed=20_000 + seed)
    prompts = [
        tokenizer.apply_chat_template(
            t["messages"], tools=tools, add_generation_prompt=True, return_dict=False
        )
        for t in probe
    ]
    well_formed = 0
    with torch.no_grad():
        for prompt in prompts:
            out = model.generate(
                torch.tensor([prompt]),
                do_sample=True,
                temperature=1.0,
                top_k=0,
                max_new_tokens=40,
                pad_token_id=tokenizer.pad_token_id,
            )
            text = tokenizer.decode(out[0, len(prompt) :])
            well_formed += bool(
                re.search(r'<tool_call>\s*\{"name": "lookup", "arguments": \{"key": "[^"]*"\}\}', text)
            )
    return well_formed / len(prompts)
