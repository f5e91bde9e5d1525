"""Weight sync from the trainer to rollout engines: bucketing, name checks, and the Ray object-store path.

Every path moves HF-named full tensors (``BaseEngine.export_hf_weights()``):

* **colocated** (actor and rollout in one process): ``rollout.update_weights(engine.export_hf_weights())``;
  the backend streams the iterator into the engine as it is on CPU, and moves it to a GPU in
  ``iter_buckets`` of ``rollout.weight_sync_bucket_mb``.
* **split** (a separate rollout worker group): every actor rank runs ``publish_weights`` over its
  export (the export is collective, so all ranks iterate); the publishing rank puts each bucket
  into the Ray object store (``ray.put`` copies each tensor's bytes straight in, no packing copy
  before it) and returns the refs. The controller hands the refs to every rollout worker, which
  reads them back with ``stream_published_weights`` as read-only views of the store's buffers
  (the engine's loader makes the one copy); bucket k+1 is fetched on a background thread while
  the engine loads bucket k (``prefetched``; at most two buckets held).
  The object store holds one copy per node, shared by all replicas.

``CheckedWeightStream`` wraps any of these and refuses unknown, duplicated or missing names.
"""

from __future__ import annotations

import warnings
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Optional, Sequence, TypeVar

import numpy as np
import torch

from rlflow.models.hf_checkpoint import safetensors_weight_map

NamedTensors = Iterable[tuple[str, torch.Tensor]]
MiB = 1 << 20
T = TypeVar("T")
U = TypeVar("U")
_END = object()  # marks the end of the items in prefetched


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
        return frozenset(safetensors_weight_map(index))
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
    """One bucket as byte arrays (Ray ships each out-of-band, straight into the object store) plus
    each tensor's name, dtype and shape."""

    arrays: tuple[np.ndarray, ...]  # uint8, one per tensor
    entries: tuple[tuple[str, str, tuple[int, ...]], ...]  # name, dtype, shape


def _byte_array(tensor: torch.Tensor) -> np.ndarray:
    """A CPU uint8 view of ``tensor``'s elements: copied only to leave a device or a strided layout."""
    return tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy()


def pack_bucket(bucket: list[tuple[str, torch.Tensor]]) -> PackedBucket:
    """A bucket's tensors (any device, any dtype) as byte views; ``ray.put`` makes the one copy."""
    arrays = tuple(_byte_array(tensor) for _, tensor in bucket)
    entries = tuple((name, str(t.dtype).removeprefix("torch."), tuple(t.shape)) for name, t in bucket)
    return PackedBucket(arrays, entries)


def unpack_bucket(packed: PackedBucket) -> list[tuple[str, torch.Tensor]]:
    """The bucket's ``(name, tensor)`` pairs as read-only views of its arrays, uncopied.

    Read back from the object store the arrays are the store's shared, read-only buffer: the
    engine's loader makes the one copy into its own parameters (``BaseRollout._load_weights``
    reads what it is given and never writes into it), and the views keep the buffer alive.
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return [
            (name, torch.from_numpy(array).view(getattr(torch, dtype)).reshape(shape))
            for array, (name, dtype, shape) in zip(packed.arrays, packed.entries)
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


def prefetched(items: Sequence[T], fetch: Callable[[T], list[U]], depth: int = 1) -> Iterator[U]:
    """Yield the elements of ``fetch(item)`` for each item in order, fetching up to ``depth`` items
    ahead on a background thread while the caller consumes the current one.

    At most ``depth + 1`` fetched items exist at once (the one being consumed and those ahead).
    """
    if depth < 0:
        raise ValueError(f"prefetch depth must be >= 0, got {depth}")
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="weight-prefetch") as pool:
        pending = iter(items)
        ahead: deque[Future] = deque(pool.submit(fetch, item) for item in islice(pending, depth))
        while True:
            if not ahead:
                item = next(pending, _END)
                if item is _END:
                    return
                ahead.append(pool.submit(fetch, item))
            current = ahead.popleft().result()
            if depth:
                ahead.extend(pool.submit(fetch, item) for item in islice(pending, 1))
            yield from current
            del current


def _fetch_bucket(ref: Any) -> list[tuple[str, torch.Tensor]]:
    import ray

    return unpack_bucket(ray.get(ref))


def stream_published_weights(refs: list, prefetch: int = 1) -> Iterator[tuple[str, torch.Tensor]]:
    """Read published buckets back in order, as read-only tensors: the next ``prefetch`` buckets
    are fetched on a background thread while the engine loads the current one (at most
    ``prefetch + 1`` buckets held by this process)."""
    return prefetched(refs, _fetch_bucket, prefetch)
