"""The RL losses the roles hand to an engine, built from ``core_algos`` and the role's config.

Each builder returns an engine ``LossFn``: ``(outputs, micro_batch, ctx) -> (loss, metrics)``.
The loss is scaled with the engine's global counts (``LossContext``) so the accumulated
gradient is that of the whole mini-batch loss. A metric that is a share of the global loss
(already ``dp_size`` times its share) is multiplied by ``ctx.num_micro_batches``, so that the
engine's micro-batch mean and the controller's DP mean turn it back into the global value.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch

from rlflow.algos import agg_loss, compute_value_loss, get_policy_loss_fn, kl_penalty, masked_mean
from rlflow.algos.rollout_correction import BYPASS_LOSS_MODE, compute_rollout_correction_weights
from rlflow.engines.base import LossContext, LossFn
from rlflow.meta_info import OLD_LOG_PROBS_FROM_UPDATE, ROLLOUT_CORRECTION, ROLLOUT_IS_IN_LOSS
from rlflow.protocol import DataProto
from rlflow.roles.batch_views import response_length, response_slice, state_values_slice

def global_batch_info(ctx: LossContext) -> dict[str, int]:
    """``agg_loss`` keyword arguments for global normalization."""
    return {"dp_size": ctx.dp_size, "batch_num_tokens": ctx.global_num_tokens, "global_batch_size": ctx.global_num_seqs}


def _share(value: torch.Tensor, ctx: LossContext) -> float:
    return float(value.detach()) * ctx.num_micro_batches


def make_policy_loss_fn(actor_config: Any) -> LossFn:
    """PPO-family policy loss (``actor.policy_loss.loss_mode``) + entropy bonus + optional KL loss.

    The old log-probs are ``micro.batch["old_log_probs"]``, or the detached current ones when
    ``OLD_LOG_PROBS_FROM_UPDATE`` (``rlflow.meta_info``) is set in ``micro.meta_info``. Rollout correction: a
    batch's ``rollout_is_weights`` go to the loss as ``rollout_is_weights=``; with ``ROLLOUT_IS_IN_LOSS`` they
    are computed here, from the detached log-probs against the batch's ``rollout_log_probs``; a batch whose
    ``ROLLOUT_CORRECTION`` meta_info holds bypass-mode settings runs the ``bypass_mode``
    loss with them as ``config.policy_loss.rollout_correction``. Entropy, when the engine computed
    it, is reported as ``actor/entropy`` and enters the loss only with a non-zero ``entropy_coeff``.
    """
    policy_loss = get_policy_loss_fn(actor_config.policy_loss.loss_mode)
    bypass_loss = get_policy_loss_fn(BYPASS_LOSS_MODE)
    agg_mode = actor_config.loss_agg_mode
    plain_config = SimpleNamespace(**_plain(actor_config))  # once: attribute reads on a DictConfig are slow
    plain_policy_loss = _plain(actor_config.policy_loss)

    def loss_fn(outputs: dict[str, torch.Tensor], micro: DataProto, ctx: LossContext) -> tuple[torch.Tensor, dict]:
        length = response_length(micro)
        mask = micro.batch["response_mask"]
        log_prob = response_slice(outputs["log_probs"], length)
        info = global_batch_info(ctx)
        on_policy = OLD_LOG_PROBS_FROM_UPDATE.read(micro.meta_info)
        old_log_prob = log_prob.detach() if on_policy else micro.batch["old_log_probs"]
        bypass = ROLLOUT_CORRECTION.read(micro.meta_info)
        if bypass is None:
            policy_fn, loss_config = policy_loss, LossConfigView(plain_config, global_batch_info=info)
        else:
            settings = SimpleNamespace(**plain_policy_loss, rollout_correction=bypass)
            policy_fn, loss_config = bypass_loss, LossConfigView(plain_config, global_batch_info=info, policy_loss=settings)
        weights = _in_loss_is_weights(old_log_prob, micro, mask) if ROLLOUT_IS_IN_LOSS.read(micro.meta_info) \
            else micro.batch.get("rollout_is_weights")
        extra = {} if weights is None else {"rollout_is_weights": weights}
        pg_loss, metrics = policy_fn(old_log_prob, log_prob, micro.batch["advantages"], mask, agg_mode, loss_config, **extra)
        loss = pg_loss
        metrics = {**metrics, "actor/pg_loss": _share(pg_loss, ctx)}
        if "entropy" in outputs:
            entropy = agg_loss(response_slice(outputs["entropy"], length), mask, agg_mode, **info)
            metrics["actor/entropy"] = _share(entropy, ctx)
            if actor_config.entropy_coeff != 0:
                loss = loss - actor_config.entropy_coeff * entropy
        if actor_config.use_kl_loss:
            token_kl = kl_penalty(log_prob, micro.batch["ref_log_prob"], actor_config.kl_loss_type)
            kl_loss = agg_loss(token_kl, mask, agg_mode, **info)
            loss = loss + actor_config.kl_loss_coef * kl_loss
            metrics["actor/kl_loss"] = _share(kl_loss, ctx)
        return loss, metrics

    return loss_fn


def _in_loss_is_weights(old_log_prob: torch.Tensor, micro: DataProto, mask: torch.Tensor) -> torch.Tensor:
    """Decoupled rollout correction's IS weights of an on-policy micro-batch (its old log-probs are the update's)."""
    settings = ROLLOUT_IS_IN_LOSS.read(micro.meta_info)
    log_ratio = old_log_prob - micro.batch["rollout_log_probs"]
    weights, _ = compute_rollout_correction_weights(log_ratio, mask, settings["rollout_is"], settings["rollout_is_threshold"])
    return weights


def make_value_loss_fn(critic_config: Any) -> LossFn:
    """PPO's clipped value loss on the critic's response-state values."""

    def loss_fn(outputs: dict[str, torch.Tensor], micro: DataProto, ctx: LossContext) -> tuple[torch.Tensor, dict]:
        length = response_length(micro)
        mask = micro.batch["response_mask"]
        vpreds = state_values_slice(outputs["values"], length)
        vf_loss, clipfrac = compute_value_loss(
            vpreds,
            micro.batch["returns"],
            micro.batch["values"],
            mask,
            critic_config.cliprange_value,
            critic_config.loss_agg_mode,
            global_batch_info=global_batch_info(ctx),
        )
        metrics = {
            "critic/vf_loss": _share(vf_loss, ctx),
            "critic/vf_clipfrac": float(clipfrac),
            "critic/vpred_mean": float(masked_mean(vpreds.detach(), mask)),
        }
        return vf_loss, metrics

    return loss_fn


class LossConfigView:
    """The actor config as a policy loss reads it, with this micro-batch's ``global_batch_info`` (and any other
    attribute given here) in front.

    Attribute reads fall through to the config, which is converted once per role, not per micro-batch.
    """

    def __init__(self, config: Any, **overrides: Any) -> None:
        self._config = config
        self.__dict__.update(overrides)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._config, name)


def _plain(config: Any) -> dict[str, Any]:
    """Top-level fields of an OmegaConf node / dataclass / namespace as attributes for core_algos."""
    if hasattr(config, "items"):
        return {key: value for key, value in config.items()}
    return dict(vars(config))
