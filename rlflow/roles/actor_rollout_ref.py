"""``ActorRolloutRef``: actor, rollout replica and (optionally) reference fused in one process per bundle.

This is the colocated placement: generation, log-probs and updates share each process, and
the weight sync after an update is an in-process copy from the actor engine into the
rollout engine (the rollout backend loads it a bounded bucket at a time).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from rlflow.protocol import DataProto
from rlflow.roles.actor import Actor, reference_is_base_model
from rlflow.roles.engine_role import build_initialized_engine
from rlflow.roles.reference import REF_MESH, ref_log_probs
from rlflow.roles.rollout_worker import ROLLOUT_MESH, RolloutMethods, sync_engine_into_rollout
from rlflow.rollout import build_rollout
from rlflow.workers import DP_COMPUTE, ONE_TO_ALL, register


class ActorRolloutRef(RolloutMethods, Actor):
    """The policy engine, a rollout replica of it on every rank, and an optional reference engine."""

    def __init__(self, actor_config: Any, rollout_config: Any, model_path: str | Path, ref_config: Optional[Any] = None):
        super().__init__(actor_config, model_path)
        self.config = rollout_config
        self.register_mesh(ROLLOUT_MESH, dp_rank=self.rank, dp_size=self.world_size, is_collect=True)
        self.rollout = build_rollout(rollout_config, model_path, self.device, replica_rank=self.rank)
        self.ref_engine = None
        if ref_config is not None and not reference_is_base_model(actor_config):
            self.ref_engine = build_initialized_engine(ref_config.engine, model_path)
            mesh = self.ref_engine.mesh
            self.register_mesh(REF_MESH, mesh.dp_rank, mesh.dp_size, mesh.is_collect)

    @register(dispatch_mode=DP_COMPUTE, mesh=REF_MESH)
    def compute_ref_log_prob(self, data: DataProto) -> DataProto:
        """``ref_log_prob`` ``[B, R]`` under the frozen reference weights (a LoRA actor's: its base model)."""
        if self.ref_engine is None:
            return super().compute_ref_log_prob(data)
        return ref_log_probs(self.ref_engine, data)

    @register(dispatch_mode=ONE_TO_ALL)
    def sync_weights(self) -> dict[str, float]:
        """Copy the actor's current weights, in the rollout's dtype, into this rank's rollout engine
        (collective export: every rank's export yields the complete model); with
        ``rollout.lora_sync=adapter``, the actor's LoRA adapters alone."""
        return sync_engine_into_rollout(self.engine, self.rollout, self.config)
