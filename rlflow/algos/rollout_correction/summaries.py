"""Scalar summaries the rollout-correction metrics share (every value a Python float, empty sets give 0)."""

from __future__ import annotations

import torch

from rlflow.algos.masked_ops import masked_mean, masked_var


def scalar(value: torch.Tensor | float) -> float:
    """A detached tensor (or number) as a float."""
    return float(torch.as_tensor(value).detach())


def extreme(values: torch.Tensor, largest: bool) -> float:
    """The largest (or smallest) of ``values``; 0 for an empty tensor."""
    if values.numel() == 0:
        return 0.0
    return scalar(values.max() if largest else values.min())


def share(flags: torch.Tensor) -> float:
    """The fraction of true entries of a 1-D bool tensor; 0 for an empty one."""
    return scalar(flags.to(torch.float64).mean()) if flags.numel() else 0.0


def sample_std(values: torch.Tensor) -> float:
    """The Bessel-corrected standard deviation of a 1-D tensor; 0 with fewer than two entries."""
    return scalar(values.std()) if values.numel() > 1 else 0.0


def clamped_token_std(values: torch.Tensor, mask: torch.Tensor, low: float, high: float) -> float:
    """The standard deviation over the masked tokens of ``values`` clamped to ``[low, high]`` (outliers bounded)."""
    return scalar(masked_var(values.clamp(min=low, max=high), mask, unbiased=False).clamp(min=0).sqrt())


def row_means(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The per-row means over the masked tokens, of the rows that have any (``[rows with tokens]``)."""
    return masked_mean(values, mask, dim=-1)[mask.sum(dim=-1) > 0]


def require_tokens(response_mask: torch.Tensor) -> None:
    """ValueError unless ``response_mask`` selects at least one token (every statistic needs one)."""
    if not bool(response_mask.bool().any()):
        raise ValueError("rollout correction needs at least one response token (response_mask is all 0)")
