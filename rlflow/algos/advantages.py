"""Advantage estimators: token rewards (+ values or group ids) -> (advantages, returns).

Each estimator is registered under the name used by ``algorithm.adv_estimator`` and returns
two ``(batch, response_len)`` tensors that are zero outside ``response_mask``. Semantics
follow verl 0.9.1 (``verl/trainer/ppo/core_algos.py``); the group statistics are vectorized.

``compute_advantage(name, **inputs)`` calls an estimator with the subset of ``inputs`` its
signature accepts, so the driver has one call site for every estimator.
"""

from __future__ import annotations

import inspect
from enum import Enum
from typing import Any, Callable, Sequence

import numpy as np
import torch

from rlflow.algos.grouping import group_rows
from rlflow.algos.masked_ops import as_float_mask, masked_whiten
from rlflow.utils.registry import Registry, as_name

AdvantageFn = Callable[..., tuple[torch.Tensor, torch.Tensor]]
ADV_ESTIMATOR_REGISTRY: Registry[AdvantageFn] = Registry("advantage estimator", "algorithm.adv_estimator")


class AdvantageEstimator(str, Enum):
    """The built-in estimator names (plain strings work everywhere too)."""

    GAE = "gae"
    GRPO = "grpo"
    RLOO = "rloo"
    REINFORCE_PLUS_PLUS = "reinforce_plus_plus"
    REINFORCE_PLUS_PLUS_BASELINE = "reinforce_plus_plus_baseline"
    REMAX = "remax"
    OPO = "opo"
    GPG = "gpg"


def get_adv_estimator_fn(name_or_enum: str | AdvantageEstimator) -> AdvantageFn:
    """The estimator registered under ``name_or_enum``; an unknown name lists the registered ones."""
    return ADV_ESTIMATOR_REGISTRY.get(name_or_enum)


def _check_token_shapes(token_level_rewards: torch.Tensor, response_mask: torch.Tensor, **others: Any) -> None:
    if token_level_rewards.dim() != 2:
        raise ValueError(f"token_level_rewards must be (batch, response_len), got {tuple(token_level_rewards.shape)}")
    for name, tensor in {"response_mask": response_mask, **others}.items():
        if tensor.shape != token_level_rewards.shape:
            raise ValueError(
                f"{name} shape {tuple(tensor.shape)} must match token_level_rewards {tuple(token_level_rewards.shape)}"
            )


def _broadcast_outcome(per_row: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One scalar per response spread over its tokens; used as both advantages and returns."""
    advantages = per_row.unsqueeze(-1) * mask
    return advantages, advantages


@ADV_ESTIMATOR_REGISTRY.register(AdvantageEstimator.GAE)
@torch.no_grad()
def compute_gae_advantage_return(
    token_level_rewards: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    gamma: float,
    lam: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE(gamma, lambda); masked tokens are skipped (values and TD errors carry across them).

    ``returns = A + V`` before whitening; the advantages are whitened over the masked tokens.
    """
    _check_token_shapes(token_level_rewards, response_mask, values=values)
    mask = as_float_mask(response_mask, token_level_rewards) > 0
    batch, length = token_level_rewards.shape
    next_value = token_level_rewards.new_zeros(batch)
    running = token_level_rewards.new_zeros(batch)
    raw_advantages = torch.empty_like(token_level_rewards)
    for t in reversed(range(length)):
        delta = token_level_rewards[:, t] + gamma * next_value - values[:, t]
        running = torch.where(mask[:, t], delta + gamma * lam * running, running)
        next_value = torch.where(mask[:, t], values[:, t], next_value)
        raw_advantages[:, t] = running
    float_mask = mask.to(token_level_rewards.dtype)
    returns = (raw_advantages + values) * float_mask
    advantages = masked_whiten(raw_advantages, float_mask) * float_mask
    return advantages, returns


@ADV_ESTIMATOR_REGISTRY.register(AdvantageEstimator.GRPO)
@torch.no_grad()
def compute_grpo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Sequence | np.ndarray,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO: ``(R - mean_group) / (std_group + eps)``; Dr.GRPO drops the std when the flag is off.

    ``R`` is the sum of the token rewards; std is unbiased; a group of one has mean 0, std 1.
    """
    _check_token_shapes(token_level_rewards, response_mask)
    scores = token_level_rewards.sum(dim=-1)
    groups = group_rows(index, scores)
    multi = groups.sizes > 1
    mean = torch.where(multi, groups.mean(scores), torch.zeros_like(groups.sizes))
    std = torch.where(multi, groups.std(scores), torch.ones_like(groups.sizes))
    centered = scores - mean[groups.ids]
    per_row = centered / (std[groups.ids] + epsilon) if norm_adv_by_std_in_grpo else centered
    return _broadcast_outcome(per_row, as_float_mask(response_mask, token_level_rewards))


@ADV_ESTIMATOR_REGISTRY.register(AdvantageEstimator.RLOO)
@torch.no_grad()
def compute_rloo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Sequence | np.ndarray,
    epsilon: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor]:
    """RLOO: ``R_i - mean of the other responses' R`` (= ``n/(n-1) (R_i - mean)``); a group of one keeps ``R``."""
    _check_token_shapes(token_level_rewards, response_mask)
    scores = token_level_rewards.sum(dim=-1)
    groups = group_rows(index, scores)
    sizes = groups.row_sizes()
    leave_one_out = (scores * sizes - groups.sum(scores)[groups.ids]) / (sizes - 1).clamp(min=1)
    per_row = torch.where(sizes > 1, leave_one_out, scores)
    return _broadcast_outcome(per_row, as_float_mask(response_mask, token_level_rewards))


@ADV_ESTIMATOR_REGISTRY.register(AdvantageEstimator.REINFORCE_PLUS_PLUS)
@torch.no_grad()
def compute_reinforce_plus_plus_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    gamma: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++: discounted returns (reset at masked tokens), whitened over the masked tokens."""
    _check_token_shapes(token_level_rewards, response_mask)
    mask = as_float_mask(response_mask, token_level_rewards)
    returns = torch.empty_like(token_level_rewards)
    running = token_level_rewards.new_zeros(token_level_rewards.shape[0])
    for t in reversed(range(token_level_rewards.shape[1])):
        running = token_level_rewards[:, t] + gamma * running
        returns[:, t] = running
        running = torch.where(mask[:, t] > 0, running, torch.zeros_like(running))
    advantages = masked_whiten(returns, mask) * mask
    return advantages, returns * mask


@ADV_ESTIMATOR_REGISTRY.register(AdvantageEstimator.REINFORCE_PLUS_PLUS_BASELINE)
@torch.no_grad()
def compute_reinforce_plus_plus_baseline_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Sequence | np.ndarray,
    epsilon: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++ with baseline: ``R - mean_group`` (0 for a group of one), then batch whitening."""
    _check_token_shapes(token_level_rewards, response_mask)
    scores = token_level_rewards.sum(dim=-1)
    groups = group_rows(index, scores)
    mean = torch.where(groups.sizes > 1, groups.mean(scores), torch.zeros_like(groups.sizes))
    mask = as_float_mask(response_mask, token_level_rewards)
    centered = (scores - mean[groups.ids]).unsqueeze(-1) * mask
    advantages = masked_whiten(centered, mask) * mask
    return advantages, advantages


@ADV_ESTIMATOR_REGISTRY.register(AdvantageEstimator.REMAX)
@torch.no_grad()
def compute_remax_outcome_advantage(
    token_level_rewards: torch.Tensor,
    reward_baselines: torch.Tensor,
    response_mask: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """ReMax: reward-to-go minus the greedy response's reward (``reward_baselines``, one per row)."""
    _check_token_shapes(token_level_rewards, response_mask)
    if reward_baselines.shape != token_level_rewards.shape[:1]:
        raise ValueError(
            f"reward_baselines must hold one value per row: got {tuple(reward_baselines.shape)} "
            f"for {token_level_rewards.shape[0]} rows"
        )
    mask = as_float_mask(response_mask, token_level_rewards)
    returns = (token_level_rewards * mask).flip(-1).cumsum(-1).flip(-1) * mask
    advantages = (returns - reward_baselines.unsqueeze(-1)) * mask
    return advantages, returns


@ADV_ESTIMATOR_REGISTRY.register(AdvantageEstimator.OPO)
@torch.no_grad()
def compute_opo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Sequence | np.ndarray,
    epsilon: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor]:
    """OPO: ``R - sum(len * R) / sum(len)`` over the group (length-weighted baseline; 0 for a group of one)."""
    _check_token_shapes(token_level_rewards, response_mask)
    mask = as_float_mask(response_mask, token_level_rewards)
    scores = token_level_rewards.sum(dim=-1)
    lengths = mask.sum(dim=-1)
    groups = group_rows(index, scores)
    total_length = groups.sum(lengths)
    weighted = groups.sum(lengths * scores) / torch.where(total_length > 0, total_length, torch.ones_like(total_length))
    baseline = torch.where(groups.sizes > 1, weighted, torch.zeros_like(weighted))
    return _broadcast_outcome(scores - baseline[groups.ids], mask)


@ADV_ESTIMATOR_REGISTRY.register(AdvantageEstimator.GPG)
@torch.no_grad()
def compute_gpg_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Sequence | np.ndarray,
    epsilon: float = 1e-6,
    f_norm: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GPG: ``alpha * (R - mean_group) / f_norm`` with ``alpha = batch / #rows with R != 0``."""
    _check_token_shapes(token_level_rewards, response_mask)
    scores = token_level_rewards.sum(dim=-1)
    groups = group_rows(index, scores)
    alpha = scores.shape[0] / torch.count_nonzero(scores).clamp(min=1).to(scores.dtype)
    mean = torch.where(groups.sizes > 1, groups.mean(scores), torch.zeros_like(groups.sizes))
    per_row = alpha * (scores - mean[groups.ids]) / f_norm
    return _broadcast_outcome(per_row, as_float_mask(response_mask, token_level_rewards))


def compute_advantage(adv_estimator: str | AdvantageEstimator, **inputs: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """Run the registered estimator with the ``inputs`` its signature names.

    Pass everything the driver has (``token_level_rewards``, ``response_mask``, ``values``,
    ``index``, ``reward_baselines``, ``gamma``, ``lam``, ``norm_adv_by_std_in_grpo`` ...);
    an estimator taking ``**kwargs`` receives all of them. ``None`` counts as absent; a
    required input that is absent raises ``ValueError`` naming it.
    """
    fn = get_adv_estimator_fn(adv_estimator)
    inputs = {name: value for name, value in inputs.items() if value is not None}
    parameters = inspect.signature(fn).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return fn(**inputs)
    named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    required = [name for name, p in parameters.items() if p.kind in named and p.default is inspect.Parameter.empty]
    missing = [name for name in required if name not in inputs]
    if missing:
        raise ValueError(
            f"advantage estimator {as_name(adv_estimator)!r} needs {missing}; the batch provides {sorted(inputs)}"
        )
    return fn(**{name: value for name, value in inputs.items() if name in parameters})
