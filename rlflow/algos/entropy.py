"""Token entropy of the policy's categorical distribution and its aggregated loss."""

from __future__ import annotations

from typing import Any, Mapping

import torch

from rlflow.algos.aggregation import agg_loss, check_global_batch_info


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """``H = logsumexp(z) - sum(softmax(z) * z)`` over the last (vocabulary) dimension."""
    probs = torch.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - (probs * logits).sum(dim=-1)


def compute_entropy_loss(
    logits: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    *,
    global_batch_info: Mapping[str, Any] | None = None,
) -> torch.Tensor:
    """Aggregated token entropy of ``logits`` (batch, response_len, vocab); the actor subtracts
    ``actor.entropy_coeff`` times it from the policy loss.
    """
    if logits.dim() != 3:
        raise ValueError(f"logits must be (batch, response_len, vocab), got {tuple(logits.shape)}")
    token_entropy = entropy_from_logits(logits)
    return agg_loss(token_entropy, response_mask, loss_agg_mode, **check_global_batch_info(global_batch_info))
