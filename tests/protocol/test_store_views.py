"""Tensors unpickled from read-only buffers, as Ray's object store hands them out: copied by
default, borrowed only inside ``borrowing_store_buffers``, and copied again by ``owned()``.

Ray's buffers are stood in for by protocol-5 out-of-band buffers made read-only, which is what
numpy sees from Ray (its store memory is shared and in fact writable, hence the copies).
"""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch

from rlflow.protocol import DataProto
from rlflow.utils.tensor_wire import borrowing_store_buffers, tensor_from_wire, tensor_to_wire


def from_read_only_buffers(data: DataProto) -> tuple[DataProto, list[memoryview]]:
    buffers: list[pickle.PickleBuffer] = []
    stream = pickle.dumps(data, protocol=5, buffer_callback=buffers.append)
    views = [memoryview(b).toreadonly() for b in buffers]
    return pickle.loads(stream, buffers=views), views


def batch() -> DataProto:
    return DataProto.from_dict(
        {"x": torch.randn(6, 4), "half": torch.randn(6, 2).to(torch.bfloat16), "mask": torch.rand(6) > 0.5}
    )


def shares(tensor: torch.Tensor, views: list[memoryview]) -> bool:
    address = tensor.data_ptr()
    return any(np.frombuffer(v, np.uint8).ctypes.data == address for v in views)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.bool, torch.int64])
def test_a_read_only_buffer_is_copied_unless_borrowed(dtype):
    tensor = (torch.randn(5, 3) > 0).to(dtype)
    dtype_name, array = tensor_to_wire(tensor)
    array = array.copy()
    array.flags.writeable = False
    copied, borrowed = tensor_from_wire(dtype_name, array)
    assert not borrowed and torch.equal(copied, tensor) and copied.data_ptr() != array.ctypes.data
    with borrowing_store_buffers():
        with borrowing_store_buffers():
            pass  # a nested block must not end the outer one
        view, borrowed = tensor_from_wire(dtype_name, array)
    assert borrowed and torch.equal(view, tensor) and view.data_ptr() == array.ctypes.data
    again, borrowed = tensor_from_wire(dtype_name, array)
    assert not borrowed and again.data_ptr() != array.ctypes.data


def test_unpickled_dataproto_owns_its_tensors_by_default():
    data = batch()
    restored, views = from_read_only_buffers(data)
    assert not any(shares(t, views) for t in restored.batch.values())
    assert restored.owned() is restored
    restored.batch["x"].add_(1.0)  # writes its own memory, not the "store"
    assert torch.equal(from_read_only_buffers(data)[0].batch["x"], data.batch["x"])


def test_borrowed_dataproto_views_the_buffers_until_owned():
    data = batch()
    with borrowing_store_buffers():
        restored, views = from_read_only_buffers(data)
    assert all(shares(t, views) for t in restored.batch.values())
    owned = restored.owned()
    assert owned is not restored and owned.owned() is owned
    assert not any(shares(t, views) for t in owned.batch.values())
    for key, value in data.batch.items():
        assert owned.batch[key].dtype == value.dtype and torch.equal(owned.batch[key], value)
    merged = DataProto.concat([restored, restored])  # a merge copies out of the buffers too
    assert not any(shares(t, views) for t in merged.batch.values()) and merged.owned() is merged
