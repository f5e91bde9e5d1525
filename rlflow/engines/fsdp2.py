"""``fsdp2``: PyTorch's per-parameter sharding (``fully_shard``) on a DeviceMesh.

Each decoder layer is one ``fully_shard`` unit and the root (embeddings, final norm,
LM or score head) another. Parameters are DTensors sharded on dim 0 over the ``dp_shard``
mesh dimension; with ``hybrid_replicate_size > 1`` the mesh is
``(dp_replicate, dp_shard)`` and shards are replicated across groups (HSDP).
Mixed precision comes from ``param_dtype`` / ``reduce_dtype`` with master weights in
``dtype``. Checkpoints are sharded DCP state dicts; HF export gathers one parameter at
a time (``DTensor.full_tensor``). With ``defer_grad_reduce`` (default) the micro-batches of a
mini-batch accumulate unsharded gradients and only the last one reduce-scatters them (one
reduction per optimizer step instead of one per micro-batch, at the cost of one full-size
gradient copy per rank between micro-batches). A checkpoint resumes at any world size that
``hybrid_replicate_size`` divides (DCP reshards). ``compile`` runs each decoder layer's forward
through ``torch.compile`` (parameter names, hooks and checkpoints unchanged); FSDP1 cannot,
its flat parameters change size under the compiled code.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from rlflow.config.ranges import Range, Ranges
from rlflow.engines.common.forward.models import ForwardModule, decoder_layer_classes
from rlflow.engines.common.fsdp.fully_shard import FullyShardEngine
from rlflow.engines.common.fsdp.layer_compile import compile_layer_forward
from rlflow.engines.config import EngineConfigError, HFModuleEngineConfig
from rlflow.engines.registry import ENGINE_REGISTRY
from rlflow.models.loading import resolve_dtype

__all__ = ["FSDP2Engine", "FSDP2EngineConfig"]


@dataclass
class FSDP2EngineConfig(HFModuleEngineConfig):
    """Options of the ``fsdp2`` engine (rlflow/configs/engine/fsdp2.yaml)."""

    name: str = "fsdp2"
    reshard_after_forward: bool = True  # free gathered layer weights after forward (re-gather in backward)
    hybrid_replicate_size: int = 1  # >1: HSDP, world = replicate x shard; shards replicate across groups
    defer_grad_reduce: bool = True  # reduce-scatter gradients once per mini-batch, not per micro-batch
    compile: bool = False  # torch.compile each decoder layer's forward (inductor)

    RANGES: ClassVar[Ranges] = {"hybrid_replicate_size": Range(1, note="1: plain FSDP")}


@ENGINE_REGISTRY.register("fsdp2")
class FSDP2Engine(FullyShardEngine):
    """FSDP2 (``fully_shard``) engine: per-layer units on a 1-D or hybrid 2-D DeviceMesh."""

    config_class = FSDP2EngineConfig
    config: FSDP2EngineConfig

    def _device_mesh(self) -> DeviceMesh:
        replicate = self.config.hybrid_replicate_size
        if replicate < 1 or self.world_size % replicate != 0:
            raise EngineConfigError(
                f"hybrid_replicate_size={replicate} must be >= 1 and divide the world size {self.world_size}"
            )
        if replicate == 1:
            return init_device_mesh(self.device.type, (self.world_size,), mesh_dim_names=("dp_shard",))
        return init_device_mesh(
            self.device.type, (replicate, self.world_size // replicate), mesh_dim_names=("dp_replicate", "dp_shard")
        )

    def _parallelize(self, module: ForwardModule) -> nn.Module:
        cfg = self.config
        self.device_mesh = self._device_mesh()
        mp_policy = MixedPrecisionPolicy(param_dtype=resolve_dtype(cfg.param_dtype), reduce_dtype=resolve_dtype(cfg.reduce_dtype))
        options = {"mesh": self.device_mesh, "mp_policy": mp_policy, "reshard_after_forward": cfg.reshard_after_forward}
        layer_classes = tuple(decoder_layer_classes(module, cfg.wrap_layer_classes))
        for layer in [m for m in module.modules() if isinstance(m, layer_classes)]:
            if cfg.compile:  # the forward only: fully_shard's hooks (all-gather, reduce-scatter) run around it
                layer.forward = compile_layer_forward(layer.forward)
            fully_shard(layer, **options)
        fully_shard(module, **options)
        return module

    def _layout(self) -> dict[str, Any]:
        return {"dp_replicate": self.config.hybrid_replicate_size}  # dp_shard = world size / dp_replicate
