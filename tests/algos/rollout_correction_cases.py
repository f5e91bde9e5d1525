"""Hand-made log-probs shared by the rollout-correction tests: two responses (3 and 2 tokens, one padding column
and more) whose token ratios ``r = pi_old / pi_rollout`` are round numbers, so every expected value is written
out in plain Python from ``RATIOS``."""

from __future__ import annotations

import math

import torch

RATIOS = [[3.0, 0.6, 1.5], [0.25, 1.2]]  # r per response token, row by row
WIDTH = 4


def tensors(old_values=((-1.0, -2.0, -0.5), (-0.3, -0.2))) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(old_log_prob, rollout_log_prob, response_mask)`` ``[2, WIDTH]`` with ``old - rollout = log r``; padding
    holds 0 in both log-prob tensors."""
    old = torch.zeros(len(RATIOS), WIDTH, dtype=torch.float64)
    rollout = torch.zeros_like(old)
    mask = torch.zeros(len(RATIOS), WIDTH, dtype=torch.long)
    for row, (ratios, values) in enumerate(zip(RATIOS, old_values)):
        for column, (ratio, value) in enumerate(zip(ratios, values)):
            old[row, column] = value
            rollout[row, column] = value - math.log(ratio)
            mask[row, column] = 1
    return old, rollout, mask


def padded(rows: list[list[float]]) -> torch.Tensor:
    """Per-row values right-padded with 0 to ``[2, WIDTH]``."""
    return torch.tensor([row + [0.0] * (WIDTH - len(row)) for row in rows], dtype=torch.float64)


def tokens() -> list[float]:
    """Every response token's ratio, row-major."""
    return [ratio for row in RATIOS for ratio in row]


def mean(values: list[float]) -> float:
    return sum(values) / len(values)
