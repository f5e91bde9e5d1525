"""``Actor``: the policy being trained. The PPO update loop lives in the controller (Tinker-style):
it calls ``forward_backward`` per mini-batch and ``optim_step`` per optimizer step."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from rlflow.meta_info import (
    COMPUTE_ENTROPY,
    METRICS,
    OLD_LOG_PROBS_FROM_UPDATE,
    ROLLOUT_CORRECTION,
    ROLLOUT_IS_IN_LOSS,
    TEMPERATURE,
)
from rlflow.models.hf_checkpoint import resolve_dtype
from rlflow.protocol import DataProto
from rlflow.roles.batch_views import engine_batch
from rlflow.roles.engine_role import EngineRole, renamed_or_empty, require_rows, response_columns, response_log_probs
from rlflow.roles.losses import make_policy_loss_fn
from rlflow.roles.reference import REF_MESH, ref_log_probs
from rlflow.rollout import publish_weights
from rlflow.utils.logging import get_logger
from rlflow.workers import DP_COMPUTE, ONE_TO_ALL, register

logger = get_logger(__name__)
ACTOR_MESH = "actor"
POLICY_INPUTS = ("old_log_probs", "advantages")
ROLLOUT_CORRECTION_INPUTS = ("rollout_is_weights",)  # sent to the loss when the batch holds them
METRIC_PREFIXES = ("actor/", "rollout_corr/")  # the loss's metrics that go back to the driver


def reference_is_base_model(actor_config: Any) -> bool:
    """Whether the reference policy is the actor's base model with its LoRA adapters off (``lora.rank > 0``),
    rather than an engine of its own built from ``ref.engine``."""
    return int(actor_config.engine.lora.rank) > 0


class Actor(EngineRole):
    """Hosts the policy engine: log-probs, and the policy-gradient update in controller-driven steps.

    ``TEMPERATURE`` in ``data.meta_info`` (the rollout's sampling temperature) scales the logits.
    """

    def __init__(self, actor_config: Any, model_path: str | Path):
        super().__init__(actor_config.engine, model_path, ACTOR_MESH)
        self.actor_config = actor_config
        self.loss_fn = make_policy_loss_fn(actor_config)
        if reference_is_base_model(actor_config):  # the reference mesh is the actor's: its adapters off
            mesh = self.engine.mesh
            self.register_mesh(REF_MESH, mesh.dp_rank, mesh.dp_size, mesh.is_collect)
            if self.rank == 0:
                logger.info("reference: the actor's base model (LoRA adapters off); ref.engine is not built")

    @register(dispatch_mode=DP_COMPUTE, mesh=REF_MESH)
    def compute_ref_log_prob(self, data: DataProto) -> DataProto:
        """``ref_log_prob`` ``[B, R]`` of a LoRA actor: its base model, adapters off (no second copy of the weights)."""
        if not reference_is_base_model(self.actor_config):
            raise RuntimeError("this actor has no LoRA adapters, so its reference is a separate engine (ref.engine)")
        with self.engine.adapters_disabled():
            return ref_log_probs(self.engine, data)

    @register(dispatch_mode=DP_COMPUTE, mesh=ACTOR_MESH)
    def compute_log_prob(self, data: DataProto) -> DataProto:
        """``old_log_probs`` and ``entropys`` ``[B, R]`` of the responses under the current policy."""
        out = response_log_probs(self.engine, data, TEMPERATURE.read(data.meta_info), with_entropy=True)
        return renamed_or_empty(out, ["log_probs", "entropy"], ["old_log_probs", "entropys"])

    @register(dispatch_mode=DP_COMPUTE, mesh=ACTOR_MESH)
    def forward_backward(self, data: DataProto) -> DataProto:
        """Accumulate the policy-loss gradient of one mini-batch (this rank's share of it).

        Returns the ``actor/...`` metrics in ``meta_info`` ``METRICS``. With
        ``OLD_LOG_PROBS_FROM_UPDATE`` set the batch needs no ``old_log_probs`` (the loss
        takes the detached current ones), entropy is always computed (the step's metric), and the
        result also holds the update forward's ``log_probs`` and ``entropy`` ``[B, R]`` of the rows,
        in their order; otherwise no per-token column travels back to the driver. An empty batch raises
        ``ValueError`` (it has no loss).

        Rollout correction: ``rollout_is_weights`` (decoupled mode) go to the loss when the batch holds
        them; ``ROLLOUT_IS_IN_LOSS`` (an on-policy batch) sends ``rollout_log_probs`` instead, and the loss computes
        the weights from its detached log-probs; ``ROLLOUT_CORRECTION`` in ``meta_info`` (bypass mode) selects the bypass loss; its
        ``rollout_corr/*`` metrics come back with the ``actor/*`` ones. Bypass mode has no old-log-prob
        pass, so entropy is computed here and reported as the loss's ``actor/entropy``.
        """
        require_rows(data, "Actor.forward_backward")
        on_policy = OLD_LOG_PROBS_FROM_UPDATE.read(data.meta_info)
        bypass, is_in_loss = ROLLOUT_CORRECTION.read(data.meta_info), ROLLOUT_IS_IN_LOSS.read(data.meta_info)
        if on_policy and bypass is not None:
            raise ValueError("bypass mode takes the rollout's log-probs as the old ones; the batch cannot also ask "
                             f"for the update forward's ({OLD_LOG_PROBS_FROM_UPDATE.name})")
        if is_in_loss is not None and not on_policy:
            raise ValueError(f"{ROLLOUT_IS_IN_LOSS.name} computes IS weights from the update forward's log-probs; "
                             f"the batch must also set {OLD_LOG_PROBS_FROM_UPDATE.name}")
        inputs = ("advantages",) if on_policy else POLICY_INPUTS
        extra = inputs + (("ref_log_prob",) if self.actor_config.use_kl_loss else ())
        extra += tuple(key for key in ROLLOUT_CORRECTION_INPUTS if key in data.batch)
        extra += ("rollout_log_probs",) if is_in_loss is not None else ()
        view = engine_batch(data, extra_keys=extra)
        view.meta_info = {
            TEMPERATURE.name: TEMPERATURE.read(data.meta_info),
            # the step's entropy metric comes from this forward when no separate pass computed it
            COMPUTE_ENTROPY.name: on_policy or bypass is not None or self.actor_config.entropy_coeff != 0,
            OLD_LOG_PROBS_FROM_UPDATE.name: on_policy,
        }
        if bypass is not None:
            view.meta_info[ROLLOUT_CORRECTION.name] = bypass
        if is_in_loss is not None:
            view.meta_info[ROLLOUT_IS_IN_LOSS.name] = is_in_loss
        with self.engine.train_mode():
            outputs, metrics = self.engine.forward_backward(view, self.loss_fn)
        result = response_columns(outputs, data) if on_policy and self.engine.mesh.is_collect else DataProto()
        result.meta_info[METRICS.name] = {key: value for key, value in metrics.items() if key.startswith(METRIC_PREFIXES)}
        return result

    @register(dispatch_mode=ONE_TO_ALL)
    def optim_step(self, lr: Optional[float] = None) -> dict[str, float]:
        """Clip, step and advance the LR schedule (``lr`` overrides it for this step)."""
        return {f"actor/{key}": float(value) for key, value in self.engine.optim_step(lr).items()}

    @register(dispatch_mode=ONE_TO_ALL)
    def publish_weights(self, bucket_mb: float, dtype: str) -> list:
        """Export the weights in the rollout's ``dtype`` (collective); rank 0 puts them in the Ray object
        store, bucket by bucket.

        Every rank's export yields the complete model (the engine contract), so global rank 0
        publishes whatever its pipeline stage. Returns rank 0's list of bucket refs (other ranks
        return an empty list); a split rollout pool loads them with ``RolloutWorker.update_weights``.
        """
        tensors = self.engine.export_hf_weights(dtype=resolve_dtype(dtype))
        return publish_weights(tensors, bucket_mb, publish=self.rank == 0)

    @register(dispatch_mode=ONE_TO_ALL)
    def publish_lora_adapter(self, bucket_mb: float, dtype: str) -> dict[str, Any]:
        """``publish_weights`` for the LoRA adapters alone (``rollout.lora_sync=adapter``): ``{"refs": bucket
        refs, "config": adapter_config.json text}`` on rank 0; ``RolloutWorker.update_lora_adapter`` loads them."""
        tensors = self.engine.export_lora_adapter(dtype=resolve_dtype(dtype))
        return {"refs": publish_weights(tensors, bucket_mb, publish=self.rank == 0),
                "config": self.engine.lora_adapter_config()}
