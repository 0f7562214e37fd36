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
* **KV-cache reuse across turns** (``reuse_kv_across_turns``). The rollout engine's prompt at turn
  ``k`` is its prompt at turn ``k - 1`` plus the sampled tokens plus the observation tokens. So
  after each call the backend keeps, per row, the KV cache of its prompt and sampled tokens (all
  but the last sampled token, which was never fed to the model), and a prompt of the next call
  that starts with a kept token sequence reuses that cache and prefills only the rest. Rows of one
  batch then hold caches of different lengths: each row's cache is left-padded to the longest,
  ``[padding][reused cache][padding][new tokens]``, with the padding masked out and
  ``position_ids`` continuing from the reused tokens. Kept caches that the next call does not
  continue (episodes that ended) are dropped; so are all of them on :meth:`HFBackend.sync_weights`
  and whenever the model's parameters changed in place since they were computed (a stale cache is
  never used), and rows past ``reuse_kv_max_gib`` are not kept. Results equal those of a full
  prefill up to floating-point summation order.
* **Reproducibility.** Sampling draws from one ``torch.Generator`` seeded with ``sampling.seed``:
  the same seed, the same prompts in the same order and the same weights give the same tokens;
  reusing kept caches does not change which random numbers a row draws.
"""

from __future__ import annotations

import inspect
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pydantic import Field

from agent_r1.contracts import ComponentConfig, Generation, RolloutBackend, SamplingParams
from agent_r1.errors import AgentR1Error
from agent_r1.models.kv import with_cache

if TYPE_CHECKING:  # pragma: no cover
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

__all__ = ["STEP_METRICS", "HFBackend", "sample_tokens"]

_GIB = float(1 << 30)

CALL_STATS = (
    "prompts",
    "prefill_rows",
    "prefill_tokens",
    "shared_prefix_tokens",
    "reused_rows",
    "reused_prefix_tokens",
    "kept_rows",
    "kept_gib",
    "kv_cap_skipped_rows",
    "generated_tokens",
    "forward_passes",
    "prefill_seconds",
    "decode_seconds",
)
"""Figures of one ``generate`` call (``HFBackend.last_stats``; ``seconds`` is added at the end)."""

STEP_METRICS: dict[str, str] = {
    "time/generate_prefill_s": "seconds of the hf backend's prefill passes (reused caches assembled, "
    "shared prefixes included)",
    "time/generate_decode_s": "seconds of the hf backend's token-by-token decoding (caches kept for the "
    "next turn included)",
    "rollout/prefill_tokens": "prompt tokens the hf backend prefilled (each shared prefix counted once)",
    "rollout/reused_prefix_tokens": "prompt tokens whose KV cache the hf backend reused from the "
    "previous turn instead of prefilling them",
    "rollout/shared_prefix_tokens": "of rollout/prefill_tokens, tokens of prefixes shared by a "
    "batch's prompts",
    "rollout/kv_cap_skipped_rows": "rows whose KV cache was not kept for the next turn because "
    "reuse_kv_max_gib was reached (they are prefilled again)",
}
"""The figures :meth:`HFBackend.step_metrics` reports, with their meaning (summed over the
``generate`` calls since the previous report)."""


@dataclass
class _Row:
    """Per-row decoding state (one prompt of the batch)."""

    index: int
    """Position of the prompt in the caller's list."""
    prompt: tuple[int, ...]
    budget: int
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str | None = None
    stop_sequence: str | None = None


@dataclass
class _KeptKV:
    """The KV cache of one finished row, kept for the next call: every token of its prompt and
    sampled tokens but the last sampled one (which was never fed to the model)."""

    tokens: tuple[int, ...]
    layers: list[tuple[torch.Tensor, torch.Tensor]]
    """Per layer, the keys and values ``[H, C, D]`` of ``tokens`` (``C = len(tokens)``)."""
    nbytes: int


@dataclass
class _Chunk:
    """Rows decoded together in one batch, and what their prefill shares or reuses."""

    rows: list[_Row]
    distinct: list[tuple[int, ...]]
    """The distinct prompts of the rows (every row's prompt when prefix sharing is off)."""
    copies: list[int]
    """Row ``b`` continues ``distinct[copies[b]]``."""
    shared: int
    """Length of the token prefix common to all ``distinct`` prompts, prefilled once (0: none);
    only when no distinct prompt reuses a kept cache."""
    reused: list[_KeptKV | None] = field(default_factory=list)
    """Per distinct prompt, the kept cache of the previous call that it continues, if any."""


class HFBackend(RolloutBackend):
    """Rollout backend on a transformers causal LM (CPU or CUDA; the device is the model's).

    Build it as ``HFBackend(config, model=model, tokenizer=tokenizer)``. The backend shares the
    trainer's model object: :meth:`sync_weights` records the policy version, swaps the model when
    given a different object and drops the KV caches kept for the next turn.
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
        reuse_kv_across_turns: bool = Field(
            True,
            description="keep each row's KV cache after a call; a prompt of the next call that "
            "continues a kept row (the next turn of an episode) prefills only its new tokens",
        )
        reuse_kv_max_gib: float = Field(
            4.0,
            ge=0,
            description="memory the caches kept for the next call may take (GiB, on the model's "
            "device); rows past it are prefilled again next turn (rollout/kv_cap_skipped_rows)",
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
        ``reused_rows`` and ``reused_prefix_tokens`` (distinct prompts that continued a cache kept
        from the previous call, and the tokens not prefilled thanks to it), ``kept_rows``,
        ``kept_gib`` and ``kv_cap_skipped_rows`` (caches kept for the next call, their size, and
        rows not kept because of ``reuse_kv_max_gib``), ``generated_tokens``, ``forward_passes``,
        ``prefill_seconds``, ``decode_seconds`` and ``seconds``."""
        self._totals: dict[str, float] = dict.fromkeys(STEP_METRICS, 0.0)
        self._kept: dict[tuple[int, ...], _KeptKV] = {}
        self._kept_index: dict[tuple[int, int], list[_KeptKV]] = {}
        """Kept caches by (length, last token), to find a prompt's continuation without a scan."""
        self._kept_lengths: list[int] = []
        self._kept_bytes = 0
        self._kept_weights: tuple[Any, ...] | None = None
        """Fingerprint of the weights the kept caches were computed with (see :meth:`_weights_key`)."""
        self._plain_cache: bool | None = None
        """Whether the model's KV cache is one plain tensor pair per layer (known after a forward)."""

    # -- setup ----------------------------------------------------------------------------------
    def _find_stop_token_ids(self) -> set[int]:
        """Token ids that end a turn (see :func:`agent_r1.rollout.chat.turn_stop_token_ids`)."""
        from agent_r1.rollout.chat import turn_stop_token_ids

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
        """Sample from ``model`` from now on (the same object in the usual colocated setup). The KV
        caches kept for the next turn were computed with the old weights, so they are dropped."""
        if model is not None and model is not self.model:
            self.model = model
        self.policy_version = version
        self._drop_kept()

    def async_replica(self, version: int) -> tuple[HFBackend, Any]:
        """For ``rollout.mode: async``: a backend of its own over a frozen copy of the policy, and
        the guard of that copy's weights (:class:`~agent_r1.engine.asynchrony.RolloutWeights`: the
        trainer's pushes, applied between backend calls)."""
        import copy

        from agent_r1.engine.asynchrony import RolloutWeights

        model = copy.deepcopy(self.model).eval().requires_grad_(False)
        return type(self)(self.config, model=model, tokenizer=self.tokenizer), RolloutWeights(model, version)

    def lane(self) -> HFBackend:
        """Another backend over the same model, with KV caches and figures of its own: asynchronous
        rollouts run several batches at once, one per lane, their backend calls taking turns under
        the weights guard."""
        return type(self)(self.config, model=self.model, tokenizer=self.tokenizer)

    def end_rollout(self) -> None:
        """The batch of episodes ended: no later prompt continues its rows, so the kept caches go
        now rather than at the next weight sync (they would sit in memory through the update)."""
        self._drop_kept()

    def step_metrics(self) -> dict[str, float]:
        """Prefill and decode seconds and prompt-token counts (see :data:`STEP_METRICS`), summed over
        the :meth:`generate` calls since the previous report, then reset. Calls between two
        training steps (evaluation rollouts) count towards the next step's figures."""
        figures = dict(self._totals)
        self._totals = dict.fromkeys(STEP_METRICS, 0.0)
        return figures

    # -- generation -----------------------------------------------------------------------------
    def _generate_within(
        self, prompts: Sequence[Sequence[int]], sampling: SamplingParams, budgets: list[int]
    ) -> list[Generation]:
        """Sample one continuation per prompt (:meth:`generate`).

        ``max_new_tokens`` optionally caps each row separately (the rollout engine passes the room
        left in each trajectory's context); the effective budget of a row is the smaller of it and
        ``sampling.max_new_tokens``. A row with a budget of 0 returns no tokens with finish reason
        ``length``. Results come back in the order of ``prompts``.
        """
        import torch

        started = time.perf_counter()
        for i, prompt in enumerate(prompts):
            if not prompt:
                raise ValueError(f"prompt {i} is empty: the backend needs at least one token to condition on")
        self.last_stats = dict.fromkeys(CALL_STATS, 0.0)
        self.last_stats["prompts"] = float(len(prompts))
        rows = [_Row(i, tuple(int(t) for t in prompts[i]), budgets[i], [], []) for i in range(len(prompts))]
        for row in rows:
            if row.budget <= 0:
                row.finish_reason = "length"
        pending = [row for row in rows if row.finish_reason is None]

        generator = torch.Generator(device=self.device)
        if sampling.seed is not None:
            generator.manual_seed(int(sampling.seed) % (1 << 63))
        else:
            generator.seed()

        if self._kept and self._kept_weights != self._weights_key():
            self._drop_kept()  # the weights changed in place without a sync: never use a stale cache
        chunks = self._chunks(pending)
        # Caches that no prompt continues (episodes that ended) go now; the chunks hold the others
        # until their prefill has copied them.
        self._drop_kept()
        if self.config.reuse_kv_across_turns:
            self._kept_weights = self._weights_key()

        was_training = self.model.training
        self.model.eval()
        try:
            # no_grad, not inference_mode: buffers that a forward (re)creates, such as rotary
            # caches, must stay usable by the trainer's later forward passes with gradients.
            with torch.no_grad():
                for chunk in chunks:
                    self._decode(chunk, sampling, generator)
        finally:
            if was_training:
                self.model.train()
        self._add_call_stats(time.perf_counter() - started)
        return [
            Generation(
                token_ids=row.token_ids,
                logprobs=row.logprobs,
                finish_reason=row.finish_reason or "length",  # type: ignore[arg-type]
                stop_sequence=row.stop_sequence,
            )
            for row in rows
        ]

    def _add_call_stats(self, seconds: float) -> None:
        """Finish this call's ``last_stats`` and add them to the step totals."""
        stats = self.last_stats
        stats["seconds"] = seconds
        stats["kept_rows"] = float(len(self._kept))
        stats["kept_gib"] = self._kept_bytes / _GIB
        totals = self._totals
        totals["time/generate_prefill_s"] += stats["prefill_seconds"]
        totals["time/generate_decode_s"] += stats["decode_seconds"]
        totals["rollout/prefill_tokens"] += stats["prefill_tokens"]
        totals["rollout/reused_prefix_tokens"] += stats["reused_prefix_tokens"]
        totals["rollout/shared_prefix_tokens"] += stats["shared_prefix_tokens"]
        totals["rollout/kv_cap_skipped_rows"] += stats["kv_cap_skipped_rows"]

    def _chunks(self, rows: list[_Row]) -> list[_Chunk]:
        """Split rows (in order) into chunks of at most ``max_batch_size``; in each chunk, find the
        distinct prompts (all prompts when prefix sharing is off), each row's prompt among them, the
        kept cache each distinct prompt continues and the prefix they share. Rows keep their order,
        so sampling draws the same random numbers with or without sharing and reuse."""
        limit = self.config.max_batch_size
        chunks = []
        for begin in range(0, len(rows), limit):
            members = rows[begin : begin + limit]
            distinct: dict[Any, int] = {}
            prompt_list: list[tuple[int, ...]] = []
            copies: list[int] = []
            for row in members:
                key: Any = row.prompt if self.config.prefix_sharing else row.index
                if key not in distinct:
                    distinct[key] = len(prompt_list)
                    prompt_list.append(row.prompt)
                copies.append(distinct[key])
            reused = [self._find_kept(prompt) for prompt in prompt_list]
            shared = 0 if any(reused) else self._shared_prefix_length(prompt_list)
            chunks.append(_Chunk(members, prompt_list, copies, shared, reused))
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

    # -- kept caches ----------------------------------------------------------------------------
    def _weights_key(self) -> tuple[Any, ...]:
        """A fingerprint that changes when the model's parameters change: every in-place update
        (optimizer steps, ``load_state_dict``) bumps a tensor's version counter, and a swapped
        tensor has another address."""
        return (id(self.model), *((p._version, p.data_ptr()) for p in self.model.parameters()))

    def _find_kept(self, prompt: tuple[int, ...]) -> _KeptKV | None:
        """The longest kept cache whose tokens are a proper prefix of ``prompt`` (the prompt keeps at
        least one new token, whose logits start its decoding), or ``None``."""
        for length in self._kept_lengths:  # longest first
            if length >= len(prompt):
                continue
            for kept in self._kept_index.get((length, prompt[length - 1]), ()):
                if prompt[:length] == kept.tokens:
                    return kept
        return None

    def _drop_kept(self) -> None:
        self._kept, self._kept_index, self._kept_lengths, self._kept_bytes = {}, {}, [], 0

    def _keep_row(self, row: _Row, b: int, cache: Any, attention_mask: torch.Tensor) -> None:
        """Keep row ``b``'s cache for the next call (before the row leaves the batch): the cache
        positions its attention mask marks, which hold its prompt and sampled tokens but the last."""
        if not self.config.reuse_kv_across_turns or not self._plain_cache:
            return
        tokens = row.prompt + tuple(row.token_ids[:-1])
        if tokens in self._kept:  # identical rows (greedy copies of one prompt) share one cache
            return
        positions = attention_mask[b].nonzero().squeeze(-1)  # [C]
        if positions.numel() != len(tokens):  # pragma: no cover - an invariant of the layout
            raise RuntimeError(f"hf backend: a cache of {positions.numel()}, not {len(tokens)} tokens")
        layers = [
            (layer.keys[b].index_select(1, positions), layer.values[b].index_select(1, positions))
            for layer in cache.layers
        ]
        nbytes = sum(k.nbytes + v.nbytes for k, v in layers)
        if self._kept_bytes + nbytes > self.config.reuse_kv_max_gib * _GIB:
            self.last_stats["kv_cap_skipped_rows"] += 1
            return
        self._store(tokens, layers, nbytes)

    def _store(
        self, tokens: tuple[int, ...], layers: list[tuple[torch.Tensor, torch.Tensor]], nbytes: int
    ) -> None:
        """Add a kept cache and index it by (length, last token)."""
        kept = _KeptKV(tokens, layers, nbytes)
        self._kept[tokens] = kept
        self._kept_bytes += nbytes
        key = (len(tokens), tokens[-1])
        if key not in self._kept_index:
            self._kept_index[key] = []
            if len(tokens) not in self._kept_lengths:
                self._kept_lengths = sorted([*self._kept_lengths, len(tokens)], reverse=True)
        self._kept_index[key].append(kept)

    def _check_plain_cache(self, cache: Any) -> None:
        """Reuse needs one plain key/value tensor pair per layer; sliding-window, quantized or
        recurrent layers crop or transform what they hold. Said once, then reuse is off."""
        from transformers.cache_utils import DynamicLayer

        if self._plain_cache is not None:
            return
        kinds = sorted({type(layer).__name__ for layer in cache.layers if type(layer) is not DynamicLayer})
        self._plain_cache = not kinds
        if kinds and self.config.reuse_kv_across_turns:
            warnings.warn(
                f"rollout backend 'hf': the model's KV cache has {', '.join(kinds)} layers, whose "
                "contents cannot be kept across turns; every turn prefills its whole prompt. Set "
                "rollout.backend.reuse_kv_across_turns: false to silence this warning.",
                stacklevel=4,
            )

    # -- forward passes -------------------------------------------------------------------------
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
            **with_cache(self.model, cache),
            use_cache=True,
            **extra,
        )
        self.last_stats["forward_passes"] += 1
        return out.logits[:, -1, :].float()  # [B, V]

    def _prefill(self, chunk: _Chunk) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, Any]:
        """Prefill each distinct prompt of the chunk once and return, for each *row*, the logits of
        its next token, its attention mask, the position of its next token and the KV cache.

        A distinct prompt starts from the cache it reuses: a kept cache of the previous call, or the
        shared prefix (``chunk.shared`` tokens, through the model alone, its cache repeated for the
        ``U`` distinct prompts). Those caches are left-padded to the longest, and the prompts'
        remainders are then prefilled together, left-padded after them. Positions count real tokens
        only, so row ``u`` sees exactly ``distinct[u]`` at positions ``0 .. len - 1``. Finally each
        distinct prompt's state is copied for its duplicates. Returns ``(logits [B, V],
        attention_mask [B, S + L], next_position [B], cache)``.
        """
        import torch
        from transformers import DynamicCache

        device = self.device
        shared, distinct = chunk.shared, chunk.distinct
        cache = DynamicCache(config=self.model.config)
        if any(chunk.reused):
            start = self._assemble(chunk, cache)  # [U]: tokens each row's cache holds
            cached = int(start.max())
            # [U, S]: 1 on the reused tokens, 0 on the left padding
            cache_mask = (torch.arange(cached, device=device)[None] >= cached - start[:, None]).long()
        else:
            if shared:
                prefix = torch.tensor([distinct[0][:shared]], dtype=torch.long, device=device)  # [1, S]
                positions = torch.arange(shared, device=device)[None]  # [1, S]
                self._forward(prefix, torch.ones_like(prefix), positions, cache)
                cache.batch_repeat_interleave(len(distinct))
            start = torch.full((len(distinct),), shared, dtype=torch.long, device=device)  # [U]
            cache_mask = torch.ones((len(distinct), shared), dtype=torch.long, device=device)  # [U, S]
        starts = start.tolist()
        remainders = [prompt[begin:] for prompt, begin in zip(distinct, starts, strict=True)]
        width = max(len(r) for r in remainders)
        input_ids = torch.full((len(distinct), width), self.pad_token_id, dtype=torch.long)  # [U, L]
        own_mask = torch.zeros((len(distinct), width), dtype=torch.long)  # [U, L]: 0 on padding
        for u, remainder in enumerate(remainders):
            input_ids[u, width - len(remainder) :] = torch.tensor(remainder, dtype=torch.long)
            own_mask[u, width - len(remainder) :] = 1
        input_ids, own_mask = input_ids.to(device), own_mask.to(device)
        position_ids = start[:, None] + (own_mask.cumsum(-1) - 1).clamp(min=0)  # [U, L]
        attention_mask = torch.cat([cache_mask, own_mask], dim=-1)  # [U, S + L]
        logits = self._forward(input_ids, attention_mask, position_ids, cache)  # [U, V]
        self._check_plain_cache(cache)
        self.last_stats["prefill_rows"] += len(distinct)
        self.last_stats["prefill_tokens"] += shared + sum(len(r) for r in remainders)
        self.last_stats["shared_prefix_tokens"] += shared

        if len(chunk.copies) != len(distinct):  # duplicates: one cache entry per row
            expand = torch.tensor(chunk.copies, dtype=torch.long, device=device)  # [B]
            cache.batch_select_indices(expand)
            logits, attention_mask, position_ids = (t[expand] for t in (logits, attention_mask, position_ids))
        return logits, attention_mask, position_ids[:, -1] + 1, cache

    def _assemble(self, chunk: _Chunk, cache: Any) -> torch.Tensor:
        """Fill ``cache`` with each distinct prompt's starting cache, right-aligned in a zero-padded
        ``[U, H, S, D]`` tensor per layer: a kept cache it continues, else the prefix it shares with
        the other fresh prompts (prefilled here once), else nothing. Returns the number of cached
        tokens per distinct prompt ``[U]``; releases the chunk's references to kept caches."""
        import torch
        from transformers import DynamicCache

        device = self.device
        fresh = [u for u, kept in enumerate(chunk.reused) if kept is None]
        shared = self._shared_prefix_length([chunk.distinct[u] for u in fresh])
        sources: list[list[tuple[torch.Tensor, torch.Tensor]] | None] = [
            kept.layers if kept is not None else None for kept in chunk.reused
        ]
        lengths = [len(kept.tokens) if kept is not None else 0 for kept in chunk.reused]
        if shared:
            prefix_cache: Any = DynamicCache(config=self.model.config)
            prefix = torch.tensor([chunk.distinct[fresh[0]][:shared]], dtype=torch.long, device=device)
            positions = torch.arange(shared, device=device)[None]  # [1, S]
            self._forward(prefix, torch.ones_like(prefix), positions, prefix_cache)
            prefix_layers = [(layer.keys[0], layer.values[0]) for layer in prefix_cache.layers]  # [H, S, D]
            for u in fresh:
                sources[u], lengths[u] = prefix_layers, shared
            self.last_stats["prefill_tokens"] += shared
            self.last_stats["shared_prefix_tokens"] += shared
        reused = [u for u, kept in enumerate(chunk.reused) if kept is not None]
        self.last_stats["reused_rows"] += len(reused)
        self.last_stats["reused_prefix_tokens"] += sum(lengths[u] for u in reused)
        width = max(lengths)
        template = next(source for source in sources if source is not None)
        for i, (keys, values) in enumerate(template):
            heads, _, dim = keys.shape
            layer_keys = keys.new_zeros((len(chunk.distinct), heads, width, dim))  # [U, H, S, D]
            layer_values = values.new_zeros((len(chunk.distinct), heads, width, values.shape[-1]))
            for u, source in enumerate(sources):
                if source is not None:
                    layer_keys[u, :, width - lengths[u] :] = source[i][0]
                    layer_values[u, :, width - lengths[u] :] = source[i][1]
            cache.update(layer_keys, layer_values, i)
        chunk.reused = []  # the copies are made: let the kept caches go
        return torch.tensor(lengths, dtype=torch.long, device=device)

    def _decode(self, chunk: _Chunk, sampling: SamplingParams, generator: torch.Generator) -> None:
        """Prefill the chunk's prompts (see :meth:`_prefill`), then sample token by token until every
        row has finished (rows are filled in place); keep each finished row's cache for the next
        call."""
        import torch

        started = time.perf_counter()
        logits, attention_mask, next_position, cache = self._prefill(chunk)
        device = self.device
        if device.type == "cuda":  # the prefill's kernels are queued: count them as prefill time
            torch.cuda.synchronize(device)
        prefilled = time.perf_counter()
        self.last_stats["prefill_seconds"] += prefilled - started
        try:
            self._sample_loop(chunk.rows, logits, attention_mask, next_position, cache, sampling, generator)
        finally:
            self.last_stats["decode_seconds"] += time.perf_counter() - prefilled

    def _sample_loop(
        self,
        rows: list[_Row],
        logits: torch.Tensor,  # [B, V]
        attention_mask: torch.Tensor,  # [B, P]
        next_position: torch.Tensor,  # [B]
        cache: Any,
        sampling: SamplingParams,
        generator: torch.Generator,
    ) -> None:
        import torch

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
                    continue
                self._keep_row(row, b, cache, attention_mask)
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
