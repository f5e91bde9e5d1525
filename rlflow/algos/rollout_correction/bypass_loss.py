"""Bypass mode's policy loss (``bypass_mode``) and the REINFORCE loss it may use.

In bypass mode the old log-probs *are* the rollout's, so the loss sees two policies: the current
``pi`` and ``pi_rollout``. Per micro-batch it computes the rollout correction of ``pi`` against
``pi_rollout`` (weights, rejection, ``rollout_corr/*`` metrics; no gradient), then the
``loss_type`` (``BYPASS_LOSS_TYPE_REGISTRY``) on the rejection-masked tokens:

* ``ppo_clip``: the ``vanilla`` PPO loss with ``r = pi / pi_rollout``; the clipped ratio is the
  importance correction, so the IS weights are not applied again;
* ``reinforce``: ``-w A log pi`` with the (detached) IS weights ``w`` when ``rollout_is`` is set,
  plain REINFORCE otherwise; no ratio, no clip.

The settings come from ``config.policy_loss.rollout_correction`` (as in verl); the actor puts them
there from the batch's ``ROLLOUT_CORRECTION`` meta_info (``rlflow.meta_info``), which the actor-update
phase sets in bypass mode.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch

from rlflow.algos.aggregation import agg_loss
from rlflow.algos.config_view import aggregation_kwargs, policy_loss_value
from rlflow.algos.masked_ops import masked_mean
from rlflow.algos.policy_losses import POLICY_LOSS_REGISTRY, compute_policy_loss_vanilla
from rlflow.algos.rollout_correction.pipeline import compute_rollout_correction_and_rejection_mask
from rlflow.algos.rollout_correction.settings import correction_settings
from rlflow.config.validation import ConfigError
from rlflow.utils.registry import Registry

BYPASS_LOSS_MODE = "bypass_mode"
# (rollout_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, rollout_is_weights) -> (loss, metrics)
BypassLossFn = Callable[..., tuple[torch.Tensor, dict[str, float]]]
BYPASS_LOSS_TYPE_REGISTRY: Registry[BypassLossFn] = Registry(
    "bypass-mode loss type", "algorithm.rollout_correction.loss_type", error=ConfigError
)


def compute_policy_loss_reinforce(
    rollout_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "seq-mean-token-sum",
    config: Any = None,
    rollout_is_weights: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """REINFORCE ``-A log pi`` per token, times ``rollout_is_weights`` when given (verl's signature);
    ``actor/ppo_kl`` is the mean of ``log pi_rollout - log pi`` over the masked tokens."""
    token_losses = -advantages * log_prob
    if rollout_is_weights is not None:
        token_losses = token_losses * rollout_is_weights
    loss = agg_loss(token_losses, response_mask, loss_agg_mode, **aggregation_kwargs(config))
    return loss, {"actor/ppo_kl": float(masked_mean(rollout_log_prob - log_prob.detach(), response_mask))}


@BYPASS_LOSS_TYPE_REGISTRY.register("reinforce")
def _reinforce(rollout_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, rollout_is_weights):
    return compute_policy_loss_reinforce(rollout_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config,
                                         rollout_is_weights)


@BYPASS_LOSS_TYPE_REGISTRY.register("ppo_clip")
def _ppo_clip(rollout_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, rollout_is_weights):
    return compute_policy_loss_vanilla(rollout_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config)


@POLICY_LOSS_REGISTRY.register(BYPASS_LOSS_MODE)
def compute_policy_loss_bypass_mode(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The bypass-mode loss; ``old_log_prob`` holds the rollout's log-probs, ``rollout_is_weights`` is ignored
    (recomputed here from the current policy). Metrics: the loss type's ``actor/*`` and ``rollout_corr/*``."""
    source = policy_loss_value(config, "rollout_correction", None)
    if source is None:
        raise ValueError("the bypass_mode policy loss needs config.policy_loss.rollout_correction (the settings)")
    settings = correction_settings(source)
    with torch.no_grad():
        weights, kept_mask, metrics = compute_rollout_correction_and_rejection_mask(
            log_prob.detach(), old_log_prob, response_mask, settings.rollout_is, settings.rollout_is_threshold,
            settings.rollout_is_batch_normalize, settings.rollout_rs, settings.rollout_rs_threshold,
        )
    loss_type = BYPASS_LOSS_TYPE_REGISTRY.get(settings.loss_type)
    weight_tensor = None if weights is None else weights.batch["rollout_is_weights"]
    loss, loss_metrics = loss_type(old_log_prob, log_prob, advantages, kept_mask, loss_agg_mode, config, weight_tensor)
    return loss, {**loss_metrics, **metrics}
