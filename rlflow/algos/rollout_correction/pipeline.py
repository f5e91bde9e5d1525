"""Rollout correction end to end: weights, rejection and diagnostics in one call (verl's two entry points).

Two modes, as in verl; the PPO step runs either as its ``RolloutCorrection`` phase
(``rlflow/trainer/phases/rollout_correction.py``):

* **decoupled** (``bypass_mode: false``, three policies): after the old log-probs,
  ``compute_rollout_correction_and_add_to_batch`` compares ``pi_old`` with ``pi_rollout`` once per
  batch, writes ``rollout_is_weights`` (when ``rollout_is`` is set) and the rejection-masked
  ``response_mask`` into the batch, and returns ``rollout_corr/*``; the policy loss multiplies its
  per-token losses by the weights.
* **bypass** (``bypass_mode: true``, two policies): there is no old-log-prob pass; the rollout's
  log-probs are the old ones and the ``bypass_mode`` policy loss (``bypass_loss``) computes weights,
  rejection and metrics per micro-batch from the *current* policy against the rollout's.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from rlflow.algos.rollout_correction.offpolicy import compute_offpolicy_metrics
from rlflow.algos.rollout_correction.rejection import compute_rollout_rejection_mask
from rlflow.algos.rollout_correction.settings import correction_settings
from rlflow.algos.rollout_correction.summaries import require_tokens
from rlflow.algos.rollout_correction.weights import compute_rollout_correction_weights
from rlflow.protocol import DataProto

METRIC_PREFIX = "rollout_corr/"
PHASE_INPUTS = ("old_log_probs", "rollout_log_probs", "response_mask")


def compute_rollout_correction_and_rejection_mask(
    old_log_prob: torch.Tensor,
    rollout_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    rollout_is: Optional[str] = None,
    rollout_is_threshold: Any = 2.0,
    rollout_is_batch_normalize: bool = False,
    rollout_rs: Optional[str] = None,
    rollout_rs_threshold: Any = None,
) -> tuple[Optional[DataProto], torch.Tensor, dict[str, float]]:
    """IS weights, rejection and off-policy diagnostics of ``pi_old`` against ``pi_rollout`` (verl's signature).

    Returns a DataProto holding ``rollout_is_weights`` ``[B, T]`` (None when ``rollout_is`` is None),
    ``response_mask`` with the rejected tokens zeroed (a copy when ``rollout_rs`` is None), and every
    metric prefixed ``rollout_corr/``. Raises ``ValueError`` on mismatched shapes, an all-zero mask,
    an unknown level or option, or a malformed threshold.
    """
    if not old_log_prob.shape == rollout_log_prob.shape == response_mask.shape:
        raise ValueError(f"old_log_prob {tuple(old_log_prob.shape)}, rollout_log_prob {tuple(rollout_log_prob.shape)} "
                         f"and response_mask {tuple(response_mask.shape)} must share a shape")
    require_tokens(response_mask)
    log_ratio = old_log_prob - rollout_log_prob
    metrics: dict[str, float] = {}
    weights = None
    if rollout_is is not None:
        weights, is_metrics = compute_rollout_correction_weights(
            log_ratio, response_mask, rollout_is, rollout_is_threshold, rollout_is_batch_normalize)
        metrics.update(is_metrics)
    masked = response_mask.clone()
    if rollout_rs is not None:
        masked, rs_metrics = compute_rollout_rejection_mask(log_ratio, response_mask, rollout_rs, rollout_rs_threshold)
        metrics.update(rs_metrics)
    metrics.update(compute_offpolicy_metrics(old_log_prob, rollout_log_prob, response_mask))
    weights_batch = None if weights is None else DataProto.from_dict({"rollout_is_weights": weights})
    return weights_batch, masked, {f"{METRIC_PREFIX}{key}": value for key, value in metrics.items()}


def compute_rollout_correction_and_add_to_batch(batch: DataProto, rollout_corr_config: Any) -> tuple[DataProto, dict[str, float]]:
    """The decoupled mode on a batch holding ``old_log_probs``, ``rollout_log_probs`` and ``response_mask``:
    ``response_mask`` replaced by its rejection-masked copy, ``rollout_is_weights`` added when ``rollout_is``
    is set; returns the batch (changed in place) and the ``rollout_corr/*`` metrics."""
    missing = [key for key in PHASE_INPUTS if key not in batch.batch]
    if missing:
        raise ValueError(f"rollout correction needs batch tensors {list(PHASE_INPUTS)}; missing {missing}")
    settings = correction_settings(rollout_corr_config)
    weights, masked, metrics = compute_rollout_correction_and_rejection_mask(
        batch.batch["old_log_probs"], batch.batch["rollout_log_probs"], batch.batch["response_mask"],
        settings.rollout_is, settings.rollout_is_threshold, settings.rollout_is_batch_normalize,
        settings.rollout_rs, settings.rollout_rs_threshold,
    )
    batch.batch["response_mask"] = masked
    if weights is not None:
        batch.batch.update(weights.batch)
    return batch, metrics
