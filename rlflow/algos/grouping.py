"""Per-group statistics of one scalar per response, grouped by prompt id (``index``/uid).

The group-relative estimators (GRPO, RLOO, RF++-baseline, OPO, GPG) all reduce to these
scatter sums, computed in one pass over the batch instead of a Python loop per row.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch


@dataclass(frozen=True)
class Groups:
    """Row -> group assignment: ``ids[i]`` is the dense group number of row ``i``."""

    ids: torch.Tensor
    sizes: torch.Tensor  # rows per group, in the scores' dtype

    @property
    def num_groups(self) -> int:
        return int(self.sizes.shape[0])

    def row_sizes(self) -> torch.Tensor:
        """Size of each row's group, one per row."""
        return self.sizes[self.ids]

    def sum(self, per_row: torch.Tensor) -> torch.Tensor:
        """Per-group sums of a per-row tensor."""
        out = torch.zeros(self.num_groups, dtype=per_row.dtype, device=per_row.device)
        return out.index_add_(0, self.ids, per_row)

    def mean(self, per_row: torch.Tensor) -> torch.Tensor:
        """Per-group means."""
        return self.sum(per_row) / self.sizes

    def std(self, per_row: torch.Tensor) -> torch.Tensor:
        """Per-group unbiased standard deviations (0 for groups of one)."""
        centered = per_row - self.mean(per_row)[self.ids]
        squares = self.sum(centered.square())
        return torch.sqrt(squares / (self.sizes - 1).clamp(min=1))


def group_rows(index: Sequence | np.ndarray, like: torch.Tensor) -> Groups:
    """Group the rows of ``like`` (one per response) by their ``index`` value."""
    keys = np.asarray(index, dtype=object) if not isinstance(index, np.ndarray) else index
    if keys.ndim != 1 or keys.shape[0] != like.shape[0]:
        raise ValueError(f"index must hold one group id per row: got shape {keys.shape} for {like.shape[0]} rows")
    if keys.shape[0] == 0:
        empty = torch.zeros(0, dtype=torch.long, device=like.device)
        return Groups(ids=empty, sizes=torch.zeros(0, dtype=like.dtype, device=like.device))
    _, inverse = np.unique(keys, return_inverse=True)
    ids = torch.as_tensor(inverse.reshape(-1), dtype=torch.long, device=like.device)
    sizes = torch.bincount(ids).to(like.dtype)
    return Groups(ids=ids, sizes=sizes)
