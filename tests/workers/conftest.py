"""Ray sessions for the worker-group tests.

Starting Ray costs 6-20 s here, so every single-node test module shares one local session
(8 logical CPUs: 0.5-CPU bundles let 4+ workers fit on 2 cores); the multi-node module swaps
it for a simulated cluster. Sessions live in short /tmp dirs (socket paths < 108 chars) and
end with ray.shutdown(), never `ray stop`.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Iterator

import pytest
import ray
import ray.cloudpickle
import sample_workers
from ray.cluster_utils import Cluster

from rlflow.workers import init_ray, shutdown_ray

# The test worker classes live in this test folder, which Ray workers cannot import: ship them by value.
ray.cloudpickle.register_pickle_by_value(sample_workers)

LOCAL_CPUS = 8


class RaySessions:
    """Starts at most one Ray session at a time and reuses a matching one."""

    def __init__(self) -> None:
        self.kind: str | None = None
        self.temp_dir: str | None = None
        self.cluster: Cluster | None = None
        self._saved_tmpdir: str | None = None

    def local(self) -> None:
        if self.kind == "local" and ray.is_initialized():
            return
        self.stop()
        self.temp_dir = tempfile.mkdtemp(prefix="r", dir="/tmp")
        init_ray(num_cpus=LOCAL_CPUS, temp_dir=self.temp_dir)
        self.kind = "local"

    def cluster_of(self, cpus_per_node: list[float]) -> Cluster:
        """A head node plus one raylet per further entry, each with its own CPUs, all on this machine."""
        self.stop()
        self.temp_dir = tempfile.mkdtemp(prefix="r", dir="/tmp")
        # Cluster writes its address file under RAY_TMPDIR/ray: keep it out of the shared /tmp/ray.
        self._saved_tmpdir = os.environ.get("RAY_TMPDIR")
        os.environ["RAY_TMPDIR"] = self.temp_dir
        os.makedirs(os.path.join(self.temp_dir, "ray"))
        # Ray's defaults for Cluster: all interfaces, no token (RAY_AUTH_MODE unset). Its head did not come up
        # with token auth here, and ray.init rewrites a 127.0.0.1 address to the machine's IP when it joins.
        self.cluster = Cluster(
            initialize_head=True, head_node_args={"num_cpus": cpus_per_node[0], "include_dashboard": False}
        )
        for cpus in cpus_per_node[1:]:
            self.cluster.add_node(num_cpus=cpus)
        self.cluster.wait_for_nodes()
        init_ray(address=self.cluster.address)
        self.kind = "cluster"
        return self.cluster

    def stop(self) -> None:
        shutdown_ray()
        if self.cluster is not None:
            self.cluster.shutdown()
            self.cluster = None
            if self._saved_tmpdir is None:
                os.environ.pop("RAY_TMPDIR", None)
            else:
                os.environ["RAY_TMPDIR"] = self._saved_tmpdir
        if self.temp_dir is not None:
            shutil.rmtree(self.temp_dir, ignore_errors=True)
            self.temp_dir = None
        self.kind = None


@pytest.fixture(scope="session")
def ray_sessions() -> Iterator[RaySessions]:
    sessions = RaySessions()
    yield sessions
    sessions.stop()


@pytest.fixture(scope="module")
def local_ray(ray_sessions: RaySessions) -> None:
    """A local Ray session with LOCAL_CPUS logical CPUs, shared by the modules that ask for it."""
    ray_sessions.local()
