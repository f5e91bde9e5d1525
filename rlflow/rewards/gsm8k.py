"""GSM8K-style rewards: the answer is the number after the last ``####``.

Like verl's default (``strict``) GSM8K scoring: a response without ``#### <number>`` scores
0, a correct final number scores 1. Numbers compare by value, so ``#### 1,000``,
``#### $1000`` and ``#### 1000.0`` all match a ground truth of ``1000``. A ground truth that
is itself a full GSM8K solution (ending in ``#### 72``) is reduced to its final number.
"""

from __future__ import annotations

import re
from typing import Any, Optional

from rlflow.rewards.numbers import parse_number, same_number
from rlflow.rewards.registry import REWARD_REGISTRY, any_ground_truth

_FINAL_ANSWER = re.compile(r"####\s*(\$?\s*[-+]?[\d,]*\.?\d+)")


def extract_hash_answer(text: str) -> Optional[str]:
    """The number after the last ``####`` in ``text``, as written; None if there is none."""
    matches = _FINAL_ANSWER.findall(text)
    return matches[-1] if matches else None


def _truth_value(ground_truth: Any) -> Optional[float]:
    text = str(ground_truth)
    answer = extract_hash_answer(text)
    return parse_number(text if answer is None else answer)


@REWARD_REGISTRY.register("openai/gsm8k", "gsm8k")
def gsm8k_score(data_source: str, solution_str: str, ground_truth: Any, extra_info: Optional[dict] = None) -> float:
    """1.0 if the number after the response's last ``####`` equals the ground truth, else 0.0."""
    answer = extract_hash_answer(solution_str)
    if answer is None:
        return 0.0
    value = parse_number(answer)
    return any_ground_truth(ground_truth, lambda truth: same_number(value, _truth_value(truth)))
