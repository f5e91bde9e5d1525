"""``test_ddp``: an engine that is NOT a ``ModuleEngine``, built only from the shared helpers.

It proves the engine contract works without ``ModuleEngine``: a ``BaseEngine`` subclass
that replicates one HF forward module with ``torch.nn.parallel.DistributedDataParallel``
(gloo on CPU) and composes ``rlflow.engines.common``: model loading and the micro-batch
forward (``hf_module``), the micro-batch loop with DDP's ``no_sync`` (``forward_backward``),
the optimizer step, offload bookkeeping, checkpoint folders/meta with DCP state, and the
HF export. It computes in its storage dtype (no mixed precision).

Registered when this module is imported (the engine test modules import it, so spawned
test processes have it too).
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Iterator, Optional

import torch
from torch.nn.parallel import DistributedDataParallel

from rlflow.engines import BaseEngine, EngineMesh, EngineRegistry, LossFn
from rlflow.engines.base import Capability
from rlflow.engines.common.checkpointing import EngineCheckpointer, load_module_state, save_module_state, setup_meta
from rlflow.engines.common.distributed import join_process_group
from rlflow.engines.common.forward_backward import run_forward_backward
from rlflow.engines.common.hf_export import save_hf_from_export
from rlflow.engines.common.hf_module import forward_micro_batch, hf_named_tensors, load_forward_module
from rlflow.engines.common.models import get_model_kind
from rlflow.engines.common.modes import module_mode
from rlflow.engines.common.offload import HostOffload
from rlflow.engines.common.optimizer_step import OptimizerStepper
from rlflow.engines.common.optimizers import build_adamw, move_optimizer_state, no_decay_names
from rlflow.engines.config import HFModuleEngineConfig, StepHyperparams
from rlflow.protocol import DataProto

__all__ = ["DDPTestEngine", "DDPTestEngineConfig"]


@dataclass
class DDPTestEngineConfig(HFModuleEngineConfig):
    """Options of the ``test_ddp`` engine."""

    name: str = "test_ddp"
    bucket_cap_mb: int = 25  # DDP gradient all-reduce bucket size


@EngineRegistry.register("test_ddp")
class DDPTestEngine(BaseEngine):
    """Replicated model; DDP averages gradients once per mini-batch (``no_sync`` on earlier micro-batches)."""

    config_class = DDPTestEngineConfig
    config: DDPTestEngineConfig
    capabilities = frozenset({Capability.VALUE_MODEL})

    def __init__(self, config: DDPTestEngineConfig, model_path: str | Path, model_kind: str = "causal_lm") -> None:
        super().__init__(config, model_path, model_kind)
        self.kind = get_model_kind(model_kind)
        self.module: Optional[DistributedDataParallel] = None

    def initialize(self) -> None:
        cfg = self.config
        self.device, self.rank, self.world_size = join_process_group(cfg.device)
        forward_module = load_forward_module(self.kind, self.model_path, cfg, self.rank).to(self.device)
        no_decay = no_decay_names(forward_module)
        # the buffers (rotary frequencies) are computed identically on every rank: no per-forward sync
        self.module = DistributedDataParallel(forward_module, bucket_cap_mb=cfg.bucket_cap_mb, forward_sync_buffers=False)
        self.module.train()
        self.optimizer = build_adamw(self.module.module.named_parameters(), no_decay, cfg.optimizer)
        self.stepper = OptimizerStepper(self.optimizer, cfg, self._clip_grad_norm)
        self.offloader = HostOffload(self.device, cfg, self.module.to, partial(move_optimizer_state, self.optimizer))
        setup = setup_meta(cfg.name, self.model_kind, self.world_size, {"dp_replicate": self.world_size})
        self.checkpointer = EngineCheckpointer(setup, self.stepper, self.rank, None)

    def _clip_grad_norm(self, max_norm: float) -> float:
        """Gradients are already averaged and identical on every rank: the local norm is the global one."""
        return torch.nn.utils.clip_grad_norm_(self.module.parameters(), max_norm).item()

    @property
    def mesh(self) -> EngineMesh:
        return EngineMesh(dp_rank=self.rank, dp_size=self.world_size, is_collect=True)

    def forward_backward(
        self, batch: DataProto, loss_fn: Optional[LossFn] = None, forward_only: bool = False
    ) -> tuple[DataProto, dict[str, Any]]:
        forward = partial(forward_micro_batch, self.module, config=self.config,
                          attn_implementation=self.module.module.attn_implementation, device=self.device)
        with self.offloader.params_resident():
            return run_forward_backward(
                batch, forward, loss_fn, forward_only, self.config, group=None, device=self.device, no_sync=self.module.no_sync
            )

    def optim_step(self, lr: Optional[float] = None, hyperparams: Optional[StepHyperparams] = None) -> dict[str, Any]:
        with self.offloader.resident():
            return self.stepper.step(lr, hyperparams)

    def zero_grad(self) -> None:
        self.stepper.zero_grad()

    def train_mode(self) -> AbstractContextManager[None]:
        return module_mode([self.module], True)

    def eval_mode(self) -> AbstractContextManager[None]:
        return module_mode([self.module], False)

    def offload(self) -> None:
        self.offloader.offload()

    def onload(self) -> None:
        self.offloader.onload()

    def save_checkpoint(self, path: str | Path) -> None:
        with self.offloader.resident(), self.checkpointer.save(path) as folder:
            save_module_state(folder, self.module, self.optimizer, None)

    def load_checkpoint(self, path: str | Path) -> None:
        with self.checkpointer.load(path) as folder, self.offloader.resident():
            load_module_state(folder, self.module, self.optimizer, None)

    def export_hf_weights(self, dtype: Optional[torch.dtype] = None) -> Iterator[tuple[str, torch.Tensor]]:
        """Every rank holds the full replica: no gather, just names and the cast."""
        with self.offloader.params_resident():
            named = ((name, param.detach()) for name, param in self.module.module.named_parameters())
            yield from hf_named_tensors(named, dtype)

    def save_hf(self, path: str | Path) -> None:
        save_hf_from_export(path, self.export_hf_weights(), self.model_path, self.kind.export_config(self.module.module))
