"""DataProto: the batch container that crosses every Ray boundary.

A ``DataProto`` holds three parts that always share one first dimension:

* ``batch``: a dict of tensors (``input_ids``, ``attention_mask`` ...);
* ``non_tensor_batch``: a dict of numpy object arrays (``uid``, ``ground_truth`` ...);
* ``meta_info``: a plain dict that travels with the batch (temperature, counts ...).

Pickling turns tensors into numpy views so that Ray's pickle-5 out-of-band
buffers carry them without an extra copy (``rlflow.utils.tensor_wire``). Unpickled
from Ray's object store, tensors are copied into memory of their own, unless the
unpickling runs inside ``borrowing_store_buffers()`` (then ``owned()`` copies them).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar, Iterator, Sequence

import numpy as np
import torch

from rlflow.utils.device import host_to_device
from rlflow.utils.host_memory import cat_host, copy_to_host
from rlflow.utils.safe_io import UnsafeContentError, decode_values, encode_values, load_weights_only, save_atomic
from rlflow.utils.tensor_wire import tensor_from_wire, tensor_to_wire

__all__ = ["DataProto", "DataProtoError", "DataProtoFuture"]


_DISK_FORMAT = "rlflow.DataProto/2"


class DataProtoError(ValueError):
    """Raised for malformed DataProto operations (lengths, keys, divisibility)."""


def _as_object_array(values: Any, key: str) -> np.ndarray:
    if isinstance(values, np.ndarray):
        if values.ndim == 0:
            raise DataProtoError(f"non-tensor '{key}' must be 1-D or more, got a 0-d array")
        return values if values.dtype == object else values.astype(object)
    if isinstance(values, (list, tuple)):
        arr = np.empty(len(values), dtype=object)
        arr[:] = list(values)
        return arr
    raise DataProtoError(f"non-tensor '{key}' must be a numpy array or list, got {type(values).__name__}")


@dataclass
class DataProto:
    """A batch of equal-length tensors, numpy object arrays and free-form metadata."""

    batch: dict[str, torch.Tensor] = field(default_factory=dict)
    non_tensor_batch: dict[str, np.ndarray] = field(default_factory=dict)
    meta_info: dict[str, Any] = field(default_factory=dict)
    _store_views: ClassVar[bool] = False  # set per instance by __setstate__ when its tensors borrow store buffers

    def __post_init__(self) -> None:
        self.batch = dict(self.batch or {})
        self.non_tensor_batch = {k: _as_object_array(v, k) for k, v in (self.non_tensor_batch or {}).items()}
        self.meta_info = dict(self.meta_info or {})
        self.check_consistency()

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_dict(
        cls,
        tensors: dict[str, torch.Tensor] | None = None,
        non_tensors: dict[str, Any] | None = None,
        meta_info: dict[str, Any] | None = None,
    ) -> "DataProto":
        """Build from dicts; every value must share the first dimension."""
        for key, value in (tensors or {}).items():
            if not isinstance(value, torch.Tensor):
                raise DataProtoError(f"tensor '{key}' must be a torch.Tensor, got {type(value).__name__}")
        return cls(batch=tensors or {}, non_tensor_batch=non_tensors or {}, meta_info=meta_info or {})

    @classmethod
    def empty_like(cls, other: "DataProto") -> "DataProto":
        """A zero-row DataProto with the same keys, dtypes and trailing shapes."""
        return other[0:0]

    def check_consistency(self) -> None:
        """Raise ``DataProtoError`` naming the key whose first dimension disagrees."""
        lengths = {}
        for key, value in self.batch.items():
            if not isinstance(value, torch.Tensor):
                raise DataProtoError(f"tensor '{key}' must be a torch.Tensor, got {type(value).__name__}")
            if value.dim() == 0:
                raise DataProtoError(f"tensor '{key}' is 0-d; every entry needs a batch dimension")
            lengths[key] = value.shape[0]
        for key, value in self.non_tensor_batch.items():
            lengths[key] = len(value)
        if len(set(lengths.values())) > 1:
            detail = ", ".join(f"{k}={n}" for k, n in lengths.items())
            raise DataProtoError(f"batch entries have mismatched lengths: {detail}")

    def __len__(self) -> int:
        for value in self.batch.values():
            return value.shape[0]
        for value in self.non_tensor_batch.values():
            return len(value)
        return 0

    def keys(self) -> list[str]:
        return list(self.batch) + list(self.non_tensor_batch)

    def __contains__(self, key: str) -> bool:
        return key in self.batch or key in self.non_tensor_batch

    # ------------------------------------------------------------------ indexing
    def __getitem__(self, item: slice | int | Sequence[int] | np.ndarray | torch.Tensor) -> "DataProto":
        """Rows by slice, integer, or index array (bool masks too). Always returns a DataProto."""
        if isinstance(item, str):
            raise DataProtoError(f"use dp.batch[{item!r}] or dp.non_tensor_batch[{item!r}] to read a column")
        if isinstance(item, int):
            item = slice(item, item + 1) if item != -1 else slice(-1, None)
        if isinstance(item, slice):
            return DataProto(
                {k: v[item] for k, v in self.batch.items()},
                {k: v[item] for k, v in self.non_tensor_batch.items()},
                dict(self.meta_info),
            )
        index = item.cpu().numpy() if isinstance(item, torch.Tensor) else np.asarray(item)
        if index.dtype == bool:
            if len(index) != len(self):
                raise DataProtoError(f"boolean mask has length {len(index)}, batch has {len(self)}")
            index = np.nonzero(index)[0]
        index = index.astype(np.int64)
        if index.size and (index.max() >= len(self) or index.min() < -len(self)):
            raise DataProtoError(f"index out of range for a batch of {len(self)}")
        t_index = torch.from_numpy(index)
        return DataProto(
            {k: v.index_select(0, t_index.to(v.device)) for k, v in self.batch.items()},
            {k: v[index] for k, v in self.non_tensor_batch.items()},
            dict(self.meta_info),
        )

    # ------------------------------------------------------------------ key operations
    def _check_keys(self, batch_keys: Sequence[str], non_tensor_keys: Sequence[str]) -> None:
        missing = [k for k in batch_keys if k not in self.batch]
        missing += [k for k in non_tensor_keys if k not in self.non_tensor_batch]
        if missing:
            raise DataProtoError(f"unknown keys {missing}; this DataProto has {self.keys()}")

    def select(
        self,
        batch_keys: Sequence[str] | None = None,
        non_tensor_batch_keys: Sequence[str] | None = None,
        meta_info_keys: Sequence[str] | None = None,
    ) -> "DataProto":
        """A new DataProto holding only the named keys (tensors are shared, not copied)."""
        batch_keys = list(self.batch) if batch_keys is None else list(batch_keys)
        non_tensor_keys = list(self.non_tensor_batch) if non_tensor_batch_keys is None else list(non_tensor_batch_keys)
        self._check_keys(batch_keys, non_tensor_keys)
        meta = self.meta_info if meta_info_keys is None else {k: self.meta_info[k] for k in meta_info_keys}
        return DataProto(
            {k: self.batch[k] for k in batch_keys},
            {k: self.non_tensor_batch[k] for k in non_tensor_keys},
            dict(meta),
        )

    def pop(
        self,
        batch_keys: Sequence[str] = (),
        non_tensor_batch_keys: Sequence[str] = (),
        meta_info_keys: Sequence[str] = (),
    ) -> "DataProto":
        """Remove the named keys from this DataProto and return them as a new one."""
        self._check_keys(batch_keys, non_tensor_batch_keys)
        missing_meta = [k for k in meta_info_keys if k not in self.meta_info]
        if missing_meta:
            raise DataProtoError(f"unknown meta_info keys {missing_meta}")
        return DataProto(
            {k: self.batch.pop(k) for k in batch_keys},
            {k: self.non_tensor_batch.pop(k) for k in non_tensor_batch_keys},
            {k: self.meta_info.pop(k) for k in meta_info_keys},
        )

    def rename(self, old_keys: Sequence[str], new_keys: Sequence[str]) -> "DataProto":
        """Rename tensor keys in place; returns self."""
        if len(old_keys) != len(new_keys):
            raise DataProtoError("rename needs as many new keys as old keys")
        self._check_keys(old_keys, ())
        for old, new in zip(old_keys, new_keys):
            self.batch[new] = self.batch.pop(old)
        return self

    def union(self, other: "DataProto") -> "DataProto":
        """Merge ``other`` into self in place. Shared keys must hold equal values."""
        if len(self.keys()) and len(other.keys()) and len(self) != len(other):
            raise DataProtoError(f"cannot union batches of length {len(self)} and {len(other)}")
        for key, value in other.batch.items():
            if key in self.batch and not (
                self.batch[key].shape == value.shape and torch.equal(self.batch[key], value)
            ):
                raise DataProtoError(f"union conflict on tensor '{key}': both sides hold different values")
            self.batch[key] = value
        for key, value in other.non_tensor_batch.items():
            if key in self.non_tensor_batch and not _object_arrays_equal(self.non_tensor_batch[key], value):
                raise DataProtoError(f"union conflict on non-tensor '{key}': both sides hold different values")
            self.non_tensor_batch[key] = value
        for key, value in other.meta_info.items():
            if key in self.meta_info and not _meta_equal(self.meta_info[key], value):
                raise DataProtoError(f"union conflict on meta_info '{key}': {self.meta_info[key]!r} != {value!r}")
            self.meta_info[key] = value
        return self

    # ------------------------------------------------------------------ splitting and joining
    def chunk(self, chunks: int) -> list["DataProto"]:
        """Split into ``chunks`` equal parts; the length must divide evenly."""
        if chunks <= 0:
            raise DataProtoError(f"chunk count must be positive, got {chunks}")
        if len(self) % chunks != 0:
            raise DataProtoError(
                f"cannot chunk a batch of {len(self)} into {chunks} equal parts; pad it first with pad_to_divisor"
            )
        return self.split(len(self) // chunks) if len(self) else [self[0:0] for _ in range(chunks)]

    def split(self, split_size: int) -> list["DataProto"]:
        """Consecutive pieces of ``split_size`` rows (the last may be shorter)."""
        if split_size <= 0:
            raise DataProtoError(f"split size must be positive, got {split_size}")
        return [self[start : start + split_size] for start in range(0, len(self), split_size)]

    @staticmethod
    def concat(data: Sequence["DataProto"]) -> "DataProto":
        """Join along the batch dimension. Keys must agree; meta_info is taken from the first part."""
        if not data:
            raise DataProtoError("concat needs at least one DataProto")
        first = data[0]
        for part in data[1:]:
            if set(part.batch) != set(first.batch) or set(part.non_tensor_batch) != set(first.non_tensor_batch):
                raise DataProtoError(f"concat of DataProtos with different keys: {first.keys()} vs {part.keys()}")
        batch = {k: cat_host([p.batch[k] for p in data], dim=0) for k in first.batch}
        non_tensor = {k: np.concatenate([p.non_tensor_batch[k] for p in data], axis=0) for k in first.non_tensor_batch}
        return DataProto(batch, non_tensor, dict(first.meta_info))

    def repeat(self, repeat_times: int, interleave: bool = True) -> "DataProto":
        """Repeat each row. ``interleave=True`` keeps copies adjacent: a a b b; else a b a b."""
        if repeat_times < 1:
            raise DataProtoError(f"repeat_times must be >= 1, got {repeat_times}")
        if interleave:
            batch = {k: v.repeat_interleave(repeat_times, dim=0) for k, v in self.batch.items()}
            non_tensor = {k: np.repeat(v, repeat_times, axis=0) for k, v in self.non_tensor_batch.items()}
        else:
            batch = {k: v.repeat(repeat_times, *([1] * (v.dim() - 1))) for k, v in self.batch.items()}
            non_tensor = {
                k: np.tile(v, (repeat_times,) + (1,) * (v.ndim - 1)) for k, v in self.non_tensor_batch.items()
            }
        return DataProto(batch, non_tensor, dict(self.meta_info))

    def pad_to_divisor(self, divisor: int) -> tuple["DataProto", int]:
        """Pad by repeating rows from the start until the length divides ``divisor``. Returns (padded, pad_size)."""
        if divisor <= 0:
            raise DataProtoError(f"divisor must be positive, got {divisor}")
        if len(self) == 0:
            return self, 0
        pad_size = (-len(self)) % divisor
        if pad_size == 0:
            return self, 0
        index = np.arange(pad_size) % len(self)
        return DataProto.concat([self, self[index]]), pad_size

    def unpad(self, pad_size: int) -> "DataProto":
        """Drop the last ``pad_size`` rows added by ``pad_to_divisor``."""
        if pad_size < 0 or pad_size > len(self):
            raise DataProtoError(f"cannot unpad {pad_size} rows from a batch of {len(self)}")
        return self if pad_size == 0 else self[: len(self) - pad_size]

    def make_iterator(
        self, mini_batch_size: int, epochs: int = 1, shuffle: bool = False, seed: int | None = None
    ) -> Iterator["DataProto"]:
        """Yield mini-batches over ``epochs`` passes; shuffled per epoch with a seeded generator."""
        if mini_batch_size <= 0 or len(self) % mini_batch_size != 0:
            raise DataProtoError(
                f"mini_batch_size {mini_batch_size} must be positive and divide the batch of {len(self)}"
            )
        generator = torch.Generator().manual_seed(0 if seed is None else seed)
        for _ in range(epochs):
            order = torch.randperm(len(self), generator=generator) if shuffle else torch.arange(len(self))
            shuffled = self[order]
            yield from shuffled.split(mini_batch_size)

    def to(self, device: torch.device | str) -> "DataProto":
        """Move tensors to ``device`` in place; returns self. Host to accelerator copies do not block the
        host (``utils.device.host_to_device``)."""
        self.batch = {k: host_to_device(v, device) for k, v in self.batch.items()}
        return self

    def copy(self) -> "DataProto":
        """A deep copy (tensors cloned)."""
        return DataProto(
            {k: v.clone() for k, v in self.batch.items()},
            {k: v.copy() for k, v in self.non_tensor_batch.items()},
            copy.deepcopy(self.meta_info),
        )

    # ------------------------------------------------------------------ serialization
    def owned(self) -> "DataProto":
        """This batch with tensors in memory of its own: a copy if they view Ray's object store
        (unpickled inside ``borrowing_store_buffers``), else ``self``."""
        if not self._store_views:
            return self
        return DataProto({k: copy_to_host(v) for k, v in self.batch.items()}, self.non_tensor_batch, self.meta_info)

    def __getstate__(self) -> dict[str, Any]:
        return {
            "batch": {k: tensor_to_wire(v) for k, v in self.batch.items()},
            "non_tensor_batch": self.non_tensor_batch,
            "meta_info": self.meta_info,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.batch, self._store_views = {}, False
        for key, wire in state["batch"].items():
            self.batch[key], borrowed = tensor_from_wire(*wire)
            self._store_views |= borrowed
        self.non_tensor_batch = state["non_tensor_batch"]
        self.meta_info = state["meta_info"]

    def save_to_disk(self, path: str | Path) -> None:
        """Write atomically to ``path`` in a format that loads without unpickling (``rlflow.utils.safe_io``).

        Tensors and columns/meta of plain values (str, numbers, None, lists/dicts of them) need no
        pickle; any other python object is stored pickled and ``load_from_disk`` asks for an opt-in.
        """
        save_atomic({"format": _DISK_FORMAT, "batch": {k: v.detach().cpu().clone() for k, v in self.batch.items()},
                     "non_tensor_batch": {k: encode_values(v) for k, v in self.non_tensor_batch.items()},
                     "meta_info": {k: encode_values(v) for k, v in self.meta_info.items()}}, path)

    @staticmethod
    def load_from_disk(path: str | Path, allow_pickle: bool = False) -> "DataProto":
        """Read a DataProto written by ``save_to_disk``; ``allow_pickle=True`` also restores pickled objects."""
        state = load_weights_only(path, DataProtoError)
        if not isinstance(state, dict) or state.get("format") != _DISK_FORMAT:
            raise DataProtoError(f"{path} does not hold a DataProto saved by save_to_disk ({_DISK_FORMAT})")
        try:
            return DataProto(
                state["batch"],
                {k: decode_values(v, f"{path}: non-tensor column {k!r}", allow_pickle)
                 for k, v in state["non_tensor_batch"].items()},
                {k: decode_values(v, f"{path}: meta_info key {k!r}", allow_pickle) for k, v in state["meta_info"].items()},
            )
        except UnsafeContentError as err:
            raise DataProtoError(str(err)) from None

    def __repr__(self) -> str:
        tensors = ", ".join(f"{k}: {tuple(v.shape)} {str(v.dtype).replace('torch.', '')}" for k, v in self.batch.items())
        others = ", ".join(self.non_tensor_batch)
        return f"DataProto(len={len(self)}, batch={{{tensors}}}, non_tensor=[{others}], meta={list(self.meta_info)})"


def _object_arrays_equal(a: np.ndarray, b: np.ndarray) -> bool:
    if a.shape != b.shape:
        return False
    return all(_meta_equal(x, y) for x, y in zip(a.ravel().tolist(), b.ravel().tolist()))


def _meta_equal(a: Any, b: Any) -> bool:
    try:
        result = a == b
        return bool(np.all(result)) if isinstance(result, np.ndarray) else bool(result)
    except (ValueError, RuntimeError):
        return a is b


class DataProtoFuture:
    """A DataProto still being computed by workers: Ray refs plus the function that collects them.

    ``get()`` waits for the refs and applies ``collect_fn`` (concat, unpad ...).
    """

    def __init__(self, refs: list[Any], collect_fn: Callable[[list[Any]], Any], getter: Callable[[list[Any]], list[Any]]):
        self.refs = refs
        self._collect_fn = collect_fn
        self._getter = getter

    def get(self) -> Any:
        return self._collect_fn(self._getter(self.refs))
