"""Greedy balanced partitions: the one splitting rule behind rlflow's load balancing.

Rollout dispatch and the trainer's batch balancing need parts of equal size (every data-parallel
rank takes ``len/dp_size`` rows); the engines' dynamic micro-batches need non-empty parts of any
size. Both are the same greedy rule, heaviest item first onto the lightest part that has room, so
both share this function.
"""

from __future__ import annotations

import heapq
from typing import Sequence

__all__ = ["balanced_partition"]


def balanced_partition(weights: Sequence[int], parts: int, *, equal_size: bool = False) -> list[list[int]]:
    """Split indices ``0..len(weights)-1`` into ``parts`` sorted lists with near-equal weight sums.

    Greedy and deterministic: heaviest item first (ties: lower index) onto the lightest part (ties:
    fewer items, then lower part index) that still has room, so with non-negative weights no part
    exceeds the mean by more than the heaviest item. ``equal_size`` gives every part
    ``len(weights) // parts`` items and needs a multiple of ``parts``; otherwise every part is non-empty.
    """
    count = len(weights)
    if equal_size and (parts < 1 or count % parts):
        raise ValueError(f"cannot split {count} items into {parts} equal parts")
    if not equal_size and not 1 <= parts <= count:
        raise ValueError(f"cannot split {count} items into {parts} non-empty parts")
    capacity = count // parts if equal_size else count
    members: list[list[int]] = [[] for _ in range(parts)]
    lightest = [(0, 0, part) for part in range(parts)]  # (weight sum, items, part)
    for index in sorted(range(count), key=lambda i: (-weights[i], i)):
        load, items, part = heapq.heappop(lightest)
        members[part].append(index)
        if items + 1 < capacity:
            heapq.heappush(lightest, (load + weights[index], items + 1, part))
    return [sorted(part) for part in members]
