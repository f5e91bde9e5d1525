"""Dispatch modes: how one controller call becomes per-rank calls, and how their outputs come back.

A mode is a ``DispatchMode`` subclass with two static methods, registered by name:

* ``dispatch(ctx, args, kwargs) -> {rank: (args, kwargs)}``: the calls to make; ranks left out
  are not called;
* ``collect(ctx, outputs) -> result``: ``outputs`` maps each called rank to what it returned.

``ctx`` (a ``DispatchContext``) carries the method name, the group size, the method's mesh (loaded
on first use) and a ``state`` dict that dispatch can fill for collect (``DP_COMPUTE`` stores
its padding there). Add a mode with ``@DISPATCH_MODE_REGISTRY.register("name")`` on its class.

DataProtos in ``outputs`` view Ray's object store (fetched without a copy). The worker group
copies any DataProto the collect returns that still views it (``DataProto.owned``), so a
collect may return them as they are or build new ones. A bare tensor taken out of one must be
cloned.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Mapping

import numpy as np

from rlflow.meta_info import METRICS
from rlflow.protocol import DataProto, DataProtoError
from rlflow.utils.registry import Registry
from rlflow.workers.mesh import MeshTable
from rlflow.workers.metrics import DEFAULT_REDUCTION, ReduceSpec, reduce_metrics

ONE_TO_ALL = "one_to_all"
ALL_TO_ALL = "all_to_all"
RANK_ZERO = "rank_zero"
DP_COMPUTE = "dp_compute"

RankCalls = dict[int, tuple[tuple, dict]]


@dataclass
class DispatchContext:
    """Everything a dispatch/collect pair may use for one call."""

    method: str
    world_size: int
    mesh_name: str | None = None
    reduce: ReduceSpec = DEFAULT_REDUCTION
    mesh_loader: Callable[[str | None], MeshTable] | None = None
    state: dict[str, Any] = field(default_factory=dict)
    _mesh: MeshTable | None = field(default=None, repr=False)

    @property
    def mesh(self) -> MeshTable:
        """The method's mesh table (the plain data-parallel one when the method names no mesh)."""
        if self._mesh is None:
            if self.mesh_loader is None or self.mesh_name is None:
                self._mesh = MeshTable.data_parallel(self.world_size)
            else:
                self._mesh = self.mesh_loader(self.mesh_name)
        return self._mesh


class DispatchMode:
    """How one controller call fans out to ranks and how their outputs come back; never instantiated.

    A subclass defines both static methods and is registered under the name that
    ``@register(dispatch_mode=...)`` uses; the registry sets its ``name``.
    """

    name: ClassVar[str] = ""

    @staticmethod
    def dispatch(ctx: DispatchContext, args: tuple, kwargs: dict) -> RankCalls:
        """The calls to make, ``{rank: (args, kwargs)}``; ranks left out are not called."""
        raise NotImplementedError

    @staticmethod
    def collect(ctx: DispatchContext, outputs: Mapping[int, Any]) -> Any:
        """The call's result from ``outputs``, ``{called rank: what it returned}``."""
        raise NotImplementedError


DISPATCH_MODE_REGISTRY: Registry[type[DispatchMode]] = Registry(
    "dispatch mode", base=DispatchMode, name_attribute="name",
    hint='add one with @DISPATCH_MODE_REGISTRY.register("name") on a DispatchMode subclass',
)


def get_dispatch_mode(name: str) -> type[DispatchMode]:
    """The registered mode called ``name``; the error lists the known ones."""
    return DISPATCH_MODE_REGISTRY.get(name)


def dispatch_mode_names() -> list[str]:
    """Names of every registered dispatch mode."""
    return DISPATCH_MODE_REGISTRY.names()


# ---------------------------------------------------------------- built-in modes
def _in_rank_order(ctx: DispatchContext, outputs: Mapping[int, Any]) -> list[Any]:
    return [outputs[rank] for rank in sorted(outputs)]


@DISPATCH_MODE_REGISTRY.register(ONE_TO_ALL)
class OneToAll(DispatchMode):
    """Every rank gets the call's arguments; the outputs come back as a list in rank order."""

    @staticmethod
    def dispatch(ctx: DispatchContext, args: tuple, kwargs: dict) -> RankCalls:
        return {rank: (args, kwargs) for rank in range(ctx.world_size)}

    collect = staticmethod(_in_rank_order)


@DISPATCH_MODE_REGISTRY.register(ALL_TO_ALL)
class AllToAll(DispatchMode):
    """Every argument is a list with one entry per rank and rank ``r`` gets entry ``r``; outputs in rank order."""

    @staticmethod
    def dispatch(ctx: DispatchContext, args: tuple, kwargs: dict) -> RankCalls:
        named = [(f"argument {i}", value) for i, value in enumerate(args)] + [(f"'{k}'", v) for k, v in kwargs.items()]
        for label, value in named:
            if not isinstance(value, (list, tuple)) or len(value) != ctx.world_size:
                raise ValueError(
                    f"{ctx.method} ({ALL_TO_ALL}): {label} must be a list with one entry per rank "
                    f"({ctx.world_size}), got {type(value).__name__}"
                    + (f" of length {len(value)}" if isinstance(value, (list, tuple)) else "")
                )
        return {
            rank: (tuple(a[rank] for a in args), {k: v[rank] for k, v in kwargs.items()}) for rank in range(ctx.world_size)
        }

    collect = staticmethod(_in_rank_order)


@DISPATCH_MODE_REGISTRY.register(RANK_ZERO)
class RankZero(DispatchMode):
    """Only rank 0 is called; its output is the result."""

    @staticmethod
    def dispatch(ctx: DispatchContext, args: tuple, kwargs: dict) -> RankCalls:
        return {0: (args, kwargs)}

    @staticmethod
    def collect(ctx: DispatchContext, outputs: Mapping[int, Any]) -> Any:
        return outputs[0]


def padded_chunks(data: DataProto, parts: int) -> tuple[list[DataProto], int]:
    """``data.pad_to_divisor(parts)`` cut into ``parts`` equal chunks, and the pad size, without
    copying the whole batch: a chunk inside ``data`` is a view, and only a chunk that reaches into
    the padding (rows repeated from the start) is copied."""
    rows = len(data)
    chunk_len = -(-rows // parts)
    pad_size = chunk_len * parts - rows
    if not pad_size:
        return data.chunk(parts), 0
    chunks = []
    for start in range(0, chunk_len * parts, chunk_len):
        end = start + chunk_len
        padding = np.arange(max(start, rows), end) % rows
        chunks.append(data[start:end] if end <= rows else DataProto.concat([data[start:rows], data[padding]]))
    return chunks, pad_size


def merge_dp_outputs(ctx: DispatchContext, parts: list[Any]) -> Any:
    """Merge the collect ranks' outputs (dp order): DataProtos concat+unpad, dicts reduce, tuples per item."""
    first = parts[0]
    if all(p is None for p in parts):
        return None
    if all(isinstance(p, DataProto) for p in parts):
        return _merge_dataprotos(ctx, parts)
    if all(isinstance(p, dict) for p in parts):
        return reduce_metrics(parts, ctx.reduce)
    if all(isinstance(p, tuple) and len(p) == len(first) for p in parts):
        return tuple(merge_dp_outputs(ctx, list(items)) for items in zip(*parts))
    return parts


def _merge_dataprotos(ctx: DispatchContext, parts: list[DataProto]) -> DataProto:
    merged = DataProto.concat(parts)
    pad_size = ctx.state.get("pad_size", 0)
    if pad_size:
        chunk_len = ctx.state["chunk_len"]
        lengths = {len(p) for p in parts}
        rows_per_input = next(iter(lengths)) // chunk_len
        if len(lengths) != 1 or rows_per_input * chunk_len != next(iter(lengths)):
            raise DataProtoError(
                f"{ctx.method} ({DP_COMPUTE}): ranks returned {sorted(len(p) for p in parts)} rows for input chunks "
                f"of {chunk_len}; with padding, each rank must return k rows per input row, in input order"
            )
        merged = merged.unpad(pad_size * rows_per_input)
    metrics = [p.meta_info[METRICS.name] for p in parts if isinstance(p.meta_info.get(METRICS.name), dict)]
    if metrics:
        merged.meta_info[METRICS.name] = reduce_metrics(metrics, ctx.reduce)
    return merged


@DISPATCH_MODE_REGISTRY.register(DP_COMPUTE)
class DPCompute(DispatchMode):
    """Data-parallel compute over the method's mesh: DataProto arguments are split by DP rank, and the outputs
    of the mesh's collect ranks are merged back (``merge_dp_outputs``)."""

    @staticmethod
    def dispatch(ctx: DispatchContext, args: tuple, kwargs: dict) -> RankCalls:
        """Pad every DataProto argument to a multiple of dp_size, chunk it, hand chunk d to DP group d."""
        mesh = ctx.mesh
        lengths = {len(v) for v in list(args) + list(kwargs.values()) if isinstance(v, DataProto)}
        if len(lengths) > 1:
            raise DataProtoError(f"{ctx.method} ({DP_COMPUTE}): DataProto arguments differ in length: {sorted(lengths)}")

        def shards(value: Any) -> list[Any]:
            if not isinstance(value, DataProto):
                return [value] * mesh.dp_size
            chunks, pad_size = padded_chunks(value, mesh.dp_size)
            ctx.state["pad_size"] = pad_size
            ctx.state["chunk_len"] = len(chunks[0])
            return chunks

        arg_shards = [shards(v) for v in args]
        kwarg_shards = {k: shards(v) for k, v in kwargs.items()}
        calls = {}
        for rank in range(ctx.world_size):
            dp = mesh.dp_rank_of[rank]
            calls[rank] = (tuple(s[dp] for s in arg_shards), {k: s[dp] for k, s in kwarg_shards.items()})
        return calls

    @staticmethod
    def collect(ctx: DispatchContext, outputs: Mapping[int, Any]) -> Any:
        return merge_dp_outputs(ctx, [outputs[rank] for rank in ctx.mesh.collect_ranks])
