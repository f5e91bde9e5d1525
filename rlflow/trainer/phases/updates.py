"""The update phases: the critic's value update and the actor's policy update, each checked by the divergence guard."""

from __future__ import annotations

from dataclasses import asdict

import torch

from rlflow.algos.rollout_correction import BYPASS, DECOUPLED, correction_settings
from rlflow.meta_info import (
    METRICS,
    MINI_BATCH_SIZE,
    OLD_LOG_PROBS_FROM_UPDATE,
    ROLLOUT_CORRECTION,
    ROLLOUT_IS_IN_LOSS,
    SEED,
    TEMPERATURE,
)
from rlflow.protocol import DataProto
from rlflow.trainer.old_log_probs import in_batch_order
from rlflow.trainer.phases.base import BatchKeys, Phase
from rlflow.trainer.phases.columns import MODEL_INPUTS, ROLLOUT_LOG_PROBS
from rlflow.trainer.phases.context import PhaseContext, StepState
from rlflow.trainer.phases.rollout_correction import decoupled_correction, weights_column
from rlflow.utils.metric_values import mean_per_key

__all__ = ["ActorUpdate", "CriticUpdate"]

ROW_INDEX = "row_index"  # an on-policy update batch's row numbers, to put the update forward's outputs back in order


class CriticUpdate(Phase):
    """``critic.ppo_epochs`` x mini-batches of PPO's clipped value loss, run inside the critic's workers
    (``Critic.update_critic``); their optimizer steps are checked together."""

    name = "update_critic"
    reads = MODEL_INPUTS + ("values", "returns")

    def run(self, ctx: PhaseContext, batch: DataProto, state: StepState) -> DataProto:
        cfg = ctx.config
        update = batch.select(batch_keys=self.reads, non_tensor_batch_keys=[])
        update.meta_info = {MINI_BATCH_SIZE.name: cfg.critic.ppo_mini_batch_size * cfg.rollout.n,
                            SEED.name: cfg.trainer.seed + state.step}
        metrics = ctx.roles.critic.update_critic(update)
        checked = ctx.guard.check_optim_steps("critic", int(metrics["critic/optim_steps"]),
                                              int(metrics["critic/trailing_skipped_steps"]))
        return DataProto(meta_info={METRICS.name: {**metrics, **checked}})


class ActorUpdate(Phase):
    """``actor.ppo_epochs`` x shuffled mini-batches, driven from here: ``Actor.forward_backward`` then
    ``Actor.optim_step`` for each mini-batch, every optimizer step checked.

    When the step's old log-probs come from the update (one epoch, one mini-batch: ``StepState``), the
    loss takes the forward's own log-probs as old, and those and its entropy become the batch's
    ``old_log_probs`` and ``entropys``, in batch row order.

    Rollout correction: the decoupled mode's ``rollout_is_weights`` go to the loss with each mini-batch;
    when the old log-probs come from the update, ``rollout_log_probs`` and the IS settings do
    (``ROLLOUT_IS_IN_LOSS``), the loss computes the weights, and the phase reports the decoupled mode's
    metrics from the forward's log-probs; in bypass mode the settings go (``ROLLOUT_CORRECTION``), and
    the loss runs the ``bypass_mode`` loss.
    """

    name = "update_actor"

    def keys(self, ctx: PhaseContext, state: StepState) -> BatchKeys:
        from_update = state.old_log_probs_from_update
        reads = MODEL_INPUTS + (("advantages",) if from_update else ("old_log_probs", "advantages"))
        reads += ("ref_log_prob",) if ctx.config.actor.use_kl_loss else ()
        reads += _correction_reads(ctx, from_update)
        return BatchKeys(reads, ("old_log_probs", "entropys") if from_update else ())

    def run(self, ctx: PhaseContext, batch: DataProto, state: StepState) -> DataProto:
        actor_cfg, from_update = ctx.config.actor, state.old_log_probs_from_update
        update = batch.select(batch_keys=self.keys(ctx, state).reads, non_tensor_batch_keys=[],
                              meta_info_keys=[TEMPERATURE.name])
        if from_update:
            update.batch[ROW_INDEX] = torch.arange(len(update))
            update.meta_info[OLD_LOG_PROBS_FROM_UPDATE.name] = True
        settings = correction_settings(ctx.config.algorithm.rollout_correction)
        corrects_in_loss = from_update and ctx.plan.rollout_correction == DECOUPLED
        if corrects_in_loss:
            update.meta_info[ROLLOUT_IS_IN_LOSS.name] = {"rollout_is": settings.rollout_is,
                                                         "rollout_is_threshold": settings.rollout_is_threshold}
        if ctx.plan.rollout_correction == BYPASS:
            update.meta_info[ROLLOUT_CORRECTION.name] = asdict(settings)
        mini_batch = actor_cfg.ppo_mini_batch_size * ctx.config.rollout.n
        step_metrics, checked = [], {}
        for mini in update.make_iterator(mini_batch, actor_cfg.ppo_epochs, actor_cfg.shuffle,
                                         seed=ctx.config.trainer.seed + state.step):
            outputs = ctx.roles.actor.forward_backward(mini)
            optim = ctx.roles.actor.optim_step()[0]
            checked = ctx.guard.check_optim_step("actor", optim["actor/skipped"] > 0)
            step_metrics.append({**METRICS.read(outputs.meta_info), **optim})
        result = DataProto()
        if from_update:  # exactly one mini-batch: ``mini`` and ``outputs`` cover the whole batch
            forward = in_batch_order(outputs, mini.batch[ROW_INDEX])
            result = DataProto.from_dict({"old_log_probs": forward.batch["log_probs"], "entropys": forward.batch["entropy"]})
        correction = {}
        if corrects_in_loss:  # the metrics the rollout-correction phase would have reported, from the same log-probs
            columns = {"old_log_probs": result.batch["old_log_probs"], ROLLOUT_LOG_PROBS: batch.batch[ROLLOUT_LOG_PROBS],
                       "response_mask": batch.batch["response_mask"]}
            correction = METRICS.read(decoupled_correction(ctx, DataProto.from_dict(columns)).meta_info)
        result.meta_info[METRICS.name] = {**correction, **mean_per_key(step_metrics), **checked}
        return result


def _correction_reads(ctx: PhaseContext, from_update: bool) -> tuple[str, ...]:
    """The rollout-correction columns the update sends: the rollout's log-probs when its loss computes the IS
    weights, else the weights the rollout-correction phase wrote (if any)."""
    if from_update:
        return (ROLLOUT_LOG_PROBS,) if ctx.plan.rollout_correction == DECOUPLED else ()
    return weights_column(ctx)
