"""Reorder a batch so each data-parallel chunk carries a near-equal amount of work.

Mesh dispatch hands chunk ``d`` to DP rank ``d``; balancing keeps one rank from getting every long
sequence. Without prefix sharing a rank's work is its token count, and rows are balanced one by one.
With ``share_prefix`` (``rlflow/engines/common/prefix_sharing.py``) a rank computes each prompt of
a ``uid`` group once however many of the group's rows it holds, so a group kept on one rank costs
less than a group split across ranks: the group order (whole groups balanced by their shared cost)
is taken when its slowest rank has less work than the row order's.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from rlflow.protocol import DataProto
from rlflow.rollout.balance import balanced_partition

__all__ = ["balance_batch"]


def balance_batch(batch: DataProto, dp_size: int, share_prefix: bool = False) -> DataProto:
    """Rows permuted so consecutive ``len/dp_size`` chunks carry near-equal work (module docstring).
    Row order carries no meaning afterwards (groups are found by ``uid``)."""
    if dp_size <= 1 or len(batch) % dp_size:
        return batch
    tokens = batch.batch["attention_mask"].sum(-1).tolist()
    order = [i for part in balanced_partition(tokens, dp_size) for i in part]
    if share_prefix and "uid" in batch.non_tensor_batch and "responses" in batch.batch:
        grouped = _group_order(batch, dp_size)
        if grouped is not None and _slowest_rank(batch, grouped, dp_size) < _slowest_rank(batch, order, dp_size):
            order = grouped
    return batch[np.asarray(order, dtype=np.int64)]


def _groups(batch: DataProto) -> dict[object, list[int]]:
    groups: dict[object, list[int]] = {}
    for row, uid in enumerate(batch.non_tensor_batch["uid"]):
        groups.setdefault(uid, []).append(row)
    return groups


def _shared_costs(batch: DataProto, rows: list[int]) -> int:
    """Tokens a rank computes for ``rows`` when each group's prompt runs once."""
    prompt_width = batch.batch["input_ids"].shape[1] - batch.batch["responses"].shape[1]
    mask = batch.batch["attention_mask"]
    prompts = {batch.non_tensor_batch["uid"][row]: int(mask[row, :prompt_width].sum()) for row in rows}
    return sum(prompts.values()) + int(mask[rows, prompt_width:].sum())


def _group_order(batch: DataProto, dp_size: int) -> Optional[list[int]]:
    """Whole ``uid`` groups balanced by their shared cost; None unless the groups are equal in size and
    split evenly over the ranks (a chunk must hold ``len/dp_size`` rows)."""
    groups = list(_groups(batch).values())
    if len({len(rows) for rows in groups}) != 1 or len(groups) % dp_size:
        return None
    parts = balanced_partition([_shared_costs(batch, rows) for rows in groups], dp_size)
    return [row for part in parts for group in part for row in groups[group]]


def _slowest_rank(batch: DataProto, order: list[int], dp_size: int) -> int:
    chunk = len(order) // dp_size
    return max(_shared_costs(batch, order[rank * chunk:(rank + 1) * chunk]) for rank in range(dp_size))
