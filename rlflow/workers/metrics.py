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

from rlflow.utils.registry import Registry

ReduceSpec = Union[str, Mapping[str, str]]

METRIC_REDUCTION_REGISTRY: Registry[Callable[[list[float]], float]] = Registry("metric reduction")
DEFAULT_REDUCTION = "mean"


@METRIC_REDUCTION_REGISTRY.register("mean")
def _mean(values: list[float]) -> float:
    return float(np.mean(values))


@METRIC_REDUCTION_REGISTRY.register("sum")
def _sum(values: list[float]) -> float:
    return float(np.sum(values))


@METRIC_REDUCTION_REGISTRY.register("max")
def _max(values: list[float]) -> float:
    return float(np.max(values))


@METRIC_REDUCTION_REGISTRY.register("min")
def _min(values: list[float]) -> float:
    return float(np.min(values))


def check_reduce_spec(reduce: ReduceSpec) -> None:
    """Raise ``UnknownNameError`` (a ``ValueError``) for the first reduction that is not registered."""
    for op in [reduce] if isinstance(reduce, str) else reduce.values():
        METRIC_REDUCTION_REGISTRY.get(op)


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
            result[key] = METRIC_REDUCTION_REGISTRY.get(op)(numbers)
    return result
