"""Rejection sampling (``algorithm.rollout_correction.rollout_rs``): drop tokens or whole sequences whose
divergence between the old policy and the rollout policy is out of bounds.

With ``d = log pi_old - log pi_rollout`` (clamped to [-20, 20]) the per-token divergences are
``k1 = -d``, ``k2 = d^2 / 2`` and ``k3 = exp(d) - 1 - d``. An option (``ROLLOUT_RS_REGISTRY``) is
one of them read per token (``token_k*``) or reduced per sequence (``seq_sum_k*``, ``seq_mean_k*``,
``seq_max_k2/k3``); a sequence option keeps or rejects every token of a row together. ``k1``
options are two-sided: their bounds are on the ratio ``exp(k1) = pi_rollout / pi_old``. Several
options, comma-joined, must all pass.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

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
from rlflow.utils.registry import Registry

TokenStatistic = Callable[[torch.Tensor], torch.Tensor]  # clamped log-ratio [B, T] -> per-token divergence
SequenceReduction = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (per-token, mask) -> per-sequence [B]


@dataclass(frozen=True)
class RejectionRule:
    """One ``rollout_rs`` option: a per-token divergence, optionally reduced per sequence (None: judged per
    token), and whether its threshold bounds it from both sides (ratio bounds) or from above."""

    statistic: TokenStatistic
    reduction: Optional[SequenceReduction]
    two_sided: bool


ROLLOUT_RS_REGISTRY: Registry[RejectionRule] = Registry(
    "rollout rejection option", "algorithm.rollout_correction.rollout_rs", error=ConfigError
)


def register_rollout_rs_option(name: str, rule: RejectionRule, override: bool = False) -> RejectionRule:
    """Make ``rule`` available as the ``rollout_rs`` option ``name``."""
    return ROLLOUT_RS_REGISTRY.add(name, rule, override=override)


def _k1(log_ratio: torch.Tensor) -> torch.Tensor:
    return -log_ratio


def _k2(log_ratio: torch.Tensor) -> torch.Tensor:
    return 0.5 * log_ratio.square()


def _k3(log_ratio: torch.Tensor) -> torch.Tensor:
    return torch.exp(log_ratio) - 1.0 - log_ratio


def _sequence_max(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    selected = values.masked_fill(~mask.bool(), float("-inf")).max(dim=-1).values
    return torch.where(torch.isinf(selected), torch.zeros_like(selected), selected)


def _sequence_sum(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return masked_sum(values, mask, dim=-1)


def _sequence_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return masked_mean(values, mask, dim=-1)


_DIVERGENCES = {"k1": _k1, "k2": _k2, "k3": _k3}
_REDUCTIONS: dict[str, Optional[SequenceReduction]] = {
    "token": None, "seq_sum": _sequence_sum, "seq_mean": _sequence_mean, "seq_max": _sequence_max,
}


def _register_verl_options() -> None:
    """verl's eleven options: every reduction of every divergence but the max of the signed ``k1``."""
    for reduction_name, reduction in _REDUCTIONS.items():
        for divergence_name, divergence in _DIVERGENCES.items():
            if (reduction_name, divergence_name) != ("seq_max", "k1"):
                rule = RejectionRule(divergence, reduction, two_sided=divergence_name == "k1")
                register_rollout_rs_option(f"{reduction_name}_{divergence_name}", rule)


_register_verl_options()


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
    rules = {option: ROLLOUT_RS_REGISTRY.get(option) for option in options}
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
        token_values = rule.statistic(clamped)
        if rule.reduction is None:
            per_token, per_sequence = token_values, row_means(token_values, mask)
            keep = _inside(token_values, bounds[option])
        else:
            sequence_values = rule.reduction(token_values, mask)
            per_token = sequence_values.unsqueeze(-1).expand_as(token_values)
            per_sequence = sequence_values[valid.any(dim=-1)]
            keep = _inside(sequence_values, bounds[option]).unsqueeze(-1).expand_as(valid)
        metrics.update(compute_rs_metrics(option, per_token, per_sequence, keep, mask, bounds[option],
                                          sequence_level=rule.reduction is not None))
        keep_all = keep_all & keep
    rejected = ~keep_all & valid
    metrics["rollout_rs_masked_fraction"] = scalar(masked_mean(rejected.to(mask.dtype), mask))
    metrics["rollout_rs_seq_masked_fraction"] = share(rejected.any(dim=-1)[valid.any(dim=-1)])
    return torch.where(keep_all, response_mask, torch.zeros_like(response_mask)), metrics
