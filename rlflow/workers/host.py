"""``WorkerHost``: the Ray actor behind one bundle, hosting one or several (colocated) roles.

The host sets the worker environment and where its log records go (``rlflow.utils.log_routing``:
the libraries' INFO lines to the run folder's ``logs/``, the console from WARNING), imports the driver's plugins and joins torch.distributed
before any role is built (so colocated roles share one process and one process group, and a
role built from a plugin's classes finds them registered), runs each controller call, and turns
any exception into a ``WorkerError`` carrying its rank, method and traceback.
"""

from __future__ import annotations

import os
import traceback
from dataclasses import dataclass
from typing import Any, Callable

import ray
import torch.distributed as dist

from rlflow.utils.log_routing import route_library_logs
from rlflow.utils.plugins import import_plugins
from rlflow.workers.errors import worker_error_from
from rlflow.workers.mesh import MeshInfo
from rlflow.workers.worker import (
    ENV_DEVICE,
    ENV_DIST_TIMEOUT_S,
    ENV_NODE_ID,
    ENV_NUM_THREADS,
    WorkerContext,
    find_free_port,
    setup_worker_process,
)

RoleBuild = tuple[type, tuple, dict]  # class, init args, init kwargs


@dataclass(frozen=True)
class WorkerInfo:
    """Where one rank of a group runs."""

    rank: int
    local_rank: int
    node_id: str
    ip: str
    pid: int


class WorkerHost:
    """One worker process: environment, torch.distributed membership, and the role objects."""

    def __init__(self, rank: int, world_size: int, local_rank: int, device_type: str, num_threads: int, dist_timeout_s: float):
        self.rank = rank
        self.local_rank = local_rank
        route_library_logs(f"worker-rank{rank}-pid{os.getpid()}")
        self.node_id = ray.get_runtime_context().get_node_id()
        os.environ.update(
            {
                "RANK": str(rank),
                "WORLD_SIZE": str(world_size),
                "LOCAL_RANK": str(local_rank),
                ENV_DEVICE: device_type,
                ENV_NUM_THREADS: str(num_threads),
                ENV_DIST_TIMEOUT_S: str(dist_timeout_s),
                ENV_NODE_ID: self.node_id,
            }
        )
        self._roles: dict[str, Any] = {}

    def import_plugins(self, plugins: list[str]) -> list[str]:
        """Import the driver's plugins (``trainer.plugins``); called before ``build`` unpickles any role argument."""
        return self._guarded("import plugins", lambda: import_plugins(plugins))

    def offer_master_address(self) -> tuple[str, int]:
        """Rank 0's rendezvous address: this node's IP and a free port."""
        return ray.util.get_node_ip_address(), find_free_port()

    def build(self, master_addr: str, master_port: int, roles: dict[str, RoleBuild]) -> WorkerInfo:
        """Join the process group, then construct every role (in the given order)."""
        os.environ.update({"MASTER_ADDR": master_addr, "MASTER_PORT": str(master_port)})
        self._guarded("torch.distributed setup", lambda: setup_worker_process(WorkerContext.from_env()))
        for name, (cls, args, kwargs) in roles.items():
            self._roles[name] = self._guarded(f"{name}.__init__ ({cls.__name__})", lambda: cls(*args, **kwargs))
        return WorkerInfo(self.rank, self.local_rank, self.node_id, ray.util.get_node_ip_address(), os.getpid())

    def call(self, role: str, method: str, *args: Any, **kwargs: Any) -> Any:
        """Run ``role.method(*args, **kwargs)``."""
        target = getattr(self._roles[role], method)
        return self._guarded(f"{role}.{method}", lambda: target(*args, **kwargs))

    def mesh_info(self, mesh_name: str) -> MeshInfo | None:
        """This process's membership in ``mesh_name``, from whichever role registered it."""
        found = {
            role: role_obj.get_mesh(mesh_name)
            for role, role_obj in self._roles.items()
            if callable(getattr(role_obj, "get_mesh", None)) and role_obj.get_mesh(mesh_name) is not None
        }
        if len(set(found.values())) > 1:
            raise ValueError(f"rank {self.rank}: colocated roles registered mesh '{mesh_name}' differently: {found}")
        return next(iter(found.values()), None)

    def close(self) -> None:
        """Let each role release its resources, then leave the process group."""
        for name, role_obj in self._roles.items():
            if callable(getattr(role_obj, "close", None)):
                self._guarded(f"{name}.close", role_obj.close)
        if dist.is_initialized():
            dist.destroy_process_group()

    def _guarded(self, method: str, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except Exception as exc:
            raise worker_error_from(exc, self.rank, method, traceback.format_exc(), os.getpid(), self.node_id) from None
