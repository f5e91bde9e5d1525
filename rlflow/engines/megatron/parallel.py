"""megatron's process-wide parallel state, shared by the megatron engines of one process.

megatron-core keeps its tensor/pipeline/data-parallel groups in module globals
(``parallel_state``), so every megatron engine in a process (an actor and its reference in one
worker) uses one layout. ``join_model_parallel`` creates the groups on first use and reuses them
for an engine with the same layout; a different layout replaces them only when no engine that
used the old one is alive, and is otherwise refused in one line. Groups made under a default process
group that has since been destroyed and re-created (a test process running several jobs) are made anew. The groups follow megatron's
default order: tensor-parallel ranks are adjacent, then data parallelism, then pipeline stages.
"""

from __future__ import annotations

import gc
import weakref
from dataclasses import dataclass
from typing import Any, Optional

import torch.distributed as dist
from megatron.core import parallel_state as mpu

from rlflow.engines.config import EngineConfigError

__all__ = ["ParallelRanks", "join_model_parallel"]

_USERS: "weakref.WeakSet[Any]" = weakref.WeakSet()
_MADE_UNDER: list[Any] = []  # the default process group the current megatron groups were made under


@dataclass(frozen=True)
class ParallelRanks:
    """This process's coordinates and groups in the megatron layout."""

    tp_rank: int
    tp_size: int
    pp_rank: int
    pp_size: int
    dp_rank: int
    dp_size: int
    tp_group: Optional[dist.ProcessGroup]
    pp_group: Optional[dist.ProcessGroup]
    dp_group: Optional[dist.ProcessGroup]
    pp_ranks: tuple[int, ...]  # global rank of each pipeline stage in this rank's pipeline group

    @property
    def is_first_stage(self) -> bool:
        return self.pp_rank == 0

    @property
    def is_last_stage(self) -> bool:
        return self.pp_rank == self.pp_size - 1

    @property
    def is_collect(self) -> bool:
        """TP rank 0 of the last pipeline stage: the rank whose outputs mesh dispatch collects."""
        return self.tp_rank == 0 and self.is_last_stage


def _current_layout() -> Optional[tuple[int, int]]:
    """(TP, PP) of megatron's groups, or None when there are none (or they belong to a destroyed process group)."""
    if not mpu.model_parallel_is_initialized() or _MADE_UNDER != [dist.group.WORLD]:
        return None
    return mpu.get_tensor_model_parallel_world_size(), mpu.get_pipeline_model_parallel_world_size()


def join_model_parallel(user: Any, tensor_parallel: int, pipeline_parallel: int) -> ParallelRanks:
    """megatron's groups for ``tensor_parallel`` x ``pipeline_parallel`` (x data parallel) over the default
    group, created or reused; ``user`` (the engine) is recorded as using them. Collective on creation."""
    world = dist.get_world_size()
    if world % (tensor_parallel * pipeline_parallel) != 0:
        raise EngineConfigError(
            f"tensor_model_parallel_size={tensor_parallel} x pipeline_model_parallel_size={pipeline_parallel} "
            f"must divide the world size {world}"
        )
    wanted = (tensor_parallel, pipeline_parallel)
    current = _current_layout()
    if current is not None and current != wanted:
        gc.collect()  # engines dropped by their owner, still in reference cycles
        if len(_USERS):
            raise EngineConfigError(
                f"this process already runs a megatron engine at tensor x pipeline parallel {current}; every megatron "
                f"engine of one process (an actor and its reference) uses one layout, not also {wanted}"
            )
        current = None
    if current is None:
        mpu.destroy_model_parallel()  # no-op when there are none; stale groups otherwise
        mpu.initialize_model_parallel(tensor_parallel, pipeline_parallel, create_gloo_process_groups=False)
        _MADE_UNDER[:] = [dist.group.WORLD]
    _USERS.add(user)
    pp_group = mpu.get_pipeline_model_parallel_group()
    return ParallelRanks(
        tp_rank=mpu.get_tensor_model_parallel_rank(),
        tp_size=tensor_parallel,
        pp_rank=mpu.get_pipeline_model_parallel_rank(),
        pp_size=pipeline_parallel,
        dp_rank=mpu.get_data_parallel_rank(),
        dp_size=mpu.get_data_parallel_world_size(),
        tp_group=mpu.get_tensor_model_parallel_group(),
        pp_group=pp_group,
        dp_group=mpu.get_data_parallel_group(),
        pp_ranks=tuple(dist.get_process_group_ranks(pp_group)),
    )
