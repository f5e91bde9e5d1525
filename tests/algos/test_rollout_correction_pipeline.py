"""The one-call correction (verl's ``compute_rollout_correction_and_rejection_mask``), its off-policy metrics
against closed forms, and verl's batch-level entry point (the PPO step's phase is tested in tests/trainer)."""

from __future__ import annotations

import math

import pytest
import torch
from rollout_correction_cases import RATIOS, mean, tensors, tokens

from rlflow.algos import (
    compute_offpolicy_metrics,
    compute_rollout_correction_and_add_to_batch,
    compute_rollout_correction_and_rejection_mask,
)
from rlflow.config.schema import RolloutCorrectionConfig
from rlflow.protocol import DataProto


def test_offpolicy_metrics_closed_form():
    old, rollout, mask = tensors()
    metrics = compute_offpolicy_metrics(old, rollout, mask)
    ratios = tokens()
    old_rows = [[-1.0, -2.0, -0.5], [-0.3, -0.2]]
    training = [mean(row) for row in old_rows]
    rollout_rows = [[v - math.log(r) for v, r in zip(values, ratios_row)] for values, ratios_row in zip(old_rows, RATIOS)]
    rolled = [mean(row) for row in rollout_rows]
    diffs = [m_r - m_t for m_r, m_t in zip(rolled, training)]
    expected = {
        "training_ppl": mean([math.exp(-m) for m in training]),
        "training_log_ppl": mean([-m for m in training]),
        "kl": mean([-math.log(r) for r in ratios]),
        "k3_kl": mean([r - math.log(r) - 1 for r in ratios]),
        "rollout_ppl": mean([math.exp(-m) for m in rolled]),
        "rollout_log_ppl": mean([-m for m in rolled]),
        "log_ppl_diff": mean(diffs),
        "log_ppl_abs_diff": mean([abs(d) for d in diffs]),
        "log_ppl_diff_max": max(diffs),
        "log_ppl_diff_min": min(diffs),
        "ppl_ratio": mean([math.exp(d) for d in diffs]),
        "chi2_token": mean([r * r for r in ratios]) - 1,
        "chi2_seq": mean([math.prod(row) ** 2 for row in RATIOS]) - 1,
    }
    assert metrics == pytest.approx(expected, rel=1e-9)
    assert compute_offpolicy_metrics(old, None, mask).keys() == {"training_ppl", "training_log_ppl"}


def test_the_one_call_returns_weights_a_masked_copy_and_prefixed_metrics():
    old, rollout, mask = tensors()
    weights, masked, metrics = compute_rollout_correction_and_rejection_mask(
        old, rollout, mask, rollout_is="token", rollout_is_threshold=2.0, rollout_rs="seq_max_k3", rollout_rs_threshold=0.7)
    assert isinstance(weights, DataProto) and set(weights.batch) == {"rollout_is_weights"}
    assert masked[0].sum() == 0 and torch.equal(masked[1], mask[1])
    assert all(key.startswith("rollout_corr/") for key in metrics)
    assert {"rollout_corr/kl", "rollout_corr/rollout_is_mean", "rollout_corr/rollout_rs_masked_fraction"} <= set(metrics)
    none, copy, only_diagnostics = compute_rollout_correction_and_rejection_mask(old, rollout, mask)
    assert none is None and torch.equal(copy, mask) and copy is not mask
    assert not any("rollout_is" in key or "rollout_rs" in key for key in only_diagnostics)


def test_the_one_call_refuses_mismatched_shapes_and_an_empty_mask():
    zeros = torch.zeros(2, 4)
    with pytest.raises(ValueError, match="share a shape"):
        compute_rollout_correction_and_rejection_mask(zeros, zeros, torch.ones(2, 3))
    with pytest.raises(ValueError, match="at least one response token"):
        compute_rollout_correction_and_rejection_mask(zeros, zeros, torch.zeros(2, 4))


def _batch(rows: int = 8, width: int = 6, perturbed: tuple[int, ...] = (2, 5)) -> DataProto:
    generator = torch.Generator().manual_seed(0)
    old = -torch.rand(rows, width, generator=generator) * 3
    rollout = old.clone()
    for row in perturbed:  # a stale rollout for these rows: its log-probs differ by up to +-1
        rollout[row] += torch.rand(width, generator=generator) * 2 - 1
    mask = torch.ones(rows, width, dtype=torch.long)
    mask[:, -2:] = 0
    return DataProto.from_dict({"old_log_probs": old, "rollout_log_probs": rollout, "response_mask": mask})


def test_add_to_batch_rejects_exactly_the_perturbed_rows_and_adds_weights():
    batch = _batch()
    _, clean = compute_rollout_correction_and_add_to_batch(_batch(perturbed=()), RolloutCorrectionConfig())
    same, metrics = compute_rollout_correction_and_add_to_batch(batch, RolloutCorrectionConfig(
        rollout_is="token", rollout_rs="seq_mean_k3", rollout_rs_threshold=0.01))
    kept = batch.batch["response_mask"].sum(-1)
    assert same is batch and [row for row in range(len(batch)) if kept[row] == 0] == [2, 5]
    assert (kept[[0, 1, 3, 4, 6, 7]] == 4).all()
    assert batch.batch["rollout_is_weights"].shape == (8, 6)
    assert clean["rollout_corr/kl"] == 0.0 and abs(metrics["rollout_corr/kl"]) > 0.01
    assert metrics["rollout_corr/rollout_rs_seq_masked_fraction"] == pytest.approx(2 / 8)


def test_add_to_batch_names_the_tensors_it_lacks():
    batch = _batch()
    batch.batch.pop("rollout_log_probs")
    with pytest.raises(ValueError, match="missing \\['rollout_log_probs'\\]"):
        compute_rollout_correction_and_add_to_batch(batch, RolloutCorrectionConfig(rollout_is="token"))
