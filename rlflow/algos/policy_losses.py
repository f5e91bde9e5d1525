"""Registered policy losses (``actor.policy_loss.loss_mode``).

Every loss is called as ``fn(old_log_prob, log_prob, advantages, response_mask,
loss_agg_mode, config, rollout_is_weights=None) -> (loss, metrics)``; ``config`` is the actor
config (any attribute object) and ``metrics`` maps ``actor/...`` names to floats. Aggregation
uses the global counts in ``config.global_batch_info`` when the caller sets them. Rollout
correction's ``rollout_is_weights`` ``[B, T]`` (detached), when given, multiply the per-token
losses before aggregation, as in verl (``geo_mean``: their per-sequence geometric mean
multiplies each sequence's loss).
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch

from rlflow.algos.aggregation import agg_loss
from rlflow.algos.config_view import (
    DEFAULT_CLIP_RATIO_C,
    DEFAULT_TAU_NEG,
    DEFAULT_TAU_POS,
    aggregation_kwargs,
    clip_bounds,
    config_value,
    policy_loss_value,
)
from rlflow.algos.masked_ops import as_float_mask, masked_mean, masked_sum
from rlflow.algos.ppo_clip import LOG_RATIO_CLAMP, ppo_clip_token_losses
from rlflow.utils.registry import Registry

PolicyLossFn = Callable[..., tuple[torch.Tensor, dict[str, float]]]
POLICY_LOSS_REGISTRY: Registry[PolicyLossFn] = Registry("policy loss", "actor.policy_loss.loss_mode")

GSPO_LOG_RATIO_MAX = 10.0
SEQUENCE_LEVEL_AGG_MODE = "seq-mean-token-mean"
GEO_MEAN_WEIGHT_EPS = 1e-10  # log(max(w, eps)): a zero IS weight (masked IS) gives a tiny, finite sequence weight


def get_policy_loss_fn(name: str) -> PolicyLossFn:
    """The policy loss registered under ``name``; an unknown name lists the registered ones."""
    return POLICY_LOSS_REGISTRY.get(name)


def _metrics(**values: torch.Tensor | float) -> dict[str, float]:
    return {f"actor/{key}": float(torch.as_tensor(value).detach()) for key, value in values.items()}


def _weighted(token_losses: torch.Tensor, rollout_is_weights: Optional[torch.Tensor]) -> torch.Tensor:
    """Per-token losses times rollout correction's importance weights, when there are any."""
    return token_losses if rollout_is_weights is None else token_losses * rollout_is_weights


def _clamped_log_ratio(old_log_prob: torch.Tensor, log_prob: torch.Tensor) -> torch.Tensor:
    return torch.clamp(log_prob - old_log_prob, min=-LOG_RATIO_CLAMP, max=LOG_RATIO_CLAMP)


@POLICY_LOSS_REGISTRY.register("vanilla")
def compute_policy_loss_vanilla(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Dual-clip PPO with clip-higher (see ``ppo_clip``); keys ``clip_ratio*``."""
    low, high = clip_bounds(config, "vanilla")
    clip_ratio_c = config_value(config, "clip_ratio_c", DEFAULT_CLIP_RATIO_C)
    terms = ppo_clip_token_losses(old_log_prob, log_prob, advantages, response_mask, low, high, clip_ratio_c)
    token_losses = _weighted(terms.token_losses, rollout_is_weights)
    loss = agg_loss(token_losses, response_mask, loss_agg_mode, **aggregation_kwargs(config))
    return loss, _metrics(pg_clipfrac=terms.clipfrac, ppo_kl=terms.ppo_kl, pg_clipfrac_lower=terms.clipfrac_lower)


@POLICY_LOSS_REGISTRY.register("gspo")
def compute_policy_loss_gspo(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = SEQUENCE_LEVEL_AGG_MODE,
    config: Any = None,
    rollout_is_weights: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """GSPO (arXiv:2507.18071): PPO clip on the length-normalized sequence ratio.

    Token ratio ``s_i * pi(y_t) / sg(pi(y_t))`` with ``s_i = exp(mean_t log(pi/pi_old))`` (stop-gradient);
    the paper's aggregation is ``seq-mean-token-mean``.
    """
    low, high = clip_bounds(config, "gspo")
    mask = as_float_mask(response_mask, log_prob)
    log_ratio = log_prob - old_log_prob
    sequence_log_ratio = masked_sum(log_ratio, mask, dim=-1) / mask.sum(dim=-1).clamp(min=1)
    token_log_ratio = log_prob - log_prob.detach() + sequence_log_ratio.detach().unsqueeze(-1)
    ratio = torch.exp(torch.clamp(token_log_ratio, max=GSPO_LOG_RATIO_MAX))
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - low, 1.0 + high)
    token_losses = _weighted(torch.maximum(unclipped, clipped), rollout_is_weights)
    loss = agg_loss(token_losses, mask, loss_agg_mode, **aggregation_kwargs(config))
    return loss, _metrics(
        pg_clipfrac=masked_mean((clipped > unclipped).to(mask.dtype), mask),
        ppo_kl=masked_mean(-log_ratio, mask),
        pg_clipfrac_lower=0.0,
    )


@POLICY_LOSS_REGISTRY.register("sapo")
def compute_policy_loss_sapo(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = SEQUENCE_LEVEL_AGG_MODE,
    config: Any = None,
    rollout_is_weights: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """SAPO (arXiv:2511.20347): soft gate ``(4/tau) sigmoid(tau (r - 1))`` instead of a hard clip.

    ``tau = tau_pos`` where ``A > 0`` else ``tau_neg``; always aggregated ``seq-mean-token-mean``, as in verl.
    """
    tau_pos = float(config_value(config, "tau_pos", DEFAULT_TAU_POS))
    tau_neg = float(config_value(config, "tau_neg", DEFAULT_TAU_NEG))
    if tau_pos <= 0 or tau_neg <= 0:
        raise ValueError(f"sapo needs actor.tau_pos and actor.tau_neg > 0, got {tau_pos}, {tau_neg}")
    log_ratio = _clamped_log_ratio(old_log_prob, log_prob)
    ratio = torch.exp(log_ratio)
    tau = torch.where(advantages > 0, torch.full_like(ratio, tau_pos), torch.full_like(ratio, tau_neg))
    gate = torch.sigmoid(tau * (ratio - 1.0)) * (4.0 / tau)
    token_losses = _weighted(-gate * advantages, rollout_is_weights)
    loss = agg_loss(token_losses, response_mask, SEQUENCE_LEVEL_AGG_MODE, **aggregation_kwargs(config))
    return loss, _metrics(pg_clipfrac=0.0, ppo_kl=masked_mean(-log_ratio, response_mask), pg_clipfrac_lower=0.0)


@POLICY_LOSS_REGISTRY.register("cispo")
def compute_policy_loss_cispo(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """CISPO (MiniMax-M1): ``-sg(clip(r, 1 - eps_low, 1 + eps_high)) * A * log_prob``; every token keeps a gradient."""
    low, high = clip_bounds(config, "cispo")
    log_ratio = _clamped_log_ratio(old_log_prob, log_prob)
    ratio = torch.exp(log_ratio)
    weight = torch.clamp(ratio, 1.0 - low, 1.0 + high).detach()
    token_losses = _weighted(-weight * advantages * log_prob, rollout_is_weights)
    loss = agg_loss(token_losses, response_mask, loss_agg_mode, **aggregation_kwargs(config))
    return loss, _metrics(
        pg_clipfrac=masked_mean((ratio != weight).to(ratio.dtype), response_mask),
        ppo_kl=masked_mean(-log_ratio, response_mask),
        pg_clipfrac_lower=0.0,
    )


@POLICY_LOSS_REGISTRY.register("geo_mean")
def compute_policy_loss_geo_mean(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """GMPO (arXiv:2507.20673): clip each token's log-ratio, then use the geometric-mean sequence ratio.

    Per sequence ``-mean_t(A) * exp(mean_t(sign(A) min(sign(A) d, sign(A) clip(d, -eps_low, eps_high))))``;
    the mean over non-empty sequences ignores ``loss_agg_mode`` (sequence-level advantages only).
    """
    low, high = clip_bounds(config, "geo_mean")
    mask = as_float_mask(response_mask, log_prob)
    lengths = mask.sum(dim=-1).clamp(min=1)
    log_ratio = log_prob - old_log_prob
    clipped_log_ratio = torch.clamp(log_ratio, -low, high)
    sign = torch.sign(advantages)
    pessimistic = sign * torch.minimum(sign * log_ratio, sign * clipped_log_ratio)
    sequence_ratio = torch.exp(masked_sum(pessimistic, mask, dim=-1) / lengths)
    sequence_advantage = masked_sum(advantages, mask, dim=-1) / lengths
    sequence_losses = (-sequence_advantage * sequence_ratio).unsqueeze(-1)
    if rollout_is_weights is not None:  # one weight per sequence: the geometric mean of its token weights
        log_weights = masked_sum(torch.log(rollout_is_weights.clamp(min=GEO_MEAN_WEIGHT_EPS)), mask, dim=-1) / lengths
        sequence_losses = sequence_losses * torch.exp(log_weights).unsqueeze(-1)
    non_empty = (mask.sum(dim=-1, keepdim=True) > 0).to(mask.dtype)
    loss = agg_loss(sequence_losses, non_empty, "seq-mean-token-sum", **aggregation_kwargs(config))
    was_clipped = (log_ratio != clipped_log_ratio).to(mask.dtype)
    return loss, _metrics(
        pg_clipfrac=masked_mean(was_clipped * (advantages > 0), mask),
        ppo_kl=masked_mean(-log_ratio, mask),
        pg_clipfrac_lower=masked_mean(was_clipped * (advantages < 0), mask),
    )


@POLICY_LOSS_REGISTRY.register("gpg")
def compute_policy_loss_gpg(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """GPG (arXiv:2504.02546): plain policy gradient ``-A * log_prob``, no ratio and no clip."""
    token_losses = _weighted(-advantages * log_prob, rollout_is_weights)
    loss = agg_loss(token_losses, response_mask, loss_agg_mode, **aggregation_kwargs(config))
    return loss, {}


@POLICY_LOSS_REGISTRY.register("clip_cov")
def compute_policy_loss_clip_cov(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Clip-Cov (arXiv:2505.22617): PPO clip, plus a random ``clip_cov_ratio`` share of the tokens
    whose ``cov = (A - mean A)(log_prob - mean log_prob)`` lies in ``(clip_cov_lb, clip_cov_ub)``
    lose their gradient. Keys ``actor.policy_loss.clip_cov_{ratio,lb,ub}``.
    """
    low, high = clip_bounds(config, "clip_cov")
    cov_ratio = float(policy_loss_value(config, "clip_cov_ratio", 0.0002))
    cov_lb = float(policy_loss_value(config, "clip_cov_lb", 1.0))
    cov_ub = float(policy_loss_value(config, "clip_cov_ub", 5.0))
    if cov_ratio <= 0:
        raise ValueError(f"actor.policy_loss.clip_cov_ratio must be > 0, got {cov_ratio}")
    valid = as_float_mask(response_mask, log_prob) > 0
    log_ratio = log_prob - old_log_prob
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - low, 1.0 + high)
    with torch.no_grad():
        cov = (advantages - masked_mean(advantages, valid)) * (log_prob - masked_mean(log_prob, valid))
        candidates = valid & ~(clipped > unclipped) & (cov > cov_lb) & (cov < cov_ub)
        candidate_idx = torch.nonzero(candidates.reshape(-1)).squeeze(-1)
        num_detached = max(int(cov_ratio * int(valid.sum())), 1)
        order = torch.randperm(candidate_idx.numel(), device=candidate_idx.device)
        keep_gradient = torch.ones(valid.numel(), dtype=log_prob.dtype, device=log_prob.device)
        keep_gradient[candidate_idx[order[:num_detached]]] = 0.0
        keep_gradient = keep_gradient.reshape(valid.shape)
    token_losses = _weighted(torch.maximum(unclipped, clipped) * keep_gradient, rollout_is_weights)
    loss = agg_loss(token_losses, response_mask, loss_agg_mode, **aggregation_kwargs(config))
    return loss, _metrics(
        pg_clipfrac=masked_mean((keep_gradient == 0).to(ratio.dtype), valid),
        ppo_kl=masked_mean(-log_ratio, valid),
    )


@POLICY_LOSS_REGISTRY.register("kl_cov")
def compute_policy_loss_kl_cov(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """KL-Cov (arXiv:2505.22617): unclipped ``-A r``, plus ``ppo_kl_coef * |log r|`` on the top
    ``kl_cov_ratio`` share of tokens by covariance. Keys ``actor.policy_loss.{kl_cov_ratio,ppo_kl_coef}``.
    """
    cov_ratio = float(policy_loss_value(config, "kl_cov_ratio", 0.0002))
    kl_coef = float(policy_loss_value(config, "ppo_kl_coef", 1.0))
    if cov_ratio <= 0:
        raise ValueError(f"actor.policy_loss.kl_cov_ratio must be > 0, got {cov_ratio}")
    valid = as_float_mask(response_mask, log_prob) > 0
    log_ratio = log_prob - old_log_prob
    token_losses = -advantages * torch.exp(log_ratio)
    num_valid = int(valid.sum())
    if num_valid > 0:
        with torch.no_grad():
            valid_idx = torch.nonzero(valid.reshape(-1)).squeeze(-1)
            valid_adv = advantages.reshape(-1)[valid_idx]
            valid_logp = log_prob.reshape(-1)[valid_idx]
            cov = (valid_adv - valid_adv.mean()) * (valid_logp - valid_logp.mean())
            top = torch.topk(cov, max(1, int(num_valid * cov_ratio))).indices
            penalized = torch.zeros(valid.numel(), dtype=log_prob.dtype, device=log_prob.device)
            penalized[valid_idx[top]] = 1.0
        token_losses = token_losses + kl_coef * log_ratio.abs() * penalized.reshape(valid.shape)
    token_losses = _weighted(token_losses, rollout_is_weights)
    loss = agg_loss(token_losses, response_mask, loss_agg_mode, **aggregation_kwargs(config))
    return loss, _metrics(ppo_kl=masked_mean(log_ratio.abs(), valid))
