"""Off-policy diagnostics: how far the rollout policy is from the training policy on the sampled tokens.

With ``d = log pi_train - log pi_rollout`` per response token (``pi_train``: the old log-probs in the
decoupled mode, the current ones in bypass mode) and per-sequence mean log-probs ``m``:

| metric | value |
|---|---|
| ``kl`` | mean over tokens of ``-d``: the k1 estimate of KL(pi_rollout ‖ pi_train) |
| ``k3_kl`` | mean over tokens of ``exp(d) - d - 1`` (non-negative, low variance) |
| ``training_ppl``, ``rollout_ppl`` | mean over sequences of ``exp(-m)`` |
| ``training_log_ppl``, ``rollout_log_ppl`` | mean over sequences of ``-m`` |
| ``log_ppl_diff`` (``_abs_diff``, ``_max``, ``_min``) | ``m_rollout - m_train`` per sequence: mean (mean of ``|.|``, max, min) |
| ``ppl_ratio`` | mean over sequences of ``exp(log_ppl_diff)`` = training PPL / rollout PPL |
| ``chi2_token`` | ``E_tokens[exp(d)^2] - 1``, ``d`` clamped to [-20, 20] |
| ``chi2_seq`` | ``E_sequences[exp(2 sum_t d)] - 1``, the sum clamped to [-20, 20] |

Sequences without tokens are left out of the sequence means.
"""

from __future__ import annotations

from typing import Optional

import torch

from rlflow.algos.masked_ops import as_float_mask, masked_mean, masked_sum
from rlflow.algos.ppo_clip import LOG_RATIO_CLAMP
from rlflow.algos.rollout_correction.summaries import extreme, require_tokens, row_means, scalar


def compute_offpolicy_metrics(
    old_log_prob: torch.Tensor,
    rollout_log_prob: Optional[torch.Tensor],
    response_mask: torch.Tensor,
) -> dict[str, float]:
    """The table above (unprefixed); without ``rollout_log_prob`` only the training policy's perplexity."""
    mask = as_float_mask(response_mask, old_log_prob)
    require_tokens(mask)
    training = row_means(old_log_prob, mask)
    metrics = {"training_ppl": scalar(torch.exp(-training).mean()), "training_log_ppl": scalar(-training.mean())}
    if rollout_log_prob is None:
        return metrics
    log_ratio = old_log_prob - rollout_log_prob
    rollout = row_means(rollout_log_prob, mask)
    log_ppl_diff = rollout - training
    clamped = log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    sequence_log_ratio = masked_sum(log_ratio, mask, dim=-1)[mask.sum(dim=-1) > 0]
    metrics.update({
        "kl": scalar(masked_mean(-log_ratio, mask)),
        "k3_kl": scalar(masked_mean(torch.exp(log_ratio) - log_ratio - 1, mask)),
        "rollout_ppl": scalar(torch.exp(-rollout).mean()),
        "rollout_log_ppl": scalar(-rollout.mean()),
        "log_ppl_diff": scalar(log_ppl_diff.mean()),
        "log_ppl_abs_diff": scalar(log_ppl_diff.abs().mean()),
        "log_ppl_diff_max": extreme(log_ppl_diff, largest=True),
        "log_ppl_diff_min": extreme(log_ppl_diff, largest=False),
        "ppl_ratio": scalar(torch.exp(log_ppl_diff).mean()),
        "chi2_token": scalar(masked_mean(torch.exp(clamped).square(), mask)) - 1.0,
        "chi2_seq": scalar(torch.exp(2.0 * sequence_log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)).mean()) - 1.0,
    })
    return metrics
