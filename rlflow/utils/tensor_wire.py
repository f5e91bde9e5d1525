"""How a CPU tensor crosses a Ray boundary inside a pickled ``DataProto``.

Out: a zero-copy numpy view, so that Ray's pickle-5 out-of-band buffers carry the bytes without an
extra copy (bf16 and fp16 travel as int16 bits, bool as uint8).

In: Ray hands back read-only numpy views on its object store. That memory is shared and in fact
writable: a write through a tensor on it changes the stored object for every process that reads
it (measured with Ray 2.60). So by default a tensor is copied out into memory of its own
(``host_memory.empty_host``).

Inside ``borrowing_store_buffers()``, the copy is skipped and the tensor views the store
("borrowed"). The driver fetches its workers' outputs this way because it merges them into new
tensors anyway. Whoever borrows must copy what it keeps (``DataProto.owned``).
"""

from __future__ import annotations

import threading
import warnings
from contextlib import contextmanager
from typing import Iterator

import numpy as np
import torch

from rlflow.utils.host_memory import empty_host

__all__ = ["borrowing_store_buffers", "tensor_from_wire", "tensor_to_wire"]

_BITS_DTYPES = {torch.bfloat16: torch.int16, torch.float16: torch.int16, torch.bool: torch.uint8}

_state = threading.local()


@contextmanager
def borrowing_store_buffers() -> Iterator[None]:
    """Unpickle tensors in this thread as views on Ray's read-only buffers instead of copies."""
    outer = getattr(_state, "borrowing", False)
    _state.borrowing = True
    try:
        yield
    finally:
        _state.borrowing = outer


def tensor_to_wire(tensor: torch.Tensor) -> tuple[str, np.ndarray]:
    """``(dtype name, zero-copy numpy view)`` of a tensor (moved to the CPU and made contiguous first if needed)."""
    tensor = tensor.detach()
    if tensor.device.type != "cpu":
        tensor = tensor.cpu()
    tensor = tensor.contiguous()
    bits = _BITS_DTYPES.get(tensor.dtype)
    return str(tensor.dtype), (tensor if bits is None else tensor.view(bits)).numpy()


def tensor_from_wire(dtype_name: str, array: np.ndarray) -> tuple[torch.Tensor, bool]:
    """The tensor again, and whether it borrows a read-only buffer (only inside ``borrowing_store_buffers``)."""
    dtype = getattr(torch, dtype_name.replace("torch.", ""))
    wire_dtype = _BITS_DTYPES.get(dtype, dtype)
    borrowed = not array.flags.writeable and getattr(_state, "borrowing", False)
    if borrowed:
        with warnings.catch_warnings():  # torch warns that it has no read-only tensors: the borrower copies
            warnings.simplefilter("ignore", UserWarning)
            tensor = torch.from_numpy(array)
    elif not array.flags.writeable:
        tensor = empty_host(array.shape, wire_dtype)
        np.copyto(tensor.numpy(), array)
    else:
        tensor = torch.from_numpy(array)
    return (tensor.view(dtype) if dtype in _BITS_DTYPES else tensor), borrowed
