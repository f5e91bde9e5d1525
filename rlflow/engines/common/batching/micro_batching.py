"""Split a batch into micro-batches and put the outputs back in the input order.

Two modes:

* fixed: at most ``micro_batch_size`` sequences per micro-batch, consecutive rows;
* dynamic (``use_dynamic_bsz``): at most ``max_token_len`` valid tokens per micro-batch,
  sequences balanced across micro-batches by token count (longest first onto the
  lightest micro-batch), fewest micro-batches that fit.

With ``share_prefix`` a prompt runs once per micro-batch that holds rows of it, so the rows that
share one (``row_groups``) are kept together: consecutive in fixed mode, and balanced as whole
groups in dynamic mode (a group over the budget is cut into budget-sized runs). The limits do not
change: the budget still counts every row's tokens, as if nothing were shared.

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


def _budget_runs(lengths: Sequence[int], row_groups: Sequence[Sequence[int]], max_token_len: int) -> list[list[int]]:
    """Each row group cut into consecutive runs of at most ``max_token_len`` tokens (every row fits alone)."""
    longest = max(lengths)
    if longest > max_token_len:
        raise ValueError(
            f"a sequence has {longest} tokens, more than max_token_len_per_micro_batch={max_token_len}; "
            "raise the budget to at least the longest sequence"
        )
    runs: list[list[int]] = []
    for rows in row_groups:
        run, tokens = [], 0
        for row in rows:
            if run and tokens + lengths[row] > max_token_len:
                runs.append(run)
                run, tokens = [], 0
            run.append(row)
            tokens += lengths[row]
        runs.append(run)
    return runs


def _dynamic_count(run_tokens: Sequence[int], max_token_len: int) -> int:
    """The fewest parts the runs balance into with no part over the budget."""
    count = max(1, math.ceil(sum(run_tokens) / max_token_len))
    while max(sum(run_tokens[i] for i in part) for part in balanced_partition(run_tokens, count)) > max_token_len:
        count += 1
    return count


def _split_to(runs: list[list[int]], count: int) -> list[list[int]]:
    """At least ``count`` runs: the run with the most rows halved until there are (``count`` <= rows)."""
    runs = list(runs)
    while len(runs) < count:
        widest = max(range(len(runs)), key=lambda i: len(runs[i]))
        run = runs.pop(widest)
        runs[widest:widest] = [run[: len(run) // 2], run[len(run) // 2:]]
    return runs


def plan_micro_batches(
    lengths: Sequence[int],
    *,
    micro_batch_size: int,
    use_dynamic_bsz: bool,
    max_token_len: int,
    group: Optional[dist.ProcessGroup] = None,
    device: torch.device = torch.device("cpu"),
    row_groups: Optional[Sequence[Sequence[int]]] = None,
) -> MicroBatchPlan:
    """Plan this rank's micro-batches; ``lengths`` are valid-token counts per row.

    ``row_groups`` (every row once; ``prefix_sharing.prefix_row_groups``) are rows to keep in one micro-batch
    where the limits allow: consecutive in fixed mode, and in dynamic mode whole, or cut into as few runs as
    the budget takes. The limits stay those of the rows alone. Collective over ``group`` (the count is
    agreed on). Raises ValueError when a rank has fewer rows than the agreed number of micro-batches.
    """
    if not lengths:
        raise ValueError("cannot run an empty batch through the engine; every DP rank needs at least one row")
    row_groups = row_groups if row_groups is not None else [[row] for row in range(len(lengths))]
    if use_dynamic_bsz:
        runs = _budget_runs(lengths, row_groups, max_token_len)
        local = _dynamic_count([sum(lengths[row] for row in run) for run in runs], max_token_len)
    else:
        local = math.ceil(len(lengths) / micro_batch_size)
    count = int(all_reduce_max([float(local)], group, device)[0])
    if count > len(lengths):
        raise ValueError(
            f"this rank has {len(lengths)} rows but the data-parallel group needs {count} micro-batches; "
            "give every rank the same number of rows (pad the batch to a multiple of dp_size)"
        )
    if use_dynamic_bsz:
        runs = _split_to(runs, count)
        parts = balanced_partition([sum(lengths[row] for row in run) for run in runs], count)
        return MicroBatchPlan([[row for run in part for row in runs[run]] for part in parts])
    order = [row for rows in row_groups for row in rows]
    bounds = [round(i * len(lengths) / count) for i in range(count + 1)]
    return MicroBatchPlan([order[bounds[i]:bounds[i + 1]] for i in range(count)])
