"""What the megatron engine's AdamW steps when it does not step the parameters themselves: shares of them.

* **The distributed optimizer** (``use_distributed_optimizer``). Each data-parallel rank owns a contiguous share
  of every parameter's elements (``ceil(numel / dp_size)`` each, the last share shorter) and keeps AdamW's moments
  for its shares alone, so a rank's optimizer state is 1 / dp_size of the model's. The gradients are all-reduced
  as before (megatron DDP), so every rank still holds them whole and the clip norm is computed as without
  sharding; each rank steps its shares, and ``step_done`` all-gathers every rank's updated shares over the
  data-parallel group, in one collective, into every rank's parameters.
* **Mixed precision** (``param_dtype`` bfloat16 with ``dtype`` float32). The model computes in bf16; AdamW steps
  fp32 master copies of the shares (of the whole parameters without the distributed optimizer) on the fp32
  gradients megatron DDP reduces, and ``step_done`` writes them back into the bf16 parameters. An update too small
  for bf16 accumulates in the masters instead of being rounded away.

Without mixed precision a share is a view of the parameter (``nn.Parameter`` over its storage): the step writes the
parameter in place. What megatron's own DistributedOptimizer does differently: it reduce-scatters the gradients
(here they are all-reduced, then the parameters all-gathered: half again the communication). The state is saved
as rlflow's: one DCP entry per share (moments, and the master copy under mixed precision), keyed by the owning
data-parallel rank, so a checkpoint resumes at the same data-parallel size.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch
import torch.distributed as dist
from torch import nn

from rlflow.engines.megatron.parallel import ParallelRanks

__all__ = ["OptimizerShares", "ParameterShare"]


@dataclass(frozen=True)
class ParameterShare:
    """This rank's share ``[start, stop)`` of ``whole``'s flattened elements, as AdamW steps it (``param``: a view of
    them, or their master copy)."""

    name: str
    whole: nn.Parameter
    start: int
    stop: int
    param: nn.Parameter

    def elements(self) -> torch.Tensor:
        return self.whole.detach().view(-1)[self.start:self.stop]


def _share(numel: int, parts: int, index: int) -> tuple[int, int]:
    size = math.ceil(numel / parts)
    return min(index * size, numel), min((index + 1) * size, numel)


class OptimizerShares:
    """This rank's shares of ``named_params``' trainable parameters (all of one dtype): over the data-parallel ranks
    when ``sharded``, else each parameter whole; with ``master_dtype`` (mixed precision), master copies of them in it,
    taken now: build the shares while the parameters still hold the checkpoint's full-precision weights."""

    def __init__(self, named_params: list[tuple[str, nn.Parameter]], ranks: ParallelRanks, sharded: bool,
                 master_dtype: Optional[torch.dtype] = None):
        self.params = [(name, param) for name, param in named_params if param.requires_grad]
        self.ranks = ranks
        self.parts, self.index = (ranks.dp_size, ranks.dp_rank) if sharded else (1, 0)
        self.masters, self.master_dtype = master_dtype is not None, master_dtype
        self.shares: list[ParameterShare] = []
        for name, whole in self.params:
            start, stop = _share(whole.numel(), self.parts, self.index)
            if stop > start:
                view = whole.detach().view(-1)[start:stop]
                param = nn.Parameter(view.to(master_dtype, copy=True) if self.masters else view)
                self.shares.append(ParameterShare(f"{name}.dp{self.index}of{self.parts}", whole, start, stop, param))

    def named(self) -> list[tuple[str, nn.Parameter]]:
        """``(checkpoint name, share)`` of every share this rank steps: what its AdamW is built over."""
        return [(shard.name, shard.param) for shard in self.shares]

    def named_masters(self) -> dict[str, torch.Tensor]:
        """The master copies by checkpoint name (none without mixed precision: the parameters are the weights)."""
        return {shard.name: shard.param.detach() for shard in self.shares} if self.masters else {}

    def attach_grads(self) -> None:
        """Point each share's ``.grad`` at its elements of the parameter's (all-reduced, fp32) ``main_grad``."""
        for shard in self.shares:
            grad = shard.whole.main_grad.view(-1)[shard.start:shard.stop]
            shard.param.grad = grad if grad.dtype == shard.param.dtype else grad.to(shard.param.dtype)

    def step_done(self) -> None:
        """After AdamW's step: master copies into the parameters, then every rank's shares into every rank's."""
        if self.masters:
            for shard in self.shares:
                shard.elements().copy_(shard.param.detach())
        if self.parts > 1:
            self._gather()

    def whole_masters(self) -> dict[int, torch.Tensor]:
        """Every trainable parameter whole in the masters' dtype, by ``id`` of the parameter: what an export of
        mixed precision's weights reads (collective over the data-parallel group when sharded)."""
        mine = {id(shard.whole): shard.param.detach() for shard in self.shares}
        if self.parts == 1:
            return {id(param): mine[id(param)].view(param.shape) for _, param in self.params}
        wholes = [torch.empty(param.numel(), dtype=self.master_dtype, device=param.device) for _, param in self.params]
        pieces = [mine.get(id(param), whole[:0]) for (_, param), whole in zip(self.params, wholes)]
        self._all_gather(pieces, wholes)
        return {id(param): whole.view(param.shape) for (_, param), whole in zip(self.params, wholes)}

    def _gather(self) -> None:
        """Every rank's updated shares into every rank's parameters."""
        wholes = [param.detach().view(-1) for _, param in self.params]
        self._all_gather([whole[slice(*_share(whole.numel(), self.parts, self.index))] for whole in wholes], wholes)

    def _all_gather(self, pieces: list[torch.Tensor], wholes: list[torch.Tensor]) -> None:
        """Each rank's ``pieces[i]`` (its share of flat ``wholes[i]``, empty where it has none) into ``wholes[i]`` on
        every rank: one all-gather over the data-parallel group."""
        sizes = [math.ceil(whole.numel() / self.parts) for whole in wholes]
        local = torch.zeros(sum(sizes), dtype=wholes[0].dtype, device=wholes[0].device)
        offset = 0
        for piece, size in zip(pieces, sizes):
            local[offset:offset + piece.numel()] = piece
            offset += size
        gathered = torch.empty(self.parts * local.numel(), dtype=local.dtype, device=local.device)
        dist.all_gather_into_tensor(gathered, local, group=self.ranks.dp_group)
        for owner, block in enumerate(gathered.split(local.numel())):
            offset = 0
            for whole, size in zip(wholes, sizes):
                start, stop = _share(whole.numel(), self.parts, owner)
                whole[start:stop].copy_(block[offset:offset + stop - start])
                offset += size
