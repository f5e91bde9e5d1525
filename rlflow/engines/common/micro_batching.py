"""Split a batch into micro-batches and put the outputs back in the input order.

Two modes:

* fixed: at most ``micro_batch_size`` sequences per micro-batch, consecutive rows;
* dynamic (``use_dynamic_bsz``): at most ``max_token_len`` valid tokens per micro-batch,
  sequences balanced across micro-batches by token count (longest first onto the
  lightest micro-batch), fewest micro-batches that fit.

Every DP rank must run the same number of forward/backward passes (sharded parameters
are gathered collectively), so the count is the maximum over the group, and each rank
splits its rows into that many micro-batches.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence

import torch
import torch.distributed as dist

from rlflow.engines.common.distributed import all_reduce_max
from rlflow.utils.partition import balanced_partition

__all__ = ["MicroBatchPlan", "plan_micro_batches"]


@dataclass(frozen=True)
class MicroBatchPlan:
    """Row indices of each micro-batch; ``restore`` undoes the reordering."""

    groups: list[list[int]]

    @property
    def order(self) -> list[int]:
        return [index for group in self.groups for index in group]

    def restore(self, stacked: torch.Tensor) -> torch.Tensor:
        """Rows of ``stacked`` (micro-batch outputs concatenated in plan order) back in input order."""
        inverse = torch.empty(len(self.order), dtype=torch.long)
        inverse[torch.tensor(self.order, dtype=torch.long)] = torch.arange(len(self.order))
        return stacked.index_select(0, inverse.to(stacked.device))


def _dynamic_count(lengths: Sequence[int], max_token_len: int) -> int:
    longest = max(lengths)
    if longest > max_token_len:
        raise ValueError(
            f"a sequence has {longest} tokens, more than max_token_len_per_micro_batch={max_token_len}; "
            "raise the budget to at least the longest sequence"
        )
    count = max(1, math.ceil(sum(lengths) / max_token_len))
    while max(sum(lengths[i] for i in part) for part in balanced_partition(lengths, count)) > max_token_len:
        count += 1
    return count


def plan_micro_batches(
    lengths: Sequence[int],
    *,
    micro_batch_size: int,
    use_dynamic_bsz: bool,
    max_token_len: int,
    group: Optional[dist.ProcessGroup] = None,
    device: torch.device = torch.device("cpu"),
) -> MicroBatchPlan:
    """Plan this rank's micro-batches; ``lengths`` are valid-token counts per row.

    Collective over ``group`` (the count is agreed on). Raises ValueError when a rank
    has fewer rows than the agreed number of micro-batches.
    """
    if not lengths:
        raise ValueError("cannot run an empty batch through the engine; every DP rank needs at least one row")
    local = _dynamic_count(lengths, max_token_len) if use_dynamic_bsz else math.ceil(len(lengths) / micro_batch_size)
    count = int(all_reduce_max([float(local)], group, device)[0])
    if count > len(lengths):
        raise ValueError(
            f"this rank has {len(lengths)} rows but the data-parallel group needs {count} micro-batches; "
            "give every rank the same number of rows (pad the batch to a multiple of dp_size)"
        )
    if use_dynamic_bsz:
        return MicroBatchPlan(balanced_partition(lengths, count))
    bounds = [round(i * len(lengths) / count) for i in range(count + 1)]
    return MicroBatchPlan([list(range(bounds[i], bounds[i + 1])) for i in range(count)])
