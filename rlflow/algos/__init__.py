"""The numerical core of RL post-training: advantages, policy/value/entropy losses, KL, aggregation.

Pure torch on any device, no worker or Ray dependency. Names and signatures follow verl 0.9.1
(``verl.trainer.ppo.core_algos``) so a verl function carries over; it is registered the rlflow way
(``@ADV_ESTIMATOR_REGISTRY.register("x")`` where verl writes ``@register_adv_est("x")``, see
docs/registries.md). Every family is a registry:

| family | register | look up | config key |
|---|---|---|---|
| advantage estimators | ``ADV_ESTIMATOR_REGISTRY`` | ``get_adv_estimator_fn`` | ``algorithm.adv_estimator`` |
| policy losses | ``POLICY_LOSS_REGISTRY`` | ``get_policy_loss_fn`` | ``actor.policy_loss.loss_mode`` |
| KL estimators | ``KL_ESTIMATOR_REGISTRY`` | ``kl_penalty`` | ``algorithm.kl_penalty``, ``actor.kl_loss_type`` |
| aggregation modes | ``LOSS_AGG_REGISTRY`` | ``agg_loss`` | ``actor.loss_agg_mode`` |
| KL controllers | ``KL_CONTROLLER_REGISTRY`` | ``get_kl_controller`` | ``algorithm.kl_ctrl.type`` |
| rollout IS levels | ``ROLLOUT_IS_LEVEL_REGISTRY`` | ``compute_rollout_correction_weights`` | ``algorithm.rollout_correction.rollout_is`` |
| rollout rejection divergences, reductions | ``ROLLOUT_RS_DIVERGENCE_REGISTRY``, ``ROLLOUT_RS_REDUCTION_REGISTRY`` | ``compute_rollout_rejection_mask`` (options ``<reduction>_<divergence>``) | ``algorithm.rollout_correction.rollout_rs`` |

A new variant is one function under ``@<FAMILY>_REGISTRY.register("name")``.

See docs/algorithms.md for the formulas.
"""

from rlflow.algos.advantages import (
    ADV_ESTIMATOR_REGISTRY,
    AdvantageEstimator,
    compute_advantage,
    compute_gae_advantage_return,
    compute_gpg_outcome_advantage,
    compute_grpo_outcome_advantage,
    compute_opo_outcome_advantage,
    compute_reinforce_plus_plus_baseline_outcome_advantage,
    compute_reinforce_plus_plus_outcome_advantage,
    compute_remax_outcome_advantage,
    compute_rloo_outcome_advantage,
    get_adv_estimator_fn,
)
from rlflow.algos.aggregation import (
    GLOBAL_BATCH_INFO_KEYS,
    LOSS_AGG_REGISTRY,
    agg_loss,
    loss_agg_modes,
)
from rlflow.algos.entropy import compute_entropy_loss, entropy_from_logits
from rlflow.algos.kl import (
    KL_ESTIMATOR_REGISTRY,
    apply_kl_penalty,
    compute_rewards,
    kl_estimator_names,
    kl_penalty,
)
from rlflow.algos.kl_control import (
    KL_CONTROLLER_REGISTRY,
    AdaptiveKLController,
    FixedKLController,
    KLController,
    get_kl_controller,
)
from rlflow.algos.masked_ops import masked_mean, masked_sum, masked_var, masked_whiten
from rlflow.algos.policy_losses import (
    POLICY_LOSS_REGISTRY,
    compute_policy_loss_cispo,
    compute_policy_loss_clip_cov,
    compute_policy_loss_geo_mean,
    compute_policy_loss_gpg,
    compute_policy_loss_gspo,
    compute_policy_loss_kl_cov,
    compute_policy_loss_sapo,
    compute_policy_loss_vanilla,
    get_policy_loss_fn,
)
from rlflow.algos.ppo_clip import compute_policy_loss, ppo_clip_token_losses
from rlflow.algos.rollout_correction import (
    ROLLOUT_IS_LEVEL_REGISTRY,
    ROLLOUT_RS_DIVERGENCE_REGISTRY,
    ROLLOUT_RS_REDUCTION_REGISTRY,
    check_rollout_correction,
    compute_offpolicy_metrics,
    compute_policy_loss_bypass_mode,
    compute_policy_loss_reinforce,
    compute_rollout_correction_and_add_to_batch,
    compute_rollout_correction_and_rejection_mask,
    compute_rollout_correction_weights,
    compute_rollout_rejection_mask,
    rollout_rs_options,
)
from rlflow.utils.registry import Registry
from rlflow.algos.value import compute_value_loss

__all__ = [
    "ADV_ESTIMATOR_REGISTRY",
    "GLOBAL_BATCH_INFO_KEYS",
    "KL_CONTROLLER_REGISTRY",
    "KL_ESTIMATOR_REGISTRY",
    "LOSS_AGG_REGISTRY",
    "POLICY_LOSS_REGISTRY",
    "ROLLOUT_IS_LEVEL_REGISTRY",
    "ROLLOUT_RS_DIVERGENCE_REGISTRY",
    "ROLLOUT_RS_REDUCTION_REGISTRY",
    "AdaptiveKLController",
    "AdvantageEstimator",
    "FixedKLController",
    "KLController",
    "Registry",
    "agg_loss",
    "apply_kl_penalty",
    "check_rollout_correction",
    "compute_advantage",
    "compute_entropy_loss",
    "compute_gae_advantage_return",
    "compute_gpg_outcome_advantage",
    "compute_grpo_outcome_advantage",
    "compute_offpolicy_metrics",
    "compute_opo_outcome_advantage",
    "compute_policy_loss",
    "compute_policy_loss_bypass_mode",
    "compute_policy_loss_cispo",
    "compute_policy_loss_clip_cov",
    "compute_policy_loss_geo_mean",
    "compute_policy_loss_gpg",
    "compute_policy_loss_gspo",
    "compute_policy_loss_kl_cov",
    "compute_policy_loss_reinforce",
    "compute_policy_loss_sapo",
    "compute_policy_loss_vanilla",
    "compute_reinforce_plus_plus_baseline_outcome_advantage",
    "compute_reinforce_plus_plus_outcome_advantage",
    "compute_remax_outcome_advantage",
    "compute_rewards",
    "compute_rloo_outcome_advantage",
    "compute_rollout_correction_and_add_to_batch",
    "compute_rollout_correction_and_rejection_mask",
    "compute_rollout_correction_weights",
    "compute_rollout_rejection_mask",
    "compute_value_loss",
    "entropy_from_logits",
    "get_adv_estimator_fn",
    "get_kl_controller",
    "get_policy_loss_fn",
    "kl_estimator_names",
    "kl_penalty",
    "loss_agg_modes",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "masked_whiten",
    "ppo_clip_token_losses",
    "rollout_rs_options",
]
