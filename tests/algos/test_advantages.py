"""Advantage estimators against hand-computed cases and plain-loop references."""

from __future__ import annotations

import math
import statistics
from collections import defaultdict

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlflow.algos import (
    ADV_ESTIMATOR_REGISTRY,
    compute_advantage,
    compute_gae_advantage_return,
    compute_gpg_outcome_advantage,
    compute_grpo_outcome_advantage,
    compute_opo_outcome_advantage,
    compute_reinforce_plus_plus_baseline_outcome_advantage,
    compute_reinforce_plus_plus_outcome_advantage,
    compute_remax_outcome_advantage,
    compute_rloo_outcome_advantage,
)

FAST = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
EPS = 1e-6
TOL = {"rel": 1e-7, "abs": 1e-7}


# ---------------------------------------------------------------- plain-loop references
def _whiten_reference(cells: dict[tuple[int, int], float]) -> dict[tuple[int, int], float]:
    """Whitening over a set of (row, col) cells with the statistics module."""
    values = list(cells.values())
    if len(values) < 2:
        return {key: 0.0 for key in cells}
    mean = statistics.fmean(values)
    std = math.sqrt(statistics.variance(values) + 1e-8)
    return {key: (value - mean) / std for key, value in cells.items()}


def _grid(rows: int, cols: int, cells: dict[tuple[int, int], float]) -> list[list[float]]:
    return [[cells.get((i, t), 0.0) for t in range(cols)] for i in range(rows)]


def _groups(index) -> dict[object, list[int]]:
    members = defaultdict(list)
    for row, key in enumerate(index):
        members[key].append(row)
    return members


def _broadcast(per_row: list[float], masks: list[list[int]]) -> list[list[float]]:
    return [[value if m else 0.0 for m in mask] for value, mask in zip(per_row, masks)]


def ref_gae(rewards, values, masks, gamma, lam):
    """GAE on each row's *compressed* list of response tokens (masked tokens removed)."""
    raw, returns = {}, {}
    for i, mask in enumerate(masks):
        positions = [t for t, m in enumerate(mask) if m]
        advantage_next, value_next = 0.0, 0.0
        for t in reversed(positions):
            delta = rewards[i][t] + gamma * value_next - values[i][t]
            advantage_next = delta + gamma * lam * advantage_next
            value_next = values[i][t]
            raw[(i, t)] = advantage_next
            returns[(i, t)] = advantage_next + values[i][t]
    cols = len(masks[0])
    return _grid(len(masks), cols, _whiten_reference(raw)), _grid(len(masks), cols, returns)


def ref_grpo(rewards, masks, index, norm_by_std=True):
    scores = [sum(row) for row in rewards]
    per_row = [0.0] * len(scores)
    for rows in _groups(index).values():
        group = [scores[r] for r in rows]
        mean, std = (0.0, 1.0) if len(group) == 1 else (statistics.fmean(group), statistics.stdev(group))
        for r in rows:
            per_row[r] = (scores[r] - mean) / (std + EPS) if norm_by_std else scores[r] - mean
    return _broadcast(per_row, masks)


def ref_rloo(rewards, masks, index):
    scores = [sum(row) for row in rewards]
    per_row = []
    for r, key in enumerate(index):
        others = [scores[o] for o, other_key in enumerate(index) if other_key == key and o != r]
        per_row.append(scores[r] - sum(others) / len(others) if others else scores[r])
    return _broadcast(per_row, masks)


def ref_reinforce_pp(rewards, masks, gamma):
    returns = {}
    for i, (row, mask) in enumerate(zip(rewards, masks)):
        for t in range(len(row)):
            if not mask[t]:
                continue
            total, discount = 0.0, 1.0
            for k in range(t, len(row)):  # the return stops at the next masked token
                if not mask[k]:
                    break
                total += discount * row[k]
                discount *= gamma
            returns[(i, t)] = total
    cols = len(masks[0])
    return _grid(len(masks), cols, _whiten_reference(returns)), _grid(len(masks), cols, returns)


def ref_reinforce_pp_baseline(rewards, masks, index):
    scores = [sum(row) for row in rewards]
    centered = {}
    for rows in _groups(index).values():
        mean = 0.0 if len(rows) == 1 else statistics.fmean(scores[r] for r in rows)
        for r in rows:
            for t, m in enumerate(masks[r]):
                if m:
                    centered[(r, t)] = scores[r] - mean
    return _grid(len(masks), len(masks[0]), _whiten_reference(centered))


def ref_remax(rewards, masks, baselines):
    advantages, returns = [], []
    for row, mask, baseline in zip(rewards, masks, baselines):
        to_go = [sum(row[k] for k in range(t, len(row)) if mask[k]) if mask[t] else 0.0 for t in range(len(row))]
        returns.append(to_go)
        advantages.append([g - baseline if m else 0.0 for g, m in zip(to_go, mask)])
    return advantages, returns


def ref_opo(rewards, masks, index):
    scores = [sum(row) for row in rewards]
    lengths = [sum(mask) for mask in masks]
    per_row = [0.0] * len(scores)
    for rows in _groups(index).values():
        total_length = sum(lengths[r] for r in rows)
        baseline = 0.0
        if len(rows) > 1 and total_length > 0:
            baseline = sum(lengths[r] * scores[r] for r in rows) / total_length
        for r in rows:
            per_row[r] = scores[r] - baseline
    return _broadcast(per_row, masks)


def ref_gpg(rewards, masks, index):
    scores = [sum(row) for row in rewards]
    alpha = len(scores) / max(1, sum(1 for s in scores if s != 0))
    per_row = [0.0] * len(scores)
    for rows in _groups(index).values():
        mean = 0.0 if len(rows) == 1 else statistics.fmean(scores[r] for r in rows)
        for r in rows:
            per_row[r] = alpha * (scores[r] - mean)
    return _broadcast(per_row, masks)


# ---------------------------------------------------------------- strategies
@st.composite
def grouped_batches(draw, contiguous_masks: bool = True):
    """Groups of 1-4 responses; rewards on a coarse grid so ties (std 0) are common."""
    group_sizes = draw(st.lists(st.integers(1, 4), min_size=1, max_size=4))
    index = np.array([f"uid-{g}" for g, size in enumerate(group_sizes) for _ in range(size)], dtype=object)
    draw(st.randoms()).shuffle(index)
    rows, cols = len(index), draw(st.integers(1, 5))
    rewards = [[draw(st.integers(-4, 4)) / 2 for _ in range(cols)] for _ in range(rows)]
    if contiguous_masks:
        lengths = [draw(st.integers(0, cols)) for _ in range(rows)]
        masks = [[1 if t < length else 0 for t in range(cols)] for length in lengths]
    else:
        masks = [[draw(st.integers(0, 1)) for _ in range(cols)] for _ in range(rows)]
    values = [[draw(st.floats(-2, 2, allow_nan=False, width=32)) for _ in range(cols)] for _ in range(rows)]
    return rewards, masks, index, values


def _t(rows) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float64)


def _close(actual: torch.Tensor, expected) -> None:
    torch.testing.assert_close(actual, _t(expected), **{"rtol": TOL["rel"], "atol": TOL["abs"]})


# ---------------------------------------------------------------- hand-computed cases
def test_grpo_hand_computed_with_singleton_and_tied_groups():
    rewards = _t([[0, 1], [0, 0], [0, 0], [1, 0], [0, 2], [0, 1], [0, 1]])
    mask = torch.ones_like(rewards)
    index = np.array(["a", "a", "a", "a", "solo", "tie", "tie"], dtype=object)
    advantages, returns = compute_grpo_outcome_advantage(rewards, mask, index)
    # group a: scores 1,0,0,1 -> mean 0.5, unbiased std sqrt(1/3); solo: mean 0, std 1; tie: std 0
    a = 0.5 / (math.sqrt(1 / 3) + EPS)
    expected_rows = [a, -a, -a, a, 2 / (1 + EPS), 0.0, 0.0]
    _close(advantages, [[v, v] for v in expected_rows])
    assert torch.equal(advantages, returns)
    dr_grpo, _ = compute_grpo_outcome_advantage(rewards, mask, index, norm_adv_by_std_in_grpo=False)
    _close(dr_grpo[:, 0], [0.5, -0.5, -0.5, 0.5, 2.0, 0.0, 0.0])


def test_gae_hand_computed():
    rewards, values = _t([[0.0, 0.0, 1.0]]), _t([[0.5, 0.5, 0.5]])
    advantages, returns = compute_gae_advantage_return(rewards, values, torch.ones(1, 3), gamma=0.9, lam=0.8)
    # A2 = 1 - 0.5 = 0.5; A1 = (0.9*0.5 - 0.5) + 0.72*0.5 = 0.31; A0 = -0.05 + 0.72*0.31 = 0.1732
    raw = [0.1732, 0.31, 0.5]
    _close(returns, [[r + 0.5 for r in raw]])
    mean, std = statistics.fmean(raw), math.sqrt(statistics.variance(raw) + 1e-8)
    _close(advantages, [[(r - mean) / std for r in raw]])


def test_gae_skips_masked_tokens_like_a_compressed_row():
    rewards, values = _t([[0.0, 7.0, 1.0, 0.0]]), _t([[0.5, 9.0, 0.25, 3.0]])
    mask = torch.tensor([[1, 0, 1, 0]])
    _, returns = compute_gae_advantage_return(rewards, values, mask, gamma=1.0, lam=1.0)
    # compressed row: rewards [0, 1], values [0.5, 0.25] -> returns-to-go [1, 1]
    _close(returns, [[1.0, 0.0, 1.0, 0.0]])


def test_rloo_remax_opo_gpg_reinforce_pp_hand_computed():
    ones = torch.ones(3, 1)
    rloo, _ = compute_rloo_outcome_advantage(_t([[1], [2], [3]]), ones, np.array([0, 0, 0]))
    _close(rloo, [[-1.5], [0.0], [1.5]])

    advantages, returns = compute_remax_outcome_advantage(
        _t([[0, 1, 5]]), _t([0.25]), torch.tensor([[1, 1, 0]])
    )
    _close(returns, [[1.0, 1.0, 0.0]])
    _close(advantages, [[0.75, 0.75, 0.0]])

    opo, _ = compute_opo_outcome_advantage(_t([[1, 0, 0], [0, 0, 0]]), torch.tensor([[1, 0, 0], [1, 1, 1]]), [7, 7])
    # baseline = (1*1 + 3*0) / 4
    _close(opo, [[0.75, 0.0, 0.0], [-0.25, -0.25, -0.25]])

    gpg, _ = compute_gpg_outcome_advantage(_t([[1], [0], [0], [1]]), torch.ones(4, 1), ["g"] * 4)
    # alpha = 4 rows / 2 non-zero scores = 2
    _close(gpg, [[1.0], [-1.0], [-1.0], [1.0]])

    _, rpp_returns = compute_reinforce_plus_plus_outcome_advantage(_t([[0, 0, 1]]), torch.ones(1, 3), gamma=0.5)
    _close(rpp_returns, [[0.25, 0.5, 1.0]])


# ---------------------------------------------------------------- loop references on random inputs
@FAST
@given(grouped_batches(contiguous_masks=False), st.floats(0.5, 1.0), st.floats(0.5, 1.0))
def test_gae_matches_reference(batch, gamma, lam):
    rewards, masks, _, values = batch
    advantages, returns = compute_gae_advantage_return(_t(rewards), _t(values), torch.tensor(masks), gamma, lam)
    expected_adv, expected_ret = ref_gae(rewards, values, masks, gamma, lam)
    _close(returns, expected_ret)
    torch.testing.assert_close(advantages, _t(expected_adv), rtol=1e-6, atol=1e-6)


@FAST
@given(grouped_batches(), st.booleans())
def test_grpo_matches_reference(batch, norm_by_std):
    rewards, masks, index, _ = batch
    advantages, _ = compute_grpo_outcome_advantage(_t(rewards), torch.tensor(masks), index, EPS, norm_by_std)
    _close(advantages, ref_grpo(rewards, masks, index, norm_by_std))


@FAST
@given(grouped_batches())
def test_group_estimators_match_references(batch):
    rewards, masks, index, _ = batch
    mask = torch.tensor(masks)
    _close(compute_rloo_outcome_advantage(_t(rewards), mask, index)[0], ref_rloo(rewards, masks, index))
    _close(compute_opo_outcome_advantage(_t(rewards), mask, index)[0], ref_opo(rewards, masks, index))
    _close(compute_gpg_outcome_advantage(_t(rewards), mask, index)[0], ref_gpg(rewards, masks, index))
    torch.testing.assert_close(
        compute_reinforce_plus_plus_baseline_outcome_advantage(_t(rewards), mask, index)[0],
        _t(ref_reinforce_pp_baseline(rewards, masks, index)),
        rtol=1e-6,
        atol=1e-6,
    )


@FAST
@given(grouped_batches(contiguous_masks=False), st.floats(0.3, 1.0))
def test_reinforce_pp_matches_reference(batch, gamma):
    rewards, masks, _, _ = batch
    advantages, returns = compute_reinforce_plus_plus_outcome_advantage(_t(rewards), torch.tensor(masks), gamma)
    expected_adv, expected_ret = ref_reinforce_pp(rewards, masks, gamma)
    _close(returns, expected_ret)
    torch.testing.assert_close(advantages, _t(expected_adv), rtol=1e-6, atol=1e-6)


@FAST
@given(grouped_batches(contiguous_masks=False))
def test_remax_matches_reference(batch):
    rewards, masks, _, values = batch
    baselines = [row[0] for row in values]
    advantages, returns = compute_remax_outcome_advantage(_t(rewards), _t(baselines), torch.tensor(masks))
    expected_adv, expected_ret = ref_remax(rewards, masks, baselines)
    _close(advantages, expected_adv)
    _close(returns, expected_ret)


# ---------------------------------------------------------------- edge cases
def _all_estimator_calls(rewards: torch.Tensor, mask: torch.Tensor, index) -> dict[str, tuple]:
    inputs = dict(
        token_level_rewards=rewards,
        response_mask=mask,
        index=index,
        values=torch.ones_like(rewards),
        reward_baselines=torch.zeros(rewards.shape[0], dtype=rewards.dtype),
        gamma=1.0,
        lam=0.95,
    )
    return {name: compute_advantage(name, **inputs) for name in ADV_ESTIMATOR_REGISTRY.names()}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_zero_length_and_fully_masked_rows_stay_zero_and_finite(dtype):
    rewards = torch.tensor([[1.0, 0.0], [0.0, 0.0], [0.5, 0.5], [2.0, 0.0]], dtype=dtype)
    mask = torch.tensor([[1, 1], [0, 0], [1, 0], [0, 0]])
    index = np.array(["a", "a", "b", "c"], dtype=object)
    for name, (advantages, returns) in _all_estimator_calls(rewards, mask, index).items():
        assert torch.isfinite(advantages).all() and torch.isfinite(returns).all(), name
        assert (advantages[mask == 0] == 0).all() and (returns[mask == 0] == 0).all(), name


def test_whole_batch_masked_or_empty_gives_zeros():
    rewards = torch.ones(3, 4)
    index = ["a", "a", "b"]
    for name, (advantages, returns) in _all_estimator_calls(rewards, torch.zeros(3, 4), index).items():
        assert torch.count_nonzero(advantages) == 0 and torch.count_nonzero(returns) == 0, name
    for name, (advantages, _) in _all_estimator_calls(torch.zeros(0, 4), torch.zeros(0, 4), []).items():
        assert advantages.shape == (0, 4), name


def test_all_equal_rewards_give_zero_group_advantages():
    rewards = torch.full((6, 3), 0.5)
    mask = torch.ones(6, 3)
    index = ["p"] * 3 + ["q"] * 3
    for name in ["grpo", "rloo", "reinforce_plus_plus_baseline", "opo", "gpg"]:
        advantages, _ = compute_advantage(name, token_level_rewards=rewards, response_mask=mask, index=index)
        assert torch.count_nonzero(advantages) == 0, name


def test_single_response_groups_keep_verl_semantics():
    rewards, mask, index = _t([[3.0]]), torch.ones(1, 1), ["only"]
    assert compute_grpo_outcome_advantage(rewards, mask, index)[0].item() == pytest.approx(3 / (1 + EPS))
    assert compute_rloo_outcome_advantage(rewards, mask, index)[0].item() == 3.0
    assert compute_opo_outcome_advantage(rewards, mask, index)[0].item() == 3.0
