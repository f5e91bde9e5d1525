"""``FullyShardEngine``: the ``ModuleEngine`` hooks that every engine on FSDP2 (``fully_shard``) runs the same way.

fsdp2 and torchtitan both end with one module whose parameters are FSDP2 DTensors (torchtitan's
also tensor-parallel); they differ in how they build and shard it (``_parallelize``) and in what
a checkpoint records of the layout (``_layout``). The rest is here, once:

* ``_grad_reduce_deferral``: with the config's ``defer_grad_reduce``, a micro-batch's gradients
  accumulate unsharded and the mini-batch's last micro-batch reduce-scatters them all (``unsynced_grads``);
* ``_iter_full_tensors``: one parameter at a time, gathered from its shards (``full_tensor``);
* ``_move_module``: ``module.to(device)`` moves the DTensor shards and their gradients;
* ``_clip_grad_norm``: ``clip_grad_norm``, ``torch.nn.utils.clip_grad_norm_``'s global L2 norm and
  clip coefficient, except that the per-parameter norms are stacked in one group per (mesh,
  placements) of the gradients, each group reduced over its own mesh: stacking norms of DTensors on
  different meshes (FSDP x TP) or DTensors with plain tensors fails on gloo. With one group (fsdp2,
  torchtitan without TP) the norm and the clipped gradients are ``clip_grad_norm_``'s, bit for bit.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, contextmanager
from functools import partial
from typing import Any, Callable, Hashable, Iterable, Iterator, Optional

import torch
from torch import nn
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor

from rlflow.engines.common.module_engine import ModuleEngine

__all__ = ["FullyShardEngine", "clip_grad_norm", "full_tensor", "iter_full_tensors", "unsynced_grads"]


class FullyShardEngine(ModuleEngine):
    """A ``ModuleEngine`` whose module is sharded by FSDP2; its config has ``defer_grad_reduce``.

    A subclass implements ``_parallelize`` (build the mesh, ``fully_shard`` the units) and ``_layout``."""

    def _grad_reduce_deferral(self) -> Optional[Callable[[], AbstractContextManager[Any]]]:
        return partial(unsynced_grads, self.module) if self.config.defer_grad_reduce else None

    def _clip_grad_norm(self, max_norm: float) -> float:
        return clip_grad_norm(self.module.parameters(), max_norm)

    def _iter_full_tensors(self, only: Optional[Callable[[str], bool]] = None) -> Iterator[tuple[str, torch.Tensor]]:
        return iter_full_tensors(self.module, only)

    def _move_module(self, device: torch.device) -> None:
        self.module.to(device)


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


def clip_grad_norm(params: Iterable[nn.Parameter], max_norm: float,
                   join: Optional[Callable[[torch.Tensor], torch.Tensor]] = None) -> float:
    """Clip the gradients of ``params`` to the global L2 norm ``max_norm`` in place; return the norm before.
    ``join`` turns the norm of ``params`` into the whole model's (a pipeline stage's into every stage's)."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return 0.0
    groups: dict[Hashable, list[torch.Tensor]] = {}
    for grad in grads:  # one group per mesh and placements (plain tensors: key None)
        key = (grad.device_mesh, grad.placements) if isinstance(grad, DTensor) else None
        groups.setdefault(key, []).append(grad)
    norms = [full_tensor(torch.nn.utils.get_total_norm(group)) for group in groups.values()]
    total = norms[0] if len(norms) == 1 else torch.linalg.vector_norm(torch.stack(norms))
    if join is not None:
        total = join(total)
    # torch.nn.utils.clip_grads_with_norm_'s coefficient, in the norm's dtype; read with the norm in one transfer,
    # as a Python float that multiplies DTensor gradients too
    coefficient = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    total_norm, scale = torch.stack([total, coefficient]).tolist()
    if scale < 1.0:
        for grad in grads:
            grad.mul_(scale)
    return total_norm
