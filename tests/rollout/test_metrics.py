"""Train/inference mismatch metrics against a numpy reference."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rlflow.rollout import rollout_mismatch_metrics


def test_mismatch_metrics_match_numpy_over_masked_tokens():
    generator = torch.Generator().manual_seed(0)
    rollout = torch.randn(6, 9, generator=generator)
    actor = rollout + 0.01 * torch.randn(6, 9, generator=generator)
    mask = (torch.rand(6, 9, generator=generator) > 0.3).long()
    actor[mask == 0] += 100.0  # padding must not count
    metrics = rollout_mismatch_metrics(rollout, actor, mask)
    diffs = [abs(r - a) for r, a, m in zip(rollout.flatten().tolist(), actor.flatten().tolist(), mask.flatten().tolist()) if m]
    assert metrics["rollout/logprob_diff_mean"] == pytest.approx(np.mean(diffs), rel=1e-6)
    assert metrics["rollout/logprob_diff_max"] == pytest.approx(np.max(diffs), rel=1e-6)
    assert metrics["rollout/logprob_diff_p99"] == pytest.approx(np.percentile(diffs, 99), rel=1e-6)


def test_mismatch_metrics_empty_mask_and_shape_check():
    zeros = torch.zeros(2, 3)
    assert rollout_mismatch_metrics(zeros, zeros + 1, torch.zeros(2, 3)) == {
        "rollout/logprob_diff_mean": 0.0, "rollout/logprob_diff_max": 0.0, "rollout/logprob_diff_p99": 0.0
    }
    with pytest.raises(ValueError, match="share a shape"):
        rollout_mismatch_metrics(zeros, torch.zeros(2, 4), torch.ones(2, 3))
