"""Importance weights against closed forms on hand-made ratios: each IS level, both threshold forms (a number
truncates, ``lower_upper`` masks), batch normalization, and the ``rollout_is_*`` metrics."""

from __future__ import annotations

import math

import pytest
import torch
from rollout_correction_cases import RATIOS, mean, padded, tensors, tokens

from rlflow.algos import compute_rollout_correction_weights
from rlflow.config import ConfigError

TOL = dict(rtol=1e-9, atol=1e-12)


def weights(level, threshold, normalize=False):
    old, rollout, mask = tensors()
    return compute_rollout_correction_weights(old - rollout, mask, level, threshold, normalize)


def sequence_ratios() -> list[float]:
    return [math.prod(row) for row in RATIOS]  # 2.7, 0.3


@pytest.mark.parametrize("level, threshold, expected", [
    ("token", 2.0, [[min(r, 2.0) for r in row] for row in RATIOS]),
    ("sequence", 2.0, [[min(s, 2.0)] * len(row) for s, row in zip(sequence_ratios(), RATIOS)]),
    ("token", "0.5_2.5", [[r if 0.5 <= r <= 2.5 else 0.0 for r in row] for row in RATIOS]),
    ("sequence", "0.5_2.5", [[s if 0.5 <= s <= 2.5 else 0.0] * len(row) for s, row in zip(sequence_ratios(), RATIOS)]),
], ids=["token_tis", "sequence_tis", "token_icepop", "sequence_mask"])
def test_weights_per_level_and_threshold_form(level, threshold, expected):
    got, _ = weights(level, threshold)
    torch.testing.assert_close(got, padded(expected), **TOL)
    assert not got.requires_grad


@pytest.mark.parametrize("level, unit_weights", [
    ("token", [min(r, 2.0) for r in tokens()]),
    ("sequence", [min(s, 2.0) for s in sequence_ratios()]),
])
def test_batch_normalization_divides_by_the_mean_over_the_levels_units(level, unit_weights):
    plain, _ = weights(level, 2.0)
    normalized, metrics = weights(level, 2.0, normalize=True)
    factor = mean(unit_weights)
    assert metrics["rollout_is_batch_norm_factor"] == pytest.approx(factor, rel=1e-12)
    torch.testing.assert_close(normalized, plain / factor, **TOL)


def test_token_metrics_are_of_the_weights_before_truncation():
    _, metrics = weights("token", 2.0)
    ratios = tokens()
    bounded = [min(max(r, 0.5), 2.0) for r in ratios]
    normalized = [b / (mean(bounded) + 1e-8) for b in bounded]
    per_sequence = [mean(row) for row in RATIOS]
    expected = {
        "rollout_is_mean": mean(ratios),
        "rollout_is_max": 3.0,
        "rollout_is_min": 0.25,
        "rollout_is_ratio_fraction_high": 1 / 5,  # 3 > 2
        "rollout_is_ratio_fraction_low": 1 / 5,  # 0.25 < 1/2
        "rollout_is_std": math.sqrt(mean([b * b for b in bounded]) - mean(bounded) ** 2),
        "rollout_is_eff_sample_size": 1 / mean([n * n for n in normalized]),
        "rollout_is_seq_mean": mean(per_sequence),
        "rollout_is_seq_std": math.sqrt(sum((s - mean(per_sequence)) ** 2 for s in per_sequence) / (len(per_sequence) - 1)),
        "rollout_is_seq_max": max(per_sequence),
        "rollout_is_seq_min": min(per_sequence),
        "rollout_is_seq_max_deviation": max(abs(s - 1) for s in per_sequence),
        "rollout_is_seq_fraction_high": 0.0,
        "rollout_is_seq_fraction_low": 0.0,
    }
    assert metrics == pytest.approx(expected, rel=1e-9)


def test_sequence_metrics_count_sequences_and_icepop_bounds_set_the_fractions():
    _, metrics = weights("sequence", "2.0_3.0")
    # sequence ratios 2.7 (inside) and 0.3 (below 2.0): max/min and fractions over the two sequences
    assert metrics["rollout_is_max"] == pytest.approx(2.7, rel=1e-12)
    assert metrics["rollout_is_min"] == pytest.approx(0.3, rel=1e-12)
    assert metrics["rollout_is_ratio_fraction_high"] == 0.0 and metrics["rollout_is_ratio_fraction_low"] == 0.5
    assert metrics["rollout_is_mean"] == pytest.approx((3 * 2.7 + 2 * 0.3) / 5, rel=1e-12)  # token-weighted


def test_equal_log_probs_give_weights_of_one():
    old, _, mask = tensors()
    for level in ("token", "sequence"):
        got, metrics = compute_rollout_correction_weights(old - old, mask, level, 2.0, True)
        assert torch.equal(got, mask.to(got.dtype))
        assert metrics["rollout_is_eff_sample_size"] == pytest.approx(1.0) and metrics["rollout_is_std"] == 0.0


def test_extreme_log_ratios_are_bounded():
    mask = torch.ones(1, 2)
    got, metrics = compute_rollout_correction_weights(torch.tensor([[80.0, -80.0]]), mask, "token", "1e-30_1e30")
    assert torch.isfinite(got).all() and got[0, 0] == pytest.approx(math.exp(20.0), rel=1e-6)
    assert metrics["rollout_is_max"] == pytest.approx(math.exp(20.0), rel=1e-6)


@pytest.mark.parametrize("level, threshold, match", [
    ("tokens", 2.0, "unknown rollout IS level 'tokens'"),
    ("token", 0.0, "positive"),
    ("token", "2.0_0.5", "lower bound must be below"),
    ("token", "a_b", "positive number"),
])
def test_bad_level_or_threshold_is_refused(level, threshold, match):
    with pytest.raises((ValueError, ConfigError), match=match):
        weights(level, threshold)
