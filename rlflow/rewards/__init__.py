"""Rule rewards by ``data_source``, user reward functions, and the manager that scores response batches.

Built in: GSM8K ``#### answer`` (``openai/gsm8k``, ``gsm8k``), boxed MATH answers (``math``,
``lighteval/MATH``, ...), every synthetic task (``synthetic/<task>``) and environment rewards (``env/*``). See docs/rewards.md.

``RewardManager``, ``score_batch`` and ``reward_metrics`` (which need torch) are imported
on first use: reward worker processes import only this package and the scoring functions, so
they start without loading torch.
"""

import importlib
from typing import Any

from rlflow.rewards import environment, gsm8k, math_boxed, synthetic  # noqa: F401  (register the built-in rewards)
from rlflow.rewards.custom import load_custom_function
from rlflow.rewards.registry import REWARD_REGISTRY, UnknownDataSourceError, get_reward_fn
from rlflow.rewards.scoring import RewardInput, ScoreResult, score_one

_FROM_MANAGER = ("RewardManager", "reward_metrics", "score_batch")

__all__ = [
    "REWARD_REGISTRY",
    "RewardInput",
    "ScoreResult",
    "UnknownDataSourceError",
    "get_reward_fn",
    "load_custom_function",
    "score_one",
    *_FROM_MANAGER,
]


def __getattr__(name: str) -> Any:
    if name in _FROM_MANAGER:
        return getattr(importlib.import_module("rlflow.rewards.manager"), name)
    raise AttributeError(f"module 'rlflow.rewards' has no attribute {name!r}")
