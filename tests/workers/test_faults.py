"""Faults reach the controller as clear errors within bounded time, and shutdown frees everything."""

from __future__ import annotations

import time

import pytest
import ray
from sample_workers import ProbeWorker

from rlflow.workers import RayWorkerGroup, ResourcePool, ResourceUnavailableError, WorkerDiedError, WorkerError, WorkerSpec

BOUND_S = 60


def test_worker_killed_mid_call_is_reported_not_waited_on(local_ray):
    pool = ResourcePool(procs_per_node=2, cpus_per_proc=0.5, device="cpu", name="dying")
    wg = RayWorkerGroup(pool, ProbeWorker, name="dying")
    started = time.monotonic()
    with pytest.raises(WorkerDiedError) as info:
        wg.execute_all("die_on", 1, others_sleep_s=2 * BOUND_S)  # rank 0 stays busy far past the bound
    assert time.monotonic() - started < BOUND_S
    assert info.value.rank == 1 and info.value.method == "main.die_on"
    assert "died" in str(info.value)
    with pytest.raises(WorkerDiedError):  # the dead rank keeps reporting itself, without a hang
        wg.execute_all_async("pid").get()

    started = time.monotonic()
    wg.shutdown(timeout_s=1.0)
    assert time.monotonic() - started < 10
    states = {ray.util.placement_group_table(slot.placement_group)["state"] for slot in pool.slots}
    assert states == {"REMOVED"}


def test_failing_constructor_raises_and_releases_the_pool(local_ray):
    free_before = ray.available_resources().get("CPU", 0.0)
    pool = ResourcePool(procs_per_node=1, cpus_per_proc=0.5, device="cpu", name="badinit")
    with pytest.raises(WorkerError, match=r"main.__init__ \(ProbeWorker\) failed on worker rank 0") as info:
        RayWorkerGroup(pool, WorkerSpec(ProbeWorker, no_such_arg=1), name="badinit")
    assert "no_such_arg" in info.value.remote_traceback
    assert ray.util.placement_group_table(pool.slots[0].placement_group)["state"] == "REMOVED"
    deadline = time.monotonic() + 10  # resources come back asynchronously after removal
    while ray.available_resources().get("CPU", 0.0) < free_before and time.monotonic() < deadline:
        time.sleep(0.2)
    assert ray.available_resources().get("CPU", 0.0) >= free_before


def test_request_larger_than_cluster_names_what_is_missing(local_ray):
    started = time.monotonic()
    with pytest.raises(ResourceUnavailableError, match=r"needs \{'CPU': 16.0\} in total .* missing \{'CPU': "):
        ResourcePool(procs_per_node=4, cpus_per_proc=4.0, device="cpu", name="huge")
    with pytest.raises(ResourceUnavailableError, match=r"needs 2 node\(s\) that each hold \{'CPU': 1.0\}, but only 1"):
        ResourcePool(procs_per_node=2, nnodes=2, cpus_per_proc=0.5, device="cpu", name="twonodes")
    assert time.monotonic() - started < BOUND_S


def test_a_pool_waits_for_a_joined_clusters_resources_at_most_its_limit(local_ray):
    """A joined cluster's nodes may still be coming up: the pool waits ``resource_wait_s`` for them, then one line."""
    started = time.monotonic()
    with pytest.raises(ResourceUnavailableError, match=r"free \(after waiting 2 s\): missing \{'CPU': ") as info:
        ResourcePool(procs_per_node=4, cpus_per_proc=4.0, device="cpu", resource_wait_s=2.0, name="waits")
    assert 2.0 <= time.monotonic() - started < BOUND_S and "\n" not in str(info.value)


def test_bad_pool_arguments_are_named():
    with pytest.raises(ValueError, match="ResourcePool 'pool': unknown pool placement 'diagonal'; registered: pack, spread"):
        ResourcePool(procs_per_node=1, placement="diagonal")
    with pytest.raises(ValueError, match="need procs_per_node >= 1"):
        ResourcePool(procs_per_node=0)
