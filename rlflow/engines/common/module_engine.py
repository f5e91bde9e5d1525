"""``ModuleEngine``: the engine body shared by data-parallel engines that shard one torch module.

Everything that is not about *how* the module is sharded lives here once: model
loading, micro-batching, packing, log-probs, loss scaling, the optimizer step with
clipping and non-finite skipping, LR schedule, offload, checkpoints and HF export.
A subclass (FSDP, FSDP2, ...) implements the hooks at the bottom of the class.
"""

from __future__ import annotations

import abc
import math
from collections import defaultdict
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any, Iterator, Optional

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from rlflow.engines.base import BaseEngine, EngineMesh, LossFn
from rlflow.engines.common import checkpointing as ckpt
from rlflow.engines.common.distributed import ensure_process_group, local_rank
from rlflow.engines.common.hf_export import write_hf_folder
from rlflow.engines.common.loss_scaling import global_counts, global_loss
from rlflow.engines.common.lr_schedulers import LRSchedule
from rlflow.engines.common.micro_batching import plan_micro_batches
from rlflow.engines.common.models import FORWARD_PREFIX, HFForwardModule, get_model_kind
from rlflow.engines.common.optimizers import build_adamw, clean_param_name, move_optimizer_state, no_decay_names
from rlflow.engines.common.packing import make_token_stream
from rlflow.engines.config import EngineConfig
from rlflow.protocol import DataProto
from rlflow.utils.device import set_device
from rlflow.utils.logging import get_logger
from rlflow.utils.seed import set_seed

__all__ = ["ModuleEngine"]

_logger = get_logger(__name__)
_HOST = torch.device("cpu")


class ModuleEngine(BaseEngine):
    """Shared implementation of ``BaseEngine`` for engines whose model is one data-parallel-sharded module."""

    def __init__(self, config: EngineConfig, model_path: str | Path, model_kind: str = "causal_lm") -> None:
        super().__init__(config, model_path, model_kind)
        self.kind = get_model_kind(model_kind)
        self.module: Optional[nn.Module] = None

    # ------------------------------------------------------------------ set-up
    def initialize(self) -> None:
        cfg = self.config
        self.device = set_device(cfg.device, local_rank())
        ensure_process_group(self.device.type)
        self.group: Optional[dist.ProcessGroup] = None  # the default group: every rank is a data-parallel rank
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        set_seed(cfg.seed)  # identical on every rank: any freshly initialised weights (a new value head) agree
        model = self.kind.load(self.model_path, dtype=cfg.dtype, attn_implementation=cfg.attn_implementation)
        set_seed(cfg.seed + self.rank)  # per-rank streams for dropout and sampling
        if cfg.gradient_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        forward_module = self.kind.forward_cls(model, cfg.logprob_chunk_size)
        no_decay = no_decay_names(forward_module)
        self.module = self._parallelize(forward_module)
        self.module.train()
        self.optimizer = build_adamw(self.module.named_parameters(), no_decay, cfg.optimizer)
        self.lr_schedule = LRSchedule(cfg.lr_scheduler, cfg.optimizer.lr)
        self.skipped_steps = 0
        self._params_on_host = self._optimizer_on_host = False
        self._offload_idle_state()

    def _require_initialized(self) -> None:
        if self.module is None:
            raise RuntimeError(f"{type(self).__name__} is not initialized; call initialize() first")

    @property
    def mesh(self) -> EngineMesh:
        self._require_initialized()
        return EngineMesh(dp_rank=self.rank, dp_size=self.world_size, is_collect=True)

    # ------------------------------------------------------------------ compute
    def forward_backward(
        self, batch: DataProto, loss_fn: Optional[LossFn] = None, forward_only: bool = False
    ) -> tuple[DataProto, dict[str, Any]]:
        self._require_initialized()
        if loss_fn is None and not forward_only:
            raise ValueError("forward_backward needs a loss_fn unless forward_only=True")
        for key in ("input_ids", "attention_mask"):
            if key not in batch.batch:
                raise ValueError(f"engine batch needs '{key}' ([B, T]); batch has {sorted(batch.batch)}")
        temperature = float(batch.meta_info.get("temperature", 1.0))
        compute_entropy = bool(batch.meta_info.get("compute_entropy", False))
        cfg = self.config
        plan = plan_micro_batches(
            batch.batch["attention_mask"].sum(-1).tolist(),
            micro_batch_size=cfg.micro_batch_size,
            use_dynamic_bsz=cfg.use_dynamic_bsz,
            max_token_len=cfg.max_token_len_per_micro_batch,
            group=self.group,
            device=self.device,
        )
        counts = global_counts(batch, len(plan.groups), self.group, self.device) if loss_fn is not None else None
        outputs: dict[str, list[torch.Tensor]] = defaultdict(list)
        losses: list[torch.Tensor] = []
        metric_lists: dict[str, list[float]] = defaultdict(list)
        with self._params_resident(), torch.set_grad_enabled(not forward_only):
            for index, rows in enumerate(plan.groups):
                micro = batch[rows].to(self.device)
                model_out = self._forward_micro_batch(micro, temperature, compute_entropy)
                if loss_fn is not None:
                    loss, metrics = loss_fn(model_out, micro, counts.context(index))
                    if not forward_only:
                        loss.backward()
                    losses.append(loss.detach())
                    for key, value in (metrics or {}).items():
                        metric_lists[key].append(float(value))
                for key, value in model_out.items():
                    outputs[key].append(value.detach())
        result = DataProto.from_dict({key: plan.restore(torch.cat(parts)) for key, parts in outputs.items()})
        metrics_out: dict[str, Any] = {key: sum(vals) / len(vals) for key, vals in metric_lists.items()}
        metrics_out["num_micro_batches"] = len(plan.groups)
        if counts is not None:
            metrics_out["loss"] = global_loss(losses, counts.dp_size, self.group, self.device)
            metrics_out["num_tokens"] = counts.num_tokens
            metrics_out["num_seqs"] = counts.num_seqs
        return result, metrics_out

    def _forward_micro_batch(self, micro: DataProto, temperature: float, compute_entropy: bool) -> dict[str, torch.Tensor]:
        stream = make_token_stream(
            micro.batch["input_ids"],
            micro.batch["attention_mask"],
            micro.batch.get("position_ids"),
            remove_padding=self.config.use_remove_padding,
            attn_implementation=self.config.attn_implementation,
        )
        return self.module(stream, temperature, compute_entropy)

    def optim_step(self, lr: Optional[float] = None) -> dict[str, Any]:
        self._require_initialized()
        with self._params_resident(), self._optimizer_resident():
            max_norm = self.config.optimizer.grad_clip
            grad_norm = float(self._clip_grad_norm(max_norm if max_norm > 0 else math.inf))
            step_lr = self.lr_schedule.current_lr() if lr is None else float(lr)
            skipped = not math.isfinite(grad_norm)
            if skipped:
                self.skipped_steps += 1
                _logger.warning("grad norm is %s: skipping optimizer step %d", grad_norm, self.lr_schedule.step_count)
            else:
                for group in self.optimizer.param_groups:
                    group["lr"] = step_lr
                self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            self.lr_schedule.advance()
        return {"grad_norm": grad_norm, "lr": step_lr, "skipped": skipped, "skipped_steps": self.skipped_steps}

    def zero_grad(self) -> None:
        self._require_initialized()
        self.optimizer.zero_grad(set_to_none=True)

    @contextmanager
    def _mode(self, training: bool) -> Iterator[None]:
        self._require_initialized()
        previous = self.module.training
        self.module.train(training)
        try:
            yield
        finally:
            self.module.train(previous)

    def train_mode(self) -> AbstractContextManager[None]:
        return self._mode(True)

    def eval_mode(self) -> AbstractContextManager[None]:
        return self._mode(False)

    # ------------------------------------------------------------------ memory placement
    def offload(self) -> None:
        self._require_initialized()
        self._place_params(_HOST)
        self._place_optimizer(_HOST)

    def onload(self) -> None:
        self._require_initialized()
        self._place_params(self.device)
        self._place_optimizer(self.device)

    def _place_params(self, device: torch.device) -> None:
        self._move_module(device)
        self._params_on_host = device == _HOST and self.device != _HOST

    def _place_optimizer(self, device: torch.device) -> None:
        move_optimizer_state(self.optimizer, device)
        self._optimizer_on_host = device == _HOST and self.device != _HOST

    def _offload_idle_state(self) -> None:
        """Apply the config's offload flags between calls."""
        if self.config.param_offload:
            self._place_params(_HOST)
        if self.config.optimizer_offload:
            self._place_optimizer(_HOST)

    @contextmanager
    def _params_resident(self) -> Iterator[None]:
        if self._params_on_host:
            self._place_params(self.device)
        yield
        if self.config.param_offload:
            self._place_params(_HOST)

    @contextmanager
    def _optimizer_resident(self) -> Iterator[None]:
        if self._optimizer_on_host:
            self._place_optimizer(self.device)
        yield
        if self.config.optimizer_offload:
            self._place_optimizer(_HOST)

    # ------------------------------------------------------------------ checkpoints
    def _setup_meta(self) -> dict[str, Any]:
        return {
            "engine": self.config.name,
            "model_kind": self.model_kind,
            "world_size": self.world_size,
            "layout": self._layout(),
        }

    def save_checkpoint(self, path: str | Path) -> None:
        self._require_initialized()
        with self._params_resident(), self._optimizer_resident():
            model_state, optim_state = get_state_dict(self.module, self.optimizer)
            with ckpt.atomic_checkpoint_dir(path, self.group) as folder:
                dcp.save(
                    {"model": model_state, "optim": optim_state},
                    checkpoint_id=str(folder / ckpt.MODEL_OPTIM_DIR),
                    process_group=self.group,
                )
                ckpt.save_rng(folder, self.rank)
                meta = {**self._setup_meta(), "lr_schedule": self.lr_schedule.state_dict(), "skipped_steps": self.skipped_steps}
                ckpt.write_meta(folder, meta, self.group)

    def load_checkpoint(self, path: str | Path) -> None:
        self._require_initialized()
        folder = ckpt.resolve_checkpoint_dir(path)
        meta = ckpt.read_meta(folder)
        ckpt.check_compatible(meta, self._setup_meta(), folder)
        with self._params_resident(), self._optimizer_resident():
            model_state, optim_state = get_state_dict(self.module, self.optimizer)
            state = {"model": model_state, "optim": optim_state}
            dcp.load(state, checkpoint_id=str(folder / ckpt.MODEL_OPTIM_DIR), process_group=self.group)
            set_state_dict(self.module, self.optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
        ckpt.load_rng(folder, self.rank)
        self.lr_schedule.load_state_dict(meta["lr_schedule"])
        self.skipped_steps = int(meta["skipped_steps"])

    # ------------------------------------------------------------------ HF export
    def export_hf_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        self._require_initialized()
        with self._params_resident():
            for name, tensor in self._iter_full_tensors():
                yield clean_param_name(name).removeprefix(FORWARD_PREFIX), tensor

    def save_hf(self, path: str | Path) -> None:
        self._require_initialized()
        tensors = self.export_hf_weights()
        if self.rank == 0:
            write_hf_folder(path, tensors, self.model_path, self.kind.weight_file)
        else:
            for _ in tensors:  # the gathers are collective
                pass
        dist.barrier(group=self.group)

    # ------------------------------------------------------------------ sharding hooks
    @abc.abstractmethod
    def _parallelize(self, module: HFForwardModule) -> nn.Module:
        """Shard ``module`` (decoder layers, then the root) and return the module to call."""

    @abc.abstractmethod
    def _clip_grad_norm(self, max_norm: float) -> float:
        """Clip gradients to ``max_norm`` in place; return the global (all-rank) norm before clipping."""

    @abc.abstractmethod
    def _iter_full_tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Yield ``(module parameter name, full tensor)`` one at a time on every rank (collective)."""

    @abc.abstractmethod
    def _move_module(self, device: torch.device) -> None:
        """Move this rank's parameter shards and gradients to ``device``."""

    @abc.abstractmethod
    def _layout(self) -> dict[str, Any]:
        """The parallel layout recorded in checkpoints (e.g. shard and replicate sizes)."""
