"""The two ways ``main_sft`` runs its workers (``trainer.launcher``), each the same ``SFTWorker`` code and loop.

* ``ray`` (default): this process is the controller; the workers are a ``RayWorkerGroup`` of
  ``trainer.nnodes x trainer.n_procs_per_node`` processes (a local Ray cluster is started
  unless ``trainer.ray_address`` names one).
* ``torchrun``: every process holds its own worker in-process (``LocalWorkerGroup``) and rank 0 logs.
  Without torchrun's environment it is a one-process run.
"""

from __future__ import annotations

import os
from typing import Any, Callable

import torch.distributed as dist
from omegaconf import DictConfig

from rlflow.config import ConfigError
from rlflow.config.loading.timeouts import group_timeouts, resource_wait_s
from rlflow.data.tasks.corpus import tokenizer_corpus
from rlflow.errors import UserError
from rlflow.models.ensure import ensure_model, model_folder
from rlflow.observability.tracking import Tracking
from rlflow.roles.sft_worker import SFTWorker
from rlflow.trainer.run_folder import RunLock, open_run_folder
from rlflow.trainer.sft_trainer import SFTRun, SFTTrainer, prepare_sft_run
from rlflow.utils.registry import Registry
from rlflow.workers import RayWorkerGroup, ResourcePool, WorkerSpec, init_cluster, shutdown_ray
from rlflow.workers.local_group import LocalWorkerGroup
from rlflow.workers.worker import ENV_DEVICE, WorkerContext, setup_worker_process

History = list[dict[str, Any]]

# trainer.launcher -> the function that runs the SFT loop with its workers (config loading checks the key).
LAUNCHER_REGISTRY: Registry[Callable[[DictConfig], History]] = Registry("launcher", "trainer.launcher", error=ConfigError)


def _tracking(config: DictConfig, run: SFTRun) -> Tracking:
    trainer = config.trainer
    return Tracking(
        trainer.project_name,
        trainer.experiment_name,
        trainer.logger,
        config=config,
        output_dir=trainer.default_local_dir,
        total_steps=run.total_steps,
    )


@LAUNCHER_REGISTRY.register("ray")
def launch_ray(config: DictConfig) -> History:
    """Controller in this process, one Ray actor per worker rank."""
    trainer = config.trainer
    model_path = ensure_model(config.model, tokenizer_corpus())
    run = prepare_sft_run(config, model_path, trainer.nnodes * trainer.n_procs_per_node)
    lock = open_run_folder(config)  # before Ray starts
    init_cluster(trainer)
    group = None
    try:
        pool = ResourcePool(
            procs_per_node=trainer.n_procs_per_node,
            nnodes=trainer.nnodes,
            cpus_per_proc=trainer.cpus_per_proc,
            device=trainer.device,
            resource_wait_s=resource_wait_s(trainer),
            name="sft",
        )
        group = RayWorkerGroup(pool, WorkerSpec(SFTWorker, run.engine_config, str(model_path)), name="sft",
                               timeouts=group_timeouts(trainer.timeouts))
        with _tracking(config, run) as tracking:
            return SFTTrainer(config, group, run, tracking).fit()
    finally:
        if group is not None:
            group.shutdown()
        shutdown_ray()
        lock.release()


@LAUNCHER_REGISTRY.register("torchrun")
def launch_torchrun(config: DictConfig) -> History:
    """Every process runs the loop with its own worker; rank 0 builds the model folder and logs."""
    os.environ.setdefault(ENV_DEVICE, config.trainer.device)
    owns_process_group = not dist.is_initialized()
    setup_worker_process(WorkerContext.from_env())
    is_driver = dist.get_rank() == 0
    lock = None
    try:
        lock = _open_run_folder_on_rank0(config, is_driver)
        if is_driver:
            ensure_model(config.model, tokenizer_corpus())
        dist.barrier()
        model_path = model_folder(config.model)
        run = prepare_sft_run(config, model_path, dist.get_world_size())
        worker = SFTWorker(run.engine_config, model_path)
        tracking = _tracking(config, run) if is_driver else None
        try:
            return SFTTrainer(config, LocalWorkerGroup(worker), run, tracking, is_driver).fit()
        finally:
            if tracking is not None:
                tracking.finish()
            worker.close()
    finally:
        if lock is not None:
            lock.release()
        if owns_process_group:
            dist.destroy_process_group()


def _open_run_folder_on_rank0(config: DictConfig, is_driver: bool) -> RunLock | None:
    """Rank 0 runs the run-folder checks and holds the lock; every rank raises if they failed (none waits)."""
    lock, error = None, None
    if is_driver:
        try:
            lock = open_run_folder(config)
        except UserError as caught:
            error = caught
    failed = [error is not None]
    dist.broadcast_object_list(failed, src=0)
    if error is not None:
        raise error
    if failed[0]:
        raise UserError("rank 0 refused the run folder (its error names the cause)")
    return lock
