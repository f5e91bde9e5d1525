"""Worker groups on real Ray + gloo: distributed init, every dispatch mode, mesh dispatch, errors."""

from __future__ import annotations

import time

import pytest
import ray
import torch
from sample_workers import GateWorker, ProbeWorker, SlowInitWorker

from rlflow.errors import UserError
from rlflow.protocol import DataProto, DataProtoFuture
from rlflow.workers import (
    ONE_TO_ALL,
    CallLimit,
    GroupTimeouts,
    RayWorkerGroup,
    ResourcePool,
    Worker,
    WorkerError,
    WorkerSpec,
    WorkerTimeoutError,
    WorkerUserError,
    register,
)


@pytest.fixture(scope="module")
def group4(local_ray):
    """4 workers x 0.5 CPU laid out as dp=2 x tp=2 on mesh 'actor'."""
    pool = ResourcePool(procs_per_node=4, cpus_per_proc=0.5, device="cpu", name="g4")
    with RayWorkerGroup(pool, WorkerSpec(ProbeWorker, tp_size=2), name="g4") as wg:
        yield wg


@pytest.fixture(scope="module")
def group2(local_ray):
    pool = ResourcePool(procs_per_node=2, cpus_per_proc=0.5, device="cpu", name="g2")
    with RayWorkerGroup(pool, ProbeWorker, name="g2") as wg:
        yield wg


def ids_batch(n: int) -> DataProto:
    return DataProto.from_dict({"ids": torch.arange(n)}, {"label": [f"row{i}" for i in range(n)]})


@pytest.mark.parametrize("group_name, size", [("group2", 2), ("group4", 4)])
def test_group_initializes_torch_distributed_and_all_reduces(request, group_name, size):
    wg = request.getfixturevalue(group_name)
    described = wg.describe()
    assert [d["rank"] for d in described] == list(range(size))
    assert [d["local_rank"] for d in described] == list(range(size))
    assert all(d["backend"] == "gloo" and d["dist_world"] == size and d["world_size"] == size for d in described)
    assert all(d["threads"] == 1 for d in described)  # 0.5-CPU bundles run one torch thread
    assert len({d["pid"] for d in described}) == size
    expected = size * (size + 1) / 2  # sum of rank + 1
    assert wg.all_reduce_rank() == [expected] * size


def test_one_to_all_and_all_to_all(group4):
    assert wg_tags(group4) == [""] * 4
    assert group4.scale([1.0, 2.0, 3.0, 4.0], offset=[0.0, 0.0, 0.0, 0.5]) == [1.0, 4.0, 9.0, 16.5]
    with pytest.raises(ValueError, match="one entry per rank"):
        group4.scale([1.0, 2.0])


def wg_tags(wg) -> list[str]:
    return [d["tag"] for d in wg.describe()]


def test_rank_zero_and_execute_helpers(group4):
    assert group4.whoami() == 0
    assert group4.execute_rank_zero("pid") == group4.describe()[0]["pid"]
    assert group4.execute_all("nap", 0.0) == [0, 1, 2, 3]
    with pytest.raises(AttributeError, match="no public method 'missing'"):
        group4.execute_all("missing")


def test_mesh_dispatch_gives_each_tp_pair_the_same_chunk(group4):
    out = group4.mark(ids_batch(8))
    received = [calls[-1] for calls in group4.execute_all("received_ids")]
    assert received[0] == received[1] == [0, 1, 2, 3]
    assert received[2] == received[3] == [4, 5, 6, 7]
    assert out.batch["dp_rank"].tolist() == [0] * 4 + [1] * 4


def test_mesh_dispatch_restores_order_when_batch_not_divisible(group4):
    data = ids_batch(7)
    out = group4.mark(data)
    assert len(out) == 7
    assert torch.equal(out.batch["doubled"], data.batch["ids"] * 2)
    assert out.non_tensor_batch["label"].tolist() == data.non_tensor_batch["label"].tolist()
    received = [calls[-1] for calls in group4.execute_all("received_ids")]
    assert received[2] == received[3] == [4, 5, 6, 0]  # the pad row (a copy of row 0) went to dp rank 1


def test_dp_compute_metrics_are_reduced_as_declared(group4):
    data = ids_batch(8)  # dp rank 0 gets 0..3, dp rank 1 gets 4..7
    out = group4.step_metrics(data)
    assert torch.equal(out.batch["out"], data.batch["ids"].float() + 0.5)
    assert out.meta_info["metrics"] == pytest.approx({"loss": 3.5, "tokens": 8.0, "peak": 7.0})
    # default mesh (no mesh name): all 4 ranks are DP ranks, plain dicts reduce too
    assert group4.plain_metrics(data) == pytest.approx({"loss": 3.5, "tokens": 8.0, "peak": 7.0})


def test_dp_compute_with_several_rows_per_input(group4):
    out = group4.sample_twice(ids_batch(5))  # 4 DP ranks, padded to 8
    assert out.batch["ids"].tolist() == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]


def test_collected_dataprotos_do_not_view_the_object_store(group2):
    """Outputs are fetched as views on Ray's shared store, not copies; what a call returns must own its
    memory, or a write to it would change the stored object."""
    data = DataProto.from_dict({"x": torch.zeros(2**18)})  # 1 MiB: kept in the shared store, not inlined
    for future in (group2.execute_rank_zero_async("echo", data), group2.execute_all_async("echo", data)):
        out = future.get()
        for part in out if isinstance(out, list) else [out]:
            part.batch["x"].add_(1.0)
        assert torch.equal(ray.get(future.refs[0]).batch["x"], data.batch["x"])


def test_custom_dispatch_mode(group4):
    # "round_robin" is registered in sample_workers with @DISPATCH_MODE_REGISTRY.register
    assert group4.total(list(range(10))) == [i * 10 for i in range(10)]


def test_async_calls_return_futures_that_overlap(group2, group4):
    future = group2.slow_rank()  # registered with blocking=False
    assert isinstance(future, DataProtoFuture)
    started = time.monotonic()
    naps = [group2.execute_all_async("nap", 2.0), group4.execute_all_async("nap", 2.0)]
    chained = group4.mark.future(ids_batch(4))
    assert future.get() == [0, 1]
    assert [f.get() for f in naps] == [[0, 1], [0, 1, 2, 3]]
    assert torch.equal(chained.get().batch["doubled"], torch.arange(4) * 2)
    assert time.monotonic() - started < 3.9  # the two 2 s naps ran at the same time (in turn: >= 4 s)
    # a future is accepted where its value is expected
    twice = group4.sample_twice(group4.sample_twice.future(ids_batch(2)))
    assert twice.batch["ids"].tolist() == [0, 0, 0, 0, 1, 1, 1, 1]


def test_worker_exception_reaches_controller_with_rank_method_and_traceback(group4):
    started = time.monotonic()
    with pytest.raises(WorkerError) as info:
        group4.execute_all("fail_on", 2, "bad input on purpose")
    assert time.monotonic() - started < 60
    err = info.value
    assert err.rank == 2 and err.method == "main.fail_on" and err.error_type == "ValueError"
    assert "bad input on purpose" in str(err)
    assert "sample_workers.py" in err.remote_traceback and "ValueError: bad input on purpose" in err.remote_traceback
    assert not isinstance(err, UserError), "a bug in a worker is not the user's input at fault"
    assert group4.whoami() == 0  # the group is still usable after a method raised


def test_user_error_in_a_worker_stays_a_one_line_user_error(group4):
    with pytest.raises(UserError) as info:
        group4.execute_all("fail_on", 1, "data.parquet row 3: field 'prompt' is missing", user_error=True)
    err = info.value
    assert isinstance(err, WorkerUserError) and err.rank == 1 and err.error_type == "DataError"
    assert str(err) == "data.parquet row 3: field 'prompt' is missing (raised by main.fail_on on worker rank 1)"
    assert "raise (DataError if user_error else ValueError)(message)" in err.remote_traceback


def test_call_timeout_raises_instead_of_waiting(group2):
    group2.timeouts = GroupTimeouts(default=CallLimit(0.5, "nap", "test.nap_s"))
    try:
        with pytest.raises(WorkerTimeoutError, match=r"nap phase timed out: main.nap did not finish within 0.5 s on ranks "
                                                     r"\[0, 1\] of worker group 'g2' .*raise test.nap_s") as raised:
            group2.execute_all("nap", 3.0)
        assert isinstance(raised.value, UserError) and "\n" not in str(raised.value)
    finally:
        group2.timeouts = GroupTimeouts()
    assert group2.execute_all("nap", 0.0) == [0, 1]


def test_start_up_timeout_names_the_roles_and_kills_without_waiting(local_ray):
    pool = ResourcePool(procs_per_node=1, cpus_per_proc=0.5, device="cpu", name="slowinit")
    # Each start-up call gets the whole limit, and the first one also waits for the process to start: 30 s leaves
    # a loaded CI box room to start it, so only the hung __init__ can run out of time.
    limits = GroupTimeouts(init=CallLimit(30.0, "init", "trainer.timeouts.init_s"))
    try:
        start = time.monotonic()
        with pytest.raises(WorkerTimeoutError, match=r"init phase timed out: main.__init__ did not finish within 30.0 s "
                                                     r"on ranks \[0\] of worker group 'slow'"):
            RayWorkerGroup(pool, WorkerSpec(SlowInitWorker, 600.0), name="slow", timeouts=limits)
        assert time.monotonic() - start < 30.0 + 20, "the hung worker is killed, not waited on to close"
    finally:
        pool.release()


def test_pool_hosts_one_group(group2):
    with pytest.raises(RuntimeError, match="already hosts worker group 'g2'"):
        RayWorkerGroup(group2._pool, ProbeWorker, name="second")


class ClashingWorker(Worker):
    @register(dispatch_mode=ONE_TO_ALL)
    def role(self) -> str:
        return "shadows RoleHandle.role"


class UnknownModeWorker(Worker):
    @register(dispatch_mode="no_such_mode")
    def work(self) -> None:
        return None


def test_bad_worker_classes_fail_before_any_actor_starts(local_ray):
    pool = ResourcePool(procs_per_node=1, cpus_per_proc=0.5, device="cpu", name="badclass")
    try:
        with pytest.raises(ValueError, match="ClashingWorker.role clashes with RoleHandle.role"):
            RayWorkerGroup(pool, ClashingWorker)
        with pytest.raises(ValueError, match="unknown dispatch mode 'no_such_mode'"):
            RayWorkerGroup(pool, UnknownModeWorker)
        with pytest.raises(ValueError, match="role name 'shutdown' must be an identifier that is not"):
            RayWorkerGroup(pool, {"shutdown": ProbeWorker})
    finally:
        pool.release()


def test_a_concurrent_call_runs_beside_the_call_in_progress_and_the_others_keep_their_order(local_ray):
    pool = ResourcePool(procs_per_node=1, cpus_per_proc=0.5, device="cpu", name="gate")
    with RayWorkerGroup(pool, GateWorker, name="gate") as wg:
        waiting = wg.wait_for_gate.future(60.0)
        later = [wg.record.future(f"call-{i}") for i in range(3)]  # sent behind the long call, in this order
        time.sleep(1.0)  # the long call is in progress
        assert wg.open_gate() != ""  # runs now, on another thread, though sent after everything above
        assert waiting.get() == [True]  # the long call saw the gate open: it had not finished before
        assert later[-1].get()[0] == ["wait_for_gate", "call-0", "call-1", "call-2"]
