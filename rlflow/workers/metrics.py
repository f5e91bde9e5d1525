"""Reducing per-rank metrics dicts into one dict at the controller.

Convention: a worker method returns metrics as a flat ``{name: value}`` dict (or puts one in
``DataProto.meta_info`` under ``rlflow.meta_info.METRICS``). A value is a number, a 0-d tensor, or a list / 1-D
tensor / array of numbers. The method's ``@register(reduce=...)`` names how the values of
all collected ranks are combined: one op for every key (``reduce="mean"``) or per key
(``reduce={"grad_norm": "max", "n_tokens": "sum"}``, unlisted keys use ``mean``). List
values are flattened before the op, so ``mean`` over per-micro-batch losses is the mean of
all micro-batches of all ranks.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence, Union

import numpy as np
import torch

ReduceSpec = Union[str, Mapping[str, str]]

REDUCTIONS: dict[str, Callable[[list[float]], float]] = {
    "mean": lambda values: float(np.mean(values)),
    "sum": lambda values: float(np.sum(values)),
    "max": lambda values: float(np.max(values)),
    "min": lambda values: float(np.min(values)),
}
DEFAULT_REDUCTION = "mean"


def check_reduce_spec(reduce: ReduceSpec) -> None:
    """Raise ValueError naming any reduction that is not in ``REDUCTIONS``."""
    ops = [reduce] if isinstance(reduce, str) else list(reduce.values())
    unknown = sorted({op for op in ops if op not in REDUCTIONS})
    if unknown:
        raise ValueError(f"unknown metric reduction(s) {unknown}; choose from {sorted(REDUCTIONS)}")


def _numbers(key: str, value: Any) -> list[float]:
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu().numpy()
    array = np.asarray(value)
    if array.dtype == object or not (np.issubdtype(array.dtype, np.number) or array.dtype == bool):
        raise TypeError(f"metric '{key}' must be a number or a list of numbers, got {type(value).__name__}")
    return array.astype(np.float64).ravel().tolist()


def reduce_metrics(parts: Sequence[Mapping[str, Any]], reduce: ReduceSpec = DEFAULT_REDUCTION) -> dict[str, float]:
    """Combine one metrics dict per rank into one dict, key by key, with the declared ops."""
    check_reduce_spec(reduce)
    values: dict[str, list[float]] = {}
    for part in parts:
        for key, value in part.items():
            values.setdefault(key, []).extend(_numbers(key, value))
    result = {}
    for key, numbers in values.items():
        op = reduce if isinstance(reduce, str) else reduce.get(key, DEFAULT_REDUCTION)
        if numbers:
            result[key] = REDUCTIONS[op](numbers)
    return result
