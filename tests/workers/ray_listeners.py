"""Start a local cluster through ``init_ray`` and report what it exposes (run as a script).

``python ray_listeners.py REPORT.json`` writes one JSON object: the node IP Ray recorded, every listening TCP socket of the Ray
session's processes (this driver, its descendants, and any process whose command line names
the session folder), and the status code the GCS gives a gRPC call that carries no token.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

import grpc
import ray
from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc

from rlflow.workers import init_ray, shutdown_ray

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for the helpers the loopback tests share
from listening_sockets import listeners, session_processes  # noqa: E402


def settled_listeners(temp_dir: str, quiet_s: float = 4.0, limit_s: float = 60.0) -> list[dict]:
    """The listeners once no new one has appeared for ``quiet_s`` (agents start after ray.init returns)."""
    deadline = time.monotonic() + limit_s
    seen = listeners(session_processes(temp_dir))
    while time.monotonic() < deadline:
        time.sleep(quiet_s)
        now = listeners(session_processes(temp_dir))
        if len(now) <= len(seen):
            return now
        seen = now
    return seen


def tokenless_gcs_call(gcs_address: str) -> str:
    with grpc.insecure_channel(gcs_address) as channel:
        stub = gcs_service_pb2_grpc.NodeInfoGcsServiceStub(channel)
        try:
            stub.GetClusterId(gcs_service_pb2.GetClusterIdRequest(), timeout=20)
        except grpc.RpcError as err:
            return err.code().name
    return "OK"


def main(report_path: str) -> None:
    temp_dir = tempfile.mkdtemp(prefix="r", dir="/tmp")
    init_ray(num_cpus=1, temp_dir=temp_dir)
    try:
        # A task makes the raylet start a worker, whose core worker opens its own port.
        assert ray.get(ray.remote(lambda: 1).remote()) == 1
        node = ray._private.worker._global_node
        report = {"node_ip": node.node_ip_address, "listeners": settled_listeners(temp_dir),
                  "tokenless_gcs_call": tokenless_gcs_call(node.gcs_address)}
    finally:
        shutdown_ray()
    with open(report_path, "w") as f:
        json.dump(report, f)


if __name__ == "__main__":
    main(sys.argv[1])
