"""Rejection sampling (``algorithm.rollout_correction.rollout_rs``): drop tokens or whole sequences whose
divergence between the old policy and the rollout policy is out of bounds.

With ``d = log pi_old - log pi_rollout`` (clamped to [-20, 20]) the per-token divergences
(``ROLLOUT_RS_DIVERGENCE_REGISTRY``) are ``k1 = -d``, ``k2 = d^2 / 2`` and ``k3 = exp(d) - 1 - d``. An
option is named ``<reduction>_<divergence>``: the divergence read per token (``token_k*``) or reduced per
sequence (``ROLLOUT_RS_REDUCTION_REGISTRY``: ``seq_sum_k*``, ``seq_mean_k*``, ``seq_max_k2/k3``); a
sequence option keeps or rejects every token of a row together. ``k1`` is signed, so its options are
two-sided (bounds on the ratio ``exp(k1) = pi_rollout / pi_old``) and the max, which needs a
non-negative divergence, does not take it: verl's eleven options. Several options, comma-joined,
must all pass.
"""

from __future__ import annotations

from dataclasses import dataclass
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
from rlflow.algos.rollout_correction.thresholds import RejectionBounds, parse_rejection_thresholds, split_options
from rlflow.config.validation import ConfigError
from rlflow.utils.registry import Registry, unknown_name_message

RS_CONFIG_KEY = "algorithm.rollout_correction.rollout_rs"
TokenStatistic = Callable[[torch.Tensor], torch.Tensor]  # clamped log-ratio [B, T] -> per-token divergence [B, T]
# (per-token divergence [B, T], mask [B, T]) -> per-token [B, T] (``per_sequence=False``) or per-sequence [B]
Reduction = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

# metadata: ``two_sided`` (a signed divergence: its threshold bounds the ratio from both sides)
ROLLOUT_RS_DIVERGENCE_REGISTRY: Registry[TokenStatistic] = Registry(
    "rollout rejection divergence", RS_CONFIG_KEY, error=ConfigError)
# metadata: ``per_sequence`` (one verdict per row), ``takes_two_sided`` (accepts a signed divergence)
ROLLOUT_RS_REDUCTION_REGISTRY: Registry[Reduction] = Registry(
    "rollout rejection reduction", RS_CONFIG_KEY, error=ConfigError)


@ROLLOUT_RS_DIVERGENCE_REGISTRY.register("k1", two_sided=True)
def _k1(log_ratio: torch.Tensor) -> torch.Tensor:
    return -log_ratio


@ROLLOUT_RS_DIVERGENCE_REGISTRY.register("k2", two_sided=False)
def _k2(log_ratio: torch.Tensor) -> torch.Tensor:
    return 0.5 * log_ratio.square()


@ROLLOUT_RS_DIVERGENCE_REGISTRY.register("k3", two_sided=False)
def _k3(log_ratio: torch.Tensor) -> torch.Tensor:
    return torch.exp(log_ratio) - 1.0 - log_ratio


@ROLLOUT_RS_REDUCTION_REGISTRY.register("token", per_sequence=False, takes_two_sided=True)
def _per_token(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return values


@ROLLOUT_RS_REDUCTION_REGISTRY.register("seq_sum", per_sequence=True, takes_two_sided=True)
def _sequence_sum(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return masked_sum(values, mask, dim=-1)


@ROLLOUT_RS_REDUCTION_REGISTRY.register("seq_mean", per_sequence=True, takes_two_sided=True)
def _sequence_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return masked_mean(values, mask, dim=-1)


@ROLLOUT_RS_REDUCTION_REGISTRY.register("seq_max", per_sequence=True, takes_two_sided=False)
def _sequence_max(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    selected = values.masked_fill(~mask.bool(), float("-inf")).max(dim=-1).values
    return torch.where(torch.isinf(selected), torch.zeros_like(selected), selected)


@dataclass(frozen=True)
class RejectionRule:
    """One ``rollout_rs`` option: its per-token divergence, its reduction, whether that judges whole rows,
    and whether its threshold bounds it from both sides (ratio bounds) or from above."""

    statistic: TokenStatistic
    reduction: Reduction
    per_sequence: bool
    two_sided: bool


def _combines(reduction: str, divergence: str) -> bool:
    return (ROLLOUT_RS_REDUCTION_REGISTRY.metadata(reduction)["takes_two_sided"]
            or not ROLLOUT_RS_DIVERGENCE_REGISTRY.metadata(divergence)["two_sided"])


def rollout_rs_options() -> list[str]:
    """Every ``rollout_rs`` option the two registries make: ``<reduction>_<divergence>``, sorted."""
    return sorted(f"{reduction}_{divergence}" for reduction in ROLLOUT_RS_REDUCTION_REGISTRY.names()
                  for divergence in ROLLOUT_RS_DIVERGENCE_REGISTRY.names() if _combines(reduction, divergence))


def rejection_rule(option: str) -> RejectionRule:
    """The rule of one ``rollout_rs`` option; an unknown one is a ``ConfigError`` listing the options."""
    reduction, _, divergence = option.rpartition("_")
    if not (reduction in ROLLOUT_RS_REDUCTION_REGISTRY and divergence in ROLLOUT_RS_DIVERGENCE_REGISTRY
            and _combines(reduction, divergence)):
        raise ConfigError(unknown_name_message("rollout rejection option", option, rollout_rs_options(), RS_CONFIG_KEY))
    return RejectionRule(ROLLOUT_RS_DIVERGENCE_REGISTRY.get(divergence), ROLLOUT_RS_REDUCTION_REGISTRY.get(reduction),
                         per_sequence=ROLLOUT_RS_REDUCTION_REGISTRY.metadata(reduction)["per_sequence"],
                         two_sided=ROLLOUT_RS_DIVERGENCE_REGISTRY.metadata(divergence)["two_sided"])


def _inside(values: torch.Tensor, bounds: RejectionBounds) -> torch.Tensor:
    keep = values <= bounds.upper
    return keep if bounds.lower is None else keep & (values >= bounds.lower)


def compute_rs_metrics(option: str, per_token: torch.Tensor, per_sequence: torch.Tensor, keep: torch.Tensor,
                       mask: torch.Tensor, bounds: RejectionBounds, sequence_level: bool) -> dict[str, float]:
    """verl's ``rollout_rs_<option>_*`` statistics of one option (unprefixed).

    ``per_token`` ``[B, T]`` is the statistic each token is judged by (its sequence's for a sequence
    option), ``per_sequence`` that statistic per row with tokens (a token option: the row mean),
    ``keep`` ``[B, T]`` the option's verdict. Bounds are in the statistic's space.
    """
    valid = mask.bool()
    lower = bounds.lower if bounds.lower is not None else 0.0
    units = per_sequence if sequence_level else per_token[valid]
    rejected = ~keep & valid
    prefix = f"rollout_rs_{option}"
    metrics = {
        f"{prefix}_mean": scalar(masked_mean(per_token, mask)),
        f"{prefix}_max": extreme(units, largest=True),
        f"{prefix}_min": extreme(units, largest=False),
        f"{prefix}_fraction_high": share(units > bounds.upper),
        f"{prefix}_fraction_low": share(units < bounds.lower) if bounds.lower is not None else 0.0,
        f"{prefix}_std": clamped_token_std(per_token, mask, lower, bounds.upper),
        f"{prefix}_seq_mean": scalar(per_sequence.mean()),
        f"{prefix}_seq_std": sample_std(per_sequence),
        f"{prefix}_seq_max": extreme(per_sequence, largest=True),
        f"{prefix}_seq_min": extreme(per_sequence, largest=False),
        f"{prefix}_seq_max_deviation": extreme(per_sequence.abs(), largest=True),
        f"{prefix}_seq_fraction_high": share(per_sequence > bounds.upper),
        f"{prefix}_masked_fraction": scalar(masked_mean(rejected.to(mask.dtype), mask)),
        f"{prefix}_seq_masked_fraction": share(rejected.any(dim=-1)[valid.any(dim=-1)]),
    }
    if bounds.lower is not None:
        metrics[f"{prefix}_seq_fraction_low"] = share(per_sequence < bounds.lower)
    return metrics


def compute_rollout_rejection_mask(
    log_ratio: torch.Tensor,
    response_mask: torch.Tensor,
    rollout_rs: str = "token_k1",
    rollout_rs_threshold: Any = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """``response_mask`` with the rejected tokens set to 0 (same dtype), and the metrics (unprefixed).

    ``rollout_rs`` is one option or several comma-joined (all must pass); ``rollout_rs_threshold`` one
    spec per option or one shared spec (``thresholds.parse_rejection_thresholds``).
    """
    options = split_options(rollout_rs)
    rules = {option: rejection_rule(option) for option in options}
    bounds = parse_rejection_thresholds({option: rule.two_sided for option, rule in rules.items()}, rollout_rs_threshold)
    if log_ratio.shape[0] == 0:
        return response_mask, {}
    mask = as_float_mask(response_mask, log_ratio)
    require_tokens(mask)
    valid = mask.bool()
    clamped = log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    keep_all = torch.ones_like(valid)
    metrics: dict[str, float] = {}
    for option, rule in rules.items():
        judged = rule.reduction(rule.statistic(clamped), mask)
        keep = _inside(judged, bounds[option])
        if rule.per_sequence:
            per_token, per_sequence = judged.unsqueeze(-1).expand_as(valid), judged[valid.any(dim=-1)]
            keep = keep.unsqueeze(-1).expand_as(valid)
        else:
            per_token, per_sequence = judged, row_means(judged, mask)
        metrics.update(compute_rs_metrics(option, per_token, per_sequence, keep, mask, bounds[option],
                                          sequence_level=rule.per_sequence))
        keep_all = keep_all & keep
    rejected = ~keep_all & valid
    metrics["rollout_rs_masked_fraction"] = scalar(masked_mean(rejected.to(mask.dtype), mask))
    metrics["rollout_rs_seq_masked_fraction"] = share(rejected.any(dim=-1)[valid.any(dim=-1)])
    return torch.where(keep_all, response_mask, torch.zeros_like(response_mask)), metrics
