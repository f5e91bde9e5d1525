"""The SFT driver loop, written once for every launcher (Ray worker groups or ``torchrun``).

``SFTTrainer`` moves batches between the data loaders and a group of ``SFTWorker`` ranks: one
``forward_backward`` plus one ``optim_step`` per global batch (``data.train_batch_size``
samples split over the data-parallel ranks), the validation loss every ``trainer.test_freq``
steps, a checkpoint every ``trainer.save_freq`` steps (``RunCheckpoints``: engine state plus the
driver's step and data-loader position, so a resumed run sees exactly the batches an
uninterrupted one would), and a final Hugging Face export. Under ``torchrun`` every rank runs
this loop (the group calls are collective) and only the driver (rank 0) logs and writes the
driver state.

``prepare_sft_run`` does the launcher-independent set-up: the engine's check against the model and the
ranks (``BaseEngine.check_model``), tokenizer, loaders (every data error
surfaces here, before any worker starts), the engine config the workers build and the divergence
guard (``rlflow.trainer.divergence``: a run of non-finite-gradient steps stops the run).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Optional, Protocol

import torch
import torch.distributed as dist
from omegaconf import DictConfig, OmegaConf

from rlflow.config import ConfigError
from rlflow.data.files import resolve_files
from rlflow.data.sampler import BatchLoader, build_loader
from rlflow.data.sft_dataset import SFTDataset, build_sft_loader
from rlflow.engines.common.optim.lr_schedulers import fit_schedule_to_run
from rlflow.models.loading import load_tokenizer
from rlflow.observability.tracking import Tracking
from rlflow.protocol import DataProto
from rlflow.roles.sft_worker import SFT_MESH
from rlflow.trainer.checkpoint import PARTIAL_SUFFIX, CheckpointManager
from rlflow.config.loading.auto_settings import RunKeys, speed_settings_line
from rlflow.config.loading.engine_checks import check_engine_fits
from rlflow.trainer.divergence import DivergenceGuard
from rlflow.trainer.preemption import PreemptionFlag
from rlflow.trainer.run_folder import export_dir
from rlflow.utils.logging import get_logger
from rlflow.workers import MeshTable

logger = get_logger(__name__)

ENGINE_CHECKPOINT_DIR = "engine"


class SFTGroup(Protocol):
    """What the loop needs from a group of ``SFTWorker`` ranks (``RayWorkerGroup`` or ``LocalWorkerGroup``)."""

    def forward_backward(self, batch: DataProto) -> dict[str, float]: ...

    def optim_step(self) -> list[dict[str, Any]]: ...

    def evaluate(self, batch: DataProto) -> dict[str, float]: ...

    def save_checkpoint(self, path: str) -> Any: ...

    def load_checkpoint(self, path: str) -> Any: ...

    def save_hf(self, path: str) -> Any: ...

    def save_lora_adapter(self, path: str) -> Any: ...

    def mesh_table(self, mesh_name: str) -> MeshTable: ...


@dataclass
class SFTRun:
    """Everything a launcher needs to start the workers and the loop."""

    train_loader: BatchLoader
    val_loader: Optional[BatchLoader]
    engine_config: dict[str, Any]
    total_steps: int
    guard: DivergenceGuard = field(default_factory=DivergenceGuard)  # trainer.max_consecutive_skipped_steps


def total_training_steps(trainer_config: Any, steps_per_epoch: int) -> int:
    """``trainer.total_training_steps`` if set, else ``trainer.total_epochs`` x batches per epoch."""
    if trainer_config.total_training_steps is not None:
        if trainer_config.total_training_steps < 1:
            raise ConfigError(f"config key 'trainer.total_training_steps': must be >= 1, got {trainer_config.total_training_steps}")
        return int(trainer_config.total_training_steps)
    if trainer_config.total_epochs < 1:
        raise ConfigError(f"config key 'trainer.total_epochs': must be >= 1, got {trainer_config.total_epochs}")
    return steps_per_epoch * int(trainer_config.total_epochs)


def prepare_sft_run(config: DictConfig, model_path: Path, world_size: int) -> SFTRun:
    """Check the engine can run the model on ``world_size`` ranks, tokenize the data into loaders and derive the
    engine config (raises ``DataError`` / ``ConfigError``)."""
    data = config.data
    resolve_files(list(data.train_files))  # a missing file is reported before the tokenizer loads
    if data.val_files:
        resolve_files(list(data.val_files))
    check_engine_fits(config, "engine", model_path, "causal_lm", world_size)
    tokenizer = load_tokenizer(config.model.tokenizer_path or model_path, config.model.trust_remote_code)
    train_loader = build_sft_loader(data, tokenizer, "train")
    val_loader = None
    if data.val_files:
        val_batch_size = data.val_batch_size or data.train_batch_size
        val_loader = build_loader(SFTDataset.from_config(data, tokenizer, "val"), val_batch_size, shuffle=False, drop_last=False)
    total_steps = total_training_steps(config.trainer, len(train_loader))
    engine_config = OmegaConf.to_container(config.engine, resolve=True)
    if engine_config.get("device", "auto") == "auto":
        engine_config["device"] = config.trainer.device
    note = fit_schedule_to_run(engine_config.setdefault("lr_scheduler", {}), total_steps, "engine.lr_scheduler")
    if note is not None:
        logger.warning(note)
    logger.info(speed_settings_line(config, ["engine"], RunKeys()))
    return SFTRun(train_loader, val_loader, engine_config, total_steps, DivergenceGuard.from_config(config))


def _any_rank(flag: bool) -> bool:
    """``flag`` or'ed over the torchrun ranks (each gets its own SIGTERM), so every rank stops at the same step."""
    if not (dist.is_available() and dist.is_initialized()):
        return flag
    value = torch.tensor([int(flag)], device="cuda" if dist.get_backend() == "nccl" else "cpu")
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item())


def pad_batch_without_loss(batch: DataProto, divisor: int) -> DataProto:
    """``batch`` padded to a multiple of ``divisor`` rows; the padding rows carry no loss tokens."""
    padded, pad_size = batch.pad_to_divisor(divisor)
    if pad_size:
        padded.batch["loss_mask"][-pad_size:] = 0
    return padded


class SFTTrainer:
    """Runs SFT steps on a worker group: train, validate, checkpoint, resume, export.

    ``is_driver``: this process logs and writes driver state (always true under Ray; rank 0
    under torchrun). ``tracking`` may be None on non-driver ranks. ``fit()`` returns the metrics
    of every step it ran (the same on every rank).
    """

    def __init__(
        self,
        config: DictConfig,
        group: SFTGroup,
        run: SFTRun,
        tracking: Optional[Tracking] = None,
        is_driver: bool = True,
    ):
        self.config = config
        self.trainer_config = config.trainer
        self.group = group
        self.train_loader = run.train_loader
        self.val_loader = run.val_loader
        self.total_steps = run.total_steps
        self.tracking = tracking
        self.is_driver = is_driver
        self.dp_size = group.mesh_table(SFT_MESH).dp_size
        batch_size = config.data.train_batch_size
        if batch_size % self.dp_size:
            raise ConfigError(
                f"config key 'data.train_batch_size': {batch_size} must be divisible by the data-parallel size "
                f"{self.dp_size} (trainer.nnodes x trainer.n_procs_per_node / model-parallel size)"
            )
        self.checkpoints = CheckpointManager.for_run(config)
        self.guard = run.guard
        self.global_step = 0
        self.history: list[dict[str, Any]] = []

    # ------------------------------------------------------------------ the loop
    def fit(self) -> list[dict[str, Any]]:
        """Train to ``total_steps`` (resuming first if configured), then export the HF folder.

        A step is logged before it is checkpointed (a kill between the two loses no row);
        SIGTERM checkpoints the current step and returns early, without the export.
        """
        self.resume()
        if self.val_loader is not None and self.trainer_config.val_before_train and self.global_step == 0:
            self._log(self.validate(), step=0)
        batches = self._batches()
        with PreemptionFlag() as preemption:
            while self.global_step < self.total_steps:
                self.global_step += 1
                metrics = self.train_step(next(batches))
                if self._due(self.trainer_config.test_freq) and self.val_loader is not None:
                    metrics.update(self.validate())
                self._log(metrics, step=self.global_step)
                preempted = _any_rank(preemption.requested)
                if self._due(self.trainer_config.save_freq) or preempted:
                    self.save_checkpoint()
                if preempted and self.global_step < self.total_steps:
                    logger.warning("preempted after step %d: checkpoint saved; run the same command to resume", self.global_step)
                    return self.history
        self.export_hf()
        return self.history

    def _batches(self) -> Iterator[DataProto]:
        while True:  # epoch after epoch; the loader's position is part of every checkpoint
            yield from self.train_loader

    def _due(self, freq: int) -> bool:
        """Every ``freq`` steps (``freq`` <= 0: never) and always at the last step, as in the PPO driver."""
        return self.global_step == self.total_steps or (freq > 0 and self.global_step % freq == 0)

    def train_step(self, batch: DataProto) -> dict[str, Any]:
        """One optimizer step on one global batch."""
        start = time.perf_counter()
        loss_metrics = self.group.forward_backward(batch)
        optim_metrics = self.group.optim_step()[0]
        elapsed = time.perf_counter() - start
        return {
            "train/loss": loss_metrics["loss"],
            "train/loss_tokens": loss_metrics["num_tokens"],
            "train/grad_norm": optim_metrics["grad_norm"],
            "train/lr": optim_metrics["lr"],
            "train/skipped_steps": optim_metrics["skipped_steps"],
            **self.guard.check_optim_step("train", bool(optim_metrics["skipped"])),
            "train/epoch": (self.global_step - 1) // len(self.train_loader),
            "timing_s/step": elapsed,
            "perf/throughput": float(batch.batch["attention_mask"].sum()) / elapsed,
        }

    def validate(self) -> dict[str, float]:
        """Token-mean SFT loss over the whole validation set."""
        weighted_loss, tokens = 0.0, 0.0
        for batch in self.val_loader:
            metrics = self.group.evaluate(pad_batch_without_loss(batch, self.dp_size))
            weighted_loss += metrics["loss"] * metrics["num_tokens"]
            tokens += metrics["num_tokens"]
        return {"val/loss": weighted_loss / tokens if tokens else math.nan}

    def _log(self, metrics: dict[str, Any], step: int) -> None:
        self.history.append({"step": step, **metrics})
        if self.tracking is not None:
            self.tracking.log(metrics, step)

    # ------------------------------------------------------------------ checkpoints and export
    def save_checkpoint(self) -> None:
        """``global_step_N``: the engine checkpoint (collective), then the driver state (driver only)."""

        def save_workers(folder: Path) -> None:
            self.group.save_checkpoint(str(folder / ENGINE_CHECKPOINT_DIR))

        step = self.global_step
        if self.is_driver:
            state = {"global_step": step, "train_loader": self.train_loader.state_dict(),
                     "divergence_guard": self.guard.state_dict()}
            path = self.checkpoints.save(step, state, save_workers)
            logger.info("saved checkpoint %s", path)
        else:  # the other torchrun ranks take part in the engine save into the driver's partial folder
            step_dir = self.checkpoints.step_dir(step)
            save_workers(step_dir.with_name(step_dir.name + PARTIAL_SUFFIX))

    def resume(self) -> None:
        """Restore engine, step and data position from the checkpoint ``trainer.resume_mode`` picks, if any."""
        folder = self.checkpoints.resolve(self.trainer_config.resume_mode, self.trainer_config.resume_from_path)
        if folder is None:
            return
        state = self.checkpoints.load_driver_state(folder, ("global_step", "train_loader", "divergence_guard"))
        self.group.load_checkpoint(str(folder / ENGINE_CHECKPOINT_DIR))
        self.train_loader.load_state_dict(state["train_loader"])
        self.guard.load_state_dict(state["divergence_guard"])
        self.global_step = int(state["global_step"])
        logger.info("resumed from %s at step %d of %d", folder, self.global_step, self.total_steps)

    def export_hf(self) -> Path:
        """Write the trained weights as an HF folder (``trainer.export_hf_dir`` or ``<default_local_dir>/hf``)."""
        path = export_dir(self.trainer_config)
        self.group.save_hf(str(path))
        if self.is_driver:
            logger.info("exported the model to %s", path)
        adapter_dir = self.trainer_config.export_lora_adapter_dir
        if adapter_dir:
            self.group.save_lora_adapter(str(adapter_dir))
            if self.is_driver:
                logger.info("exported the LoRA adapters to %s", adapter_dir)
        return path
