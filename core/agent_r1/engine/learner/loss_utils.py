"""Numerical pieces of the policy update that the framework owns, not the plugins.

* masked statistics (:func:`masked_sum`, :func:`masked_mean`, :func:`masked_var`,
  :func:`masked_whiten`) shared by the advantage estimators and the losses;
* loss aggregation (:func:`aggregate`) with a :class:`Normalizer` computed once per optimizer step
  from the whole mini-batch, so that micro-batching and gradient accumulation never change the loss;
* KL to a reference policy (:func:`kl_penalty`) and its coefficient controllers;
* token entropy and log-probabilities from logits;
* truncated importance sampling against rollout-engine log-probabilities (:func:`tis_weights`) and
  the mismatch KL metric (:func:`mismatch_kl`).

Conventions (see ``ALGORITHMS.md``): every ``mask`` argument is a bool tensor that is true on
policy-sampled tokens; "whitened" means ``(x - mean) / sqrt(var + 1e-8)`` with the mean and the
unbiased variance taken over masked tokens only.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, NamedTuple, get_args

import torch

AggregationMode = Literal[
    "token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"
]
AGGREGATION_MODES: tuple[str, ...] = get_args(AggregationMode)
KLKind = Literal["k1", "k2", "k3"]

WHITEN_EPS = 1e-8
LOG_RATIO_BOUND = 20.0
"""Log-ratios are clamped to ±20 before ``exp`` (e^20 ≈ 5e8) so that one wild token cannot overflow."""
K3_MAX = 10.0
"""Upper bound on the per-token k3 estimate. k3 = e^{-l} + l - 1 grows exponentially when the policy
puts far less mass than the reference on a sampled token; capping it keeps one such token from
dominating the KL term (verl bounds its ``low_var_kl`` at the same value)."""


# --------------------------------------------------------------------------------------------
# Masked statistics
# --------------------------------------------------------------------------------------------


def _check_mask(mask: torch.Tensor, like: torch.Tensor) -> None:
    if mask.dtype != torch.bool:
        raise TypeError(f"mask must be a bool tensor, got {mask.dtype}; convert with `mask.bool()`")
    if mask.shape != like.shape:
        raise ValueError(f"mask shape {tuple(mask.shape)} does not match values shape {tuple(like.shape)}")


def masked_sum(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Sum of ``values`` where ``mask`` is true (over ``dim``, or over everything when ``dim`` is
    None). Uses ``torch.where`` rather than multiplication, so non-finite values outside the mask
    (padding) never leak into the result or its gradient."""
    _check_mask(mask, values)
    selected = torch.where(mask, values, 0.0)
    return selected.sum() if dim is None else selected.sum(dim)


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of ``values`` over masked entries (over ``dim``, or over everything). An empty mask
    gives 0, not NaN: an empty row or batch contributes nothing."""
    count = mask.sum() if dim is None else mask.sum(dim)
    return masked_sum(values, mask, dim) / count.clamp(min=1).to(values.dtype)


def masked_var(values: torch.Tensor, mask: torch.Tensor, *, unbiased: bool = True) -> torch.Tensor:
    """Variance of ``values`` over all masked entries (a scalar). The unbiased estimator divides by
    ``n - 1``; with fewer than two entries the variance is defined as 0."""
    count = mask.sum()
    mean = masked_mean(values, mask)
    squares = masked_sum((values - mean) ** 2, mask)
    divisor = (count - 1 if unbiased else count).to(values.dtype)
    # torch.where rather than a Python branch: no host-device sync on accelerators.
    return torch.where(divisor > 0, squares / divisor.clamp(min=1), torch.zeros_like(squares))


def masked_whiten(
    values: torch.Tensor, mask: torch.Tensor, *, shift_mean: bool = True, eps: float = WHITEN_EPS
) -> torch.Tensor:
    """Whiten ``values`` over the masked entries: ``(x - mean) / sqrt(var + eps)`` with the mean and
    unbiased variance over the mask only (``ALGORITHMS.md``). With ``shift_mean=False`` the mean is
    added back after scaling. Entries outside the mask are 0. A mask with a single entry has
    variance 0 and whitens to 0."""
    mean = masked_mean(values, mask)
    var = masked_var(values, mask)
    whitened = (values - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        whitened = whitened + mean
    return torch.where(mask, whitened, 0.0)


# --------------------------------------------------------------------------------------------
# Group statistics (advantage estimators, dynamic sampling, the zero-variance metric)
# --------------------------------------------------------------------------------------------

FLAT_GROUP_RTOL = 1e-6
"""A group's scores are *all equal* when ``max − min ≤ FLAT_GROUP_RTOL · max(1, largest |score|)``.

Rewards reach the estimators in float32 and are sums of several signals, so scores that are equal
in exact arithmetic can differ in their last bits (summation order, placement on tokens); float32
carries about 7 significant digits, and the sum of a few dozen signals stays well within 1e-6 of
the largest magnitude. Dividing such a difference by a group std of the same size would turn
rounding into advantages of either sign, so an all-equal group gets exactly zero instead. The
estimators, DAPO's dynamic filter, the ``batch/zero_variance_groups`` metric and the skipping of
rows with zero advantage all use this one definition."""


def within_flat_tolerance(low: torch.Tensor, high: torch.Tensor) -> torch.Tensor:
    """Elementwise: values spanning ``low .. high`` are all equal in the sense of
    :data:`FLAT_GROUP_RTOL` (true where ``high < low``, an empty span, and where either is NaN)."""
    scale = torch.maximum(low.abs(), high.abs()).clamp(min=1.0)
    return ~(high - low > FLAT_GROUP_RTOL * scale)


def scores_all_equal(scores: Sequence[float]) -> bool:
    """True when ``scores`` are all equal in the sense of :data:`FLAT_GROUP_RTOL` (an empty list
    or a single score is all equal)."""
    if len(scores) < 2:
        return True
    span = torch.tensor([min(scores), max(scores)], dtype=torch.float64)
    return bool(within_flat_tolerance(span[0], span[1]))


class GroupStats(NamedTuple):
    """Each entry's group statistics, all ``[N]`` float64 (``flat``: bool)."""

    count: torch.Tensor
    """Members of the entry's group."""
    total: torch.Tensor
    """Sum of the members' values."""
    mean: torch.Tensor
    std: torch.Tensor
    """Unbiased standard deviation; 0 for a group of one and for an all-equal group."""
    flat: torch.Tensor
    """The group's values are all equal (:data:`FLAT_GROUP_RTOL`): its advantages are exactly 0."""


def index_stats(
    values: torch.Tensor, index: torch.Tensor, num_groups: int, members: torch.Tensor | None = None
) -> GroupStats:
    """Group statistics of ``values`` ``[N]`` in groups ``index`` ``[N]`` (dense,
    ``0 .. num_groups - 1``), computed in float64 whatever the input dtype, with
    ``index_add_`` / ``scatter_reduce_`` rather than a loop over entries.

    ``members`` ``[N]`` bool leaves entries out of their group's statistics (an episode without
    any action turn): they still get their group's figures, but do not count in them."""
    values = values.detach().double()
    if members is None:
        members = torch.ones_like(values, dtype=torch.bool)
    counted = torch.where(members, values, 0.0)
    zeros = values.new_zeros(num_groups)
    count = zeros.clone().index_add_(0, index, members.double())  # [G]
    total = zeros.clone().index_add_(0, index, counted)  # [G]
    mean = total / count.clamp(min=1)  # [G]
    squares = zeros.clone().index_add_(0, index, torch.where(members, values - mean[index], 0.0) ** 2)
    std = torch.sqrt(squares / (count - 1).clamp(min=1))  # [G]; 0 for a group of one
    inf = torch.full_like(values, math.inf)
    low = zeros.clone().scatter_reduce_(
        0, index, torch.where(members, values, inf), "amin", include_self=False
    )
    high = zeros.clone().scatter_reduce_(
        0, index, torch.where(members, values, -inf), "amax", include_self=False
    )
    flat = within_flat_tolerance(low, high)  # [G]; a group without members is flat
    std = torch.where(flat, 0.0, std)
    return GroupStats(count[index], total[index], mean[index], std[index], flat[index])


# --------------------------------------------------------------------------------------------
# Aggregation
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Normalizer:
    """The denominator of a loss aggregation, fixed for one optimizer step.

    Build it once per optimizer step from the loss masks of the *whole* mini-batch (all its
    micro-batches) with :meth:`from_masks`, then pass it to :func:`aggregate` for every
    micro-batch. Each micro-batch's aggregated loss is then its share of the mini-batch loss, so
    summing the micro-batch losses (or accumulating their gradients with one ``backward`` each, no
    extra scaling) gives exactly the full-batch loss and gradient, whatever the micro-batch size.

    Sequences without any policy token (e.g. truncated trajectories masked out of the loss) do not
    count in ``num_sequences``: they carry no loss and must not dilute the others.
    """

    mode: AggregationMode
    num_tokens: int
    """Policy tokens in the mini-batch."""
    num_sequences: int
    """Sequences of the mini-batch with at least one policy token."""
    length: float | None = None
    """The fixed length constant of ``seq-mean-token-sum-norm`` (Dr.GRPO), else None."""

    @classmethod
    def from_masks(
        cls,
        masks: torch.Tensor | Sequence[torch.Tensor],
        mode: AggregationMode | str,
        max_len: int | float | None = None,
    ) -> Normalizer:
        """Count tokens and sequences over the whole mini-batch. ``masks`` is either the full
        ``[B, T]`` bool loss mask or the list of its micro-batch masks (widths may differ).
        ``max_len`` is the fixed length constant that ``seq-mean-token-sum-norm`` divides by (the
        configured maximum response length); it is required for that mode and ignored otherwise."""
        if mode not in AGGREGATION_MODES:
            raise ValueError(
                f"unknown loss aggregation {mode!r}; choose one of {', '.join(AGGREGATION_MODES)}"
            )
        mask_list = [masks] if isinstance(masks, torch.Tensor) else list(masks)
        num_tokens = 0
        num_sequences = 0
        for mask in mask_list:
            if mask.dtype != torch.bool or mask.dim() != 2:
                raise TypeError(
                    f"loss masks must be [B, T] bool tensors, got {mask.dtype} {tuple(mask.shape)}"
                )
            num_tokens += int(mask.sum())
            num_sequences += int(mask.any(dim=1).sum())
        length: float | None = None
        if mode == "seq-mean-token-sum-norm":
            if max_len is None or max_len <= 0:
                raise ValueError(
                    "loss aggregation 'seq-mean-token-sum-norm' (Dr.GRPO) divides by a fixed length: "
                    "pass max_len (the maximum response length), a positive number"
                )
            length = float(max_len)
        return cls(mode=mode, num_tokens=num_tokens, num_sequences=num_sequences, length=length)  # type: ignore[arg-type]

    @property
    def denominator(self) -> float:
        """What a micro-batch's (per-sequence) token sums are divided by; at least 1."""
        if self.mode == "token-mean":
            value = float(self.num_tokens)
        elif self.mode == "seq-mean-token-sum-norm":
            value = float(self.num_sequences) * float(self.length or 1.0)
        else:
            value = float(self.num_sequences)
        return max(value, 1.0)


def aggregate(
    token_values: torch.Tensor,
    mask: torch.Tensor,
    mode: AggregationMode | str,
    *,
    normalizer: Normalizer,
) -> torch.Tensor:
    """Reduce a per-token quantity ``[B, T]`` of one micro-batch to its share of the mini-batch loss.

    * ``token-mean``: sum over policy tokens / policy tokens in the mini-batch (DAPO's token-level
      loss; Yu et al. 2025).
    * ``seq-mean-token-mean``: each sequence's token mean, summed, / sequences in the mini-batch
      (original GRPO; Shao et al. 2024).
    * ``seq-mean-token-sum``: each sequence's token sum, summed, / sequences in the mini-batch.
    * ``seq-mean-token-sum-norm``: token sum / (sequences × fixed length) (Dr.GRPO; Liu et al. 2025).

    ``normalizer`` must come from :meth:`Normalizer.from_masks` over the whole mini-batch with the
    same ``mode``; passing one built for another mode is an error.
    """
    if mode != normalizer.mode:
        raise ValueError(
            f"aggregation mode {mode!r} does not match the normalizer's mode {normalizer.mode!r}"
        )
    _check_mask(mask, token_values)
    if mode == "seq-mean-token-mean":
        per_sequence = masked_mean(token_values, mask, dim=-1)  # [B]; 0 for empty rows
        total = per_sequence.sum()
    else:
        total = masked_sum(token_values, mask)
    return total / normalizer.denominator


# --------------------------------------------------------------------------------------------
# KL to a reference policy
# --------------------------------------------------------------------------------------------


def kl_penalty(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, kind: KLKind | str = "k3") -> torch.Tensor:
    """Per-token estimate ``[B, T]`` of KL(π‖π_ref) on tokens sampled from π, with
    ``l = logπ - logπ_ref`` (Schulman, "Approximating KL divergence", 2020):

    * ``k1 = l``: unbiased, high variance, can be negative;
    * ``k2 = ½ l²``: biased, low variance, non-negative;
    * ``k3 = e^{-l} + l - 1``: unbiased, low variance, non-negative. ``l`` is clamped to ±20
      inside the exponential and the result capped at :data:`K3_MAX` for stability.
    """
    log_ratio = logprobs - ref_logprobs  # [B, T]
    if kind == "k1":
        return log_ratio
    if kind == "k2":
        return 0.5 * log_ratio.square()
    if kind == "k3":
        bounded = log_ratio.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)
        # expm1 keeps e^{-l} − 1 + l accurate (and ≥ 0) for l near 0, where exp would cancel.
        return (torch.expm1(-bounded) + bounded).clamp(min=0.0, max=K3_MAX)
    raise ValueError(f"unknown KL estimator {kind!r}; choose k1, k2 or k3")


class FixedKLController:
    """A constant KL coefficient β. ``update`` is a no-op, so both controllers share one interface."""

    def __init__(self, coef: float) -> None:
        self.value = float(coef)

    def update(self, current_kl: float, n_steps: int) -> None:
        """Ignore the measured KL: β stays fixed."""


class AdaptiveKLController:
    """Adaptive KL coefficient of Ziegler et al. 2019 ("Fine-Tuning Language Models from Human
    Preferences"): after each batch of ``n_steps`` samples with mean KL ``current_kl``,
    ``β ← β · (1 + clip(KL/target - 1, -0.2, 0.2) · n_steps / horizon)``, so β grows while the KL is
    above target and shrinks while it is below."""

    def __init__(self, init_coef: float, target: float, horizon: int) -> None:
        if target <= 0 or horizon <= 0:
            raise ValueError(f"adaptive KL needs target > 0 and horizon > 0, got {target} and {horizon}")
        self.value = float(init_coef)
        self.target = float(target)
        self.horizon = int(horizon)

    def update(self, current_kl: float, n_steps: int) -> None:
        """Move β towards keeping the per-token KL at ``target``."""
        proportional_error = min(max(current_kl / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + proportional_error * n_steps / self.horizon


# --------------------------------------------------------------------------------------------
# Logits
# --------------------------------------------------------------------------------------------


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy ``[B, T]`` of the categorical distributions given by ``logits [B, T, V]``, computed
    as ``logsumexp(z) - Σ softmax(z)·z``, which never takes the log of a small probability."""
    log_normalizer = torch.logsumexp(logits, dim=-1)  # [B, T]
    probs = torch.softmax(logits, dim=-1)  # [B, T, V]
    return log_normalizer - (probs * logits).sum(dim=-1)


def token_logprobs(logits: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
    """Log-probability ``[B, T]`` of ``token_ids [B, T]`` under ``logits [B, T, V]`` (the logits
    already aligned so that position t predicts ``token_ids[:, t]``)."""
    log_probs = torch.log_softmax(logits, dim=-1)  # [B, T, V]
    return log_probs.gather(-1, token_ids.unsqueeze(-1)).squeeze(-1)


# --------------------------------------------------------------------------------------------
# Rollout / trainer mismatch
# --------------------------------------------------------------------------------------------


def mismatch_log_ratio(
    old_logprobs: torch.Tensor, rollout_logprobs: torch.Tensor, mask: torch.Tensor, level: str
) -> torch.Tensor:
    """``log(π_old / π_rollout)`` ``[B, T]`` per token, or summed over the sequence's policy tokens
    and broadcast to them (``level="sequence"``); 0 off ``mask``, clamped to ±``LOG_RATIO_BOUND``.
    Not differentiable on purpose: call it under ``torch.no_grad()``."""
    log_ratio = torch.where(mask, old_logprobs - rollout_logprobs, 0.0)  # [B, T]
    if level == "sequence":
        log_ratio = log_ratio.sum(dim=-1, keepdim=True).expand_as(log_ratio)  # [B, T]
    return log_ratio.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)


def tis_weights(
    old_logprobs: torch.Tensor,
    rollout_logprobs: torch.Tensor,
    mask: torch.Tensor,
    cap: float = 2.0,
    level: Literal["token", "sequence"] = "token",
    masked: bool = False,
) -> torch.Tensor:
    """Importance weights that correct for the rollout engine sampling from a slightly different
    policy than the trainer's π_old (``ALGORITHMS.md``, "Rollout/trainer mismatch").

    The ratio is ``π_old / π_rollout`` per token (``level="token"``) or its product over the
    sequence's policy tokens (``level="sequence"``, broadcast to the tokens). Truncated IS
    (``masked=False``) returns ``min(ratio, cap)``; masked IS (``masked=True``) keeps the ratio
    where it lies in ``[1/cap, cap]`` and drops the token or sequence otherwise.

    Returns detached ``weights [B, T]``, 0 off the mask and on dropped tokens (every kept weight is
    positive, so ``weights > 0`` is the kept-token mask). Multiply the per-token policy loss by
    them before :func:`aggregate`. Dropped tokens then count in the :class:`Normalizer` as
    zero-loss tokens, which keeps the loss scale steady when a few are dropped; to exclude them
    instead, AND ``weights > 0`` into the loss mask before building the normaliser.
    """
    if cap <= 1.0:
        raise ValueError(f"the importance-sampling cap must exceed 1, got {cap}")
    if level not in ("token", "sequence"):
        raise ValueError(f"unknown importance-sampling level {level!r}; choose token or sequence")
    _check_mask(mask, old_logprobs)
    with torch.no_grad():
        log_ratio = mismatch_log_ratio(old_logprobs, rollout_logprobs, mask, level)  # [B, T]
        ratio = torch.exp(log_ratio)  # [B, T]
        if masked:
            log_cap = math.log(cap)
            keep = mask & (log_ratio >= -log_cap) & (log_ratio <= log_cap)  # [B, T]
            return torch.where(keep, ratio, 0.0)
        return torch.where(mask, ratio.clamp(max=cap), 0.0)


def mismatch_kl_tensors(
    old_logprobs: torch.Tensor, rollout_logprobs: torch.Tensor, mask: torch.Tensor
) -> dict[str, torch.Tensor]:
    """:func:`mismatch_kl` as 0-dim tensors on the inputs' device: no host synchronisation (the
    trainer reads every metric of an optimizer step at once, see :func:`host_floats`)."""
    with torch.no_grad():
        k1 = kl_penalty(rollout_logprobs, old_logprobs, "k1")
        k3 = kl_penalty(rollout_logprobs, old_logprobs, "k3")
        abs_diff = torch.where(mask, (old_logprobs - rollout_logprobs).abs(), 0.0)
        return {
            "mismatch/kl_k1": masked_mean(k1, mask),
            "mismatch/kl_k3": masked_mean(k3, mask),
            "mismatch/max_abs_log_ratio": abs_diff.max() if abs_diff.numel() else abs_diff.new_zeros(()),
        }


def mismatch_kl(
    old_logprobs: torch.Tensor, rollout_logprobs: torch.Tensor, mask: torch.Tensor
) -> dict[str, float]:
    """KL(π_rollout‖π_old) per policy token, estimated on the rollout's own samples with k1 and k3
    (see :func:`kl_penalty`), plus the largest absolute log-ratio. Log these every run: they should
    stay near 0 when the rollout engine and the trainer agree."""
    return host_floats(mismatch_kl_tensors(old_logprobs, rollout_logprobs, mask))


def host_floats(values: Mapping[str, torch.Tensor | float]) -> dict[str, float]:
    """Every value as a Python float, the tensors among them copied to the host in one transfer
    (one synchronisation with the device instead of one per value)."""
    tensors = [(name, value) for name, value in values.items() if isinstance(value, torch.Tensor)]
    out = {name: float(value) for name, value in values.items() if not isinstance(value, torch.Tensor)}
    if tensors:
        device = tensors[0][1].device
        dtype = torch.float32 if device.type == "mps" else torch.float64  # MPS has no float64
        stacked = torch.stack([value.detach().reshape(()).to(device, dtype) for _, value in tensors])
        out.update(zip((name for name, _ in tensors), stacked.tolist(), strict=True))
    return {name: out[name] for name in values}


__all__ = [
    "AGGREGATION_MODES",
    "FLAT_GROUP_RTOL",
    "K3_MAX",
    "LOG_RATIO_BOUND",
    "WHITEN_EPS",
    "AdaptiveKLController",
    "AggregationMode",
    "FixedKLController",
    "GroupStats",
    "KLKind",
    "Normalizer",
    "aggregate",
    "entropy_from_logits",
    "host_floats",
    "index_stats",
    "kl_penalty",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "masked_whiten",
    "mismatch_kl",
    "mismatch_kl_tensors",
    "mismatch_log_ratio",
    "scores_all_equal",
    "tis_weights",
    "token_logprobs",
    "within_flat_tolerance",
]
