"""Reductions over the response tokens selected by a 0/1 mask.

Every helper is safe on an all-zero mask: counts of zero give a mean of 0 instead of NaN,
so fully masked rows and zero-length responses never poison a batch.
"""

from __future__ import annotations

import torch

WHITEN_EPS = 1e-8


def _nonzero(count: torch.Tensor) -> torch.Tensor:
    """``count`` with zeros replaced by ones (the numerator is zero there anyway)."""
    return torch.where(count > 0, count, torch.ones_like(count))


def as_float_mask(mask: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A bool/int/float mask in the dtype and device of ``like``."""
    if mask.shape != like.shape:
        raise ValueError(f"mask shape {tuple(mask.shape)} does not match values shape {tuple(like.shape)}")
    return mask.to(dtype=like.dtype, device=like.device)


def masked_sum(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Sum of ``values`` where ``mask`` is 1 (masked entries may hold anything finite)."""
    weights = as_float_mask(mask, values)
    selected = torch.where(weights != 0, values * weights, torch.zeros_like(values))
    return selected.sum() if dim is None else selected.sum(dim=dim)


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of ``values`` over the masked entries; 0 where nothing is selected."""
    weights = as_float_mask(mask, values)
    count = weights.sum() if dim is None else weights.sum(dim=dim)
    return masked_sum(values, weights, dim) / _nonzero(count)


def masked_var(values: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance over all masked entries (Bessel-corrected when ``unbiased`` and more than one entry)."""
    weights = as_float_mask(mask, values)
    centered = values - masked_mean(values, weights)
    variance = masked_mean(centered.square(), weights)
    count = weights.sum()
    if unbiased:
        variance = torch.where(count > 1, variance * count / _nonzero(count - 1), variance)
    return variance


def masked_whiten(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``(values - mean) / sqrt(var + 1e-8)`` with mean and unbiased variance over the masked entries.

    With fewer than two masked entries the variance is 0 and every masked entry equals the
    mean, so the result is 0 there; callers multiply by the mask to clear the rest.
    """
    weights = as_float_mask(mask, values)
    mean = masked_mean(values, weights)
    variance = masked_var(values, weights, unbiased=True)
    return (values - mean) * torch.rsqrt(variance + WHITEN_EPS)
