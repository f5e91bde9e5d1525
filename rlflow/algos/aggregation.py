"""Turning a (batch, response_len) loss matrix into the scalar that is back-propagated.

Each mode is a registered reducer that returns a *sum* over this split's rows divided by a
normalizer. When the caller passes the global normalizer (``batch_num_tokens`` for token
modes, ``global_batch_size`` for sequence modes), per-split results add up to the
whole-batch result, however the batch was cut into micro-batches or DP ranks. ``dp_size``
multiplies the result so that the data-parallel gradient *average* (FSDP/DDP) turns back
into that sum.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

import torch

from rlflow.algos.masked_ops import as_float_mask, masked_sum
from rlflow.utils.registry import Registry


@dataclass(frozen=True)
class AggregationCounts:
    """The normalizers a reducer may use: global counts when given, else this split's own."""

    num_tokens: torch.Tensor | float
    num_sequences: torch.Tensor | float
    scale_factor: float


LossAggFn = Callable[[torch.Tensor, torch.Tensor, AggregationCounts], torch.Tensor]
LOSS_AGG_REGISTRY: Registry[LossAggFn] = Registry("loss aggregation mode", "actor.loss_agg_mode")

GLOBAL_BATCH_INFO_KEYS = ("dp_size", "batch_num_tokens", "global_batch_size", "loss_scale_factor")


def _safe_divide(numerator: torch.Tensor, denominator: torch.Tensor | float) -> torch.Tensor:
    denominator = torch.as_tensor(denominator, dtype=numerator.dtype, device=numerator.device)
    return numerator / torch.where(denominator != 0, denominator, torch.ones_like(denominator))


@LOSS_AGG_REGISTRY.register("token-mean")
def _token_mean(loss_mat: torch.Tensor, mask: torch.Tensor, counts: AggregationCounts) -> torch.Tensor:
    return _safe_divide(masked_sum(loss_mat, mask), counts.num_tokens)


@LOSS_AGG_REGISTRY.register("token-sum")
def _token_sum(loss_mat: torch.Tensor, mask: torch.Tensor, counts: AggregationCounts) -> torch.Tensor:
    return masked_sum(loss_mat, mask)


@LOSS_AGG_REGISTRY.register("seq-mean-token-sum")
def _seq_mean_token_sum(loss_mat: torch.Tensor, mask: torch.Tensor, counts: AggregationCounts) -> torch.Tensor:
    return _safe_divide(masked_sum(loss_mat, mask, dim=-1).sum(), counts.num_sequences)


@LOSS_AGG_REGISTRY.register("seq-mean-token-sum-norm")
def _seq_mean_token_sum_norm(loss_mat: torch.Tensor, mask: torch.Tensor, counts: AggregationCounts) -> torch.Tensor:
    return _seq_mean_token_sum(loss_mat, mask, counts) / counts.scale_factor


@LOSS_AGG_REGISTRY.register("seq-mean-token-mean")
def _seq_mean_token_mean(loss_mat: torch.Tensor, mask: torch.Tensor, counts: AggregationCounts) -> torch.Tensor:
    per_sequence = _safe_divide(masked_sum(loss_mat, mask, dim=-1), mask.sum(dim=-1))
    return _safe_divide(per_sequence.sum(), counts.num_sequences)


def agg_loss(
    loss_mat: torch.Tensor,
    loss_mask: torch.Tensor,
    loss_agg_mode: str,
    dp_size: int = 1,
    batch_num_tokens: int | float | torch.Tensor | None = None,
    global_batch_size: int | None = None,
    loss_scale_factor: float | None = None,
) -> torch.Tensor:
    """Aggregate a per-token loss matrix into a scalar (verl's ``agg_loss``).

    Modes (``loss_agg_mode``):

    * ``token-mean``: sum over masked tokens / number of masked tokens;
    * ``token-sum``: sum over masked tokens;
    * ``seq-mean-token-sum``: mean over sequences of each sequence's token sum;
    * ``seq-mean-token-sum-norm``: the same divided by ``loss_scale_factor``
      (default ``loss_mat.shape[-1]``; a constant avoids length bias, Dr.GRPO);
    * ``seq-mean-token-mean``: mean over sequences of each sequence's token mean.

    Sequence means run over the non-empty sequences (fully masked rows are left out, as in
    verl 0.9.1). ``batch_num_tokens`` / ``global_batch_size`` replace this split's own token /
    non-empty-sequence counts so results are split-invariant; they are required when
    ``dp_size > 1``, and the result is multiplied by ``dp_size``. An all-masked split gives 0,
    never NaN.
    """
    reducer = LOSS_AGG_REGISTRY.get(loss_agg_mode)
    if loss_mat.dim() != 2:
        raise ValueError(f"loss_mat must be (batch, response_len), got shape {tuple(loss_mat.shape)}")
    if dp_size < 1:
        raise ValueError(f"dp_size must be >= 1, got {dp_size}")
    if dp_size > 1 and (batch_num_tokens is None or global_batch_size is None):
        raise ValueError(
            f"agg_loss with dp_size={dp_size} needs the global batch_num_tokens and global_batch_size "
            "(the mini-batch's masked-token and non-empty-sequence counts over all DP ranks)"
        )
    mask = as_float_mask(loss_mask, loss_mat)
    counts = AggregationCounts(
        num_tokens=mask.sum() if batch_num_tokens is None else batch_num_tokens,
        num_sequences=(mask.sum(dim=-1) > 0).sum() if global_batch_size is None else global_batch_size,
        scale_factor=float(loss_mat.shape[-1] if loss_scale_factor is None else loss_scale_factor),
    )
    if counts.scale_factor <= 0:
        raise ValueError(f"loss_scale_factor must be positive, got {loss_scale_factor}")
    return reducer(loss_mat, mask, counts) * dp_size


def loss_agg_modes() -> list[str]:
    """The registered aggregation mode names."""
    return LOSS_AGG_REGISTRY.names()


def check_global_batch_info(global_batch_info: Mapping[str, Any] | None) -> dict[str, Any]:
    """Validate a ``global_batch_info`` mapping and return it as ``agg_loss`` keyword arguments."""
    info = dict(global_batch_info or {})
    unknown = sorted(set(info) - set(GLOBAL_BATCH_INFO_KEYS))
    if unknown:
        raise ValueError(f"global_batch_info has unknown keys {unknown}; valid keys: {list(GLOBAL_BATCH_INFO_KEYS)}")
    return info
