"""Turning per-sample lists into batch columns: padded tensors, position ids, numpy object arrays."""

from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np
import torch


def pad_to_tensor(
    sequences: Sequence[Sequence[int]], pad_value: int, side: str, length: Optional[int] = None
) -> torch.Tensor:
    """A ``[len(sequences), length]`` int64 tensor, padded on ``side`` ("left" or "right").

    ``length`` defaults to the longest sequence; a longer sequence is an error (truncate first).
    """
    if side not in ("left", "right"):
        raise ValueError(f"padding side must be 'left' or 'right', got {side!r}")
    longest = max((len(s) for s in sequences), default=0)
    length = longest if length is None else length
    if longest > length:
        raise ValueError(f"a sequence of {longest} tokens does not fit a padded length of {length}")
    out = torch.full((len(sequences), length), pad_value, dtype=torch.long)
    for row, seq in enumerate(sequences):
        if not len(seq):
            continue
        values = torch.as_tensor(list(seq), dtype=torch.long)
        if side == "left":
            out[row, length - len(seq):] = values
        else:
            out[row, : len(seq)] = values
    return out


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions 0, 1, ... counted over real tokens; padding before the first real token gets 0.

    With left padding ``[0, 0, 1, 1, 1]`` gives ``[0, 0, 0, 1, 2]``; with right padding the
    padding after the last real token repeats the last position.
    """
    return (attention_mask.long().cumsum(dim=-1) - 1).clamp(min=0)


def object_array(values: Sequence[Any]) -> np.ndarray:
    """A 1-D numpy object array holding ``values`` as they are (lists stay list elements, not a 2-D array)."""
    out = np.empty(len(values), dtype=object)
    for index, value in enumerate(values):
        out[index] = value
    return out
