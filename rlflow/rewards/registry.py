"""The reward registry: rule reward functions keyed by ``data_source``.

A reward function has verl's ``compute_score`` signature::

    fn(data_source: str, solution_str: str, ground_truth, extra_info: dict) -> float | dict

(a dict carries ``score`` plus any extra numbers to report). Register one with
``@register_reward("openai/gsm8k")``; a key with glob characters (``"synthetic/*"``) matches
every data_source it fits. Lookup takes the exact key first, then the longest matching pattern.
"""

from __future__ import annotations

import fnmatch
from typing import Any, Callable, Union

from rlflow.errors import UserError

RewardFn = Callable[[str, str, Any, dict], Union[float, dict]]

REWARD_REGISTRY: dict[str, RewardFn] = {}
_GLOB_CHARS = "*?["


class UnknownDataSourceError(UserError, LookupError):
    """No reward function is registered for a row's ``data_source``."""


def register_reward(data_source_or_pattern: str, override: bool = False) -> Callable[[RewardFn], RewardFn]:
    """Decorator registering a reward function for a data_source (or a glob pattern of them)."""

    def decorate(fn: RewardFn) -> RewardFn:
        existing = REWARD_REGISTRY.get(data_source_or_pattern)
        if existing is not None and existing is not fn and not override:
            raise ValueError(
                f"a reward for {data_source_or_pattern!r} is already registered ({existing.__module__}.{existing.__qualname__}); "
                "pass override=True to replace it"
            )
        REWARD_REGISTRY[data_source_or_pattern] = fn
        return fn

    return decorate


def get_reward_fn(data_source: str) -> RewardFn:
    """The reward function for ``data_source``; raises ``UnknownDataSourceError`` listing the registered keys."""
    if data_source in REWARD_REGISTRY:
        return REWARD_REGISTRY[data_source]
    patterns = [key for key in REWARD_REGISTRY if any(c in key for c in _GLOB_CHARS) and fnmatch.fnmatchcase(data_source, key)]
    if patterns:
        return REWARD_REGISTRY[max(patterns, key=len)]
    raise UnknownDataSourceError(
        f"no reward function for data_source {data_source!r}; registered: {sorted(REWARD_REGISTRY)}. "
        "Register one with @rlflow.rewards.register_reward(...) or set reward.custom_function=path/to/file.py:fn"
    )


def any_ground_truth(ground_truth: Any, is_correct: Callable[[Any], bool]) -> float:
    """1.0 if ``is_correct`` holds for the ground truth (or for any of a list of acceptable ones), else 0.0."""
    candidates = ground_truth if isinstance(ground_truth, (list, tuple)) else [ground_truth]
    return 1.0 if any(is_correct(candidate) for candidate in candidates) else 0.0
