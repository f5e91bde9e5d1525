"""agg_loss: hand-computed cases, a plain-loop reference, split invariance and bad input."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlflow.algos import agg_loss, loss_agg_modes

MODES = ["token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-sum-norm", "seq-mean-token-mean"]
FAST = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def reference_agg(rows: list[list[float]], masks: list[list[int]], mode: str, scale: float | None = None) -> float:
    """Plain Python loops over rows and tokens; whole-batch semantics, no global counts.
    Sequence means run over the rows that keep at least one token (verl 0.9.1)."""
    width = len(rows[0]) if rows else 0
    token_total, token_count, per_seq_sum, per_seq_mean = 0.0, 0, [], []
    for row, mask in zip(rows, masks):
        kept = [value for value, m in zip(row, mask) if m]
        token_total += sum(kept)
        token_count += len(kept)
        per_seq_sum.append(sum(kept))
        per_seq_mean.append(sum(kept) / len(kept) if kept else 0.0)
    n_seq = sum(1 for mask in masks if any(mask))
    if mode == "token-mean":
        return token_total / token_count if token_count else 0.0
    if mode == "token-sum":
        return token_total
    if mode == "seq-mean-token-sum":
        return sum(per_seq_sum) / n_seq if n_seq else 0.0
    if mode == "seq-mean-token-sum-norm":
        return (sum(per_seq_sum) / (scale or width)) / n_seq if n_seq else 0.0
    return sum(per_seq_mean) / n_seq if n_seq else 0.0


@st.composite
def loss_batches(draw, min_rows: int = 1):
    rows = draw(st.integers(min_rows, 7))
    width = draw(st.integers(1, 6))
    values = [[draw(st.floats(-5, 5, allow_nan=False, width=32)) for _ in range(width)] for _ in range(rows)]
    masks = [[draw(st.integers(0, 1)) for _ in range(width)] for _ in range(rows)]
    return values, masks


def _tensors(values, masks):
    return torch.tensor(values, dtype=torch.float64), torch.tensor(masks, dtype=torch.float64)


def test_registered_modes_are_the_five_verl_modes():
    assert sorted(loss_agg_modes()) == sorted(MODES)


def test_hand_computed_every_mode():
    loss = torch.tensor([[1.0, 2.0, 3.0, 4.0], [10.0, 20.0, 30.0, 40.0]])
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]])
    # kept tokens: row0 -> 1, 2 (sum 3, mean 1.5); row1 -> 10..40 (sum 100, mean 25)
    assert agg_loss(loss, mask, "token-mean").item() == pytest.approx(103 / 6)
    assert agg_loss(loss, mask, "token-sum").item() == pytest.approx(103)
    assert agg_loss(loss, mask, "seq-mean-token-sum").item() == pytest.approx(103 / 2)
    assert agg_loss(loss, mask, "seq-mean-token-sum-norm").item() == pytest.approx(103 / 2 / 4)
    assert agg_loss(loss, mask, "seq-mean-token-sum-norm", loss_scale_factor=8).item() == pytest.approx(103 / 2 / 8)
    assert agg_loss(loss, mask, "seq-mean-token-mean").item() == pytest.approx((1.5 + 25) / 2)


def test_masked_entries_never_leak_even_when_not_finite():
    loss = torch.tensor([[1.0, float("nan")], [float("inf"), 3.0]])
    mask = torch.tensor([[1, 0], [0, 1]])
    for mode in MODES:
        assert math.isfinite(agg_loss(loss, mask, mode).item()), mode
    assert agg_loss(loss, mask, "token-mean").item() == pytest.approx(2.0)


@FAST
@given(loss_batches())
def test_matches_loop_reference(batch):
    values, masks = batch
    loss, mask = _tensors(values, masks)
    for mode in MODES:
        expected = reference_agg(values, masks, mode)
        assert agg_loss(loss, mask, mode).item() == pytest.approx(expected, rel=1e-9, abs=1e-9), mode


@FAST
@given(loss_batches(min_rows=2), st.data())
def test_split_invariance_with_global_counts(batch, data):
    """Per-split results with the global counts add up (dp_size=1: micro-batches) or
    average (dp_size=k: DP ranks whose gradients are averaged) to the whole-batch value."""
    values, masks = batch
    loss, mask = _tensors(values, masks)
    rows = loss.shape[0]
    cuts = sorted(data.draw(st.lists(st.integers(0, rows), min_size=1, max_size=3)))
    bounds = [0, *cuts, rows]
    pieces = [(loss[a:b], mask[a:b]) for a, b in zip(bounds, bounds[1:])]
    global_counts = {"batch_num_tokens": mask.sum().item(), "global_batch_size": int((mask.sum(-1) > 0).sum())}
    for mode in MODES:
        whole = agg_loss(loss, mask, mode).item()
        accumulated = sum(agg_loss(piece, piece_mask, mode, **global_counts).item() for piece, piece_mask in pieces)
        assert accumulated == pytest.approx(whole, rel=1e-9, abs=1e-9), mode
        dp_size = len(pieces)
        per_rank = [agg_loss(p, m, mode, dp_size=dp_size, **global_counts).item() for p, m in pieces]
        assert sum(per_rank) / dp_size == pytest.approx(whole, rel=1e-9, abs=1e-9), mode


def test_split_invariance_needs_global_counts():
    """Without global counts, token-mean of unequal splits is not the whole-batch mean: the
    counts are what make the invariance hold (guards against a vacuous invariance test)."""
    loss = torch.tensor([[1.0, 1.0, 1.0], [4.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    whole = agg_loss(loss, mask, "token-mean").item()
    local_average = (agg_loss(loss[:1], mask[:1], "token-mean") + agg_loss(loss[1:], mask[1:], "token-mean")) / 2
    assert whole == pytest.approx(7 / 4)
    assert local_average.item() == pytest.approx(2.5)


def test_fully_masked_rows_and_empty_batches_give_zero_not_nan():
    loss = torch.randn(3, 4)
    mask = torch.zeros(3, 4)
    for mode in MODES:
        assert agg_loss(loss, mask, mode).item() == 0.0, mode
        assert agg_loss(loss[:0], mask[:0], mode).item() == 0.0, mode
    # fully masked rows are left out of the sequence count (verl 0.9.1)
    mask[0] = 1
    mask[1, 0] = 1
    assert agg_loss(2 * torch.ones(3, 4), mask, "seq-mean-token-mean").item() == pytest.approx(2.0)
    assert agg_loss(2 * torch.ones(3, 4), mask, "seq-mean-token-sum").item() == pytest.approx((8 + 2) / 2)  # 2 rows


def test_gradient_flows_only_through_masked_tokens():
    loss = torch.randn(2, 3, dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([[1, 0, 1], [0, 0, 1]])
    agg_loss(loss, mask, "token-mean").backward()
    assert torch.equal(loss.grad, mask.double() / 3)


def test_unknown_mode_lists_valid_modes():
    with pytest.raises(ValueError) as error:
        agg_loss(torch.zeros(1, 1), torch.ones(1, 1), "token-average")
    for mode in MODES:
        assert mode in str(error.value)


def test_bad_shapes_and_sizes_are_rejected():
    with pytest.raises(ValueError, match="mask shape"):
        agg_loss(torch.zeros(2, 3), torch.ones(2, 2), "token-mean")
    with pytest.raises(ValueError, match="dp_size"):
        agg_loss(torch.zeros(2, 3), torch.ones(2, 3), "token-mean", dp_size=0)
    with pytest.raises(ValueError, match="global batch_num_tokens and global_batch_size"):
        agg_loss(torch.zeros(2, 3), torch.ones(2, 3), "seq-mean-token-mean", dp_size=2, batch_num_tokens=6)
    with pytest.raises(ValueError, match=r"\(batch, response_len\)"):
        agg_loss(torch.zeros(3), torch.ones(3), "token-mean")
