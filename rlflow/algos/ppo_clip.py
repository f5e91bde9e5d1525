"""The PPO clipped surrogate with asymmetric bounds (DAPO clip-higher) and dual clip.

Per token, with ``r = exp(clamp(log_prob - old_log_prob, -20, 20))`` and advantage ``A``::

    L = max(-A r, -A clip(r, 1 - eps_low, 1 + eps_high))     # PPO clip
    L = min(L, -A c)            where A < 0                    # dual clip (Ye et al. 2019), c > 1
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlflow.algos.aggregation import agg_loss
from rlflow.algos.masked_ops import masked_mean

LOG_RATIO_CLAMP = 20.0


@dataclass(frozen=True)
class SurrogateTerms:
    """Per-token losses of a clipped surrogate and its diagnostics (0-d tensors)."""

    token_losses: torch.Tensor
    clipfrac: torch.Tensor  # fraction of tokens where the clip bound was active
    ppo_kl: torch.Tensor  # masked mean of old_log_prob - log_prob
    clipfrac_lower: torch.Tensor  # fraction of tokens where the dual clip was active


def ppo_clip_token_losses(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    clip_low: float,
    clip_high: float,
    clip_ratio_c: float = 3.0,
) -> SurrogateTerms:
    """The dual-clip PPO loss per token, before aggregation."""
    if clip_ratio_c <= 1.0:
        raise ValueError(f"clip_ratio_c (dual-clip bound, actor.clip_ratio_c) must be > 1.0, got {clip_ratio_c}")
    log_ratio = torch.clamp(log_prob - old_log_prob, min=-LOG_RATIO_CLAMP, max=LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    clip_loss = torch.maximum(unclipped, clipped)
    dual_bound = -advantages * clip_ratio_c
    negative = advantages < 0
    return SurrogateTerms(
        token_losses=torch.where(negative, torch.minimum(clip_loss, dual_bound), clip_loss),
        clipfrac=masked_mean((clipped > unclipped).to(ratio.dtype), response_mask),
        ppo_kl=masked_mean(-log_ratio, response_mask),
        clipfrac_lower=masked_mean(((clip_loss > dual_bound) & negative).to(ratio.dtype), response_mask),
    )


def compute_policy_loss(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    cliprange: float | None = None,
    cliprange_low: float | None = None,
    cliprange_high: float | None = None,
    clip_ratio_c: float = 3.0,
    loss_agg_mode: str = "token-mean",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """PPO loss (verl's functional form) -> ``(pg_loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower)``.

    ``cliprange_low`` / ``cliprange_high`` default to ``cliprange``.
    """
    low = cliprange if cliprange_low is None else cliprange_low
    high = cliprange if cliprange_high is None else cliprange_high
    if low is None or high is None:
        raise ValueError("compute_policy_loss needs cliprange, or both cliprange_low and cliprange_high")
    terms = ppo_clip_token_losses(old_log_prob, log_prob, advantages, response_mask, low, high, clip_ratio_c)
    pg_loss = agg_loss(terms.token_losses, response_mask, loss_agg_mode)
    return pg_loss, terms.clipfrac, terms.ppo_kl, terms.clipfrac_lower
