"""The single-controller machinery: resource pools, worker groups, dispatch modes, colocation.

See docs/single_controller.md for the design and a usage example.
"""

from rlflow.workers.call_limits import CallLimit, GroupTimeouts
from rlflow.workers.decorator import MethodSpec, register
from rlflow.workers.dispatch import (
    ALL_TO_ALL,
    DISPATCH_MODE_REGISTRY,
    DP_COMPUTE,
    ONE_TO_ALL,
    RANK_ZERO,
    DispatchContext,
    DispatchMode,
    dispatch_mode_names,
    get_dispatch_mode,
)
from rlflow.workers.errors import (
    ResourceUnavailableError,
    WorkerDiedError,
    WorkerError,
    WorkerTimeoutError,
    WorkerUserError,
)
from rlflow.workers.mesh import MeshInfo, MeshTable
from rlflow.workers.metrics import METRIC_REDUCTION_REGISTRY, reduce_metrics
from rlflow.workers.ray_cluster import init_cluster, init_ray, shutdown_ray
from rlflow.workers.resource_pool import ResourcePool
from rlflow.workers.worker import Worker, WorkerContext
from rlflow.workers.worker_group import RayWorkerGroup, RoleHandle, WorkerSpec

__all__ = [
    "CallLimit",
    "GroupTimeouts",
    "ALL_TO_ALL",
    "DISPATCH_MODE_REGISTRY",
    "DP_COMPUTE",
    "ONE_TO_ALL",
    "RANK_ZERO",
    "METRIC_REDUCTION_REGISTRY",
    "DispatchContext",
    "DispatchMode",
    "MeshInfo",
    "MeshTable",
    "MethodSpec",
    "RayWorkerGroup",
    "ResourcePool",
    "ResourceUnavailableError",
    "RoleHandle",
    "Worker",
    "WorkerContext",
    "WorkerDiedError",
    "WorkerError",
    "WorkerSpec",
    "WorkerTimeoutError",
    "WorkerUserError",
    "dispatch_mode_names",
    "get_dispatch_mode",
    "init_cluster",
    "init_ray",
    "reduce_metrics",
    "register",
    "shutdown_ray",
]
