"""Rewards of the synthetic tasks: each ``synthetic/<task>`` data_source is scored by that task's ``score``.

Every task registered in ``rlflow.data.tasks`` when this module is imported gets an entry,
so an unknown ``synthetic/...`` data_source fails at lookup like any other unknown source.
A task registered later is added with ``register_synthetic_rewards()``.
"""

from __future__ import annotations

from typing import Any, Optional

from rlflow.data.tasks import DATA_SOURCE_PREFIX, TASK_REGISTRY, score
from rlflow.rewards.registry import REWARD_REGISTRY, register_reward


def synthetic_task_score(data_source: str, solution_str: str, ground_truth: Any, extra_info: Optional[dict] = None) -> float:
    """The task's final-answer score: 1.0 correct, 0.0 otherwise."""
    return score(data_source, solution_str, ground_truth)


def register_synthetic_rewards() -> None:
    """Register ``synthetic_task_score`` for every registered synthetic task not yet in the reward registry."""
    registered = set(REWARD_REGISTRY.names())
    for name in TASK_REGISTRY.names():
        if DATA_SOURCE_PREFIX + name not in registered:
            register_reward(DATA_SOURCE_PREFIX + name)(synthetic_task_score)


register_synthetic_rewards()
