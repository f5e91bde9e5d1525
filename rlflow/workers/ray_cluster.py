"""Start or join the Ray cluster the controller drives.

``init_ray()`` starts a private local cluster: every port on loopback, token auth on (unless
``RAY_AUTH_MODE`` is set), no dashboard (see ``ray_security``), and a watcher that ends every
process the driver started once the driver is gone, even after a SIGKILL (see ``cluster_reaper``).
``init_ray(address="auto")`` or ``init_ray(address="10.0.0.1:6379")`` joins one started with
``ray start`` under that cluster's own network and auth settings (see docs/multinode.md), with no
watcher; so does ``RAY_ADDRESS`` when no address is given. Joining is bounded by
``connect_timeout_s`` (``trainer.timeouts.connect_s``; ``ray_connect``). It never runs ``ray stop``: that would kill every Ray process on the machine, other
users' included.
"""

from __future__ import annotations

import os
from typing import Any, Optional

import ray

from rlflow.utils.cpu_heap import ENV_RETAIN_HEAP
from rlflow.utils.log_routing import ENV_CONSOLE_LEVEL, ENV_LOG_DIR, LIBRARY_ENV, console_level
from rlflow.utils.logging import get_logger
from rlflow.workers.cluster_reaper import ClusterReaper
from rlflow.workers.ray_connect import connect_deadline, join_address, probe_cluster
from rlflow.workers.ray_security import LOOPBACK, ClusterAuth, loopback_worker_env, node_ip_scope

logger = get_logger(__name__)

# Every worker process runs one torch/OpenMP thread unless its bundle asks for more.
# "/session_<date>_<time>_<usec>_<pid>/sockets/plasma_store" and the AF_UNIX path limit.
_SOCKET_SUFFIX_CHARS = 64
_MAX_SOCKET_PATH = 107
_WORKER_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", **LIBRARY_ENV}
_PASSED_ENV = (ENV_RETAIN_HEAP, ENV_LOG_DIR, ENV_CONSOLE_LEVEL)  # the driver's settings reach workers on other nodes too
_AUTH = ClusterAuth()
_reaper: Optional[ClusterReaper] = None  # the watcher started with the local cluster of this process


def init_ray(
    address: str | None = None,
    num_cpus: float | None = None,
    temp_dir: str | None = None,
    object_store_memory: int | None = None,
    node_ip_address: Optional[str] = LOOPBACK,
    connect_timeout_s: float = 120.0,
    **ray_init_kwargs: Any,
) -> None:
    """Connect this process to Ray, starting a local cluster when ``address`` is None.

    A local cluster listens on ``node_ip_address`` only (loopback by default; a real interface
    address, or None for Ray's own pick, opens it to other machines, which then also listens on
    all interfaces), requires a token (a fresh one, unless ``RAY_AUTH_MODE`` is set), runs no
    dashboard, and keeps its sockets and logs in ``temp_dir`` (keep the path short: Ray's socket
    paths must stay under 108 characters). Calling it again while connected is a no-op.

    ``address`` None with ``RAY_ADDRESS`` set joins that cluster. Joining waits at most
    ``connect_timeout_s`` and fails with one line naming the address (``RayConnectError``, or an exit
    with status 2 if ``ray.init`` itself hangs); a SIGTERM while joining ends the process at once.
    """
    global _reaper
    if ray.is_initialized():
        return
    runtime_env = dict(ray_init_kwargs.pop("runtime_env", None) or {})
    passed = {name: os.environ[name] for name in _PASSED_ENV if name in os.environ}
    runtime_env["env_vars"] = {**_WORKER_ENV, **passed, **runtime_env.get("env_vars", {})}
    joined = join_address(address)
    if joined is None:
        runtime_env["env_vars"] = {**loopback_worker_env(node_ip_address), **runtime_env["env_vars"]}
        if temp_dir is not None and len(temp_dir) + _SOCKET_SUFFIX_CHARS > _MAX_SOCKET_PATH:
            raise ValueError(
                f"temp_dir {temp_dir!r} is {len(temp_dir)} characters; Ray adds about {_SOCKET_SUFFIX_CHARS} for its "
                f"session socket paths, which must stay under {_MAX_SOCKET_PATH}. Use a short one, e.g. "
                "tempfile.mkdtemp(prefix='r', dir='/tmp')"
            )
        ray_init_kwargs.setdefault("include_dashboard", False)
        ray_init_kwargs.setdefault("logging_level", console_level())  # Ray's INFO lines ("Started a local Ray instance")
        _AUTH.enable()
        _reaper = ClusterReaper()
        try:
            with node_ip_scope(node_ip_address):
                ray.init(
                    num_cpus=num_cpus,
                    object_store_memory=object_store_memory,
                    _temp_dir=temp_dir,
                    _node_ip_address=node_ip_address,
                    runtime_env=runtime_env,
                    **ray_init_kwargs,
                )
        except BaseException:
            _stop_reaper()
            _AUTH.restore()
            raise
    else:
        probe_cluster(joined, connect_timeout_s)
        with connect_deadline(joined, connect_timeout_s):
            ray.init(address=joined, runtime_env=runtime_env, **ray_init_kwargs)
    logger.info("ray connected: %s", {k: v for k, v in ray.cluster_resources().items() if "node:" not in k})


def init_cluster(trainer: Any) -> None:
    """``init_ray`` with a run's ``trainer`` settings: ``ray_address``, ``ray_num_cpus``, ``ray_temp_dir``,
    ``ray_node_ip_address`` and ``timeouts.connect_s``."""
    init_ray(address=trainer.ray_address, num_cpus=trainer.ray_num_cpus, temp_dir=trainer.ray_temp_dir,
             node_ip_address=trainer.ray_node_ip_address, connect_timeout_s=float(trainer.timeouts.connect_s))


def shutdown_ray() -> None:
    """Disconnect this process from Ray (and stop the local cluster it started). Never ``ray stop``."""
    if ray.is_initialized():
        ray.shutdown()
    _stop_reaper()
    _AUTH.restore()


def _stop_reaper() -> None:
    global _reaper
    if _reaper is not None:
        _reaper.stop()
        _reaper = None
