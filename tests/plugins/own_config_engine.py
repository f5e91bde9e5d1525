"""A plugin engine whose config class is its own (a subclass of ``HFModuleEngineConfig``, not of FSDP2's).

The engine from docs/engines.md: one replicated module, gradients all-reduced by DDP. It has no
YAML under rlflow/configs/engine/, so ``engine.name=user_ddp`` composes a node of the command line's
keys and ``UserDDPEngineConfig`` supplies every other default. The SFT parity suite
(tests/trainer/test_sft_parity.py) trains with it through ``trainer.plugins``, as a user would.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.nn.parallel import DistributedDataParallel

from rlflow.engines.common.module_engine import ModuleEngine
from rlflow.engines.config import HFModuleEngineConfig
from rlflow.engines.registry import ENGINE_REGISTRY


@dataclass
class UserDDPEngineConfig(HFModuleEngineConfig):
    """The options of an engine over one HF module, plus DDP's bucket size."""

    name: str = "user_ddp"
    bucket_cap_mb: int = 25


@ENGINE_REGISTRY.register("user_ddp")
class UserDDPEngine(ModuleEngine):
    """Replicated model, gradients averaged by DDP."""

    config_class = UserDDPEngineConfig
    config: UserDDPEngineConfig

    def _parallelize(self, module):
        return DistributedDataParallel(module.to(self.device), bucket_cap_mb=self.config.bucket_cap_mb)

    def _clip_grad_norm(self, max_norm):
        return torch.nn.utils.clip_grad_norm_(self.module.parameters(), max_norm).item()

    def _iter_full_tensors(self, only=None):
        for name, param in self.module.module.named_parameters():
            if only is None or only(name):
                yield name, param.detach()

    def _move_module(self, device):
        self.module.to(device)

    def _layout(self):
        return {}  # every rank a full replica: nothing to record besides the world size (RESHARD frees it)
