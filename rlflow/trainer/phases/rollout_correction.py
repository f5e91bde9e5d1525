"""The rollout-correction phase: importance weights and rejection from the rollout's own log-probs.

It runs when ``algorithm.rollout_correction`` corrects anything (``RunPlan.rollout_correction``), after
the old-log-prob, reference and value passes and before the advantages, so the advantages, the
critic and the actor all see the rejection-masked ``response_mask`` (docs/algorithms.md, "Rollout
correction"):

* decoupled mode (``rollout_is`` or ``rollout_rs``): verl's ``compute_rollout_correction_and_add_to_batch``
  on the old and the rollout log-probs: ``rollout_is_weights`` (with ``rollout_is``) and the masked
  ``response_mask``; its metrics are ``rollout_corr/*`` and the train/inference mismatch
  (``rollout/logprob_diff_*``), both of the whole rollout, before rejection;
* decoupled mode on an on-policy step (weights only, each from its own sample: ``weights_only_per_sample``):
  the phase does not run; the update's loss computes the weights from its own forward's log-probs, and
  the actor-update phase reports the same metrics from them after the update (``decoupled_correction``);
* bypass mode: the step has no old-log-prob pass; the rollout's log-probs become ``old_log_probs`` and
  the actor update hands the settings to the loss (``ROLLOUT_CORRECTION``), which corrects per
  micro-batch and reports ``rollout_corr/*`` itself.

The phase hands the corrected batch on as the step's batch (``StepRecord.produce``), since it replaces
a column the batch holds.
"""

from __future__ import annotations

from rlflow.algos.rollout_correction import BYPASS, compute_rollout_correction_and_add_to_batch, correction_settings
from rlflow.meta_info import METRICS
from rlflow.protocol import DataProto
from rlflow.rollout import rollout_mismatch_metrics
from rlflow.trainer.phases.base import BatchKeys, Phase
from rlflow.trainer.phases.columns import ROLLOUT_LOG_PROBS
from rlflow.trainer.phases.context import PhaseContext, StepState

__all__ = ["RolloutCorrection", "decoupled_correction", "weights_column"]


def weights_column(ctx: PhaseContext) -> tuple[str, ...]:
    """``("rollout_is_weights",)`` when this run's phase writes them (decoupled mode with ``rollout_is``), else ``()``."""
    settings = correction_settings(ctx.config.algorithm.rollout_correction)
    return ("rollout_is_weights",) if settings.rollout_is is not None and not settings.bypass_mode else ()


class RolloutCorrection(Phase):
    """Decoupled: weights and rejection of the old log-probs against the rollout's; bypass: the rollout's
    log-probs as the old ones (module docstring)."""

    name = "rollout_correction"

    def keys(self, ctx: PhaseContext, state: StepState) -> BatchKeys:
        if ctx.plan.rollout_correction == BYPASS:
            return BatchKeys((ROLLOUT_LOG_PROBS,), ("old_log_probs",))
        return BatchKeys(("old_log_probs", ROLLOUT_LOG_PROBS, "response_mask"), ("response_mask",) + weights_column(ctx))

    def run(self, ctx: PhaseContext, batch: DataProto, state: StepState) -> DataProto:
        corrected = DataProto(dict(batch.batch), dict(batch.non_tensor_batch), dict(batch.meta_info))
        if ctx.plan.rollout_correction == BYPASS:
            corrected.batch["old_log_probs"] = corrected.batch[ROLLOUT_LOG_PROBS]
            return corrected
        return decoupled_correction(ctx, corrected)


def decoupled_correction(ctx: PhaseContext, batch: DataProto) -> DataProto:
    """Decoupled mode on ``batch`` (``old_log_probs``, ``rollout_log_probs``, ``response_mask``; changed in place):
    the weights and the masked ``response_mask``, with ``rollout_corr/*`` and ``rollout/logprob_diff_*`` under
    ``METRICS``."""
    data = batch.batch
    mismatch = rollout_mismatch_metrics(data[ROLLOUT_LOG_PROBS], data["old_log_probs"], data["response_mask"])
    corrected, metrics = compute_rollout_correction_and_add_to_batch(batch, ctx.config.algorithm.rollout_correction)
    corrected.meta_info[METRICS.name] = {**mismatch, **metrics}
    return corrected
