"""Dispatch modes, mesh tables, metric reduction and @register, in-process (no Ray).

A "fake group" here runs each per-rank call as a plain function, so dispatch + collect are
checked against an independent expectation: the whole batch processed in one piece.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlflow.protocol import DataProto, DataProtoError
from rlflow.workers import (
    ALL_TO_ALL,
    DISPATCH_MODE_REGISTRY,
    DP_COMPUTE,
    ONE_TO_ALL,
    RANK_ZERO,
    DispatchContext,
    DispatchMode,
    MeshInfo,
    MeshTable,
    Worker,
    get_dispatch_mode,
    reduce_metrics,
    register,
)
from rlflow.workers.decorator import registered_methods
from rlflow.workers.dispatch import padded_chunks


def dp_tp_mesh(dp: int, tp: int) -> MeshTable:
    """dp x tp ranks; consecutive ranks share a DP shard and the first of them collects."""
    return MeshTable.from_members("m", [MeshInfo("m", r // tp, dp, r % tp == 0) for r in range(dp * tp)])


def run(mode: str, ctx: DispatchContext, fn, *args, **kwargs):
    """Dispatch, run ``fn(rank, *args)`` per called rank, collect."""
    spec = get_dispatch_mode(mode)
    calls = spec.dispatch(ctx, args, kwargs)
    outputs = {rank: fn(rank, *a, **kw) for rank, (a, kw) in calls.items()}
    return calls, spec.collect(ctx, outputs)


def ctx_for(mesh: MeshTable, reduce="mean") -> DispatchContext:
    return DispatchContext("test.method", len(mesh.dp_rank_of), "m", reduce, mesh_loader=lambda name: mesh)


def batch(n: int) -> DataProto:
    return DataProto.from_dict({"ids": torch.arange(n), "x": torch.randn(n, 3)}, {"uid": [f"u{i}" for i in range(n)]})


def test_dp_compute_gives_each_tp_group_the_same_chunk():
    mesh = dp_tp_mesh(dp=2, tp=2)
    calls, _ = run(DP_COMPUTE, ctx_for(mesh), lambda rank, data: data, batch(8))
    chunks = {rank: args[0].batch["ids"].tolist() for rank, (args, _) in calls.items()}
    assert chunks == {0: [0, 1, 2, 3], 1: [0, 1, 2, 3], 2: [4, 5, 6, 7], 3: [4, 5, 6, 7]}


@settings(max_examples=40, deadline=None)
@given(n=st.integers(0, 23), dp=st.integers(1, 5), tp=st.integers(1, 3))
def test_dp_compute_round_trip_keeps_rows_and_order(n, dp, tp):
    data = batch(n)
    # each rank tags its output with its rank, so a wrong collector would show up
    calls, out = run(
        DP_COMPUTE,
        ctx_for(dp_tp_mesh(dp, tp)),
        lambda rank, chunk: DataProto.from_dict(
            {**chunk.batch, "by": torch.full((len(chunk),), rank)}, dict(chunk.non_tensor_batch)
        ),
        data,
    )
    assert torch.equal(out.batch["ids"], data.batch["ids"])
    assert torch.equal(out.batch["x"], data.batch["x"])
    assert out.non_tensor_batch["uid"].tolist() == data.non_tensor_batch["uid"].tolist()
    assert set(out.batch["by"].tolist()) <= {d * tp for d in range(dp)}  # only collect ranks answered
    if n:
        assert all(len(args[0]) == -(-n // dp) for args, _ in calls.values())  # padded to equal chunks


@settings(max_examples=60, deadline=None)
@given(n=st.integers(0, 23), parts=st.integers(1, 7))
def test_padded_chunks_equal_pad_then_chunk_and_view_the_unpadded_rows(n, parts):
    data = batch(n)
    chunks, pad_size = padded_chunks(data, parts)
    padded, expected_pad = data.pad_to_divisor(parts)
    assert pad_size == expected_pad and len(chunks) == parts
    for chunk, expected in zip(chunks, padded.chunk(parts)):
        assert torch.equal(chunk.batch["ids"], expected.batch["ids"]) and torch.equal(chunk.batch["x"], expected.batch["x"])
        assert chunk.non_tensor_batch["uid"].tolist() == expected.non_tensor_batch["uid"].tolist()
    chunk_len = len(padded) // parts
    for index, chunk in enumerate(chunks):
        if len(chunk) and (index + 1) * chunk_len <= n:  # wholly inside the batch: a view, no copy
            assert chunk.batch["x"].data_ptr() == data.batch["x"][index * chunk_len].data_ptr()


def test_dp_compute_unpads_k_rows_per_input_row():
    data = batch(5)
    _, out = run(DP_COMPUTE, ctx_for(dp_tp_mesh(2, 1)), lambda r, chunk: chunk.repeat(3, interleave=True), data)
    assert torch.equal(out.batch["ids"], data.batch["ids"].repeat_interleave(3))


def test_dp_compute_rejects_outputs_that_break_row_order_under_padding():
    with pytest.raises(DataProtoError, match="k rows per input row"):
        run(DP_COMPUTE, ctx_for(dp_tp_mesh(2, 1)), lambda r, chunk: chunk[: 1 + r], batch(5))


def test_dp_compute_broadcasts_non_dataproto_args_and_rejects_unequal_batches():
    calls, _ = run(DP_COMPUTE, ctx_for(dp_tp_mesh(2, 1)), lambda r, d, scale: d, batch(4), scale=2.0)
    assert all(kw["scale"] == 2.0 for _, kw in calls.values())
    with pytest.raises(DataProtoError, match="differ in length"):
        run(DP_COMPUTE, ctx_for(dp_tp_mesh(2, 1)), lambda r, a, b: a, batch(4), batch(5))


def test_dp_compute_merges_metrics_and_tuples():
    data = batch(6)

    def step(rank, chunk):
        metrics = {"loss": float(chunk.batch["ids"].float().mean()), "tokens": len(chunk), "peak": int(chunk.batch["ids"].max())}
        return DataProto.from_dict({"ids": chunk.batch["ids"]}, meta_info={"metrics": metrics}), metrics

    reduce = {"tokens": "sum", "peak": "max"}
    _, (out, metrics) = run(DP_COMPUTE, ctx_for(dp_tp_mesh(3, 2), reduce), step, data)
    expected = {"loss": float(np.mean([0.5, 2.5, 4.5])), "tokens": 6.0, "peak": 5.0}
    assert out.meta_info["metrics"] == pytest.approx(expected)
    assert metrics == pytest.approx(expected)


def test_one_to_all_all_to_all_rank_zero():
    ctx = DispatchContext("t", 3)
    calls, out = run(ONE_TO_ALL, ctx, lambda r, v: (r, v), "same")
    assert out == [(0, "same"), (1, "same"), (2, "same")]
    calls, out = run(ALL_TO_ALL, ctx, lambda r, v, w: v + w, [1, 2, 3], w=[10, 20, 30])
    assert out == [11, 22, 33]
    calls, out = run(RANK_ZERO, ctx, lambda r, v: (r, v), "x")
    assert list(calls) == [0] and out == (0, "x")


def test_all_to_all_names_the_bad_argument():
    with pytest.raises(ValueError, match=r"'w' must be a list with one entry per rank \(3\), got list of length 2"):
        run(ALL_TO_ALL, DispatchContext("t", 3), lambda r, v, w: v, [1, 2, 3], w=[1, 2])


def test_custom_mode_registry():
    with DISPATCH_MODE_REGISTRY.temporary():

        @DISPATCH_MODE_REGISTRY.register("unit_last_rank")
        class LastRank(DispatchMode):
            @staticmethod
            def dispatch(ctx, args, kwargs):
                return {ctx.world_size - 1: (args, kwargs)}

            @staticmethod
            def collect(ctx, outputs):
                return outputs[ctx.world_size - 1]

        assert LastRank.name == "unit_last_rank"
        calls, out = run("unit_last_rank", DispatchContext("t", 4), lambda r, v: (r, v), 7)
        assert list(calls) == [3] and out == (3, 7)
        with pytest.raises(ValueError, match="already registered"):
            DISPATCH_MODE_REGISTRY.register("unit_last_rank")(type("Other", (DispatchMode,), {}))
        with pytest.raises(TypeError, match="must be a subclass of DispatchMode"):
            DISPATCH_MODE_REGISTRY.register("unit_function")(lambda ctx, args, kwargs: {})
    assert "unit_last_rank" not in DISPATCH_MODE_REGISTRY
    with pytest.raises(ValueError, match="unknown dispatch mode 'nope'; registered: .*dp_compute"):
        get_dispatch_mode("nope")


def test_mesh_table_validation_names_the_problem():
    with pytest.raises(ValueError, match=r"ranks \[1\] have not registered mesh 'a'"):
        MeshTable.from_members("a", [MeshInfo("a", 0, 1, True), None])
    with pytest.raises(ValueError, match="disagree on dp_size"):
        MeshTable.from_members("a", [MeshInfo("a", 0, 2, True), MeshInfo("a", 0, 1, True)])
    with pytest.raises(ValueError, match="exactly one is_collect"):
        MeshTable.from_members("a", [MeshInfo("a", 0, 1, True), MeshInfo("a", 0, 1, True)])
    with pytest.raises(ValueError, match=r"dp ranks \[1\] have no worker"):
        MeshTable.from_members("a", [MeshInfo("a", 0, 2, True), MeshInfo("a", 0, 2, False)])
    with pytest.raises(ValueError, match="dp_rank < dp_size"):
        MeshInfo("a", 2, 2, True)


def test_reduce_metrics_ops_and_value_kinds():
    parts = [{"a": 1.0, "b": torch.tensor(2.0), "c": [1, 2]}, {"a": 3, "b": np.float32(6.0), "c": torch.tensor([3.0])}]
    assert reduce_metrics(parts) == pytest.approx({"a": 2.0, "b": 4.0, "c": 2.0})
    assert reduce_metrics(parts, {"a": "sum", "b": "max", "c": "min"}) == pytest.approx({"a": 4.0, "b": 6.0, "c": 1.0})
    with pytest.raises(ValueError, match="unknown metric reduction"):
        reduce_metrics(parts, "median")
    with pytest.raises(TypeError, match="metric 'name' must be a number"):
        reduce_metrics([{"name": "text"}])


def test_register_records_specs_and_rejects_misuse():
    class Base(Worker):
        @register(dispatch_mode=DP_COMPUTE, mesh="actor", reduce={"n": "sum"})
        def compute(self, data):
            return data

    class Child(Base):
        @register(dispatch_mode=RANK_ZERO, blocking=False)
        def save(self):
            return None

        def helper(self):
            return None

    specs = registered_methods(Child)
    assert set(specs) == {"compute", "save"}
    assert (specs["compute"].dispatch_mode, specs["compute"].mesh, specs["compute"].reduce) == (DP_COMPUTE, "actor", {"n": "sum"})
    assert specs["save"].blocking is False
    with pytest.raises(TypeError, match="with parentheses"):
        register(lambda self: None)
    with pytest.raises(ValueError, match="unknown metric reduction"):
        register(dispatch_mode=ONE_TO_ALL, reduce={"x": "avg"})
