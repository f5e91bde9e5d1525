"""``test_ddp``: the DDP engine of docs/engines.md ("Adding an engine"), as a newcomer writes it.

A ``ModuleEngine`` (the base for one torch module that a data-parallel wrapper shards or
replicates): ``torch.nn.parallel.DistributedDataParallel`` replicates the HF forward module (gloo
on CPU) and the five sharding hooks are all it writes. It computes in its storage dtype (no
``Capability.MIXED_PRECISION``) and resumes only at the world size it saved at (no ``RESHARD``:
the engine suite's wrong-world-size checkpoint case).

Registered when this module is imported (the engine test modules import it, so spawned
test processes have it too).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch.nn.parallel import DistributedDataParallel

from rlflow.config.ranges import AT_LEAST_1, Ranges
from rlflow.engines import Capability, ENGINE_REGISTRY, HFModuleEngineConfig, ModuleEngine

__all__ = ["DDPTestEngine", "DDPTestEngineConfig"]


@dataclass
class DDPTestEngineConfig(HFModuleEngineConfig):
    """Options of the ``test_ddp`` engine."""

    name: str = "test_ddp"
    bucket_cap_mb: int = 25  # DDP gradient all-reduce bucket size

    RANGES: ClassVar[Ranges] = {"bucket_cap_mb": AT_LEAST_1}


@ENGINE_REGISTRY.register("test_ddp")
class DDPTestEngine(ModuleEngine):
    """Replicated model, gradients all-reduced (average) by DDP once per mini-batch."""

    config_class = DDPTestEngineConfig
    config: DDPTestEngineConfig
    capabilities = frozenset({Capability.VALUE_MODEL})

    def _parallelize(self, module):
        # the buffers (rotary frequencies) are computed identically on every rank: no per-forward sync
        return DistributedDataParallel(module.to(self.device), bucket_cap_mb=self.config.bucket_cap_mb,
                                       forward_sync_buffers=False)

    def _grad_reduce_deferral(self):
        return self.module.no_sync  # earlier micro-batches accumulate; the mini-batch's last one all-reduces

    def _clip_grad_norm(self, max_norm):
        return torch.nn.utils.clip_grad_norm_(self.module.parameters(), max_norm).item()  # grads equal on all ranks

    def _iter_full_tensors(self, only=None):
        for name, param in self.module.module.named_parameters():
            if only is None or only(name):
                yield name, param.detach()

    def _move_module(self, device):
        self.module.to(device)

    def _layout(self):
        return {}  # every rank a full replica: nothing to record besides the world size
