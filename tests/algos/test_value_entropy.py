"""Clipped value loss and entropy loss against hand values and independent references."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlflow.algos import agg_loss, compute_entropy_loss, compute_value_loss

FAST = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def ref_value_tokens(vpreds, returns, values, clip):
    losses, clipped_flags = [], []
    for vp_row, ret_row, v_row in zip(vpreds, returns, values):
        row, flags = [], []
        for vp, ret, v in zip(vp_row, ret_row, v_row):
            vp_clipped = min(max(vp, v - clip), v + clip)
            plain, bounded = (vp - ret) ** 2, (vp_clipped - ret) ** 2
            row.append(max(plain, bounded))
            flags.append(1.0 if bounded > plain else 0.0)
        losses.append(row)
        clipped_flags.append(flags)
    return losses, clipped_flags


def test_value_loss_hand_computed():
    vpreds, returns, values = torch.tensor([[1.0, 0.0]]), torch.tensor([[0.0, 0.0]]), torch.tensor([[0.0, 0.5]])
    vf_loss, vf_clipfrac = compute_value_loss(vpreds, returns, values, torch.ones(1, 2), cliprange_value=0.2)
    # token 0: clipped pred 0.2 -> max(1, 0.04) = 1; token 1: clipped pred 0.3 -> max(0, 0.09) = 0.09 (clip active)
    assert vf_loss.item() == pytest.approx(0.5 * (1.0 + 0.09) / 2)
    assert vf_clipfrac.item() == pytest.approx(0.5)


@FAST
@given(st.data(), st.floats(0.0, 1.0), st.sampled_from(["token-mean", "seq-mean-token-mean", "token-sum"]))
def test_value_loss_matches_reference(data, clip, mode):
    rows, cols = data.draw(st.integers(1, 4)), data.draw(st.integers(1, 5))
    cell = st.floats(-3, 3, allow_nan=False)
    grid = lambda: [[data.draw(cell) for _ in range(cols)] for _ in range(rows)]  # noqa: E731
    vpreds, returns, values = grid(), grid(), grid()
    mask = [[data.draw(st.integers(0, 1)) for _ in range(cols)] for _ in range(rows)]
    losses, flags = ref_value_tokens(vpreds, returns, values, clip)
    t = lambda x: torch.tensor(x, dtype=torch.float64)  # noqa: E731
    vf_loss, vf_clipfrac = compute_value_loss(t(vpreds), t(returns), t(values), t(mask), clip, mode)
    torch.testing.assert_close(vf_loss, 0.5 * agg_loss(t(losses), t(mask), mode))
    kept = sum(map(sum, mask))
    expected_frac = sum(f * m for fr, mr in zip(flags, mask) for f, m in zip(fr, mr)) / max(kept, 1)
    assert vf_clipfrac.item() == pytest.approx(expected_frac)


def test_value_loss_gradcheck_and_global_counts():
    vpreds = torch.tensor([[0.3, -1.2, 2.0], [0.9, 0.1, -0.4]], dtype=torch.float64, requires_grad=True)
    returns = torch.tensor([[0.0, -0.5, 1.0], [1.0, 0.7, 0.4]], dtype=torch.float64)
    values = torch.tensor([[0.1, -0.6, 1.5], [0.2, 0.4, -0.1]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.float64)
    assert torch.autograd.gradcheck(lambda v: compute_value_loss(v, returns, values, mask, 0.2)[0], (vpreds,))
    whole, _ = compute_value_loss(vpreds, returns, values, mask, 0.2)
    info = {"batch_num_tokens": mask.sum().item()}
    halves = [
        compute_value_loss(vpreds[s], returns[s], values[s], mask[s], 0.2, global_batch_info=info)[0]
        for s in (slice(0, 1), slice(1, 2))
    ]
    assert (halves[0] + halves[1]).item() == pytest.approx(whole.item())
    with pytest.raises(ValueError, match="cliprange_value"):
        compute_value_loss(vpreds, returns, values, mask, -0.1)


def test_entropy_matches_torch_distributions():
    torch.manual_seed(0)
    logits = torch.randn(3, 4, 7, dtype=torch.float64) * 3
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]], dtype=torch.float64)
    token_entropy = torch.distributions.Categorical(logits=logits).entropy()
    for mode in ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"]:
        torch.testing.assert_close(compute_entropy_loss(logits, mask, mode), agg_loss(token_entropy, mask, mode))


def test_entropy_hand_computed_and_extreme_logits():
    uniform = torch.zeros(1, 1, 4)
    assert compute_entropy_loss(uniform, torch.ones(1, 1)).item() == pytest.approx(torch.log(torch.tensor(4.0)).item())
    peaked = torch.tensor([[[1e4, 0.0, -1e4]]])
    assert compute_entropy_loss(peaked, torch.ones(1, 1)).item() == pytest.approx(0.0, abs=1e-6)
    with pytest.raises(ValueError, match="vocab"):
        compute_entropy_loss(torch.zeros(2, 3), torch.ones(2, 3))
