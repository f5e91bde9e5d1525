"""The reward registry: rule reward functions keyed by ``data_source``.

A reward function has verl's ``compute_score`` signature::

    fn(data_source: str, solution_str: str, ground_truth, extra_info: dict) -> float | dict

(a dict carries ``score`` plus any extra numbers to report). Register one with
``@REWARD_REGISTRY.register("openai/gsm8k")``; a key with glob characters (``"synthetic/*"``) matches
every data_source it fits. Lookup takes the exact key first, then the longest matching pattern.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Union

from rlflow.errors import UserError
from rlflow.utils.registry import Registry

RewardFn = Callable[[str, str, Any, dict], Union[float, dict]]


class UnknownDataSourceError(UserError, LookupError):
    """No reward function is registered for a row's ``data_source``."""


class RewardSignatureError(UserError, TypeError):
    """A reward function cannot be called the way every reward is called."""


def describe_function(fn: Callable) -> str:
    """``name (path/to/file.py)``: how messages name a user's function."""
    try:
        where = inspect.getsourcefile(fn) or inspect.getfile(fn)
    except TypeError:  # a builtin or a C function has no file
        where = getattr(fn, "__module__", None) or "?"
    return f"{getattr(fn, '__qualname__', repr(fn))} ({where})"


def check_reward_signature(fn: Callable) -> Callable:
    """``fn`` if it accepts ``fn(data_source, solution_str, ground_truth, extra_info)``, else ``RewardSignatureError``
    naming the function and its file (a function whose signature cannot be read is taken as it is)."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return fn
    try:
        signature.bind("data_source", "solution_str", None, {})
    except TypeError as error:
        raise RewardSignatureError(f"reward function {describe_function(fn)} takes {signature}, but rewards are called as "
                                   f"fn(data_source, solution_str, ground_truth, extra_info) ({error})") from None
    return fn


REWARD_REGISTRY: Registry[RewardFn] = Registry(
    "reward data_source",
    error=UnknownDataSourceError,
    hint="register one with @rlflow.rewards.REWARD_REGISTRY.register(...) or set reward.custom_function=path/to/file.py:fn",
    patterns=True,
    check=check_reward_signature,  # a function that cannot take the four arguments is refused when its plugin loads
)


def get_reward_fn(data_source: str) -> RewardFn:
    """The reward function for ``data_source``; raises ``UnknownDataSourceError`` listing the registered keys."""
    return REWARD_REGISTRY.get(data_source)


def any_ground_truth(ground_truth: Any, is_correct: Callable[[Any], bool]) -> float:
    """1.0 if ``is_correct`` holds for the ground truth (or for any of a list of acceptable ones), else 0.0."""
    candidates = ground_truth if isinstance(ground_truth, (list, tuple)) else [ground_truth]
    return 1.0 if any(is_correct(candidate) for candidate in candidates) else 0.0
