"""Rejection against closed forms on hand-made ratios: every option (token, sequence sum/mean/max of k1/k2/k3),
two-sided k1 bounds on ``pi_rollout / pi_old``, comma-joined options with per-option thresholds, and metrics."""

from __future__ import annotations

import math

import pytest
import torch
from rollout_correction_cases import RATIOS, mean, tensors

from rlflow.algos import compute_rollout_rejection_mask, rollout_rs_options
from rlflow.config import ConfigError

DIVERGENCES = {
    "k1": lambda r: -math.log(r),
    "k2": lambda r: 0.5 * math.log(r) ** 2,
    "k3": lambda r: r - 1 - math.log(r),
}
REDUCTIONS = {"seq_sum": sum, "seq_mean": mean, "seq_max": max}
SEQUENCE_OPTIONS = [f"{reduction}_{k}" for reduction in REDUCTIONS for k in DIVERGENCES if (reduction, k) != ("seq_max", "k1")]


def reject(option, threshold):
    old, rollout, mask = tensors()
    return compute_rollout_rejection_mask(old - rollout, mask, option, threshold)


def row_statistics(option: str) -> list[float]:
    reduction, k = option.rsplit("_", 1)
    return [REDUCTIONS[reduction]([DIVERGENCES[k](r) for r in row]) for row in RATIOS]


def expected_mask(keep_rows: list[list[bool]]):
    _, _, mask = tensors()
    expected = torch.zeros_like(mask)
    for row, keeps in enumerate(keep_rows):
        expected[row, : len(keeps)] = torch.tensor([int(k) for k in keeps])
    return expected


def test_the_registries_make_verls_eleven_options():
    assert rollout_rs_options() == sorted(["token_k1", "token_k2", "token_k3"] + SEQUENCE_OPTIONS)


@pytest.mark.parametrize("k, threshold, keeps", [
    ("k1", "0.5_2.0", lambda r: 0.5 <= 1 / r <= 2.0),  # bounds on exp(k1) = pi_rollout / pi_old
    ("k2", 0.3, lambda r: 0.5 * math.log(r) ** 2 <= 0.3),
    ("k3", 0.3, lambda r: r - 1 - math.log(r) <= 0.3),
])
def test_token_options_judge_each_token(k, threshold, keeps):
    masked, metrics = reject(f"token_{k}", threshold)
    keep_rows = [[keeps(r) for r in row] for row in RATIOS]
    assert torch.equal(masked, expected_mask(keep_rows))
    values = [DIVERGENCES[k](r) for row in RATIOS for r in row]
    rejected = [not keep for row in keep_rows for keep in row]
    assert metrics[f"rollout_rs_token_{k}_mean"] == pytest.approx(mean(values), rel=1e-9)
    assert metrics[f"rollout_rs_token_{k}_max"] == pytest.approx(max(values), rel=1e-9)
    assert metrics[f"rollout_rs_token_{k}_min"] == pytest.approx(min(values), rel=1e-9)
    assert metrics["rollout_rs_masked_fraction"] == pytest.approx(mean(rejected), rel=1e-12)
    assert metrics["rollout_rs_seq_masked_fraction"] == mean([not all(row) for row in keep_rows])


@pytest.mark.parametrize("option", SEQUENCE_OPTIONS)
def test_sequence_options_keep_or_reject_whole_rows(option):
    """A threshold between the two rows' statistics keeps the row with the smaller one, whole."""
    statistics = row_statistics(option)
    low, high = sorted(statistics)
    middle = (low + high) / 2
    two_sided = option.endswith("k1")
    threshold = f"{math.exp(low - 0.01)}_{math.exp(middle)}" if two_sided else middle
    masked, metrics = reject(option, threshold)
    keep_rows = [[statistic == low] * len(row) for statistic, row in zip(statistics, RATIOS)]
    assert torch.equal(masked, expected_mask(keep_rows))
    assert metrics[f"rollout_rs_{option}_seq_mean"] == pytest.approx(mean(statistics), rel=1e-9)
    assert metrics[f"rollout_rs_{option}_max"] == pytest.approx(high, rel=1e-9)
    assert metrics[f"rollout_rs_{option}_min"] == pytest.approx(low, rel=1e-9)
    assert metrics[f"rollout_rs_{option}_seq_masked_fraction"] == 0.5
    token_weighted = sum(s * len(row) for s, row in zip(statistics, RATIOS)) / sum(map(len, RATIOS))
    assert metrics[f"rollout_rs_{option}_mean"] == pytest.approx(token_weighted, rel=1e-9)
    assert (f"rollout_rs_{option}_seq_fraction_low" in metrics) is two_sided


def test_one_number_for_a_k1_option_means_its_reciprocal_to_it():
    assert torch.equal(reject("token_k1", 2.0)[0], reject("token_k1", "0.5_2.0")[0])


def test_comma_joined_options_must_all_pass_each_with_its_threshold():
    # token_k1 rejects the ratios 3 and 0.25; seq_max_k3 (max of r - 1 - log r) with 0.5 rejects row 0 (3 -> 0.90)
    # and row 1 (0.25 -> 0.64): with 0.7 only row 0
    masked, metrics = reject("token_k1, seq_max_k3", "0.5_2.0,0.7")
    assert torch.equal(masked, expected_mask([[False, False, False], [False, True]]))
    assert metrics["rollout_rs_token_k1_masked_fraction"] == pytest.approx(2 / 5)
    assert metrics["rollout_rs_seq_max_k3_masked_fraction"] == pytest.approx(3 / 5)
    assert metrics["rollout_rs_masked_fraction"] == pytest.approx(4 / 5)
    assert metrics["rollout_rs_seq_masked_fraction"] == 1.0


def test_one_shared_threshold_serves_every_option_and_duplicates_count_once():
    masked, metrics = reject("token_k2,seq_max_k2,token_k2", 0.3)
    assert torch.equal(masked, reject("token_k2", 0.3)[0] * reject("seq_max_k2", 0.3)[0])
    assert sum(key.endswith("_masked_fraction") and "token_k2" in key for key in metrics) == 2


def test_equal_log_probs_reject_nothing():
    old, _, mask = tensors()
    for option in rollout_rs_options():
        masked, metrics = compute_rollout_rejection_mask(old - old, mask, option, "0.999_1.001" if option.endswith("k1") else 1e-6)
        assert torch.equal(masked, mask) and metrics["rollout_rs_masked_fraction"] == 0.0


def test_the_mask_keeps_its_dtype():
    old, rollout, mask = tensors()
    for dtype in (torch.bool, torch.float32, torch.long):
        masked, _ = compute_rollout_rejection_mask(old - rollout, mask.to(dtype), "token_k2", 0.3)
        assert masked.dtype == dtype


@pytest.mark.parametrize("option, threshold, match", [
    ("token_k4", 1.0, "unknown rollout rejection option 'token_k4'"),
    ("seq_max_k1", "0.5_2.0", "unknown rollout rejection option"),
    ("token_k2", None, "needs rollout_rs_threshold"),
    ("token_k2", "0.1_0.5", "one upper bound"),
    ("token_k1,token_k2", "0.5_2.0,0.1,0.2", "has 3 entries"),
    ("token_k1", 0.5, "must exceed 1"),
    ("token_k3", -0.1, "positive"),
])
def test_bad_options_and_thresholds_are_refused(option, threshold, match):
    with pytest.raises((ValueError, ConfigError), match=match):
        reject(option, threshold)
