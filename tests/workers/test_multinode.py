"""Placement across nodes on a simulated 2-node cluster (two raylets on this machine)."""

from __future__ import annotations

import time
from collections import Counter

import pytest
import ray
from sample_workers import ProbeWorker

from rlflow.workers import RayWorkerGroup, ResourcePool, ResourceUnavailableError

CPUS_PER_NODE = 2.0


@pytest.fixture(scope="module")
def two_nodes(ray_sessions):
    cluster = ray_sessions.cluster_of([CPUS_PER_NODE, CPUS_PER_NODE])
    node_ids = {node["NodeID"] for node in ray.nodes() if node["Alive"]}
    assert len(node_ids) == 2
    yield node_ids
    ray_sessions.stop()
    assert cluster is not None


@pytest.fixture(scope="module")
def spanning_group(two_nodes):
    pool = ResourcePool(procs_per_node=2, nnodes=2, cpus_per_proc=0.5, device="cpu", name="span")
    with RayWorkerGroup(pool, ProbeWorker, name="span") as wg:
        yield wg


def wait_for_free_cpus(expected: float, timeout_s: float = 20.0) -> None:
    """Removed placement groups hand their resources back asynchronously."""
    deadline = time.monotonic() + timeout_s
    while ray.available_resources().get("CPU", 0.0) != expected and time.monotonic() < deadline:
        time.sleep(0.2)
    assert ray.available_resources().get("CPU", 0.0) == expected


def test_pool_of_two_nodes_places_two_workers_on_each(two_nodes, spanning_group):
    described = spanning_group.describe()
    per_node = Counter(d["node_id"] for d in described)
    assert set(per_node) == two_nodes and set(per_node.values()) == {2}
    # ranks are node-contiguous and local ranks count within each node
    assert described[0]["node_id"] == described[1]["node_id"] != described[2]["node_id"] == described[3]["node_id"]
    assert [d["local_rank"] for d in described] == [0, 1, 0, 1]
    assert [info.node_id for info in spanning_group.workers] == [d["node_id"] for d in described]
    assert spanning_group.all_reduce_rank() == [10.0] * 4  # gloo across both "nodes"


def test_spread_placement_uses_both_nodes(spanning_group, two_nodes):
    pool = ResourcePool(procs_per_node=2, cpus_per_proc=0.5, device="cpu", placement="spread", name="spread")
    try:
        assert set(pool.node_ids()) == two_nodes
    finally:
        pool.release()


def test_group_that_fits_in_total_but_on_no_single_node_times_out_clearly(spanning_group):
    # each node has 1 of its 2 CPUs free: 1.5 CPUs on one node fits the totals, never the free space
    wait_for_free_cpus(2 * CPUS_PER_NODE - 4 * 0.5)
    started = time.monotonic()
    with pytest.raises(ResourceUnavailableError, match=r"'node0' .* was not placed within 3 s") as info:
        ResourcePool(procs_per_node=2, cpus_per_proc=0.75, device="cpu", ready_timeout_s=3, name="fragmented")
    assert time.monotonic() - started < 60
    assert "Free now: {'CPU': 2.0}" in str(info.value)  # 1 + 1, on two nodes
