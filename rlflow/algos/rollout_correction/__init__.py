"""Rollout correction: importance weights and rejection from the rollout's own log-probs (verl's names).

The rollout engine and the trainer compute different probabilities for the same tokens (other
kernels, dtypes, a stale policy in asynchronous training). Comparing ``pi_old`` (or, in bypass mode,
the current ``pi``) with ``pi_rollout`` on the sampled tokens, this package

* weights the policy loss per token or per sequence (``weights``: truncated or masked IS),
* rejects tokens or sequences whose divergence is out of bounds (``rejection``),
* reports the gap (``offpolicy``), every metric under ``rollout_corr/``,

and the start-up check (``config_check.check_rollout_correction``); the PPO step runs it as its
``RolloutCorrection`` phase (``rlflow/trainer/phases/rollout_correction.py``). docs/algorithms.md, "Rollout correction", has the math.
"""

from rlflow.algos.rollout_correction.bypass_loss import (
    BYPASS_LOSS_MODE,
    BYPASS_LOSS_TYPE_REGISTRY,
    compute_policy_loss_bypass_mode,
    compute_policy_loss_reinforce,
)
from rlflow.algos.rollout_correction.config_check import check_rollout_correction
from rlflow.algos.rollout_correction.offpolicy import compute_offpolicy_metrics
from rlflow.algos.rollout_correction.pipeline import (
    compute_rollout_correction_and_add_to_batch,
    compute_rollout_correction_and_rejection_mask,
)
from rlflow.algos.rollout_correction.rejection import (
    ROLLOUT_RS_DIVERGENCE_REGISTRY,
    ROLLOUT_RS_REDUCTION_REGISTRY,
    RejectionRule,
    compute_rollout_rejection_mask,
    rejection_rule,
    rollout_rs_options,
)
from rlflow.algos.rollout_correction.settings import (
    BYPASS,
    DECOUPLED,
    correction_mode,
    correction_settings,
    corrects,
    needs_rollout_log_probs,
    weights_only_per_sample,
)
from rlflow.algos.rollout_correction.weights import (
    ROLLOUT_IS_LEVEL_REGISTRY,
    compute_rollout_correction_weights,
)

__all__ = [
    "BYPASS",
    "BYPASS_LOSS_MODE",
    "BYPASS_LOSS_TYPE_REGISTRY",
    "DECOUPLED",
    "ROLLOUT_IS_LEVEL_REGISTRY",
    "ROLLOUT_RS_DIVERGENCE_REGISTRY",
    "ROLLOUT_RS_REDUCTION_REGISTRY",
    "RejectionRule",
    "check_rollout_correction",
    "compute_offpolicy_metrics",
    "compute_policy_loss_bypass_mode",
    "compute_policy_loss_reinforce",
    "compute_rollout_correction_and_add_to_batch",
    "compute_rollout_correction_and_rejection_mask",
    "compute_rollout_correction_weights",
    "compute_rollout_rejection_mask",
    "correction_mode",
    "correction_settings",
    "corrects",
    "needs_rollout_log_probs",
    "rejection_rule",
    "rollout_rs_options",
    "weights_only_per_sample",
]
