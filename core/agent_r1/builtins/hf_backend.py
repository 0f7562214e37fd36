"""The ``hf`` rollout backend: batched sampling with a KV cache on a transformers causal LM.

The decoding loop is written out here rather than delegated to ``model.generate`` so that the
backend controls exactly what the trainer later relies on:

* **Log-probabilities.** Each sampled token carries ``log_softmax(logits / T)`` at that token,
  computed in float32 from the model's logits *before* top-k / top-p filtering (no
  renormalisation over the kept tokens). The trainer recomputes exactly this quantity with one
  forward pass over the trajectory, scaling the logits by ``1 / T``. With ``temperature == 0``
  decoding is greedy and the log-probabilities are those at temperature 1.
* **Stopping.** A row stops on an end-of-turn / EOS token (the tokenizer's ``eos_token_id``, the
  model's ``generation_config.eos_token_id``, the chat template's end-of-turn token such as
  ``<|im_end|>``, and :attr:`HFBackend.Config.stop_token_ids`), on a stop string (found in the
  decoded tail of the *new* tokens; the row stops right after the token that completes it and
  every sampled token is kept as sampled, so the text may run a few characters past the stop
  string), or after its token budget. Finished rows leave the batch, so they stop costing compute.
* **Batches of different lengths.** Prompts are left-padded; the attention mask hides the padding
  and ``position_ids`` count real tokens only, so a row's result does not depend on its neighbours
  (up to floating-point summation order).
* **Shared prefixes** (``prefix_sharing``). Nothing is prefilled twice within a batch: identical
  prompts (the G samples of a group at the first turn) are prefilled once, and the longest token
  prefix common to all distinct prompts (system prompt, few-shot turns) is prefilled once with
  batch size 1 when it is at least ``min_shared_prefix`` tokens long. Its KV cache is repeated
  for every distinct prompt, whose remainders are then prefilled together, left-padded *after*
  the shared prefix: ``[shared prefix][padding][remainder]``, with the padding masked out and
  ``position_ids`` continuing from the prefix. Each distinct prompt's cache is finally copied for
  its duplicates. Results equal those without sharing up to floating-point summation order.
* **Reproducibility.** Sampling draws from one ``torch.Generator`` seeded with ``sampling.seed``:
  the same seed, the same prompts in the same order and the same weights give the same tokens.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import Field

from agent_r1.contracts import ComponentConfig, Generation, RolloutBackend, SamplingParams
from agent_r1.errors import AgentR1Error

if TYPE_CHECKING:  # pragma: no cover
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

__all__ = ["HFBackend", "sample_tokens"]


@dataclass
class _Row:
    """Per-row decoding state (one prompt of the batch)."""

    index: int
    """Position of the prompt in the caller's list."""
    budget: int
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str | None = None
    stop_sequence: str | None = None


@dataclass
class _Chunk:
    """Rows decoded together in one batch, and what their prefill shares."""

    rows: list[_Row]
    distinct: list[tuple[int, ...]]
    """The distinct prompts of the rows (every row's prompt when prefix sharing is off)."""
    copies: list[int]
    """Row ``b`` continues ``distinct[copies[b]]``."""
    shared: int
    """Length of the token prefix common to all ``distinct`` prompts, prefilled once (0: none)."""


class HFBackend(RolloutBackend):
    """Rollout backend on a transformers causal LM (CPU or CUDA; the device is the model's).

    Build it as ``HFBackend(config, model=model, tokenizer=tokenizer)``. The backend shares the
    trainer's model object: :meth:`sync_weights` only records the policy version (and swaps the
    model when given a different object).
    """

    name = "hf"

    class Config(ComponentConfig):
        prefix_sharing: bool = Field(
            True,
            description="prefill identical prompts, and the token prefix common to all prompts of a "
            "batch, once and share their KV cache",
        )
        min_shared_prefix: int = Field(
            16,
            ge=1,
            description="prefill the prefix common to a batch's distinct prompts separately only when "
            "it has at least this many tokens (below, the extra forward pass costs more than it saves)",
        )
        max_batch_size: int = Field(64, ge=1, description="rows per forward pass; larger batches are split")
        stop_token_ids: list[int] = Field(
            default_factory=list, description="extra token ids that end a turn, besides EOS/end-of-turn"
        )

    config: Config

    def __init__(
        self,
        config: ComponentConfig | dict[str, Any] | None = None,
        *,
        model: PreTrainedModel | None = None,
        tokenizer: PreTrainedTokenizerBase | None = None,
        **resources: Any,
    ) -> None:
        super().__init__(config, model=model, tokenizer=tokenizer, **resources)
        if model is None or tokenizer is None:
            raise AgentR1Error(
                "the 'hf' rollout backend needs the policy model and its tokenizer: build it as "
                "HFBackend(config, model=model, tokenizer=tokenizer)"
            )
        self.model = model
        self.tokenizer = tokenizer
        self.stop_token_ids: frozenset[int] = frozenset(self._find_stop_token_ids())
        pad = tokenizer.pad_token_id
        self.pad_token_id: int = int(pad if pad is not None else min(self.stop_token_ids, default=0))
        # Only the last position's logits are needed; older models compute all of them.
        self._logits_to_keep = "logits_to_keep" in inspect.signature(model.forward).parameters
        self.last_stats: dict[str, float] = {}
        """Counters of the latest :meth:`generate` call: ``prompts``, ``prefill_rows`` (distinct
        prompts prefilled), ``prefill_tokens`` (tokens actually prefilled, each shared prefix
        counted once), ``shared_prefix_tokens`` (of those, tokens of shared prefixes),
        ``generated_tokens``, ``forward_passes`` and ``seconds``."""

    # -- setup ----------------------------------------------------------------------------------
    def _find_stop_token_ids(self) -> set[int]:
        """Token ids that end a turn (see :func:`agent_r1.engine.chat.turn_stop_token_ids`)."""
        from agent_r1.engine.chat import turn_stop_token_ids

        return turn_stop_token_ids(
            self.tokenizer,
            getattr(self.model, "generation_config", None),
            self.config.stop_token_ids,
            backend=self.name,
        )

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def sync_weights(self, model: Any, version: int) -> None:
        """Sample from ``model`` from now on (the same object in the usual colocated setup)."""
        if model is not None and model is not self.model:
            self.model = model
        self.policy_version = version

    # -- generation -----------------------------------------------------------------------------
    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        sampling: SamplingParams,
        *,
        max_new_tokens: Sequence[int] | None = None,
    ) -> list[Generation]:
        """Sample one continuation per prompt.

        ``max_new_tokens`` optionally caps each row separately (the rollout engine passes the room
        left in each trajectory's context); the effective budget of a row is the smaller of it and
        ``sampling.max_new_tokens``. A row with a budget of 0 returns no tokens with finish reason
        ``length``. Results come back in the order of ``prompts``.
        """
        import torch

        started = time.perf_counter()
        if max_new_tokens is not None and len(max_new_tokens) != len(prompts):
            raise ValueError(f"got {len(max_new_tokens)} token budgets for {len(prompts)} prompts")
        budgets = [
            min(sampling.max_new_tokens, int(max_new_tokens[i]) if max_new_tokens is not None else 1 << 62)
            for i in range(len(prompts))
        ]
        for i, prompt in enumerate(prompts):
            if not prompt:
                raise ValueError(f"prompt {i} is empty: the backend needs at least one token to condition on")
        self.last_stats = {
            "prompts": float(len(prompts)),
            "prefill_rows": 0.0,
            "prefill_tokens": 0.0,
            "shared_prefix_tokens": 0.0,
            "generated_tokens": 0.0,
            "forward_passes": 0.0,
        }
        rows = [_Row(i, budgets[i], [], []) for i in range(len(prompts))]
        for row in rows:
            if row.budget <= 0:
                row.finish_reason = "length"
        pending = [row for row in rows if row.finish_reason is None]

        generator = torch.Generator(device=self.device)
        if sampling.seed is not None:
            generator.manual_seed(int(sampling.seed) % (1 << 63))
        else:
            generator.seed()

        was_training = self.model.training
        self.model.eval()
        try:
            # no_grad, not inference_mode: buffers that a forward (re)creates, such as rotary
            # caches, must stay usable by the trainer's later forward passes with gradients.
            with torch.no_grad():
                for chunk in self._chunks(pending, prompts):
                    self._decode(chunk, sampling, generator)
        finally:
            if was_training:
                self.model.train()
        self.last_stats["seconds"] = time.perf_counter() - started
        return [
            Generation(
                token_ids=row.token_ids,
                logprobs=row.logprobs,
                finish_reason=row.finish_reason or "length",  # type: ignore[arg-type]
                stop_sequence=row.stop_sequence,
            )
            for row in rows
        ]

    def _chunks(self, rows: list[_Row], prompts: Sequence[Sequence[int]]) -> list[_Chunk]:
        """Split rows (in order) into chunks of at most ``max_batch_size``; in each chunk, find the
        distinct prompts (all prompts when prefix sharing is off), each row's prompt among them and
        the prefix they share. Rows keep their order, so sampling draws the same random numbers
        with or without sharing."""
        limit = self.config.max_batch_size
        chunks = []
        for begin in range(0, len(rows), limit):
            members = rows[begin : begin + limit]
            distinct: dict[Any, int] = {}
            prompt_list: list[tuple[int, ...]] = []
            copies: list[int] = []
            for row in members:
                prompt = tuple(int(t) for t in prompts[row.index])
                key: Any = prompt if self.config.prefix_sharing else row.index
                if key not in distinct:
                    distinct[key] = len(prompt_list)
                    prompt_list.append(prompt)
                copies.append(distinct[key])
            chunks.append(_Chunk(members, prompt_list, copies, self._shared_prefix_length(prompt_list)))
        return chunks

    def _shared_prefix_length(self, distinct: list[tuple[int, ...]]) -> int:
        """Length of the token prefix common to all ``distinct`` prompts that is worth prefilling
        once, or 0. Every prompt keeps at least one token of its own, whose logits start its
        decoding; a lone distinct prompt is prefilled whole, as splitting it would only add a
        forward pass."""
        if not self.config.prefix_sharing or len(distinct) < 2:
            return 0
        first = distinct[0]
        length = min(len(prompt) for prompt in distinct) - 1
        for prompt in distinct[1:]:
            common = 0
            while common < length and prompt[common] == first[common]:
                common += 1
            length = common
        return length if length >= self.config.min_shared_prefix else 0

    def _forward(
        self,
        input_ids: torch.Tensor,  # [B, L]
        attention_mask: torch.Tensor,  # [B, P + L]
        position_ids: torch.Tensor,  # [B, L]
        cache: Any,
    ) -> torch.Tensor:
        """One forward pass through the cache; returns the float32 logits of the last position."""
        extra = {"logits_to_keep": 1} if self._logits_to_keep else {}
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=cache,
            use_cache=True,
            **extra,
        )
        self.last_stats["forward_passes"] += 1
        return out.logits[:, -1, :].float()  # [B, V]

    def _prefill(self, chunk: _Chunk) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, Any]:
        """Prefill each distinct prompt of the chunk once and return, for each *row*, the logits of
        its next token, its attention mask, the position of its next token and the KV cache.

        The shared prefix (``chunk.shared`` tokens) goes through the model alone and its cache is
        repeated for the ``U`` distinct prompts; their remainders are then prefilled together,
        left-padded after the prefix. Positions count real tokens only, so row ``u`` sees exactly
        ``distinct[u]`` at positions ``0 .. len - 1``. Finally each distinct prompt's state is
        copied for its duplicates. Returns ``(logits [B, V], attention_mask [B, S + L],
        next_position [B], cache)``.
        """
        import torch
        from transformers import DynamicCache

        device = self.device
        shared, distinct = chunk.shared, chunk.distinct
        cache = DynamicCache(config=self.model.config)
        if shared:
            prefix = torch.tensor([distinct[0][:shared]], dtype=torch.long, device=device)  # [1, S]
            positions = torch.arange(shared, device=device)[None]  # [1, S]
            self._forward(prefix, torch.ones_like(prefix), positions, cache)
            cache.batch_repeat_interleave(len(distinct))
        remainders = [prompt[shared:] for prompt in distinct]
        width = max(len(r) for r in remainders)
        input_ids = torch.full((len(distinct), width), self.pad_token_id, dtype=torch.long)  # [U, L]
        own_mask = torch.zeros((len(distinct), width), dtype=torch.long)  # [U, L]: 0 on padding
        for u, remainder in enumerate(remainders):
            input_ids[u, width - len(remainder) :] = torch.tensor(remainder, dtype=torch.long)
            own_mask[u, width - len(remainder) :] = 1
        input_ids, own_mask = input_ids.to(device), own_mask.to(device)
        position_ids = shared + (own_mask.cumsum(-1) - 1).clamp(min=0)  # [U, L]
        prefix_mask = own_mask.new_ones((len(distinct), shared))  # [U, S]
        attention_mask = torch.cat([prefix_mask, own_mask], dim=-1)  # [U, S + L]
        logits = self._forward(input_ids, attention_mask, position_ids, cache)  # [U, V]
        self.last_stats["prefill_rows"] += len(distinct)
        self.last_stats["prefill_tokens"] += shared + sum(len(r) for r in remainders)
        self.last_stats["shared_prefix_tokens"] += shared

        if len(chunk.copies) != len(distinct):  # duplicates: one cache entry per row
            expand = torch.tensor(chunk.copies, dtype=torch.long, device=device)  # [B]
            cache.batch_select_indices(expand)
            logits, attention_mask, position_ids = (t[expand] for t in (logits, attention_mask, position_ids))
        return logits, attention_mask, position_ids[:, -1] + 1, cache

    def _decode(self, chunk: _Chunk, sampling: SamplingParams, generator: torch.Generator) -> None:
        """Prefill the chunk's prompts (see :meth:`_prefill`), then sample token by token until every
        row has finished (rows are filled in place)."""
        import torch

        logits, attention_mask, next_position, cache = self._prefill(chunk)
        rows = chunk.rows
        device = self.device

        stops = [s for s in sampling.stop if s]
        window = max((len(s.encode("utf-8")) for s in stops), default=0) + 1
        while True:
            tokens, logprobs = sample_tokens(logits, sampling, generator)  # [B], [B]
            token_list, logprob_list = tokens.tolist(), logprobs.tolist()
            keep: list[int] = []
            for b, row in enumerate(rows):
                token = int(token_list[b])
                row.token_ids.append(token)
                row.logprobs.append(float(logprob_list[b]))
                if token in self.stop_token_ids:
                    row.finish_reason = "eos"
                elif stops and (hit := self._stop_hit(row.token_ids, stops, window)) is not None:
                    row.finish_reason, row.stop_sequence = "stop", hit
                elif len(row.token_ids) >= row.budget:
                    row.finish_reason = "length"
                else:
                    keep.append(b)
            self.last_stats["generated_tokens"] += len(rows)
            if not keep:
                return
            if len(keep) != len(rows):  # finished rows leave the batch
                index = torch.tensor(keep, dtype=torch.long, device=device)  # [B']
                cache.batch_select_indices(index)
                tokens, attention_mask, next_position = (
                    tokens[index],
                    attention_mask[index],
                    next_position[index],
                )
                rows = [rows[b] for b in keep]
            attention_mask = torch.cat(  # [B, P + 1]
                [attention_mask, attention_mask.new_ones((len(rows), 1))], dim=-1
            )
            logits = self._forward(tokens[:, None], attention_mask, next_position[:, None], cache)
            next_position = next_position + 1

    def _stop_hit(self, token_ids: list[int], stops: list[str], window: int) -> str | None:
        """The stop string completed by the latest token, if any. Only the new tokens are searched,
        and only a tail long enough to hold the longest stop string: an earlier occurrence would
        have stopped the row at an earlier step."""
        tail = self.tokenizer.decode(
            token_ids[-window:], skip_special_tokens=False, clean_up_tokenization_spaces=False
        )
        for stop in stops:
            if stop in tail:
                return stop
        return None


def sample_tokens(
    logits: torch.Tensor,  # [B, V] float32
    sampling: SamplingParams,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row and return ``(tokens [B], logprobs [B])``.

    The log-probability is ``log_softmax(logits / T)`` at the sampled token, *without* top-k/top-p
    renormalisation (the filters only restrict which tokens may be drawn). ``T == 0`` is greedy
    decoding with log-probabilities at temperature 1.
    """
    import torch

    if sampling.temperature == 0:
        logp = torch.log_softmax(logits, dim=-1)  # [B, V]
        tokens = logits.argmax(dim=-1)  # [B]
        return tokens, logp.gather(-1, tokens[:, None]).squeeze(-1)
    scaled = logits / sampling.temperature  # [B, V]
    logp = torch.log_softmax(scaled, dim=-1)  # [B, V]
    filtered = scaled
    if sampling.top_k and sampling.top_k < scaled.shape[-1]:
        kth = torch.topk(scaled, sampling.top_k, dim=-1).values[:, -1:]  # [B, 1]
        filtered = filtered.masked_fill(filtered < kth, float("-inf"))
    if sampling.top_p < 1.0:
        sorted_logits, order = torch.sort(filtered, dim=-1, descending=True)  # [B, V]
        probs = torch.softmax(sorted_logits, dim=-1)
        mass_before = probs.cumsum(dim=-1) - probs  # [B, V]: mass of strictly more likely tokens
        drop_sorted = mass_before >= sampling.top_p  # the most likely token is always kept
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        filtered = filtered.masked_fill(drop, float("-inf"))
    probs = torch.softmax(filtered, dim=-1)  # [B, V]
    tokens = torch.multinomial(probs, 1, generator=generator).squeeze(-1)  # [B]
    return tokens, logp.gather(-1, tokens[:, None]).squeeze(-1)
