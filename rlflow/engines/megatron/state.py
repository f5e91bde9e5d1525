"""The megatron engine's checkpoint state and its whole-tensor export, over the tensor/pipeline layout.

**Checkpoint state.** Each rank holds shards under its stage's local names, the same names on
every tensor-parallel rank and stage. The checkpoint keys them by place, ``tp{t}.pp{p}.<name>``,
in one torch.distributed.checkpoint (DCP) of ``{"model": ..., "optim": ...}``: the data-parallel
replicas of a shard write one copy, and each rank reads back its own. The optimizer state is
AdamW's per parameter (``exp_avg``, ``exp_avg_sq``, ``step``), created as zeros before a first step
so every checkpoint has the same keys (``OptimizerStepper.forget_placeholder_state`` drops them
again after a save or load before the first step). ``whole_tensors_from_checkpoint`` reads the
shards back on one process (``rlflow-export``).

**Export.** ``iter_whole_tensors`` yields every whole tensor of the model on every rank, in the
same order: stage by stage, each shard gathered over the tensor-parallel group and the whole
tensor broadcast from its stage over the pipeline group, one tensor in memory at a time.
"""

from __future__ import annotations

import re
from collections import defaultdict
from typing import Callable, Iterable, Iterator

import torch
import torch.distributed as dist
from torch import nn

from rlflow.engines.megatron.parallel import ParallelRanks
from rlflow.engines.megatron.weights import global_name, tensor_parallel_dim, whole_of

__all__ = ["iter_whole_tensors", "model_state", "optimizer_state", "place_key", "whole_tensors_from_checkpoint"]

_PLACE = re.compile(r"^tp(\d+)\.pp(\d+)\.(.+)$")


def place_key(ranks: ParallelRanks, name: str) -> str:
    """The checkpoint key of this rank's shard of ``name``."""
    return f"tp{ranks.tp_rank}.pp{ranks.pp_rank}.{name}"


def model_state(named_params: Iterable[tuple[str, nn.Parameter]], ranks: ParallelRanks) -> dict[str, torch.Tensor]:
    """This rank's parameters by checkpoint key (the tensors themselves: DCP loads into them in place)."""
    return {place_key(ranks, name): param.detach() for name, param in named_params}


def optimizer_state(
    optimizer: torch.optim.Optimizer, named_params: Iterable[tuple[str, nn.Parameter]], ranks: ParallelRanks
) -> dict[str, dict[str, torch.Tensor]]:
    """AdamW's state of each parameter by checkpoint key (zeros at step 0 where no step ran yet)."""
    state = {}
    for name, param in named_params:
        if not param.requires_grad:
            continue
        slots = optimizer.state[param]
        if not slots:
            slots.update(step=torch.tensor(0.0), exp_avg=torch.zeros_like(param), exp_avg_sq=torch.zeros_like(param))
        state[place_key(ranks, name)] = slots
    return state


def iter_whole_tensors(
    named_params: list[tuple[str, nn.Parameter]], ranks: ParallelRanks, layer_offsets: list[int], skip: frozenset[str],
    device: torch.device,
) -> Iterator[tuple[str, torch.Tensor]]:
    """``(whole name, whole tensor)`` of every parameter of every stage, on every rank (collective over the
    tensor- and pipeline-parallel groups). ``layer_offsets[s]``: stage ``s``'s first layer; ``skip``: whole
    names left out (a tied output layer's copy); ``device``: where another stage's tensors are received."""
    for stage in range(ranks.pp_size):
        mine = stage == ranks.pp_rank
        metadata = [
            (global_name(name, layer_offsets[stage]), _whole_shape(name, param, ranks.tp_size), param.dtype)
            for name, param in named_params
        ] if mine else None
        if ranks.pp_size > 1:
            shared = [metadata]
            dist.broadcast_object_list(shared, src=ranks.pp_ranks[stage], group=ranks.pp_group)
            metadata = shared[0]
        params = iter(named_params) if mine else None
        for whole_name, shape, dtype in metadata:
            whole = _gather(next(params)[1], whole_name, ranks) if mine else torch.empty(shape, dtype=dtype, device=device)
            if ranks.pp_size > 1:
                dist.broadcast(whole, src=ranks.pp_ranks[stage], group=ranks.pp_group)
            if whole_name not in skip:
                yield whole_name, whole


def _whole_shape(name: str, param: torch.Tensor, tp_size: int) -> tuple[int, ...]:
    shape = list(param.shape)
    dim = tensor_parallel_dim(name)
    if dim is not None:
        shape[dim] *= tp_size
    return tuple(shape)


def _gather(param: torch.Tensor, whole_name: str, ranks: ParallelRanks) -> torch.Tensor:
    local = param.detach()
    if tensor_parallel_dim(whole_name) is None or ranks.tp_size == 1:
        return local.clone()
    shards = [torch.empty_like(local) for _ in range(ranks.tp_size)]
    dist.all_gather(shards, local.contiguous(), group=ranks.tp_group)
    return whole_of(whole_name, shards)


def whole_tensors_from_checkpoint(
    state: Iterable[tuple[str, torch.Tensor]], layer_offset: Callable[[int, int], int]
) -> Iterator[tuple[str, torch.Tensor]]:
    """``(whole name, whole tensor)`` from a checkpoint's model state read on one process (``tp{t}.pp{p}.<name>``
    keys of every shard); ``layer_offset(stage, stages)``: the global index of a stage's first layer."""
    shards: dict[tuple[int, str], dict[int, torch.Tensor]] = defaultdict(dict)
    for key, tensor in state:
        match = _PLACE.match(key)
        if match is None:
            raise ValueError(f"{key!r} is not a megatron checkpoint key (tp<t>.pp<p>.<name>)")
        tp, pp, name = int(match.group(1)), int(match.group(2)), match.group(3)
        shards[(pp, name)][tp] = tensor
    stages = 1 + max(pp for pp, _ in shards)
    for (pp, name), by_rank in shards.items():
        yield global_name(name, layer_offset(pp, stages)), whole_of(name, [by_rank[t] for t in sorted(by_rank)])
