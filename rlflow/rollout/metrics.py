"""Train/inference mismatch: how far the rollout engine's log-probs are from the actor's.

A stale or partial weight sync, or a precision mismatch between engine and trainer, shows up
here first: with a correct sync in fp32 these stay near 1e-6; a stale engine gives values
around the size of one update.
"""

from __future__ import annotations

import torch


def rollout_mismatch_metrics(
    rollout_log_probs: torch.Tensor, actor_log_probs: torch.Tensor, response_mask: torch.Tensor
) -> dict[str, float]:
    """Mean, max and 99th percentile of ``|rollout_log_prob - actor_log_prob|`` over response tokens.

    All three tensors are ``[batch, response_length]``; tokens where ``response_mask`` is 0 are
    ignored. With no response tokens at all, every metric is 0.
    """
    if not rollout_log_probs.shape == actor_log_probs.shape == response_mask.shape:
        raise ValueError(
            "rollout_log_probs, actor_log_probs and response_mask must share a shape; got "
            f"{tuple(rollout_log_probs.shape)}, {tuple(actor_log_probs.shape)}, {tuple(response_mask.shape)}"
        )
    diff = (rollout_log_probs.double() - actor_log_probs.double()).abs()[response_mask.bool()]
    if diff.numel() == 0:
        return {"rollout/logprob_diff_mean": 0.0, "rollout/logprob_diff_max": 0.0, "rollout/logprob_diff_p99": 0.0}
    return {
        "rollout/logprob_diff_mean": diff.mean().item(),
        "rollout/logprob_diff_max": diff.max().item(),
        "rollout/logprob_diff_p99": torch.quantile(diff, 0.99).item(),
    }
