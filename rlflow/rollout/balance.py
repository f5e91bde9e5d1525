"""Token-balanced dispatch of prompts over rollout replicas.

Plain ``DP_COMPUTE`` gives replica ``d`` the ``d``-th consecutive chunk, so one replica can get
all the long prompts. ``DP_BALANCED_TOKENS`` is the same mesh dispatch with a reordering: it
partitions the (padded) rows into ``dp_size`` equal-count parts with near-equal prompt-token
sums, sends part ``d`` to DP rank ``d``, and on collect puts every output row back in input
order. A method returning ``k`` rows per input row (``n`` samples) keeps them adjacent.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from rlflow.meta_info import METRICS
from rlflow.protocol import DataProto, DataProtoError
from rlflow.utils.partition import balanced_partition
from rlflow.workers import DISPATCH_MODE_REGISTRY, DispatchContext, DispatchMode, reduce_metrics
from rlflow.workers.dispatch import RankCalls

DP_BALANCED_TOKENS = "dp_balanced_tokens"


def _the_dataproto(ctx: DispatchContext, args: tuple, kwargs: dict) -> DataProto:
    found = [v for v in (*args, *kwargs.values()) if isinstance(v, DataProto)]
    if len(found) != 1:
        raise DataProtoError(
            f"{ctx.method} ({DP_BALANCED_TOKENS}) takes exactly one DataProto argument, got {len(found)}"
        )
    return found[0]


@DISPATCH_MODE_REGISTRY.register(DP_BALANCED_TOKENS)
class DPBalancedTokens(DispatchMode):
    """``DP_COMPUTE`` with the rows reordered into near-equal prompt-token parts, and put back on collect."""

    @staticmethod
    def dispatch(ctx: DispatchContext, args: tuple, kwargs: dict) -> RankCalls:
        mesh = ctx.mesh
        data = _the_dataproto(ctx, args, kwargs)
        padded, pad_size = data.pad_to_divisor(mesh.dp_size)
        if "attention_mask" not in padded.batch:
            raise DataProtoError(
                f"{ctx.method} ({DP_BALANCED_TOKENS}) balances by 'attention_mask' token counts; it is missing"
            )
        tokens = padded.batch["attention_mask"].sum(dim=1).tolist()
        parts = balanced_partition(tokens, mesh.dp_size, equal_size=True)
        order = np.concatenate([np.asarray(p, dtype=np.int64) for p in parts])
        shards = padded[order].chunk(mesh.dp_size) if len(padded) else [padded] * mesh.dp_size
        ctx.state.update(order=order, pad_size=pad_size, rows=len(data))

        def pick(value: Any, rank: int) -> Any:
            return shards[mesh.dp_rank_of[rank]] if value is data else value

        return {
            rank: (tuple(pick(a, rank) for a in args), {k: pick(v, rank) for k, v in kwargs.items()})
            for rank in range(ctx.world_size)
        }

    @staticmethod
    def collect(ctx: DispatchContext, outputs: Mapping[int, Any]) -> DataProto:
        parts = [outputs[rank] for rank in ctx.mesh.collect_ranks]
        if not all(isinstance(p, DataProto) for p in parts):
            raise DataProtoError(f"{ctx.method} ({DP_BALANCED_TOKENS}) must return a DataProto from every replica")
        merged = DataProto.concat(parts)
        order: np.ndarray = ctx.state["order"]
        if len(order) == 0:
            return merged
        per_row, remainder = divmod(len(merged), len(order))
        if remainder or per_row < 1:
            raise DataProtoError(
                f"{ctx.method}: replicas returned {len(merged)} rows for {len(order)} inputs; need k rows per input"
            )
        position = np.empty_like(order)
        position[order] = np.arange(len(order))  # where each input row went
        rows = (position[: ctx.state["rows"], None] * per_row + np.arange(per_row)).reshape(-1)
        restored = merged[rows]
        metrics = [p.meta_info[METRICS.name] for p in parts if isinstance(p.meta_info.get(METRICS.name), dict)]
        if metrics:
            restored.meta_info[METRICS.name] = reduce_metrics(metrics, ctx.reduce)
        return restored
