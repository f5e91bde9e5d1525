"""``Worker``: the base class of everything a worker group hosts.

A worker process learns who it is from the standard torch.distributed environment variables
(``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``) plus
``RLFLOW_DEVICE`` and ``RLFLOW_NUM_THREADS``. The worker group sets them before any role is
built; ``torchrun`` sets the first five too, so a ``Worker`` also runs outside Ray, and with
none of them set it is a one-process group on this machine (handy in unit tests).
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from rlflow.utils.cpu_heap import retain_freed_memory
from rlflow.utils.device import dist_backend_for, limit_cpu_threads, resolve_device_type, set_device
from rlflow.workers.mesh import MeshInfo

ENV_DEVICE = "RLFLOW_DEVICE"
ENV_NUM_THREADS = "RLFLOW_NUM_THREADS"
ENV_DIST_TIMEOUT_S = "RLFLOW_DIST_TIMEOUT_S"
ENV_NODE_ID = "RLFLOW_NODE_ID"
_AGENT_STORE_ENV = "TORCHELASTIC_USE_AGENT_STORE"  # torchrun: its agent hosts the rendezvous store


def find_free_port() -> int:
    """A TCP port that was free a moment ago (rank 0 offers it as the rendezvous port)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]


@dataclass(frozen=True)
class WorkerContext:
    """Where this process sits in its group: ranks, rendezvous address, device and threads."""

    rank: int
    world_size: int
    local_rank: int
    master_addr: str
    master_port: int
    device_type: str
    num_threads: int
    node_id: str
    dist_timeout_s: float

    @classmethod
    def from_env(cls) -> "WorkerContext":
        """Read the context from the environment (worker group or torchrun); default: one process."""
        env = os.environ
        if "MASTER_PORT" not in env:
            env.setdefault("MASTER_ADDR", "127.0.0.1")
            env["MASTER_PORT"] = str(find_free_port())
        return cls(
            rank=int(env.get("RANK", 0)),
            world_size=int(env.get("WORLD_SIZE", 1)),
            local_rank=int(env.get("LOCAL_RANK", 0)),
            master_addr=env.get("MASTER_ADDR", "127.0.0.1"),
            master_port=int(env["MASTER_PORT"]),
            device_type=resolve_device_type(env.get(ENV_DEVICE, "auto")),
            num_threads=int(env.get(ENV_NUM_THREADS, 1)),
            node_id=env.get(ENV_NODE_ID, socket.gethostname()),
            dist_timeout_s=float(env.get(ENV_DIST_TIMEOUT_S, 600)),
        )


def rendezvous_store(ctx: WorkerContext) -> dist.TCPStore:
    """The group's ``TCPStore`` at ``master_addr:master_port``: rank 0 serves it, the others connect.

    torch's own ``tcp://`` rendezvous serves the store on every interface (``::``); rank 0 here binds the
    listening socket to ``master_addr`` itself (loopback for a local cluster) and hands it to the store.
    Under ``torchrun`` its agent serves the store already (``TORCHELASTIC_USE_AGENT_STORE``): every rank connects.
    """
    timeout = timedelta(seconds=ctx.dist_timeout_s)
    if ctx.rank != 0 or os.environ.get(_AGENT_STORE_ENV) == "True":
        return dist.TCPStore(ctx.master_addr, ctx.master_port, ctx.world_size, is_master=False, timeout=timeout)
    family = socket.getaddrinfo(ctx.master_addr, ctx.master_port, type=socket.SOCK_STREAM)[0][0]
    listener = socket.create_server((ctx.master_addr, ctx.master_port), family=family, backlog=max(128, ctx.world_size))
    return dist.TCPStore(ctx.master_addr, ctx.master_port, ctx.world_size, is_master=True, timeout=timeout,
                         wait_for_workers=False, master_listen_fd=listener.detach())


def setup_worker_process(ctx: WorkerContext) -> torch.device:
    """Threads, device and the default torch.distributed group for this process (idempotent).

    The backend comes from the device type: gloo on CPU, nccl on GPU. On CPU the process also keeps
    freed memory in its heap (``rlflow.utils.cpu_heap``: large tensors stop faulting their pages in anew).
    """
    limit_cpu_threads(ctx.num_threads)
    if ctx.device_type == "cpu":
        retain_freed_memory()
    device = set_device(ctx.device_type, ctx.local_rank)
    if not dist.is_initialized():
        dist.init_process_group(
            backend=dist_backend_for(ctx.device_type),
            store=rendezvous_store(ctx),
            rank=ctx.rank,
            world_size=ctx.world_size,
            timeout=timedelta(seconds=ctx.dist_timeout_s),
        )
    return device


class Worker:
    """Base class of a role hosted in a worker group (actor, critic, rollout, ...).

    On construction the process is set up (threads, device, torch.distributed), so a subclass's
    ``__init__`` can build models and use collectives right away. Subclasses expose
    controller-callable methods with ``@register`` and declare their data-parallel layout with
    ``register_mesh``. Override ``close()`` to release resources (engines, shared memory)
    before the group kills the process.
    """

    def __init__(self) -> None:
        self._ctx = WorkerContext.from_env()
        self._device = setup_worker_process(self._ctx)
        self._meshes: dict[str, MeshInfo] = {}

    @property
    def rank(self) -> int:
        return self._ctx.rank

    @property
    def world_size(self) -> int:
        return self._ctx.world_size

    @property
    def local_rank(self) -> int:
        return self._ctx.local_rank

    @property
    def node_id(self) -> str:
        return self._ctx.node_id

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def master_address(self) -> tuple[str, int]:
        return self._ctx.master_addr, self._ctx.master_port

    def register_mesh(self, name: str, dp_rank: int, dp_size: int, is_collect: bool = True) -> None:
        """Declare this worker's place in mesh ``name`` (used by ``DP_COMPUTE`` methods with ``mesh=name``).

        A worker may belong to several meshes ("actor", "rollout", ...). Membership is fixed once
        declared: the controller caches it at the first dispatch.
        """
        info = MeshInfo(name, dp_rank, dp_size, is_collect)
        if name in self._meshes and self._meshes[name] != info:
            raise ValueError(f"mesh '{name}' is already registered as {self._meshes[name]}; cannot change it to {info}")
        self._meshes[name] = info

    def get_mesh(self, name: str) -> MeshInfo | None:
        """This worker's membership in mesh ``name``, or None if it never registered it."""
        return self._meshes.get(name)

    def close(self) -> None:
        """Release what the worker holds before its process is killed; the default holds nothing."""
