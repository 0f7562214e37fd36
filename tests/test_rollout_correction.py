"""Rollout/trainer mismatch correction (``algorithm.rollout_correction``): the config section and its
deprecated ``tis_cap`` alias, the ratio diagnostics on hand-computed numbers, and what the
correction does to a real update of the tiny model (``ALGORITHMS.md``, "Rollout/trainer mismatch")."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
from trainer_helpers import fixed_trajectories, toy_config

from agent_r1.config import AlgorithmConfig, RunConfig, load_config, validate_components
from agent_r1.engine.learner.rollout_correction import correction_weights, ratio_stats
from agent_r1.errors import ConfigError

# --------------------------------------------------------------------------------------------
# Config
# --------------------------------------------------------------------------------------------


def test_correction_is_off_by_default() -> None:
    correction = AlgorithmConfig().rollout_correction
    assert (correction.mode, correction.level, correction.cap) == ("off", "token", 2.0)


def test_tis_cap_is_a_deprecated_alias_for_token_truncation() -> None:
    with pytest.warns(FutureWarning, match="tis_cap is deprecated"):
        algo = AlgorithmConfig(tis_cap=3.0)
    correction = algo.rollout_correction
    assert (correction.mode, correction.level, correction.cap) == ("truncate", "token", 3.0)
    assert algo.tis_cap is None  # the effective form is what `config show` prints
    again = AlgorithmConfig.model_validate(algo.model_dump())  # a saved config reloads unchanged
    assert again.rollout_correction == correction


def test_tis_cap_conflicting_with_the_section_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"conflicts with algorithm\.rollout_correction"):
        load_config(None, ["algorithm.tis_cap=2.0", "algorithm.rollout_correction.mode=mask"])


def test_sequence_level_masking_from_overrides() -> None:
    config = load_config(
        None,
        [
            "algorithm.rollout_correction.mode=mask",
            "algorithm.rollout_correction.level=sequence",
            "algorithm.rollout_correction.cap=1.5",
        ],
    )
    correction = config.algorithm.rollout_correction
    assert (correction.mode, correction.level, correction.cap) == ("mask", "sequence", 1.5)


@pytest.mark.parametrize("override", ["algorithm.rollout_correction.cap=1.0", "algorithm.tis_cap=0.5"])
def test_a_cap_not_above_one_is_rejected(override: str) -> None:
    with pytest.raises(ConfigError):
        load_config(None, [override])


# --------------------------------------------------------------------------------------------
# Ratio diagnostics
# --------------------------------------------------------------------------------------------


def test_ratio_stats_on_hand_computed_numbers() -> None:
    # Token log-ratios (old - rollout) on the policy tokens: ln 3, 0, -ln 4 | ln 1.5 (padding ignored).
    old = torch.tensor([[math.log(3.0), 0.0, -math.log(4.0)], [math.log(1.5), 9.0, 9.0]])
    rollout = torch.zeros(2, 3)
    mask = torch.tensor([[True, True, True], [True, False, False]])

    token = ratio_stats(old, rollout, mask, level="token", cap=2.0)
    assert token["mismatch/ratio_mean"] == pytest.approx((3.0 + 1.0 + 0.25 + 1.5) / 4)
    assert token["mismatch/ratio_max"] == pytest.approx(3.0)
    assert token["mismatch/ratio_min"] == pytest.approx(0.25)
    assert token["mismatch/clipped_frac"] == pytest.approx(1 / 4)  # only 3 > 2
    assert token["mismatch/masked_frac"] == pytest.approx(2 / 4)  # 3 and 1/4 lie outside [1/2, 2]

    # Sequence level: row 0's ratio is 3 * 1 * 1/4 = 0.75 on its 3 tokens, row 1's 1.5 on its one.
    sequence = ratio_stats(old, rollout, mask, level="sequence", cap=2.0)
    assert sequence["mismatch/ratio_mean"] == pytest.approx((3 * 0.75 + 1.5) / 4)
    assert sequence["mismatch/ratio_max"] == pytest.approx(1.5)
    assert sequence["mismatch/clipped_frac"] == 0.0
    assert sequence["mismatch/masked_frac"] == 0.0


def test_ratio_stats_without_policy_tokens_are_neutral() -> None:
    stats = ratio_stats(torch.zeros(1, 2), torch.ones(1, 2), torch.zeros(1, 2, dtype=torch.bool))
    assert stats["mismatch/ratio_mean"] == 1.0 and stats["mismatch/masked_frac"] == 0.0


def test_correction_weights_follow_the_config() -> None:
    old = torch.tensor([[math.log(3.0), 0.0, -math.log(4.0)]])
    rollout = torch.zeros(1, 3)
    mask = torch.ones(1, 3, dtype=torch.bool)
    algo = AlgorithmConfig()
    assert correction_weights(algo.rollout_correction, old, rollout, mask) is None
    truncate = AlgorithmConfig(rollout_correction={"mode": "truncate", "cap": 2.0}).rollout_correction
    assert torch.allclose(correction_weights(truncate, old, rollout, mask), torch.tensor([[2.0, 1.0, 0.25]]))
    mask_mode = AlgorithmConfig(rollout_correction={"mode": "mask", "cap": 2.0}).rollout_correction
    assert torch.allclose(correction_weights(mask_mode, old, rollout, mask), torch.tensor([[0.0, 1.0, 0.0]]))


# --------------------------------------------------------------------------------------------
# A real update on the tiny model
# --------------------------------------------------------------------------------------------


def _update(
    registry: Any, model_dir: Path, run_dir: Path, correction: dict[str, Any], *, exact_logprobs: bool
) -> tuple[dict[str, float], dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """One update of the tiny model on the fixed trajectories; returns (metrics, initial, final).
    ``exact_logprobs`` replaces the trajectories' rollout log-probabilities (-1 everywhere, far from
    the tiny model's) by the trainer's own recomputation, i.e. a rollout engine that agrees."""
    from agent_r1.engine.learner.batch import collate
    from agent_r1.engine.learner.packing import no_grad_logprobs
    from agent_r1.engine.session import build_session
    from agent_r1.engine.update import update

    config = toy_config(
        model_dir,
        run_dir,
        algorithm={"name": "grpo", "rollout_correction": correction},
        trainer={"steps": 1, "tasks_per_step": 2, "micro_batch_size": 8, "lr": 1e-2, "grad_clip": None},
    )
    run = RunConfig.model_validate(config)
    session = build_session(run, validate_components(run, registry), Path(run.output_dir), registry=registry)
    trajectories = fixed_trajectories(session.tokenizer, count=8)
    if exact_logprobs:
        batch = collate(trajectories, session.pad_id)
        exact = no_grad_logprobs(session.model, batch, 1.0, 8)  # [B, T]
        for row, trajectory in enumerate(trajectories):
            position = 0
            for segment in trajectory.segments:
                if segment.logprobs is not None:
                    width = len(segment.token_ids)
                    segment.logprobs = exact[row, position : position + width].tolist()
                position += len(segment.token_ids)
    initial = {k: v.detach().clone() for k, v in session.unwrapped.state_dict().items()}
    metrics = update(session, trajectories)
    final = {k: v.detach().clone() for k, v in session.unwrapped.state_dict().items()}
    return metrics, initial, final


def _moved(initial: dict[str, torch.Tensor], final: dict[str, torch.Tensor]) -> float:
    return max((final[k] - initial[k]).abs().max().item() for k in initial)


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_masking_drops_every_token_of_a_disagreeing_rollout(
    level: str, registry: Any, model_dir: Path, tmp_path: Path
) -> None:
    metrics, initial, final = _update(
        registry, model_dir, tmp_path / "run", {"mode": "mask", "level": level}, exact_logprobs=False
    )
    assert metrics["rollout/mismatch/masked_frac"] == 1.0
    assert metrics["rollout/mismatch/ratio_max"] < 0.5  # the tiny model finds these tokens unlikely
    assert metrics["rollout/mismatch/kl_k3"] > 0.1
    assert _moved(initial, final) == 0.0, "a fully masked batch must not move the weights"

    _, initial, final = _update(registry, model_dir, tmp_path / "off", {"mode": "off"}, exact_logprobs=False)
    assert _moved(initial, final) > 1e-4, "without the correction the same batch moves the weights"


@pytest.mark.parametrize("mode", ["truncate", "mask"])
@pytest.mark.parametrize("level", ["token", "sequence"])
def test_an_agreeing_rollout_gets_the_uncorrected_update(
    mode: str, level: str, registry: Any, model_dir: Path, tmp_path: Path
) -> None:
    metrics, _, corrected = _update(
        registry, model_dir, tmp_path / "run", {"mode": mode, "level": level}, exact_logprobs=True
    )
    assert metrics["rollout/mismatch/kl_k3"] == pytest.approx(0.0, abs=1e-6)
    assert metrics["rollout/mismatch/ratio_mean"] == pytest.approx(1.0, abs=1e-4)
    assert metrics["rollout/mismatch/clipped_frac"] == 0.0 and metrics["rollout/mismatch/masked_frac"] == 0.0
    _, initial, plain = _update(registry, model_dir, tmp_path / "off", {"mode": "off"}, exact_logprobs=True)
    assert _moved(initial, plain) > 1e-4
    for name in plain:
        assert torch.allclose(corrected[name], plain[name], atol=1e-6), name


def test_truncation_scales_the_update_of_a_disagreeing_rollout(
    registry: Any, model_dir: Path, tmp_path: Path
) -> None:
    """The tiny model's π_old is far below the rollout's -1 log-probabilities, so every token's
    weight is a ratio well under 1: truncated IS keeps the update but shrinks the gradient."""
    metrics, initial, final = _update(
        registry, model_dir, tmp_path / "run", {"mode": "truncate", "level": "token"}, exact_logprobs=False
    )
    assert metrics["rollout/mismatch/clipped_frac"] == 0.0  # ratios below the cap are not clipped
    assert 0.0 < metrics["rollout/mismatch/ratio_mean"] < 0.5
    assert _moved(initial, final) > 0.0
