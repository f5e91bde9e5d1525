"""The distributed optimizer (``use_distributed_optimizer``): AdamW's state sharded over the data-parallel ranks.

Each data-parallel rank owns a contiguous share of every parameter's elements (``ceil(numel / dp_size)`` each, the
last share shorter) and keeps AdamW's moments for its shares alone, so the optimizer state of a rank is 1 / dp_size
of the model's. The gradients are all-reduced as before (megatron DDP), so every rank still holds them whole:
the clip norm is computed as without sharding, and each rank steps its shares of the parameters in place
(``ParameterShard.param``: a Parameter that shares the parameter's storage). ``gather`` then all-gathers every
rank's updated shares over the data-parallel group, in one collective, into every rank's parameters.

What megatron's own DistributedOptimizer also does and this does not: reduce-scatter the gradients (here they
are all-reduced, then the parameters all-gathered: half again the communication) and keep fp32 main weights for
a bf16 model (the engine trains in one dtype). Its state is saved as rlflow's: one DCP entry per share, keyed by
the owning data-parallel rank, so a checkpoint resumes at the same data-parallel size.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from rlflow.engines.megatron.parallel import ParallelRanks

__all__ = ["DataParallelShards", "ParameterShard"]


@dataclass(frozen=True)
class ParameterShard:
    """This rank's share ``[start, stop)`` of ``whole``'s flattened elements; ``param`` views them (shared storage)."""

    name: str
    whole: nn.Parameter
    start: int
    stop: int
    param: nn.Parameter


def _share(numel: int, dp_size: int, dp_rank: int) -> tuple[int, int]:
    size = math.ceil(numel / dp_size)
    return min(dp_rank * size, numel), min((dp_rank + 1) * size, numel)


class DataParallelShards:
    """This data-parallel rank's shares of ``named_params`` (trainable, contiguous, one dtype) and their all-gather."""

    def __init__(self, named_params: list[tuple[str, nn.Parameter]], ranks: ParallelRanks):
        self.params = [(name, param) for name, param in named_params if param.requires_grad]
        self.ranks = ranks
        self.shards = []
        for name, param in self.params:
            start, stop = _share(param.numel(), ranks.dp_size, ranks.dp_rank)
            if stop > start:
                view = nn.Parameter(param.detach().view(-1)[start:stop])
                self.shards.append(ParameterShard(f"{name}.dp{ranks.dp_rank}of{ranks.dp_size}", param, start, stop, view))

    def named(self) -> list[tuple[str, nn.Parameter]]:
        """``(checkpoint name, share)`` of every share this rank steps: what its AdamW is built over."""
        return [(shard.name, shard.param) for shard in self.shards]

    def attach_grads(self) -> None:
        """Point each share's ``.grad`` at its elements of the parameter's (all-reduced) ``main_grad``."""
        for shard in self.shards:
            grad = shard.whole.main_grad.view(-1)[shard.start:shard.stop]
            shard.param.grad = grad if grad.dtype == shard.param.dtype else grad.to(shard.param.dtype)

    def gather(self) -> None:
        """Every rank's updated shares into every rank's parameters: one all-gather over the data-parallel group."""
        sizes = [math.ceil(param.numel() / self.ranks.dp_size) for _, param in self.params]
        first = self.params[0][1]
        local = torch.zeros(sum(sizes), dtype=first.dtype, device=first.device)
        offset = 0
        for (_, param), size in zip(self.params, sizes):
            start, stop = _share(param.numel(), self.ranks.dp_size, self.ranks.dp_rank)
            local[offset:offset + stop - start] = param.detach().view(-1)[start:stop]
            offset += size
        gathered = torch.empty(self.ranks.dp_size * local.numel(), dtype=local.dtype, device=local.device)
        dist.all_gather_into_tensor(gathered, local, group=self.ranks.dp_group)
        for owner, block in enumerate(gathered.split(local.numel())):
            offset = 0
            for (_, param), size in zip(self.params, sizes):
                start, stop = _share(param.numel(), self.ranks.dp_size, owner)
                param.detach().view(-1)[start:stop].copy_(block[offset:offset + stop - start])
                offset += size
