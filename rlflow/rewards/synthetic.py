"""Rewards of the synthetic tasks: each ``synthetic/<task>`` data_source is scored by that task's ``score``.

Every task registered in ``rlflow.data.tasks`` when this module is imported gets an entry,
so an unknown ``synthetic/...`` data_source fails at lookup like any other unknown source.
"""

from __future__ import annotations

from typing import Any, Optional

from rlflow.data.tasks import DATA_SOURCE_PREFIX, TASK_REGISTRY, score
from rlflow.rewards.registry import REWARD_REGISTRY


@REWARD_REGISTRY.register(*(DATA_SOURCE_PREFIX + name for name in TASK_REGISTRY.names()))
def synthetic_task_score(data_source: str, solution_str: str, ground_truth: Any, extra_info: Optional[dict] = None) -> float:
    """The task's final-answer score: 1.0 correct, 0.0 otherwise."""
    return score(data_source, solution_str, ground_truth)
