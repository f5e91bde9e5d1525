"""Helpers for engines whose parameters are FSDP2 (``fully_shard``) DTensors: fsdp2 and torchtitan.

* ``unsynced_grads``: accumulate a micro-batch's gradients unsharded (no reduce-scatter); the
  mini-batch's last micro-batch reduces them all (``ModuleEngine._grad_reduce_deferral``);
* ``full_tensor`` / ``iter_full_tensors``: one parameter at a time, gathered from its shards;
* ``clip_grad_norm``: the global gradient norm from per-parameter norms, each DTensor norm reduced
  over its own mesh, then clipped in place. ``torch.nn.utils.clip_grad_norm_`` stacks the
  per-parameter norms, which fails on gloo when they mix DTensors on different meshes (FSDP x TP)
  or DTensors and plain tensors; reducing each norm first leaves only plain scalars to stack.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterable, Iterator, Optional

import torch
from torch import nn
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor

from rlflow.engines.common.optimizer_step import clip_to_norm

__all__ = ["clip_grad_norm", "full_tensor", "iter_full_tensors", "unsynced_grads"]


@contextmanager
def unsynced_grads(root: FSDPModule) -> Iterator[None]:
    """Inside: backward accumulates unsharded gradients without reduce-scatter (every unit under ``root``)."""
    root.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        root.set_requires_gradient_sync(True)


def full_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """The whole tensor: gathered from its shards, or (a mesh of one rank) the local tensor itself, uncopied."""
    if not isinstance(tensor, DTensor):
        return tensor
    if tensor.device_mesh.size() == 1:
        return tensor.to_local()
    return tensor.full_tensor()


def iter_full_tensors(module: nn.Module, only: Optional[Callable[[str], bool]] = None) -> Iterator[tuple[str, torch.Tensor]]:
    """``(parameter name, full tensor)`` one parameter at a time (collective over the parameters' meshes), for
    every parameter or those whose name ``only`` accepts."""
    for name, param in module.named_parameters():
        if only is None or only(name):
            yield name, full_tensor(param.detach())


def clip_grad_norm(params: Iterable[nn.Parameter], max_norm: float) -> float:
    """Clip the gradients of ``params`` to the global L2 norm ``max_norm`` in place; return the norm before."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return 0.0
    squares = []
    for grad in grads:
        norm = torch.linalg.vector_norm(grad, dtype=torch.float32)
        squares.append(full_tensor(norm) ** 2 if isinstance(norm, DTensor) else norm**2)
    total = float(torch.stack(squares).sum().sqrt())
    clip_to_norm(grads, total, max_norm)
    return total
