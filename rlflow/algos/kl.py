"""Per-token KL estimators between the policy and the reference policy, and KL-in-reward.

Estimators (Schulman, "Approximating KL divergence", 2020), with ``d = logprob - ref_logprob``:

* ``kl`` / ``k1``: ``d``
* ``abs``: ``|d|``
* ``mse`` / ``k2``: ``d^2 / 2``
* ``low_var_kl`` / ``k3``: ``exp(-d) + d - 1``, with ``-d`` clamped to [-20, 20] and the result to [-10, 10]

A ``+`` suffix (``k3+``, ``low_var_kl+``, ``k1+`` ...) keeps the named estimator's value but
back-propagates the k2 gradient ``d`` (straight-through), which is the unbiased gradient of
KL for on-policy samples. ``full`` would need whole-vocabulary distributions and is refused.
"""

from __future__ import annotations

from typing import Callable

import torch

from rlflow.algos.kl_control import KLController
from rlflow.algos.masked_ops import as_float_mask, masked_mean
from rlflow.utils.registry import Registry

KLEstimatorFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
KL_ESTIMATOR_REGISTRY: Registry[KLEstimatorFn] = Registry(
    "KL estimator", "algorithm.kl_penalty / actor.kl_loss_type"
)

STRAIGHT_THROUGH_SUFFIX = "+"
LOG_RATIO_CLAMP = 20.0
LOW_VAR_KL_CLAMP = 10.0


@KL_ESTIMATOR_REGISTRY.register("kl", "k1")
def kl_k1(logprob: torch.Tensor, ref_logprob: torch.Tensor) -> torch.Tensor:
    """``log p - log q``: unbiased for KL(p||q) on samples from p, high variance."""
    return logprob - ref_logprob


@KL_ESTIMATOR_REGISTRY.register("abs")
def kl_abs(logprob: torch.Tensor, ref_logprob: torch.Tensor) -> torch.Tensor:
    """``|log p - log q|``."""
    return (logprob - ref_logprob).abs()


@KL_ESTIMATOR_REGISTRY.register("mse", "k2")
def kl_k2(logprob: torch.Tensor, ref_logprob: torch.Tensor) -> torch.Tensor:
    """``(log p - log q)^2 / 2``: biased value, but its gradient is the KL gradient."""
    return 0.5 * (logprob - ref_logprob).square()


@KL_ESTIMATOR_REGISTRY.register("low_var_kl", "k3")
def kl_k3(logprob: torch.Tensor, ref_logprob: torch.Tensor) -> torch.Tensor:
    """``q/p - log(q/p) - 1``: unbiased and non-negative; clamped like verl for stability."""
    log_ratio = torch.clamp(ref_logprob - logprob, min=-LOG_RATIO_CLAMP, max=LOG_RATIO_CLAMP)
    estimate = torch.exp(log_ratio) - log_ratio - 1
    return torch.clamp(estimate, min=-LOW_VAR_KL_CLAMP, max=LOW_VAR_KL_CLAMP)


@KL_ESTIMATOR_REGISTRY.register("full")
def kl_full(logprob: torch.Tensor, ref_logprob: torch.Tensor) -> torch.Tensor:
    """Exact KL over the vocabulary: not supported, since only sampled-token log-probs are available."""
    raise NotImplementedError(
        "kl_penalty='full' needs the whole-vocabulary distributions, but rlflow passes sampled-token "
        "log-probs only; use one of kl/k1, abs, mse/k2, low_var_kl/k3, optionally with a '+' suffix "
        "(e.g. k3+) for the k2 gradient"
    )


def _straight_through_k2(value: torch.Tensor, logprob: torch.Tensor, ref_logprob: torch.Tensor) -> torch.Tensor:
    """``value`` in the forward pass, the k2 gradient in the backward pass."""
    surrogate = kl_k2(logprob, ref_logprob)
    return surrogate - surrogate.detach() + value.detach()


def kl_penalty(logprob: torch.Tensor, ref_logprob: torch.Tensor, kl_penalty: str) -> torch.Tensor:
    """Per-token KL estimate named by ``kl_penalty`` (verl's ``kl_penalty``), same shape as the inputs."""
    if logprob.shape != ref_logprob.shape:
        raise ValueError(f"logprob shape {tuple(logprob.shape)} != ref_logprob shape {tuple(ref_logprob.shape)}")
    straight_through = kl_penalty.endswith(STRAIGHT_THROUGH_SUFFIX)
    base_name = kl_penalty[: -len(STRAIGHT_THROUGH_SUFFIX)] if straight_through else kl_penalty
    value = KL_ESTIMATOR_REGISTRY.get(base_name)(logprob, ref_logprob)
    return _straight_through_k2(value, logprob, ref_logprob) if straight_through else value


def kl_estimator_names() -> list[str]:
    """Valid ``kl_penalty`` names (each also accepts the ``+`` suffix)."""
    return KL_ESTIMATOR_REGISTRY.names()


def compute_rewards(
    token_level_scores: torch.Tensor,
    old_log_prob: torch.Tensor,
    ref_log_prob: torch.Tensor,
    kl_ratio: float,
) -> torch.Tensor:
    """Token rewards with the k1 KL penalty: ``scores - kl_ratio * (old_log_prob - ref_log_prob)``."""
    return token_level_scores - kl_ratio * (old_log_prob - ref_log_prob)


def apply_kl_penalty(
    token_level_scores: torch.Tensor,
    old_log_prob: torch.Tensor,
    ref_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    kl_ctrl: KLController,
    kl_penalty_type: str = "kl",
) -> tuple[torch.Tensor, dict[str, float]]:
    """KL-in-reward (``algorithm.use_kl_in_reward``): ``rewards = scores - beta * KL`` on response tokens.

    ``beta`` is ``kl_ctrl.value`` before this call; the controller is then updated with the batch's
    mean per-sequence KL and ``n_steps = batch size``. Returns the rewards and the metrics
    ``actor/reward_kl_penalty`` (that KL) and ``actor/reward_kl_penalty_coeff`` (beta).
    """
    mask = as_float_mask(response_mask, token_level_scores)
    token_kl = kl_penalty(old_log_prob, ref_log_prob, kl_penalty_type) * mask
    beta = float(kl_ctrl.value)
    rewards = token_level_scores - beta * token_kl
    current_kl = float(masked_mean(token_kl, mask, dim=-1).mean()) if token_kl.shape[0] else 0.0
    kl_ctrl.update(current_kl=current_kl, n_steps=token_kl.shape[0])
    return rewards, {"actor/reward_kl_penalty": current_kl, "actor/reward_kl_penalty_coeff": beta}

