"""torch.distributed helpers for engines: pick the device, join or create the process group, reduce small values."""

from __future__ import annotations

import os
from typing import Optional

import torch
import torch.distributed as dist

from rlflow.utils.device import dist_backend_for, set_device

__all__ = ["all_reduce_max", "all_reduce_sum", "ensure_process_group", "join_process_group", "local_rank"]


def ensure_process_group(device_type: str) -> None:
    """Use the initialized default group; with none and WORLD_SIZE unset or 1, create a one-process group.

    A larger WORLD_SIZE without an initialized group is an error: the launcher
    (a Ray worker, torchrun) must initialize torch.distributed first.
    """
    if dist.is_initialized():
        return
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size != 1:
        raise RuntimeError(
            f"WORLD_SIZE={world_size} but torch.distributed is not initialized; initialize the process group "
            "(rlflow.workers.Worker does) before initializing an engine"
        )
    dist.init_process_group(dist_backend_for(device_type), store=dist.HashStore(), rank=0, world_size=1)


def join_process_group(device_option: str) -> tuple[torch.device, int, int]:
    """Select this rank's device from the config's ``device`` option, join the default group;
    returns ``(device, rank, world_size)``."""
    device = set_device(device_option, local_rank())
    ensure_process_group(device.type)
    return device, dist.get_rank(), dist.get_world_size()


def local_rank() -> int:
    """LOCAL_RANK from the launcher (0 when absent)."""
    return int(os.environ.get("LOCAL_RANK", "0"))


def _reduce(values: list[float], op: dist.ReduceOp, group: Optional[dist.ProcessGroup], device: torch.device) -> list[float]:
    tensor = torch.tensor(values, dtype=torch.float64, device=device)
    if dist.is_initialized() and dist.get_world_size(group) > 1:
        dist.all_reduce(tensor, op=op, group=group)
    return tensor.tolist()


def all_reduce_sum(values: list[float], group: Optional[dist.ProcessGroup], device: torch.device) -> list[float]:
    """Element-wise sum of small float lists over ``group`` (float64, exact for counts)."""
    return _reduce(values, dist.ReduceOp.SUM, group, device)


def all_reduce_max(values: list[float], group: Optional[dist.ProcessGroup], device: torch.device) -> list[float]:
    """Element-wise max of small float lists over ``group``."""
    return _reduce(values, dist.ReduceOp.MAX, group, device)
