"""``run_step``: the synchronous PPO step, a sequence of phase calls.

generate -> balance -> score -> old log-probs / ref log-probs / values (sent together) ->
[rollout correction] -> [ReMax greedy baseline] -> advantages -> [rollout sleep] -> critic update ->
actor update -> weight sync. In rollout correction's bypass mode the rollout-correction phase takes
the place of the old-log-prob pass; on a step whose old log-probs come from the update, the update's
loss computes the IS weights (``phases/rollout_correction.py``). A loop that runs steps differently (asynchronously, multi-turn) composes the same
phases with its own ``StepRecord``.
"""

from __future__ import annotations

from typing import Optional

from rlflow.protocol import DataProto
from rlflow.trainer.phases.advantages import Advantages
from rlflow.trainer.phases.base import Phase, StepRecord
from rlflow.trainer.phases.context import PhaseContext, StepState
from rlflow.trainer.phases.forward_passes import forward_passes
from rlflow.trainer.phases.generate import Balance, Generate, GreedyBaselines, PendingSamples, SentGenerate
from rlflow.trainer.phases.rollout_correction import RolloutCorrection
from rlflow.trainer.phases.scoring import Score
from rlflow.trainer.phases.sync import WEIGHT_SYNC, RolloutSleep
from rlflow.trainer.phases.updates import ActorUpdate, CriticUpdate
from rlflow.trainer.ppo_metrics import step_end_metrics

__all__ = ["run_step"]


def run_step(ctx: PhaseContext, prompts: DataProto, step: int, sent: Optional[PendingSamples] = None,
             weight_sync: Optional[Phase] = WEIGHT_SYNC) -> dict[str, float]:
    """Step ``step`` on a batch of prompts; returns the step's metrics (``timing_s/<name>`` per timed block).

    ``sent``: this step's generation, already sent (``Generate.start``); the step waits for it instead of sending one.
    ``weight_sync``: how the update's weights reach the rollout (``WEIGHT_SYNC``: after the calls sent before it;
    ``LiveWeightSync``: beside a generation in progress); None: they stay with the trainer (``fully_async``
    publishes every ``trigger_parameter_sync_step`` updates).
    """
    state, record = StepState.begin(ctx, prompts, step), StepRecord()
    with record.timed("step"):
        with record.timed("gen"):
            batch = record.produce(Generate() if sent is None else SentGenerate(sent), ctx, prompts, state)
        batch = record.produce(Balance(), ctx, batch, state)
        with record.timed("reward"):
            record.add(Score(), ctx, batch, state)
        with record.timed("log_probs_and_values"):
            record.add_concurrently(forward_passes(ctx, state), ctx, batch, state)
        if ctx.plan.rollout_correction is not None and not state.old_log_probs_from_update:  # else in the update's loss
            with record.timed("rollout_correction"):
                batch = record.produce(RolloutCorrection(), ctx, batch, state)
        with record.timed("adv"):
            if ctx.plan.needs_greedy_baseline:
                record.add(GreedyBaselines(), ctx, batch, state)
            record.add(Advantages(), ctx, batch, state)
        if state.update_actor:  # the weight sync below wakes the rollout engines again
            record.add(RolloutSleep(), ctx, batch, state)
        if ctx.plan.use_critic:
            with record.timed("update_critic"):
                record.add(CriticUpdate(), ctx, batch, state)
        if state.update_actor:
            with record.timed("update_actor"):
                record.add(ActorUpdate(), ctx, batch, state)
            if weight_sync is not None:
                with record.timed("weight_sync"):
                    record.add(weight_sync, ctx, batch, state)
    uncorrected = ctx.plan.rollout_correction is None  # else the phase or the bypass loss reported rollout_corr/*
    return {**record.metrics, **step_end_metrics(batch, record.timings, ctx.plan.use_critic, ctx.plan.world_size, step,
                                                 with_rollout_log_prob_metrics=uncorrected)}
