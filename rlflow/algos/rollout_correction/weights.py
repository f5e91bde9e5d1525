"""Importance-sampling weights ``pi_old / pi_rollout`` (``algorithm.rollout_correction.rollout_is``).

The IS level is a registry (``ROLLOUT_IS_LEVEL_REGISTRY``): a level maps the per-token log-ratios
to the log weight of each unit it weights, tokens (``token``) or whole sequences (``sequence``: the
product of the token ratios). Weights are ``exp`` of log weights clamped to [-20, 20], zero on
padding, detached (they change the measure, not the objective), then cut by the threshold
(``thresholds.parse_is_threshold``: truncated or masked) and optionally divided by their batch mean.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import torch

from rlflow.algos.masked_ops import as_float_mask, masked_mean, masked_sum
from rlflow.algos.ppo_clip import LOG_RATIO_CLAMP
from rlflow.algos.rollout_correction.summaries import (
    clamped_token_std,
    extreme,
    require_tokens,
    row_means,
    sample_std,
    scalar,
    share,
)
from rlflow.algos.rollout_correction.thresholds import ISThreshold, parse_is_threshold
from rlflow.config.validation import ConfigError
from rlflow.utils.registry import Registry

# (log_ratio [B, T], response_mask [B, T]) -> (log weight of each unit, which units hold tokens); units are
# [B, T] (tokens) or [B, 1] (sequences), broadcastable to [B, T].
ISLevelFn = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
ROLLOUT_IS_LEVEL_REGISTRY: Registry[ISLevelFn] = Registry(
    "rollout IS level", "algorithm.rollout_correction.rollout_is", error=ConfigError
)
BATCH_NORM_MIN_MEAN = 1e-8  # a smaller batch mean leaves the weights unnormalized
ESS_EPS = 1e-8


@ROLLOUT_IS_LEVEL_REGISTRY.register("token")
def token_level(log_ratio: torch.Tensor, response_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One weight per token: ``pi_old(y_t) / pi_rollout(y_t)`` (biased, low variance)."""
    return log_ratio, response_mask.bool()


@ROLLOUT_IS_LEVEL_REGISTRY.register("sequence")
def sequence_level(log_ratio: torch.Tensor, response_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One weight per sequence: the product of its token ratios (unbiased, high variance)."""
    return masked_sum(log_ratio, response_mask, dim=-1).unsqueeze(-1), response_mask.bool().any(dim=-1, keepdim=True)


def _cut(weights: torch.Tensor, threshold: ISThreshold) -> torch.Tensor:
    if threshold.masks:
        inside = (weights >= threshold.lower) & (weights <= threshold.upper)
        return torch.where(inside, weights, torch.zeros_like(weights))
    return weights.clamp(max=threshold.upper)


def compute_is_metrics(raw_weights: torch.Tensor, unit_log_weights: torch.Tensor, unit_mask: torch.Tensor,
                       response_mask: torch.Tensor, threshold: ISThreshold) -> dict[str, float]:
    """verl's ``rollout_is_*`` statistics of the weights before the threshold cut (unprefixed).

    ``raw_weights`` ``[B, T]`` are the safety-bounded weights on tokens (0 on padding); max, min and
    the ``ratio_fraction_*`` shares are over the level's units (tokens or sequences); std and the
    effective sample size use the weights clamped to the threshold's bounds.
    """
    units = unit_log_weights[unit_mask].clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    low, high = threshold.lower, threshold.upper
    bounded = raw_weights.clamp(min=low, max=high)
    normalized = bounded / (masked_mean(bounded, response_mask) + ESS_EPS)
    per_sequence = row_means(raw_weights, response_mask)
    return {
        "rollout_is_mean": scalar(masked_mean(raw_weights, response_mask)),
        "rollout_is_max": math.exp(extreme(units, largest=True)),
        "rollout_is_min": math.exp(extreme(units, largest=False)),
        "rollout_is_ratio_fraction_high": share(units > math.log(high)),
        "rollout_is_ratio_fraction_low": share(units < math.log(low)),
        "rollout_is_std": clamped_token_std(raw_weights, response_mask, low, high),
        "rollout_is_eff_sample_size": 1.0 / scalar(masked_mean(normalized.square(), response_mask)),
        "rollout_is_seq_mean": scalar(per_sequence.mean()),
        "rollout_is_seq_std": sample_std(per_sequence),
        "rollout_is_seq_max": extreme(per_sequence, largest=True),
        "rollout_is_seq_min": extreme(per_sequence, largest=False),
        "rollout_is_seq_max_deviation": extreme((per_sequence - 1.0).abs(), largest=True),
        "rollout_is_seq_fraction_high": share(per_sequence > high),
        "rollout_is_seq_fraction_low": share(per_sequence < low),
    }


def compute_rollout_correction_weights(
    log_ratio: torch.Tensor,
    response_mask: torch.Tensor,
    rollout_is: str = "token",
    rollout_is_threshold: Any = 2.0,
    rollout_is_batch_normalize: bool = False,
) -> tuple[torch.Tensor, dict[str, float]]:
    """IS weights ``[B, T]`` from ``log_ratio = log pi_old - log pi_rollout`` and their metrics (unprefixed).

    ``rollout_is`` names a registered level; ``rollout_is_threshold`` is a number (truncate) or a
    ``"lower_upper"`` string (zero the weights outside). With ``rollout_is_batch_normalize`` the weights
    are divided by their mean over the level's units (``rollout_is_batch_norm_factor``). Padding gets 0.
    """
    level = ROLLOUT_IS_LEVEL_REGISTRY.get(rollout_is)
    threshold = parse_is_threshold(rollout_is_threshold)
    mask = as_float_mask(response_mask, log_ratio)
    require_tokens(mask)
    unit_log_weights, unit_mask = level(log_ratio, mask)
    unit_weights = torch.exp(unit_log_weights.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)).detach()
    metrics = compute_is_metrics(unit_weights.expand_as(log_ratio) * mask, unit_log_weights.detach(), unit_mask, mask,
                                 threshold)
    kept = _cut(unit_weights, threshold)
    if rollout_is_batch_normalize:
        mean = masked_mean(kept, unit_mask)
        factor = mean if mean > BATCH_NORM_MIN_MEAN else torch.ones_like(mean)
        metrics["rollout_is_batch_norm_factor"] = scalar(factor)
        kept = kept / factor
    return kept.expand_as(log_ratio) * mask, metrics
