"""The phases around the update that concern the rollout engines: sleep before it, weight sync after it."""

from __future__ import annotations

from rlflow.meta_info import METRICS
from rlflow.protocol import DataProto
from rlflow.trainer.phases.base import Phase
from rlflow.trainer.phases.context import PhaseContext, StepState

__all__ = ["LIVE_WEIGHT_SYNC", "LiveWeightSync", "RolloutSleep", "WEIGHT_SYNC", "WeightSync"]


class RolloutSleep(Phase):
    """Colocated with ``rollout.free_cache_engine``: the rollout engines free their memory for the update
    (``PlacedRoles.free_rollout_memory``); the next ``WeightSync`` wakes them."""

    name = "rollout_sleep"

    def run(self, ctx: PhaseContext, batch: DataProto, state: StepState) -> DataProto:
        ctx.roles.free_rollout_memory(ctx.config.rollout)
        return DataProto()


class WeightSync(Phase):
    """The actor's updated weights into every rollout replica, in the rollout's dtype (``PlacedRoles.sync_weights``)."""

    name = "weight_sync"

    def run(self, ctx: PhaseContext, batch: DataProto, state: StepState) -> DataProto:
        version = state.policy_version + 1  # this step's update made it
        return DataProto(meta_info={METRICS.name: ctx.roles.sync_weights(ctx.config.rollout, version)})


WEIGHT_SYNC = WeightSync()


class LiveWeightSync(Phase):
    """Partial rollouts: the actor's weights into the rollout replicas while they generate
    (``PlacedRoles.sync_weights_live``: their requests in flight resume from their tokens with the new weights)."""

    name = "weight_sync"

    def run(self, ctx: PhaseContext, batch: DataProto, state: StepState) -> DataProto:
        version = state.policy_version + 1  # this step's update made it
        return DataProto(meta_info={METRICS.name: ctx.roles.sync_weights_live(ctx.config.rollout, version)})


LIVE_WEIGHT_SYNC = LiveWeightSync()
