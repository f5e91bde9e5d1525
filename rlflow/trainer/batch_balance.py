"""Reorder a batch so each data-parallel chunk carries a near-equal amount of work.

Mesh dispatch hands chunk ``d`` to DP rank ``d``; balancing keeps one rank from getting every long
sequence. Without prefix sharing a rank's work is its token count, and rows are balanced one by one.
With ``share_prefix`` (``rlflow/engines/common/batching/prefix_sharing.py``) a rank computes each prompt of
a ``uid`` group once however many of the group's rows it holds, so a group kept on one rank costs
less than a group split across ranks: the group order (whole groups balanced by their shared cost)
is taken when its slowest rank has less work than the row order's.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from rlflow.protocol import DataProto
from rlflow.utils.partition import balanced_partition

__all__ = ["balance_batch"]


def balance_batch(batch: DataProto, dp_size: int, share_prefix: bool = False) -> DataProto:
    """Rows permuted so consecutive ``len/dp_size`` chunks carry near-equal work (module docstring).
    Row order carries no meaning afterwards (groups are found by ``uid``)."""
    if dp_size <= 1 or len(batch) % dp_size:
        return batch
    tokens = batch.batch["attention_mask"].sum(-1).tolist()
    order = [i for part in balanced_partition(tokens, dp_size, equal_size=True) for i in part]
    if share_prefix and "uid" in batch.non_tensor_batch and "responses" in batch.batch:
        costs = _SharedCosts(batch)
        grouped = costs.group_order(dp_size)
        if grouped is not None and costs.slowest_rank(grouped, dp_size) < costs.slowest_rank(order, dp_size):
            order = grouped
    return batch[np.asarray(order, dtype=np.int64)]


class _SharedCosts:
    """Per-row prompt and response token counts of an RL batch, read once, and the work of row sets
    when each ``uid`` group's prompt runs once per rank."""

    def __init__(self, batch: DataProto) -> None:
        mask = batch.batch["attention_mask"]
        prompt_width = mask.shape[1] - batch.batch["responses"].shape[1]
        self.uids = list(batch.non_tensor_batch["uid"])
        self.prompt_tokens = mask[:, :prompt_width].sum(-1).tolist()
        self.response_tokens = mask[:, prompt_width:].sum(-1).tolist()

    def work(self, rows: list[int]) -> int:
        """Tokens a rank computes for ``rows``."""
        prompts = {self.uids[row]: self.prompt_tokens[row] for row in rows}
        return sum(prompts.values()) + sum(self.response_tokens[row] for row in rows)

    def group_order(self, dp_size: int) -> Optional[list[int]]:
        """Whole ``uid`` groups balanced by their work; None unless the groups are equal in size and split
        evenly over the ranks (a chunk must hold ``len/dp_size`` rows)."""
        by_uid: dict[object, list[int]] = {}
        for row, uid in enumerate(self.uids):
            by_uid.setdefault(uid, []).append(row)
        groups = list(by_uid.values())
        if len({len(rows) for rows in groups}) != 1 or len(groups) % dp_size:
            return None
        parts = balanced_partition([self.work(rows) for rows in groups], dp_size, equal_size=True)
        return [row for part in parts for group in part for row in groups[group]]

    def slowest_rank(self, order: list[int], dp_size: int) -> int:
        """The largest work of the ``dp_size`` consecutive chunks of ``order``."""
        chunk = len(order) // dp_size
        return max(self.work(order[rank * chunk:(rank + 1) * chunk]) for rank in range(dp_size))
