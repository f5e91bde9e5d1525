"""``fsdp``: FullyShardedDataParallel (FSDP1) with ``use_orig_params=True``.

Each decoder layer is one FSDP unit (``ModuleWrapPolicy``) and the root module
another. ``use_orig_params`` keeps the original parameter names and objects, so the
optimizer's decay/no-decay split and DCP state dicts see HF names. Checkpoints are
sharded DCP state dicts; HF export gathers one FSDP unit at a time
(``summon_full_params(recurse=False)``). A checkpoint resumes at any world size (DCP reshards).
With LoRA the frozen parameters outside the decoder layers (embeddings, final norm, LM head) stay
out of FSDP, whole on every rank (``_frozen_root_params``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional

import torch
from torch import nn
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp import MixedPrecision, ShardingStrategy
from torch.distributed.fsdp.wrap import ModuleWrapPolicy

from rlflow.engines.common.forward.models import ForwardModule, decoder_layer_classes
from rlflow.engines.common.module_engine import ModuleEngine
from rlflow.engines.config import EngineConfigError, HFModuleEngineConfig
from rlflow.engines.registry import ENGINE_REGISTRY
from rlflow.models.loading import resolve_dtype
from rlflow.utils.registry import unknown_name_message

__all__ = ["FSDPEngine", "FSDPEngineConfig"]

_STRATEGIES = {
    "FULL_SHARD": ShardingStrategy.FULL_SHARD,
    "SHARD_GRAD_OP": ShardingStrategy.SHARD_GRAD_OP,
    "NO_SHARD": ShardingStrategy.NO_SHARD,
}


@dataclass
class FSDPEngineConfig(HFModuleEngineConfig):
    """Options of the ``fsdp`` (FSDP1) engine (rlflow/configs/engine/fsdp.yaml)."""

    name: str = "fsdp"
    sharding_strategy: str = "FULL_SHARD"  # FULL_SHARD | SHARD_GRAD_OP | NO_SHARD
    forward_prefetch: bool = False  # issue the next unit's all-gather before the current forward finishes


@ENGINE_REGISTRY.register("fsdp")
class FSDPEngine(ModuleEngine):
    """FSDP1 engine: per-layer FSDP units, original parameters exposed."""

    config_class = FSDPEngineConfig
    config: FSDPEngineConfig

    def _parallelize(self, module: ForwardModule) -> nn.Module:
        cfg = self.config
        if cfg.sharding_strategy not in _STRATEGIES:
            raise EngineConfigError(unknown_name_message("FSDP sharding strategy", cfg.sharding_strategy, _STRATEGIES,
                                                         "engine.sharding_strategy"))
        param_dtype = resolve_dtype(cfg.param_dtype)
        mixed_precision = None
        if param_dtype != resolve_dtype(cfg.dtype):
            mixed_precision = MixedPrecision(param_dtype=param_dtype, reduce_dtype=resolve_dtype(cfg.reduce_dtype))
        layer_classes = decoder_layer_classes(module, cfg.wrap_layer_classes)
        self.unsharded_params = _frozen_root_params(module, layer_classes)
        return FSDP(
            module,
            auto_wrap_policy=ModuleWrapPolicy(layer_classes),
            ignored_states=self.unsharded_params or None,
            sharding_strategy=_STRATEGIES[cfg.sharding_strategy],
            mixed_precision=mixed_precision,
            device_id=self.device,  # FSDP1 needs an explicit device, torch.device("cpu") included
            use_orig_params=True,
            forward_prefetch=cfg.forward_prefetch,
        )

    def _units(self) -> list[FSDP]:
        return [m for m in self.module.modules() if isinstance(m, FSDP)]

    def _clip_grad_norm(self, max_norm: float) -> float:
        return self.module.clip_grad_norm_(max_norm).item()

    def _iter_full_tensors(self, only: Optional[Callable[[str], bool]] = None) -> Iterator[tuple[str, torch.Tensor]]:
        root_prefix = {id(unit): name for name, unit in self.module.named_modules() if isinstance(unit, FSDP)}
        for unit in self._units():
            nested = [m for m in unit.modules() if isinstance(m, FSDP) and m is not unit]
            nested_params = {id(p) for m in nested for p in m.parameters()}
            with FSDP.summon_full_params(unit, recurse=False, writeback=False):
                for name, param in unit.named_parameters():
                    full_name = f"{root_prefix[id(unit)]}.{name}" if root_prefix[id(unit)] else name
                    if id(param) in nested_params or (only is not None and not only(full_name)):
                        continue
                    yield full_name, param.detach().clone()

    def _move_module(self, device: torch.device) -> None:
        for unit in self._units():
            handle = unit._handle
            if handle is None or handle.flat_param.device == device:
                continue
            handle.flat_param_to(device, non_blocking=True)
            handle.flat_param._local_shard = handle.flat_param.data
        for param in self.module.parameters():
            if param.grad is not None and param.grad.device != device:
                param.grad = param.grad.to(device, non_blocking=True)
        for param in self.unsharded_params:  # FSDP's ignored (whole, frozen) parameters
            param.data = param.data.to(device, non_blocking=True)

    def _layout(self) -> dict[str, Any]:
        return {"sharding_strategy": self.config.sharding_strategy}  # every rank is a shard: dp_shard = world size


def _frozen_root_params(module: nn.Module, layer_classes: set[type[nn.Module]]) -> list[nn.Parameter]:
    """The frozen parameters outside the decoder layers (the embeddings, final norm and LM head under LoRA).

    FSDP leaves them out (``ignored_states``): each rank keeps them whole, as they never need a gradient
    reduction. Sharded in a root unit of frozen parameters only, FSDP1 with ``use_orig_params`` swaps them
    for plain tensors in a forward with grad and, at world size 1 (NO_SHARD), never puts them back as
    parameters, so they vanish from ``named_parameters()`` and state dicts (torch 2.13).
    """
    in_layers = {id(p) for m in module.modules() if isinstance(m, tuple(layer_classes)) for p in m.parameters()}
    return [p for p in module.parameters() if not p.requires_grad and id(p) not in in_layers]
