"""Policy losses against naive per-token formulas, plus the KL, entropy and importance-sampling
helpers of ``agent_r1.engine.learner.loss_utils``."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from agent_r1.builtins.losses import CISPO, GSPO, LOSSES, PPOClip
from agent_r1.contracts import LossInput, PolicyLoss
from agent_r1.engine.learner.loss_utils import (
    K3_MAX,
    AdaptiveKLController,
    FixedKLController,
    Normalizer,
    aggregate,
    entropy_from_logits,
    kl_penalty,
    mismatch_kl,
    tis_weights,
    token_logprobs,
)
from agent_r1.errors import ConfigError
from agent_r1.registry import validate_component_config

SETTINGS = settings(max_examples=60, deadline=None)
F64 = torch.float64


@st.composite
def loss_inputs(
    draw: st.DrawFn,
) -> tuple[list[list[float]], list[list[float]], list[list[float]], list[list[bool]]]:
    """(logprobs, old_logprobs, advantages, mask) as nested lists; ratios from e^-1.5 to e^1.5."""
    rows, cols = draw(st.integers(1, 4)), draw(st.integers(1, 6))
    cell = st.tuples(
        st.floats(-4.0, 0.0, width=32),
        st.floats(-1.5, 1.5, width=32),
        st.floats(-3.0, 3.0, width=32),
        st.booleans(),
    )
    grid = [[draw(cell) for _ in range(cols)] for _ in range(rows)]
    logprobs = [[c[0] for c in row] for row in grid]
    old = [[c[0] - c[1] for c in row] for row in grid]
    advantages = [[c[2] for c in row] for row in grid]
    mask = [[c[3] for c in row] for row in grid]
    return logprobs, old, advantages, mask


def to_input(logprobs, old, advantages, mask) -> tuple[LossInput, torch.Tensor]:
    current = torch.tensor(logprobs, dtype=F64, requires_grad=True)
    inputs = LossInput(
        logprobs=current,
        old_logprobs=torch.tensor(old, dtype=F64),
        advantages=torch.tensor(advantages, dtype=F64),
        loss_mask=torch.tensor(mask, dtype=torch.bool),
    )
    return inputs, current


def naive_ppo(lp: float, old: float, adv: float, low: float, high: float, dual: float | None):
    """(loss, d loss / d logπθ, clipped, dual_clipped) of one token."""
    ratio = math.exp(lp - old)
    unclipped = -adv * ratio
    clipped = -adv * min(max(ratio, 1 - low), 1 + high)
    loss, grad = (unclipped, -adv * ratio) if unclipped >= clipped else (clipped, 0.0)
    dual_clipped = False
    if dual is not None and adv < 0 and loss > -adv * dual:
        loss, grad, dual_clipped = -adv * dual, 0.0, True
    return loss, grad, clipped > unclipped, dual_clipped


def assert_close(actual: torch.Tensor, expected: list[list[float]]) -> None:
    torch.testing.assert_close(
        actual, torch.tensor(expected, dtype=F64).reshape(actual.shape), rtol=1e-9, atol=1e-9
    )


# --------------------------------------------------------------------------------------------
# PPO-clip
# --------------------------------------------------------------------------------------------


@SETTINGS
@given(
    data=loss_inputs(),
    clip=st.sampled_from([(0.2, 0.2), (0.2, 0.28), (0.1, 0.5)]),
    dual=st.sampled_from([None, 3.0, 1.5]),
)
def test_ppo_clip_matches_naive(data, clip, dual) -> None:
    logprobs, old, advantages, mask = data
    inputs, current = to_input(*data)
    loss, diagnostics = PPOClip({"clip_low": clip[0], "clip_high": clip[1], "dual_clip": dual}).token_loss(
        inputs
    )
    loss.sum().backward()
    expected = [
        [
            naive_ppo(lp, o, a, clip[0], clip[1], dual) if m else (0.0, 0.0, False, False)
            for lp, o, a, m in zip(*row, strict=True)
        ]
        for row in zip(logprobs, old, advantages, mask, strict=True)
    ]
    assert_close(loss, [[e[0] for e in row] for row in expected])
    assert_close(current.grad, [[e[1] for e in row] for row in expected])
    assert_close(diagnostics["clipped"], [[float(e[2]) for e in row] for row in expected])
    assert_close(diagnostics["dual_clipped"], [[float(e[3]) for e in row] for row in expected])
    ratio = [
        [math.exp(lp - o) if m else 0.0 for lp, o, m in zip(*row, strict=True)]
        for row in zip(logprobs, old, mask, strict=True)
    ]
    assert_close(diagnostics["ratio"], ratio)
    assert torch.all(diagnostics["approx_kl"] >= 0)


@SETTINGS
@given(adv=st.floats(-3.0, 3.0).filter(lambda a: abs(a) > 1e-3), loss_cls=st.sampled_from(LOSSES))
def test_on_policy_gradient_follows_the_sign_of_the_advantage(adv: float, loss_cls: type[PolicyLoss]) -> None:
    """At ρ = 1 every loss is a policy gradient: a positive advantage pushes logπθ up."""
    inputs, current = to_input([[-1.0, -2.0]], [[-1.0, -2.0]], [[adv, adv]], [[True, True]])
    loss, _ = loss_cls().token_loss(inputs)
    loss.sum().backward()
    assert torch.all(torch.sign(-current.grad) == math.copysign(1.0, adv))
    torch.testing.assert_close(current.grad.abs(), torch.full_like(current.grad, abs(adv)))


def test_ppo_clip_examples() -> None:
    # ratio 2 with A > 0 is clipped at 1.2: no gradient; ratio 2 with A < 0 is not clipped.
    inputs, current = to_input([[math.log(2.0)] * 2], [[0.0] * 2], [[1.0, -1.0]], [[True, True]])
    loss, diagnostics = PPOClip({"dual_clip": None}).token_loss(inputs)
    loss.sum().backward()
    torch.testing.assert_close(loss, torch.tensor([[-1.2, 2.0]], dtype=F64))
    torch.testing.assert_close(current.grad, torch.tensor([[0.0, 2.0]], dtype=F64))
    assert diagnostics["clipped"].tolist() == [[1.0, 0.0]]
    # ratio 5 with A = -1: dual clip caps the loss at c·|A| = 3 and removes the gradient.
    inputs, current = to_input([[math.log(5.0)]], [[0.0]], [[-1.0]], [[True]])
    loss, diagnostics = PPOClip().token_loss(inputs)
    loss.sum().backward()
    assert loss.item() == pytest.approx(3.0)
    assert current.grad.item() == 0.0
    assert diagnostics["dual_clipped"].item() == 1.0


def test_ppo_dual_clip_must_exceed_one() -> None:
    with pytest.raises(ConfigError, match="dual_clip"):
        validate_component_config(PPOClip, {"dual_clip": 0.5}, where="policy loss 'ppo_clip'")


# --------------------------------------------------------------------------------------------
# GSPO
# --------------------------------------------------------------------------------------------


@SETTINGS
@given(data=loss_inputs(), clip=st.sampled_from([(3e-4, 4e-4), (0.2, 0.2), (0.05, 0.5)]))
def test_gspo_matches_naive_sequence_objective(data, clip) -> None:
    """With one advantage per sequence and seq-mean-token-mean aggregation, GSPO-token has the
    value and the gradient of sequence-level GSPO: max(−A·s, −A·clip(s)) with
    s = exp(mean_t(logπθ − logπold))."""
    logprobs, old, advantages, mask = data
    advantages = [[row[0]] * len(row) for row in advantages]  # one advantage per sequence
    inputs, current = to_input(logprobs, old, advantages, mask)
    loss_fn = GSPO({"clip_low": clip[0], "clip_high": clip[1]})
    token_loss, diagnostics = loss_fn.token_loss(inputs)
    normalizer = Normalizer.from_masks(inputs.loss_mask, "seq-mean-token-mean")
    aggregate(token_loss, inputs.loss_mask, "seq-mean-token-mean", normalizer=normalizer).backward()

    reference_lp = torch.tensor(logprobs, dtype=F64, requires_grad=True)
    total = torch.zeros((), dtype=F64)
    sequences = 0
    for i, row_mask in enumerate(mask):
        tokens = [t for t, m in enumerate(row_mask) if m]
        if not tokens:
            continue
        sequences += 1
        log_s = sum(reference_lp[i, t] - old[i][t] for t in tokens) / len(tokens)
        s = torch.exp(log_s)
        adv = advantages[i][0]
        sequence_loss = torch.maximum(-adv * s, -adv * s.clamp(1 - clip[0], 1 + clip[1]))
        total = total + sequence_loss
        for t in tokens:
            assert diagnostics["ratio"][i, t].item() == pytest.approx(s.item(), rel=1e-9)
            assert token_loss[i, t].item() == pytest.approx(sequence_loss.item(), rel=1e-9, abs=1e-12)
    if sequences:
        (total / sequences).backward()
        torch.testing.assert_close(current.grad, reference_lp.grad, rtol=1e-9, atol=1e-12)
    assert torch.all(token_loss[~inputs.loss_mask] == 0)


def test_gspo_clip_defaults_follow_the_paper() -> None:
    config = GSPO.Config()
    assert (config.clip_low, config.clip_high) == (3e-4, 4e-4)


def test_gspo_clips_the_whole_sequence() -> None:
    # Sequence ratio e^{0.01} ≈ 1.01 > 1 + 4e-4 with A > 0: every token of the row is clipped.
    inputs, current = to_input([[0.02, 0.0]], [[0.0, 0.0]], [[1.0, 1.0]], [[True, True]])
    loss, diagnostics = GSPO().token_loss(inputs)
    loss.sum().backward()
    assert diagnostics["clipped"].tolist() == [[1.0, 1.0]]
    torch.testing.assert_close(loss, torch.full((1, 2), -(1 + 4e-4), dtype=F64))
    assert torch.all(current.grad == 0)


# --------------------------------------------------------------------------------------------
# CISPO
# --------------------------------------------------------------------------------------------


@SETTINGS
@given(data=loss_inputs(), clip=st.sampled_from([(1.0, 0.28), (0.2, 0.2), (0.5, 2.0)]))
def test_cispo_matches_naive(data, clip) -> None:
    logprobs, old, advantages, mask = data
    inputs, current = to_input(*data)
    loss, diagnostics = CISPO({"clip_low": clip[0], "clip_high": clip[1]}).token_loss(inputs)
    loss.sum().backward()
    losses, grads, clipped = [], [], []
    for lp_row, old_row, adv_row, mask_row in zip(logprobs, old, advantages, mask, strict=True):
        losses.append([])
        grads.append([])
        clipped.append([])
        for lp, o, a, m in zip(lp_row, old_row, adv_row, mask_row, strict=True):
            ratio = math.exp(lp - o)
            weight = min(max(ratio, 1 - clip[0]), 1 + clip[1])
            losses[-1].append(-weight * a * lp if m else 0.0)
            grads[-1].append(-weight * a if m else 0.0)  # the weight carries no gradient
            clipped[-1].append(float(m and weight != ratio))
    assert_close(loss, losses)
    assert_close(current.grad, grads)
    assert_close(diagnostics["clipped"], clipped)


def test_cispo_keeps_the_gradient_where_ppo_drops_it() -> None:
    """The point of CISPO: a token whose ratio left the trust region still gets a (bounded) update."""
    inputs, current = to_input([[math.log(3.0)]], [[0.0]], [[1.0]], [[True]])
    CISPO().token_loss(inputs)[0].sum().backward()
    assert current.grad.item() == pytest.approx(-1.28)
    inputs, current = to_input([[math.log(3.0)]], [[0.0]], [[1.0]], [[True]])
    PPOClip().token_loss(inputs)[0].sum().backward()
    assert current.grad.item() == 0.0


# --------------------------------------------------------------------------------------------
# All losses
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("loss_cls", LOSSES, ids=lambda c: c.name)
def test_padding_with_infinite_logprobs_stays_finite(loss_cls: type[PolicyLoss]) -> None:
    logprobs = torch.tensor([[-1.0, -float("inf")], [-0.5, -2.0]], dtype=F64, requires_grad=True)
    inputs = LossInput(
        logprobs=logprobs,
        old_logprobs=torch.tensor([[-1.1, 0.0], [-0.4, -float("inf")]], dtype=F64),
        advantages=torch.tensor([[1.0, 1.0], [-1.0, 2.0]], dtype=F64),
        loss_mask=torch.tensor([[True, False], [True, False]]),
    )
    loss, diagnostics = loss_cls().token_loss(inputs)
    loss.sum().backward()
    assert torch.isfinite(loss).all() and torch.isfinite(logprobs.grad).all()
    assert loss[:, 1].tolist() == [0.0, 0.0] and logprobs.grad[:, 1].tolist() == [0.0, 0.0]
    for name, value in diagnostics.items():
        assert torch.isfinite(value).all(), name
        assert not value.requires_grad, name


@pytest.mark.parametrize("loss_cls", LOSSES, ids=lambda c: c.name)
def test_every_loss_config_field_is_documented(loss_cls: type[PolicyLoss]) -> None:
    for field_name, field in loss_cls.Config.model_fields.items():
        assert field.description, f"{loss_cls.name}.Config.{field_name} has no description"


def test_float_loss_mask_is_rejected() -> None:
    inputs = LossInput(torch.zeros(1, 2), torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2))
    with pytest.raises(TypeError, match="bool"):
        PPOClip().token_loss(inputs)


# --------------------------------------------------------------------------------------------
# KL estimators and controllers
# --------------------------------------------------------------------------------------------


@SETTINGS
@given(
    st.lists(st.floats(-30.0, 30.0), min_size=1, max_size=20), st.lists(st.floats(-30.0, 30.0), min_size=1)
)
def test_kl_estimators_pointwise(logprobs: list[float], ref: list[float]) -> None:
    n = min(len(logprobs), len(ref))
    lp, rf = torch.tensor(logprobs[:n], dtype=F64), torch.tensor(ref[:n], dtype=F64)
    k1, k2, k3 = (kl_penalty(lp, rf, kind) for kind in ("k1", "k2", "k3"))
    torch.testing.assert_close(k1, lp - rf)
    torch.testing.assert_close(k2, 0.5 * (lp - rf) ** 2)
    assert torch.all(k2 >= 0) and torch.all(k3 >= 0) and torch.all(k3 <= K3_MAX)
    for value, l_value in zip(k3.tolist(), (lp - rf).tolist(), strict=True):
        exact = math.expm1(-l_value) + l_value if abs(l_value) < 20 else math.inf
        assert value == pytest.approx(min(exact, K3_MAX), rel=1e-9, abs=1e-12)


def test_kl_estimators_are_unbiased_on_samples() -> None:
    """Sampling tokens from π: mean k1 and mean k3 estimate KL(π‖π_ref); k3 has lower variance."""
    generator = torch.Generator().manual_seed(0)
    policy = torch.log_softmax(torch.tensor([1.0, 0.5, 0.0, -0.5, -1.0], dtype=F64), dim=0)
    reference = torch.log_softmax(torch.tensor([0.8, 0.6, 0.1, -0.7, -0.9], dtype=F64), dim=0)
    true_kl = float((policy.exp() * (policy - reference)).sum())
    samples = torch.multinomial(policy.exp(), 200_000, replacement=True, generator=generator)
    k1 = kl_penalty(policy[samples], reference[samples], "k1")
    k3 = kl_penalty(policy[samples], reference[samples], "k3")
    assert float(k1.mean()) == pytest.approx(true_kl, rel=0.1)
    assert float(k3.mean()) == pytest.approx(true_kl, rel=0.1)
    assert float(k3.var()) < float(k1.var())


def test_unknown_kl_estimator_is_an_error() -> None:
    with pytest.raises(ValueError, match="k1, k2 or k3"):
        kl_penalty(torch.zeros(1), torch.zeros(1), "k4")


def test_adaptive_kl_controller_moves_towards_the_target() -> None:
    above = AdaptiveKLController(0.1, target=0.05, horizon=1000)
    above.update(current_kl=0.5, n_steps=100)
    assert above.value == pytest.approx(0.1 * (1 + 0.2 * 100 / 1000))  # error clipped at +0.2
    below = AdaptiveKLController(0.1, target=0.05, horizon=1000)
    below.update(current_kl=0.04, n_steps=100)
    assert below.value == pytest.approx(0.1 * (1 - 0.2 * 100 / 1000))
    on_target = AdaptiveKLController(0.1, target=0.05, horizon=1000)
    on_target.update(current_kl=0.05, n_steps=100)
    assert on_target.value == pytest.approx(0.1)
    fixed = FixedKLController(0.1)
    fixed.update(current_kl=10.0, n_steps=100)
    assert fixed.value == 0.1
    with pytest.raises(ValueError, match="target > 0"):
        AdaptiveKLController(0.1, target=0.0, horizon=10)


# --------------------------------------------------------------------------------------------
# Logits helpers
# --------------------------------------------------------------------------------------------


def test_entropy_matches_definition_and_is_stable() -> None:
    logits = torch.randn(3, 4, 7, dtype=F64, generator=torch.Generator().manual_seed(1))
    probs = torch.softmax(logits, dim=-1)
    torch.testing.assert_close(entropy_from_logits(logits), -(probs * probs.log()).sum(-1))
    uniform = torch.zeros(1, 1, 7, dtype=F64)
    assert entropy_from_logits(uniform).item() == pytest.approx(math.log(7))
    huge = logits * 1e4  # near one-hot: naive -Σp·log p would produce 0·(-inf) = nan
    entropy = entropy_from_logits(huge.float())
    assert torch.isfinite(entropy).all() and torch.all(entropy >= -1e-3)
    shifted = entropy_from_logits(logits + 1000.0)
    torch.testing.assert_close(shifted, entropy_from_logits(logits))


def test_token_logprobs() -> None:
    logits = torch.randn(2, 3, 5, dtype=F64, generator=torch.Generator().manual_seed(2))
    tokens = torch.tensor([[0, 4, 2], [1, 1, 3]])
    expected = [
        [math.log(torch.softmax(logits[b, t], -1)[tokens[b, t]].item()) for t in range(3)] for b in range(2)
    ]
    assert_close(token_logprobs(logits, tokens), expected)


# --------------------------------------------------------------------------------------------
# Rollout/trainer mismatch
# --------------------------------------------------------------------------------------------


@SETTINGS
@given(
    data=loss_inputs(),
    cap=st.sampled_from([1.5, 2.0, 5.0]),
    level=st.sampled_from(["token", "sequence"]),
    masked=st.booleans(),
)
def test_tis_weights_match_naive(data, cap: float, level: str, masked: bool) -> None:
    old, rollout, _, mask = data  # reuse: the "logprobs" play π_old and the shifted ones π_rollout
    weights = tis_weights(
        torch.tensor(old, dtype=F64),
        torch.tensor(rollout, dtype=F64),
        torch.tensor(mask),
        cap=cap,
        level=level,
        masked=masked,
    )
    expected_w, expected_keep = [], []
    for o_row, r_row, m_row in zip(old, rollout, mask, strict=True):
        sequence_log_ratio = sum(o - r for o, r, m in zip(o_row, r_row, m_row, strict=True) if m)
        expected_w.append([])
        expected_keep.append([])
        for o, r, m in zip(o_row, r_row, m_row, strict=True):
            log_ratio = (o - r) if level == "token" else sequence_log_ratio
            ratio = math.exp(max(min(log_ratio, 20.0), -20.0))
            if not m:
                kept, weight = False, 0.0
            elif masked:
                kept = 1 / cap <= ratio <= cap
                weight = ratio if kept else 0.0
            else:
                kept, weight = True, min(ratio, cap)
            expected_w[-1].append(weight)
            expected_keep[-1].append(kept)
    torch.testing.assert_close(weights, torch.tensor(expected_w, dtype=F64), rtol=1e-9, atol=1e-12)
    assert (weights > 0).tolist() == expected_keep


def test_tis_rejects_a_cap_below_one() -> None:
    with pytest.raises(ValueError, match="exceed 1"):
        tis_weights(torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1, dtype=torch.bool), cap=0.5)


def test_mismatch_kl_is_zero_when_engines_agree_and_positive_otherwise() -> None:
    logprobs = torch.tensor([[-1.0, -2.0, -0.5]], dtype=F64)
    mask = torch.tensor([[True, True, False]])
    metrics = mismatch_kl(logprobs, logprobs, mask)
    assert metrics == {"mismatch/kl_k1": 0.0, "mismatch/kl_k3": 0.0, "mismatch/max_abs_log_ratio": 0.0}
    rollout = logprobs + torch.tensor([[0.1, -0.2, 9.0]], dtype=F64)  # the 9.0 sits off the mask
    metrics = mismatch_kl(logprobs, rollout, mask)
    assert metrics["mismatch/kl_k3"] > 0
    assert metrics["mismatch/kl_k1"] == pytest.approx((0.1 - 0.2) / 2)
    assert metrics["mismatch/max_abs_log_ratio"] == pytest.approx(0.2)
