"""Metric values as plain Python numbers, and the per-key mean of a list of metric dicts."""

from __future__ import annotations

import numbers
from typing import Any, Iterable

__all__ = ["mean_per_key", "numeric_metrics", "to_plain"]


def to_plain(value: Any) -> Any:
    """A one-element tensor or numpy value as a Python number; other values unchanged."""
    if type(value) in (int, float, bool, str, type(None)):
        return value
    item = getattr(value, "item", None)
    if callable(item):
        try:
            return item()
        except (ValueError, RuntimeError):  # more than one element: leave it alone
            pass
    return value


def numeric_metrics(metrics: dict[str, Any]) -> dict[str, float]:
    """Only the entries that are real numbers (bools excluded), as floats."""
    return {k: float(v) for k, v in metrics.items() if isinstance(v, numbers.Real) and not isinstance(v, bool)}


def mean_per_key(metrics: Iterable[dict[str, Any]]) -> dict[str, float]:
    """The mean of each key over the dicts that have it (e.g. per-micro-batch metrics -> one step's)."""
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    for entry in metrics:
        for key, value in entry.items():
            sums[key] = sums.get(key, 0.0) + float(to_plain(value))
            counts[key] = counts.get(key, 0) + 1
    return {key: sums[key] / counts[key] for key in sums}
