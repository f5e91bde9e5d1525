"""The clipped value-function loss of PPO's critic."""

from __future__ import annotations

from typing import Any, Mapping

import torch

from rlflow.algos.aggregation import agg_loss, check_global_batch_info
from rlflow.algos.masked_ops import masked_mean


def compute_value_loss(
    vpreds: torch.Tensor,
    returns: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    cliprange_value: float,
    loss_agg_mode: str = "token-mean",
    *,
    global_batch_info: Mapping[str, Any] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``0.5 * agg(max((V - R)^2, (clip(V, V_old - c, V_old + c) - R)^2))`` -> ``(vf_loss, vf_clipfrac)``.

    ``values`` are the critic's values at rollout time, ``vpreds`` the current ones and
    ``cliprange_value`` is ``critic.cliprange_value``. ``global_batch_info`` carries the
    ``agg_loss`` global counts (``dp_size``, ``batch_num_tokens``, ``global_batch_size``).
    """
    if cliprange_value < 0:
        raise ValueError(f"cliprange_value (critic.cliprange_value) must be >= 0, got {cliprange_value}")
    clipped_preds = torch.clamp(vpreds, values - cliprange_value, values + cliprange_value)
    unclipped_losses = (vpreds - returns).square()
    clipped_losses = (clipped_preds - returns).square()
    token_losses = torch.maximum(unclipped_losses, clipped_losses)
    vf_loss = 0.5 * agg_loss(token_losses, response_mask, loss_agg_mode, **check_global_batch_info(global_batch_info))
    vf_clipfrac = masked_mean((clipped_losses > unclipped_losses).to(vpreds.dtype), response_mask)
    return vf_loss, vf_clipfrac
