"""Weight sync from the trainer to rollout engines: bucketing, name checks, and the Ray object-store path.

Every path moves HF-named full tensors (``BaseEngine.export_hf_weights()``) a bucket at a time:

* **colocated** (actor and rollout in one process): ``rollout.update_weights(engine.export_hf_weights())``;
  the backend streams ``iter_buckets`` of the iterator into the engine.
* **split** (a separate rollout worker group): every actor rank runs ``publish_weights`` over its
  export (the export is collective, so all ranks iterate); the publishing rank puts each bucket
  into the Ray object store as one packed byte buffer and returns the refs. The controller hands
  the refs to every rollout worker, which reads them back one bucket at a time with
  ``stream_published_weights``. The object store holds one copy per node, shared by all replicas.

``CheckedWeightStream`` wraps any of these and refuses unknown, duplicated or missing names.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, Optional

import numpy as np
import torch

NamedTensors = Iterable[tuple[str, torch.Tensor]]
MiB = 1 << 20


class WeightSyncError(RuntimeError):
    """The weights handed to a rollout engine do not match its model (unknown, duplicated or missing names)."""


def tensor_nbytes(tensor: torch.Tensor) -> int:
    """Bytes a tensor's elements take."""
    return tensor.numel() * tensor.element_size()


def iter_buckets(named_tensors: NamedTensors, bucket_mb: float) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Group ``(name, tensor)`` pairs, in order, into buckets of at most ``bucket_mb`` MiB.

    A tensor larger than the bound gets a bucket of its own. This is the one bucketing rule
    every sync path uses.
    """
    if bucket_mb <= 0:
        raise ValueError(f"rollout.weight_sync_bucket_mb must be positive, got {bucket_mb}")
    limit = int(bucket_mb * MiB)
    bucket: list[tuple[str, torch.Tensor]] = []
    size = 0
    for name, tensor in named_tensors:
        nbytes = tensor_nbytes(tensor)
        if bucket and size + nbytes > limit:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, tensor))
        size += nbytes
    if bucket:
        yield bucket


def checkpoint_weight_names(model_path: str | Path) -> Optional[frozenset[str]]:
    """The tensor names stored in an HF folder's safetensors files (None if it has none)."""
    folder = Path(model_path)
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        return frozenset(json.loads(index.read_text())["weight_map"])
    single = folder / "model.safetensors"
    if not single.is_file():
        return None
    from safetensors import safe_open

    with safe_open(str(single), framework="pt") as handle:
        return frozenset(handle.keys())


class CheckedWeightStream:
    """Passes ``(name, tensor)`` pairs through, checking each name against the model's names.

    An unknown or repeated name raises at once; ``finish()`` raises if any expected name never
    came. ``expected=None`` checks only for repeats. ``bytes_seen`` counts what went through.
    """

    def __init__(self, named_tensors: NamedTensors, expected: Optional[frozenset[str]]):
        self._source = named_tensors
        self._expected = expected
        self.seen: set[str] = set()
        self.bytes_seen = 0

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        for name, tensor in self._source:
            if self._expected is not None and name not in self._expected:
                raise WeightSyncError(f"weight sync sent {name!r}, which the rollout model does not have")
            if name in self.seen:
                raise WeightSyncError(f"weight sync sent {name!r} twice")
            self.seen.add(name)
            self.bytes_seen += tensor_nbytes(tensor)
            yield name, tensor

    def finish(self) -> None:
        """Raise ``WeightSyncError`` if some expected weights were never sent."""
        missing = sorted((self._expected or frozenset()) - self.seen)
        if missing:
            raise WeightSyncError(
                f"weight sync left {len(missing)} tensors of the rollout model stale, e.g. {missing[:5]}; "
                "the exporter must send every weight"
            )


# ---------------------------------------------------------------------- Ray object store path
@dataclass(frozen=True)
class PackedBucket:
    """One bucket as a single byte buffer (Ray ships it out-of-band) plus each tensor's place in it."""

    buffer: np.ndarray  # uint8
    entries: tuple[tuple[str, str, tuple[int, ...], int, int], ...]  # name, dtype, shape, offset, nbytes


_ALIGN = 16  # every tensor starts at a multiple of this, so byte views can be re-typed to any dtype


def _aligned(offset: int) -> int:
    return -(-offset // _ALIGN) * _ALIGN


def pack_bucket(bucket: list[tuple[str, torch.Tensor]]) -> PackedBucket:
    """Copy a bucket's tensors (any device, any dtype) into one CPU byte buffer."""
    offsets, end = [], 0
    for _, tensor in bucket:
        offsets.append(_aligned(end))
        end = offsets[-1] + tensor_nbytes(tensor)
    buffer = torch.empty(end, dtype=torch.uint8)
    entries = []
    for (name, tensor), offset in zip(bucket, offsets):
        nbytes = tensor_nbytes(tensor)
        flat = tensor.detach().contiguous().reshape(-1).view(torch.uint8)
        buffer[offset : offset + nbytes].copy_(flat)
        entries.append((name, str(tensor.dtype).removeprefix("torch."), tuple(tensor.shape), offset, nbytes))
    return PackedBucket(buffer.numpy(), tuple(entries))


def unpack_bucket(packed: PackedBucket) -> list[tuple[str, torch.Tensor]]:
    """The bucket's ``(name, tensor)`` pairs as CPU tensors (one copy out of the read-only store buffer)."""
    buffer = torch.from_numpy(np.array(packed.buffer, copy=True))
    return [
        (name, buffer[offset : offset + nbytes].view(getattr(torch, dtype)).reshape(shape))
        for name, dtype, shape, offset, nbytes in packed.entries
    ]


def publish_weights(named_tensors: NamedTensors, bucket_mb: float, publish: bool = True) -> list:
    """Put each bucket of ``named_tensors`` into the Ray object store; returns the ObjectRefs in order.

    Every rank of a sharded exporter calls this (the export is a collective); only the rank with
    ``publish=True`` stores buckets, the others just drain the iterator and return [].
    """
    import ray

    refs = []
    for bucket in iter_buckets(named_tensors, bucket_mb):
        if publish:
            refs.append(ray.put(pack_bucket(bucket)))
    return refs


def stream_published_weights(refs: list) -> Iterator[tuple[str, torch.Tensor]]:
    """Read published buckets back one at a time (at most one bucket in this process's memory)."""
    import ray

    for ref in refs:
        yield from unpack_bucket(ray.get(ref))
