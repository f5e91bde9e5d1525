"""``ModuleEngine``: the engine body shared by data-parallel engines that shard (or replicate) one torch module.

It composes the rooms of ``rlflow.engines.common`` around the hooks at the bottom of the class, which
are all such an engine (FSDP, FSDP2, torchtitan, DDP) implements: ``DelegatingEngine`` (modes,
zero_grad, offload), ``forward/`` (loading the forward module, the micro-batch loop, HF names, LoRA),
``optim/`` (AdamW, the optimizer step, host offload) and ``checkpoint/`` (DCP checkpoints, HF and peft
exports). The model hooks default to the HF module (fsdp, fsdp2, DDP); an engine built on another model
implementation (torchtitan) overrides how the forward module is loaded and how its names map to HF.
"""

from __future__ import annotations

import abc
from contextlib import AbstractContextManager
from functools import partial
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import torch
import torch.distributed as dist
from torch import nn
from transformers import AutoConfig

from rlflow.engines.base import Capability, EngineMesh, LossFn
from rlflow.engines.common.checkpoint.checkpointing import (
    EngineCheckpointer,
    load_module_state,
    save_model_files,
    save_module_state,
    setup_meta,
)
from rlflow.engines.common.checkpoint.hf_export import save_hf_from_export, write_from_export, write_peft_adapter_folder
from rlflow.engines.common.checkpoint.lora_export import adapter_tensors, merged_lora_tensors
from rlflow.engines.common.delegating_engine import DelegatingEngine
from rlflow.engines.common.distributed import join_process_group
from rlflow.engines.common.forward.forward_backward import run_forward_backward
from rlflow.engines.common.forward.hf_module import forward_micro_batch, hf_named_tensors, load_forward_module
from rlflow.engines.common.forward.lora import ADAPTER_CONFIG_FILE, LoraAdapters, adapters_disabled, is_adapter_param
from rlflow.engines.common.forward.models import MODEL_KIND_REGISTRY, ForwardModule
from rlflow.engines.common.forward.ulysses import SequenceParallel, check_heads
from rlflow.engines.common.optim.offload import HostOffload
from rlflow.engines.common.optim.optimizer_step import OptimizerStepper
from rlflow.engines.common.optim.optimizers import build_adamw, move_optimizer_state, no_decay_names
from rlflow.engines.config import EngineConfig, EngineConfigError, HFModuleEngineConfig, StepHyperparams
from rlflow.protocol import DataProto

__all__ = ["ModuleEngine"]


class ModuleEngine(DelegatingEngine):
    """Shared implementation of ``BaseEngine`` for engines whose model is one data-parallel-sharded module."""

    config_class = HFModuleEngineConfig
    config: EngineConfig
    # RESHARD: the state is a DCP checkpoint of FQN-keyed state dicts, which DCP redistributes over any world size
    capabilities = frozenset({Capability.MIXED_PRECISION, Capability.VALUE_MODEL, Capability.RESHARD, Capability.LORA,
                              Capability.SEQUENCE_PARALLEL})

    @classmethod
    def check_supported(cls, config: EngineConfig, model_kind: str = "causal_lm") -> None:
        super().check_supported(config, model_kind)
        if config.lora.enabled and model_kind != "causal_lm":
            raise EngineConfigError(f"lora.rank={config.lora.rank} on a {model_kind} model (critic, reward model) is not "
                                    "supported; set that engine's lora.rank=0")

    @classmethod
    def node_local_ranks(cls, config: EngineConfig) -> int:
        return config.ulysses_sequence_parallel_size  # an SP group exchanges heads in every attention layer

    @classmethod
    def check_model(cls, config: EngineConfig, model_path: str | Path, model_kind: str, world_size: int) -> None:
        size = config.ulysses_sequence_parallel_size
        if size == 1:
            return
        if world_size % size:
            raise EngineConfigError(f"ulysses_sequence_parallel_size={size} must divide the engine's {world_size} "
                                    "ranks (one SP group of adjacent ranks per data-parallel rank)")
        hf_config = AutoConfig.from_pretrained(model_path, local_files_only=True,
                                               trust_remote_code=config.trust_remote_code)
        problem = check_heads(hf_config, size)
        if problem:
            raise EngineConfigError(problem)

    def __init__(self, config: EngineConfig, model_path: str | Path, model_kind: str = "causal_lm") -> None:
        super().__init__(config, model_path, model_kind)
        self.kind = MODEL_KIND_REGISTRY.get(model_kind)
        self.module: Optional[nn.Module] = None

    def initialize(self) -> None:
        cfg = self.config
        self.device, self.rank, self.world_size = join_process_group(cfg.device)
        self.group: Optional[dist.ProcessGroup] = None  # checkpoints and exports: every rank (the default group)
        forward_module = self._load_forward_module()
        self.sequence_parallel = SequenceParallel.build(cfg.ulysses_sequence_parallel_size, self.rank, self.world_size,
                                                        forward_module.attn_implementation)
        self.sequence_parallel.install(forward_module.model)
        forward_module.sequence_parallel = self.sequence_parallel
        # global batch counts: the data-parallel ranks (None: all; with SP, this rank's place in every SP group)
        self.dp_group: Optional[dist.ProcessGroup] = self.sequence_parallel.dp_group
        self.lora: Optional[LoraAdapters] = forward_module.lora
        no_decay = no_decay_names(forward_module)
        self.hidden_size = forward_module.hidden_size
        self.attn_implementation = forward_module.attn_implementation
        self.forward_module = forward_module  # unwrapped: the same object as module under FSDP2, inside it otherwise
        self.module = self._parallelize(forward_module)
        self.module.train()
        self.optimizer = build_adamw(self.module.named_parameters(), no_decay, cfg.optimizer)
        self.stepper = OptimizerStepper(self.optimizer, cfg, self._clip_grad_norm)
        self.offloader = HostOffload(self.device, cfg, self._move_module, partial(move_optimizer_state, self.optimizer))
        setup = setup_meta(cfg.name, self.model_kind, self.world_size, {**self._layout(), **self._lora_layout()})
        reshard = Capability.RESHARD in self.capabilities
        self.checkpointer = EngineCheckpointer(setup, self.stepper, self.rank, self.group, reshard, cfg.seed)

    @property
    def mesh(self) -> EngineMesh:
        self._require_initialized()
        size = self.sequence_parallel.size  # an SP group takes one data-parallel rank's data; its first rank collects
        return EngineMesh(dp_rank=self.rank // size, dp_size=self.world_size // size,
                          is_collect=self.sequence_parallel.rank == 0)

    def forward_backward(
        self, batch: DataProto, loss_fn: Optional[LossFn] = None, forward_only: bool = False
    ) -> tuple[DataProto, dict[str, Any]]:
        self._require_initialized()
        forward = partial(forward_micro_batch, self.module, config=self.config, hidden_size=self.hidden_size,
                          attn_implementation=self.attn_implementation, device=self.device)
        with self.offloader.params_resident():
            return run_forward_backward(
                batch, forward, loss_fn, forward_only, self.config, group=self.dp_group, device=self.device,
                no_sync=self._grad_reduce_deferral(),
            )

    def optim_step(self, lr: Optional[float] = None, hyperparams: Optional[StepHyperparams] = None) -> dict[str, Any]:
        self._require_initialized()
        with self.offloader.resident():
            return self.stepper.step(lr, hyperparams)

    def save_checkpoint(self, path: str | Path) -> None:
        self._require_initialized()
        with self.offloader.resident(), self.checkpointer.save(path) as folder:
            save_module_state(folder, self.module, self.optimizer, self.group, trainable_only=self.lora is not None,
                              by_name=self._ranks_hold_different_parameters())
            save_model_files(folder, self.model_path, self.group)
            if self.lora is not None and self.rank == 0:  # what rlflow-export names the adapters' peft folder with
                (folder / ADAPTER_CONFIG_FILE).write_text(self.lora_adapter_config())

    def load_checkpoint(self, path: str | Path) -> None:
        self._require_initialized()
        with self.checkpointer.load(path) as folder, self.offloader.resident():
            load_module_state(folder, self.module, self.optimizer, self.group, trainable_only=self.lora is not None,
                              by_name=self._ranks_hold_different_parameters())

    def export_hf_weights(self, dtype: Optional[torch.dtype] = None) -> Iterator[tuple[str, torch.Tensor]]:
        self._require_initialized()
        with self.offloader.params_resident():
            named = self._iter_full_tensors()
            if self.lora is not None:
                named = merged_lora_tensors(named, self.lora.scaling)
            yield from self._hf_named_tensors(named, dtype)

    def save_hf(self, path: str | Path) -> None:
        self._require_initialized()
        config = self.kind.export_config(self.forward_module)
        save_hf_from_export(path, self.export_hf_weights(), self.model_path, config, self.group)

    # ------------------------------------------------------------------ LoRA
    def adapters_disabled(self) -> AbstractContextManager[None]:
        self._require_lora()
        return adapters_disabled(self.module)

    def export_lora_adapter(self, dtype: Optional[torch.dtype] = None) -> Iterator[tuple[str, torch.Tensor]]:
        self._require_lora()
        with self.offloader.params_resident():
            yield from adapter_tensors(self._iter_full_tensors(only=is_adapter_param), dtype)

    def lora_adapter_config(self) -> str:
        self._require_lora()
        return self.lora.adapter_config_json()

    def save_lora_adapter(self, path: str | Path) -> None:
        self._require_lora()
        config_json = self.lora_adapter_config()
        write_from_export(self.export_lora_adapter(), partial(write_peft_adapter_folder, path, adapter_config_json=config_json),
                          self.group)

    def _require_lora(self) -> None:
        self._require_initialized()
        if self.lora is None:
            raise self._no_adapters()

    def _lora_layout(self) -> dict[str, Any]:
        """What a checkpoint of adapters only must match: the adapters' shape and targets (none without LoRA)."""
        if self.lora is None:
            return {}
        peft_config = self.lora.peft_config
        return {"lora": {"rank": peft_config.r, "alpha": float(peft_config.lora_alpha),
                         "target_modules": sorted(peft_config.target_modules)}}

    # ------------------------------------------------------------------ model hooks
    def _load_forward_module(self) -> ForwardModule:
        """The unwrapped forward module of ``self.kind`` (default: the HF model, ``hf_module.load_forward_module``)."""
        return load_forward_module(self.kind, self.model_path, self.config, self.rank)

    def _hf_named_tensors(
        self, named_full_tensors: Iterator[tuple[str, torch.Tensor]], dtype: Optional[torch.dtype]
    ) -> Iterator[tuple[str, torch.Tensor]]:
        """``(hf_name, tensor)`` from ``_iter_full_tensors`` (default: the HF module's own names)."""
        return hf_named_tensors(named_full_tensors, dtype)

    # ------------------------------------------------------------------ sharding hooks
    @abc.abstractmethod
    def _parallelize(self, module: ForwardModule) -> nn.Module:
        """Shard ``module`` (decoder layers, then the root) and return the module to call."""

    @abc.abstractmethod
    def _clip_grad_norm(self, max_norm: float) -> float:
        """Clip gradients to ``max_norm`` in place; return the global (all-rank) norm before clipping."""

    @abc.abstractmethod
    def _iter_full_tensors(self, only: Optional[Callable[[str], bool]] = None) -> Iterator[tuple[str, torch.Tensor]]:
        """Yield ``(module parameter name, full tensor)`` one at a time on every rank (collective), for every
        parameter or those whose name ``only`` accepts (the others are not gathered)."""

    @abc.abstractmethod
    def _move_module(self, device: torch.device) -> None:
        """Move this rank's parameter shards and gradients to ``device``."""

    def _ranks_hold_different_parameters(self) -> bool:
        """Whether ranks hold different parameters (pipeline stages), not shards of the same ones: the checkpoint
        then keys the optimizer's group settings by parameter name (``save_module_state``'s ``by_name``)."""
        return False

    def _grad_reduce_deferral(self) -> Optional[Callable[[], AbstractContextManager[Any]]]:
        """A context manager factory that defers the gradient reduction of a micro-batch to the
        mini-batch's last one (``run_forward_backward``'s ``no_sync``); None: reduce every micro-batch."""
        return None

    @abc.abstractmethod
    def _layout(self) -> dict[str, Any]:
        """The parallel layout recorded in checkpoints, apart from the world size (which ``RESHARD`` lets differ)."""
