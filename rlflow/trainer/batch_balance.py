"""Reorder a batch so each data-parallel chunk carries a near-equal number of tokens."""

from __future__ import annotations

import numpy as np

from rlflow.protocol import DataProto
from rlflow.rollout.balance import balanced_partition


def balance_batch(batch: DataProto, dp_size: int) -> DataProto:
    """Rows permuted so consecutive ``len/dp_size`` chunks have balanced ``attention_mask`` sums.

    Mesh dispatch hands chunk ``d`` to DP rank ``d``; this keeps one rank from getting every
    long sequence. Row order carries no meaning afterwards (groups are found by ``uid``).
    """
    if dp_size <= 1 or len(batch) % dp_size:
        return batch
    tokens = batch.batch["attention_mask"].sum(-1).tolist()
    order = np.concatenate([np.asarray(part, dtype=np.int64) for part in balanced_partition(tokens, dp_size)])
    return batch[order]
