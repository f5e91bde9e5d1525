"""Colocation: several roles fused into one process per bundle; and separate pools per role."""

from __future__ import annotations

import pytest
import ray
import torch
from sample_workers import GenerateRole, TrainRole

from rlflow.protocol import DataProto
from rlflow.workers import RayWorkerGroup, ResourcePool, RoleHandle, WorkerSpec


@pytest.fixture(scope="module")
def fused(local_ray):
    pool = ResourcePool(procs_per_node=2, cpus_per_proc=0.5, device="cpu", name="fused")
    roles = {"train": TrainRole, "rollout": WorkerSpec(GenerateRole, dp_size=2)}
    with RayWorkerGroup(pool, roles, name="fused") as wg:
        yield wg


def test_fused_roles_share_processes_and_process_group(fused):
    assert isinstance(fused.train, RoleHandle) and fused.role("rollout") is fused.rollout
    train = fused.train.pid_and_sum()
    rollout = fused.rollout.pid_and_sum()
    worker_pids = [info.pid for info in fused.workers]
    assert [pid for pid, _ in train] == [pid for pid, _ in rollout] == worker_pids
    assert len(set(worker_pids)) == 2
    assert [total for _, total in train] == [1.0, 1.0]  # ranks 0 + 1 over the shared gloo group
    assert [total for _, total in rollout] == [10.0, 10.0]


def test_fused_role_methods_keep_their_own_namespace_and_mesh(fused):
    prompts = DataProto.from_dict({"ids": torch.arange(5)})
    assert fused.rollout.generate(prompts).batch["response"].tolist() == [100, 101, 102, 103, 104]
    assert not hasattr(fused.train, "generate")
    with pytest.raises(AttributeError, match=r"hosts roles \['train', 'rollout'\]; call methods as wg.<role>"):
        fused.generate(prompts)
    assert fused.rollout.execute_all("get_mesh", "rollout")[1].dp_rank == 1


def test_separate_pools_per_role_get_separate_processes_and_groups(fused):
    pool = ResourcePool(procs_per_node=1, cpus_per_proc=0.5, device="cpu", name="solo")
    with RayWorkerGroup(pool, {"rollout": WorkerSpec(GenerateRole, dp_size=1)}, name="solo") as solo:
        (pid, total), = solo.rollout.pid_and_sum()  # its own world of one: 10 * rank 0
        assert total == 0.0 and pid not in {info.pid for info in fused.workers}
        assert solo.generate(DataProto.from_dict({"ids": torch.arange(3)})).batch["response"].tolist() == [100, 101, 102]
        placement_group = pool.slots[0].placement_group
    assert ray.util.placement_group_table(placement_group)["state"] == "REMOVED"


def test_a_worker_with_several_devices_reserves_a_share_of_cpus_for_each(local_ray):
    """``devices_per_proc`` (a rollout worker whose engine runs a process per tensor-parallel shard): the bundle and
    the worker's actor hold that many devices, and as many times ``cpus_per_proc`` CPUs."""
    pool = ResourcePool(procs_per_node=1, cpus_per_proc=0.5, device="cpu", name="shards", devices_per_proc=2)
    try:
        assert pool.bundle == {"CPU": 1.0} and pool.actor_options(0)["num_cpus"] == 1.0
        assert ray.util.placement_group_table(pool.slots[0].placement_group)["bundles"] == {0: {"CPU": 1.0}}
    finally:
        pool.release()
