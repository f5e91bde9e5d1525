"""``LocalWorkerGroup``: a worker group without Ray, for SPMD launches such as ``torchrun``.

Every process runs the same driver loop and holds one worker of the group (this rank's).
Each ``@register``-ed method of the worker appears on the group and behaves as it does on a
``RayWorkerGroup``: the call goes through the method's dispatch mode (so this rank computes on
exactly the shard Ray would send it), runs on this rank's worker when the mode addresses this
rank, and the outputs of all ranks are exchanged (``all_gather_object``) and combined by the
mode's collect function. Every rank therefore gets the result a Ray controller would get,
and the driver code does not care which launcher it runs under.
"""

from __future__ import annotations

import functools
from typing import Any

import torch.distributed as dist

from rlflow.workers import DispatchContext, MeshTable, Worker, get_dispatch_mode
from rlflow.workers.decorator import MethodSpec, registered_methods


def _all_gather(value: Any) -> list[Any]:
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, value)
    return gathered


class LocalWorkerGroup:
    """This process's worker, exposed with the group-level methods of a ``RayWorkerGroup``.

    The worker must already be built (its ``Worker.__init__`` joined the default process
    group from the launcher's environment). Every rank must make the same calls in the same
    order: each call is collective.
    """

    def __init__(self, worker: Worker):
        self.worker = worker
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        self._mesh_cache: dict[str, MeshTable] = {}
        for name, spec in registered_methods(type(worker)).items():
            get_dispatch_mode(spec.dispatch_mode)  # an unknown mode fails here, as in RayWorkerGroup
            setattr(self, name, functools.partial(self._call, spec))

    def mesh_table(self, mesh_name: str) -> MeshTable:
        """The group's layout of ``mesh_name`` (gathered from every rank once, then cached)."""
        if mesh_name not in self._mesh_cache:
            members = _all_gather(self.worker.get_mesh(mesh_name))
            self._mesh_cache[mesh_name] = MeshTable.from_members(mesh_name, members)
        return self._mesh_cache[mesh_name]

    def _call(self, spec: MethodSpec, *args: Any, **kwargs: Any) -> Any:
        mode = get_dispatch_mode(spec.dispatch_mode)
        ctx = DispatchContext(spec.name, self.world_size, spec.mesh, spec.reduce, self.mesh_table)
        calls = mode.dispatch(ctx, args, kwargs)
        output = None
        if self.rank in calls:
            my_args, my_kwargs = calls[self.rank]
            output = getattr(self.worker, spec.name)(*my_args, **my_kwargs)
        outputs = _all_gather(output)
        return mode.collect(ctx, {rank: outputs[rank] for rank in calls})
