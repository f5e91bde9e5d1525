"""DataProto: property tests of the algebra and tests of every bad-input error."""

import pickle

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlflow.protocol import DataProto, DataProtoError

DTYPES = [torch.float32, torch.bfloat16, torch.int64, torch.bool, torch.float16]


def make_batch(n: int, width: int = 3, dtype: torch.dtype = torch.float32, seed: int = 0) -> DataProto:
    g = torch.Generator().manual_seed(seed)
    values = torch.randn(n, width, generator=g)
    values = values > 0 if dtype == torch.bool else values.to(dtype)
    return DataProto.from_dict(
        tensors={"x": values, "ids": torch.arange(n)},
        non_tensors={"uid": np.array([f"u{i}" for i in range(n)], dtype=object), "payload": [{"i": i} for i in range(n)]},
        meta_info={"temperature": 0.7},
    )


def assert_same(a: DataProto, b: DataProto) -> None:
    assert set(a.batch) == set(b.batch) and set(a.non_tensor_batch) == set(b.non_tensor_batch)
    for k in a.batch:
        assert a.batch[k].dtype == b.batch[k].dtype
        assert torch.equal(a.batch[k], b.batch[k]), k
    for k in a.non_tensor_batch:
        assert a.non_tensor_batch[k].tolist() == b.non_tensor_batch[k].tolist(), k
    assert a.meta_info == b.meta_info


# ---------------------------------------------------------------- properties
@settings(max_examples=40, deadline=None)
@given(chunks=st.integers(1, 6), per_chunk=st.integers(0, 5), dtype=st.sampled_from(DTYPES))
def test_chunk_then_concat_is_identity(chunks, per_chunk, dtype):
    data = make_batch(chunks * per_chunk, dtype=dtype)
    parts = data.chunk(chunks)
    assert len(parts) == chunks and all(len(p) == per_chunk for p in parts)
    assert_same(DataProto.concat(parts), data)


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 17), divisor=st.integers(1, 8))
def test_pad_then_unpad_is_identity(n, divisor):
    data = make_batch(n)
    padded, pad_size = data.pad_to_divisor(divisor)
    assert len(padded) % divisor == 0 and pad_size == len(padded) - n and 0 <= pad_size < divisor
    assert_same(padded.unpad(pad_size), data)


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 9), times=st.integers(1, 5))
def test_repeat_interleave_keeps_groups_adjacent(n, times):
    data = make_batch(n)
    rep = data.repeat(times, interleave=True)
    assert len(rep) == n * times
    uids = rep.non_tensor_batch["uid"].tolist()
    for i in range(n):
        assert uids[i * times : (i + 1) * times] == [f"u{i}"] * times
        assert torch.equal(rep.batch["x"][i * times : (i + 1) * times], data.batch["x"][i : i + 1].expand(times, -1))
    tiled = data.repeat(times, interleave=False)
    assert tiled.non_tensor_batch["uid"].tolist() == data.non_tensor_batch["uid"].tolist() * times


@settings(max_examples=25, deadline=None)
@given(n=st.integers(0, 12), dtype=st.sampled_from(DTYPES))
def test_save_load_round_trip_is_exact(tmp_path_factory, n, dtype):
    data = make_batch(n, dtype=dtype)
    path = tmp_path_factory.mktemp("dp") / "batch.pkl"
    data.save_to_disk(path)
    assert_same(DataProto.load_from_disk(path), data)


@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 12), dtype=st.sampled_from(DTYPES))
def test_pickle_round_trip_is_exact(n, dtype):
    data = make_batch(n, dtype=dtype)
    assert_same(pickle.loads(pickle.dumps(data, protocol=5)), data)


def test_pickle_uses_out_of_band_buffers():
    """Protocol 5 hands tensor memory to Ray as buffers instead of copying it into the stream."""
    data = DataProto.from_dict({"big": torch.zeros(1000, 1000)})
    buffers = []
    stream = pickle.dumps(data, protocol=5, buffer_callback=buffers.append)
    assert len(buffers) == 1 and len(stream) < 10_000
    restored = pickle.loads(stream, buffers=buffers)
    assert torch.equal(restored.batch["big"], data.batch["big"])


def test_make_iterator_covers_every_row_each_epoch_and_is_seeded():
    data = make_batch(12)
    batches = list(data.make_iterator(mini_batch_size=4, epochs=2, shuffle=True, seed=3))
    assert len(batches) == 6
    for epoch in (batches[:3], batches[3:]):
        assert sorted(torch.cat([b.batch["ids"] for b in epoch]).tolist()) == list(range(12))
    again = list(data.make_iterator(mini_batch_size=4, epochs=2, shuffle=True, seed=3))
    assert all(torch.equal(a.batch["ids"], b.batch["ids"]) for a, b in zip(batches, again))
    assert not torch.equal(batches[0].batch["ids"], torch.arange(4)) or not torch.equal(
        batches[3].batch["ids"], batches[0].batch["ids"]
    )


def test_getitem_slice_int_and_index_arrays():
    data = make_batch(6)
    assert data[2:4].batch["ids"].tolist() == [2, 3]
    assert data[1].batch["ids"].tolist() == [1]
    assert data[-1].batch["ids"].tolist() == [5]
    assert data[np.array([5, 0])].non_tensor_batch["uid"].tolist() == ["u5", "u0"]
    assert data[torch.tensor([1, 1])].batch["ids"].tolist() == [1, 1]
    mask = np.array([True, False, True, False, False, True])
    assert data[mask].batch["ids"].tolist() == [0, 2, 5]


def test_select_pop_union():
    data = make_batch(4)
    only_x = data.select(batch_keys=["x"], non_tensor_batch_keys=[])
    assert only_x.keys() == ["x"]
    popped = data.pop(batch_keys=["ids"], non_tensor_batch_keys=["payload"])
    assert "ids" not in data and "ids" in popped and "payload" in popped
    data.union(popped)
    assert "ids" in data
    data.union(data.select(batch_keys=["x"]))  # same values: no conflict


# ---------------------------------------------------------------- bad input
def test_mismatched_lengths_name_the_keys():
    with pytest.raises(DataProtoError, match=r"mismatched lengths: a=3, b=2"):
        DataProto.from_dict({"a": torch.zeros(3), "b": torch.zeros(2)})
    with pytest.raises(DataProtoError, match=r"uid=2"):
        DataProto.from_dict({"a": torch.zeros(3)}, {"uid": ["x", "y"]})


def test_non_tensor_values_are_checked():
    with pytest.raises(DataProtoError, match="'a' must be a torch.Tensor"):
        DataProto.from_dict({"a": [1, 2]})
    with pytest.raises(DataProtoError, match="'uid' must be a numpy array or list"):
        DataProto.from_dict(non_tensors={"uid": "abc"})
    with pytest.raises(DataProtoError, match="0-d"):
        DataProto.from_dict({"a": torch.tensor(1.0)})


def test_unknown_keys_are_named():
    data = make_batch(2)
    with pytest.raises(DataProtoError, match=r"unknown keys \['nope'\]"):
        data.select(batch_keys=["nope"])
    with pytest.raises(DataProtoError, match=r"unknown keys \['missing'\]"):
        data.pop(non_tensor_batch_keys=["missing"])
    with pytest.raises(DataProtoError, match="unknown meta_info keys"):
        data.pop(meta_info_keys=["gone"])


def test_chunk_count_that_does_not_divide():
    with pytest.raises(DataProtoError, match="cannot chunk a batch of 5 into 2"):
        make_batch(5).chunk(2)
    with pytest.raises(DataProtoError, match="must be positive"):
        make_batch(4).chunk(0)


def test_union_conflicts_are_named():
    a = make_batch(3)
    b = make_batch(3, seed=1).select(batch_keys=["x"], non_tensor_batch_keys=[])
    with pytest.raises(DataProtoError, match="union conflict on tensor 'x'"):
        a.union(b)
    with pytest.raises(DataProtoError, match="union conflict on meta_info 'temperature'"):
        a.union(DataProto(meta_info={"temperature": 1.0}))
    with pytest.raises(DataProtoError, match="length 3 and 2"):
        a.union(make_batch(2))


def test_concat_with_different_keys_and_bad_iterators(tmp_path):
    with pytest.raises(DataProtoError, match="different keys"):
        DataProto.concat([make_batch(2), make_batch(2).select(batch_keys=["x"])])
    with pytest.raises(DataProtoError, match="at least one"):
        DataProto.concat([])
    with pytest.raises(DataProtoError, match="must be positive and divide"):
        next(make_batch(5).make_iterator(mini_batch_size=2))
    with pytest.raises(DataProtoError, match="cannot unpad 9"):
        make_batch(3).unpad(9)
    with pytest.raises(DataProtoError, match="out of range"):
        make_batch(3)[np.array([3])]
    path = tmp_path / "x.pt"
    torch.save({"a": 1}, path)
    with pytest.raises(DataProtoError, match="does not hold a DataProto"):
        DataProto.load_from_disk(path)
