"""The forward passes over the generated batch: old log-probs (actor), reference log-probs, values (critic).

They are independent worker calls: a step sends all of them before it waits for any
(``StepRecord.add_concurrently``), so with split placement the actor, reference and critic pools
compute in parallel; colocated, each process runs them one after the other.
"""

from __future__ import annotations

from typing import Callable

from rlflow.algos.rollout_correction import BYPASS
from rlflow.protocol import DataProto, DataProtoFuture
from rlflow.trainer.phases.base import RolePass
from rlflow.trainer.phases.columns import MODEL_INPUTS
from rlflow.trainer.phases.context import PhaseContext, StepState
from rlflow.trainer.placement import PlacedRoles
from rlflow.workers.worker_group import GroupMethod

__all__ = ["OLD_LOG_PROBS", "REF_LOG_PROBS", "VALUES", "RoleForward", "forward_passes"]


class RoleForward(RolePass):
    """A forward-only pass of one role over the model inputs: ``method(roles)(batch)`` returns ``writes``."""

    reads = MODEL_INPUTS

    def __init__(self, name: str, writes: tuple[str, ...], method: Callable[[PlacedRoles], GroupMethod]):
        self.name, self.writes, self.method = name, writes, method

    def start(self, ctx: PhaseContext, batch: DataProto, state: StepState) -> DataProtoFuture:
        return self.method(ctx.roles).future(batch)


# ``old_log_probs`` and ``entropys`` [B, R] under the policy that generated the batch
OLD_LOG_PROBS = RoleForward("old_log_probs", ("old_log_probs", "entropys"), lambda roles: roles.actor.compute_log_prob)
# ``ref_log_prob`` [B, R] under the frozen reference policy
REF_LOG_PROBS = RoleForward("ref_log_probs", ("ref_log_prob",), lambda roles: roles.ref.compute_ref_log_prob)
# ``values`` [B, R]: the critic's value of the state each response token is generated from
VALUES = RoleForward("values", ("values",), lambda roles: roles.critic.compute_values)


def forward_passes(ctx: PhaseContext, state: StepState) -> list[RolePass]:
    """This step's passes, in the order they are sent: old log-probs unless the actor update gives them
    (``old_log_probs.py``) or rollout correction's bypass mode takes the rollout's (the ``RolloutCorrection``
    phase), reference log-probs for a KL term, values for GAE."""
    old_log_probs = not state.old_log_probs_from_update and ctx.plan.rollout_correction != BYPASS
    passes: list[RolePass] = [OLD_LOG_PROBS] if old_log_probs else []
    if ctx.plan.use_ref:
        passes.append(REF_LOG_PROBS)
    if ctx.plan.use_critic:
        passes.append(VALUES)
    return passes
