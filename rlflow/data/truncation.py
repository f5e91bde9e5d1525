"""Truncation policies for sequences longer than their token budget.

A policy maps (length, budget) to the slice of tokens to keep, or to ``None`` to drop the
sample; ``error`` raises ``OverlongError``. The same slice is applied to every per-token list
of a sample (ids, loss mask), so they stay aligned.

| policy | over-long sample |
|---|---|
| ``error``  | raises (the dataset turns it into a ``DataError`` naming file and row) |
| ``left``   | keeps the last ``budget`` tokens (drops the start) |
| ``right``  | keeps the first ``budget`` tokens (drops the end) |
| ``filter`` | drops the sample (RL prompts only) |
"""

from __future__ import annotations

from typing import Callable, Optional

from rlflow.config import ConfigError
from rlflow.utils.registry import Registry, unknown_name_message


class OverlongError(ValueError):
    """A sample exceeds its token budget under the ``error`` policy."""

    def __init__(self, length: int, budget: int):
        super().__init__(f"{length} tokens, over the limit of {budget}")
        self.length = length
        self.budget = budget


TruncationPolicy = Callable[[int, int], Optional[slice]]
TRUNCATION_POLICY_REGISTRY: Registry[TruncationPolicy] = Registry("truncation policy", "data.truncation", error=ConfigError)


@TRUNCATION_POLICY_REGISTRY.register("error")
def _error(length: int, budget: int) -> Optional[slice]:
    raise OverlongError(length, budget)


@TRUNCATION_POLICY_REGISTRY.register("left")
def _left(length: int, budget: int) -> Optional[slice]:
    return slice(length - budget, length)


@TRUNCATION_POLICY_REGISTRY.register("right")
def _right(length: int, budget: int) -> Optional[slice]:
    return slice(0, budget)


@TRUNCATION_POLICY_REGISTRY.register("filter")
def _drop(length: int, budget: int) -> Optional[slice]:
    return None


def check_policy(policy: str, allowed: tuple[str, ...], key: str = "data.truncation") -> None:
    """Raise ``ConfigError`` naming ``key`` and the allowed policies (a dataset's subset of the registry) if
    ``policy`` is not one of them."""
    if policy not in allowed:
        raise ConfigError(unknown_name_message("truncation policy", policy, allowed, key))


def keep_slice(length: int, budget: int, policy: str) -> Optional[slice]:
    """The tokens to keep of a ``length``-token sample (all of them when it fits), or None to drop it."""
    if length <= budget:
        return slice(0, length)
    return TRUNCATION_POLICY_REGISTRY.get(policy)(length, budget)
