"""Loopback binding and token authentication for the local Ray cluster ``init_ray`` starts.

**Loopback.** Ray 2.60's gRPC servers (GCS, raylet, every worker's core worker) and its
agents listen on every interface, except when the node's IP is ``127.0.0.1``: then each one
binds to loopback. ``ray.init(_node_ip_address="127.0.0.1")`` alone does not get there, since
``ray.init`` swaps a loopback address for the machine's outward address
(``ray._private.services.resolve_ip_for_localhost``) on every platform where Ray supports
multi-node clusters (``ray_constants.ENABLE_RAY_CLUSTER``: false only on macOS/Windows, where
Ray keeps local clusters on loopback). ``node_ip_scope`` clears that flag for the duration of
the ``ray.init`` call only; the node then records ``127.0.0.1`` and passes it to every process it
starts. ``tests/workers/test_ray_loopback.py`` lists every listening socket of such a cluster.

**The workers' own sockets.** A worker group's rendezvous store is bound to its master address
(``rlflow.workers.worker.rendezvous_store``: loopback on such a cluster). gloo and NCCL pick the
interface of the host name for their connections unless told otherwise; ``loopback_worker_env``
names the loopback interface to them (``GLOO_SOCKET_IFNAME``, ``NCCL_SOCKET_IFNAME``) for the
workers of a loopback cluster, unless the user set these variables.

**Token auth.** Unless ``RAY_AUTH_MODE`` is already set in the environment (the user's choice,
kept as is), ``ClusterAuth.enable`` turns on ``RAY_AUTH_MODE=token`` with a fresh random token
in ``RAY_AUTH_TOKEN``. The cluster's processes inherit it from this process's environment
(readable only by the same user), so nothing is written to ``~/.ray``; ``restore`` removes what
``enable`` set once the cluster is gone, so a later ``init_ray(address=...)`` uses the user's
own settings.
"""

from __future__ import annotations

import os
import secrets
import socket
from contextlib import contextmanager
from typing import Iterator, Optional
from unittest import mock

from ray._private import ray_constants
from ray._raylet import AuthenticationTokenLoader, Config

LOOPBACK = "127.0.0.1"
SOCKET_INTERFACE_ENVS = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")
AUTH_MODE_ENV = "RAY_AUTH_MODE"
AUTH_TOKEN_ENVS = ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")


@contextmanager
def node_ip_scope(node_ip_address: Optional[str]) -> Iterator[None]:
    """Let ``ray.init(_node_ip_address=LOOPBACK)`` keep the loopback address inside this block.

    Any other address (a real interface for a head that other machines join, or None for Ray's
    own choice) leaves Ray's behaviour unchanged.
    """
    if node_ip_address != LOOPBACK:
        yield
        return
    with mock.patch.object(ray_constants, "ENABLE_RAY_CLUSTER", False):
        yield


def loopback_worker_env(node_ip_address: Optional[str]) -> dict[str, str]:
    """Environment for the workers of a cluster on ``node_ip_address``: on loopback, gloo's and NCCL's interface
    is the loopback one (``lo``), unless set already; on any other address, nothing."""
    if node_ip_address != LOOPBACK:
        return {}
    names = [name for _, name in socket.if_nameindex() if name.startswith("lo")]
    if not names:
        return {}
    return {env: names[0] for env in SOCKET_INTERFACE_ENVS if env not in os.environ}


def _refresh_ray_auth_config() -> None:
    """Make this process's Ray core re-read ``RAY_AUTH_*`` (it caches them at import)."""
    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()


class ClusterAuth:
    """Turns token auth on for a local cluster when the user left ``RAY_AUTH_MODE`` unset."""

    def __init__(self) -> None:
        self._set_by_us: list[str] = []

    def enable(self) -> str:
        """Set the auth environment for the cluster about to start; returns the mode in force."""
        if AUTH_MODE_ENV in os.environ:
            return os.environ[AUTH_MODE_ENV]
        os.environ[AUTH_MODE_ENV] = "token"
        self._set_by_us.append(AUTH_MODE_ENV)
        if not any(name in os.environ for name in AUTH_TOKEN_ENVS):
            os.environ["RAY_AUTH_TOKEN"] = secrets.token_hex(32)
            self._set_by_us.append("RAY_AUTH_TOKEN")
        _refresh_ray_auth_config()
        return "token"

    def restore(self) -> None:
        """Remove what ``enable`` set (call after ``ray.shutdown()``)."""
        if not self._set_by_us:
            return
        for name in self._set_by_us:
            os.environ.pop(name, None)
        self._set_by_us = []
        _refresh_ray_auth_config()
