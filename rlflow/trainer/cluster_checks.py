"""The cluster a run asks for, checked before Ray starts: a local one big enough, a joined one reachable.

A run without ``trainer.ray_address`` starts a one-node Ray cluster with ``trainer.ray_num_cpus``
CPUs (null: the CPUs this process may use, as Ray counts them) and this machine's visible GPUs. Each
worker process reserves ``trainer.cpus_per_proc`` CPUs and, on CUDA, one GPU; a request the
cluster cannot hold would otherwise wait in Ray's scheduler or fail after the cluster started. A
run that joins a cluster is checked by the resource pools themselves, which wait for the
cluster's resources at most ``trainer.timeouts.connect_s`` (``rlflow.workers.resource_pool``); its
head must answer first (``rlflow.workers.ray_connect.check_cluster_reachable``).
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from ray._private.utils import get_num_cpus

from rlflow.config import ConfigError
from rlflow.utils.device import resolve_device_type
from rlflow.workers.ray_connect import join_address

_EPS = 1e-9

ProcessCount = Callable[[Any], int]


def local_cluster_cpus(trainer: Any) -> float:
    """The CPUs a local Ray cluster of this run gets: ``trainer.ray_num_cpus``, or Ray's count of this process's CPUs."""
    return float(trainer.ray_num_cpus) if trainer.ray_num_cpus is not None else float(get_num_cpus())


def _uses_cuda(trainer: Any) -> bool:
    return (trainer.device if trainer.device != "auto" else resolve_device_type("auto")) != "cpu"


def check_local_cluster_fits(config: Any, processes_per_node: ProcessCount) -> None:
    """Raise a one-line ``ConfigError`` when the worker processes of a local-cluster run cannot all be placed.

    ``processes_per_node(config)`` is how many worker processes the run starts (its pools together).
    Runs that join a cluster (``trainer.ray_address``, ``RAY_ADDRESS``) are not checked here.
    """
    trainer = config.trainer
    if join_address(trainer.ray_address) is not None:
        return
    if trainer.nnodes > 1:
        raise ConfigError(f"config key 'trainer.nnodes': {trainer.nnodes} nodes need a Ray cluster of that many; the local "
                          "cluster is this machine alone: set trainer.nnodes=1, or trainer.ray_address to join a cluster")
    processes = processes_per_node(config)
    need, have = processes * float(trainer.cpus_per_proc), local_cluster_cpus(trainer)
    if need > have + _EPS:
        source = "trainer.ray_num_cpus" if trainer.ray_num_cpus is not None else "the CPUs of this machine"
        raise ConfigError(
            f"config keys 'trainer.n_procs_per_node' / 'trainer.cpus_per_proc': {processes} worker processes x "
            f"{trainer.cpus_per_proc:g} CPUs need {need:g} CPUs, and the local Ray cluster has {have:g} ({source}); "
            "lower trainer.n_procs_per_node or trainer.cpus_per_proc (it may be fractional, e.g. 0.5), or raise trainer.ray_num_cpus")
    gpus = torch.cuda.device_count() if _uses_cuda(trainer) else None
    if gpus is not None and processes > gpus:
        raise ConfigError(f"config key 'trainer.n_procs_per_node': {processes} worker processes need one GPU each, and "
                          f"this machine has {gpus} visible; lower trainer.n_procs_per_node or set trainer.device=cpu")
