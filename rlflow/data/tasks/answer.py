"""The final-answer convention of every synthetic task: the answer is the number after ``####``.

A solution is scored by the *last* ``####`` marker in the text; the number must follow the
marker directly (spaces allowed), so "#### 579" is an answer and "#### I think 579" is not.
"""

from __future__ import annotations

import re

ANSWER_MARKER = "####"
_ANSWER_RE = re.compile(re.escape(ANSWER_MARKER) + r"[ \t]*(-?\d[\d,]*)")


def extract_final_answer(solution_str: object) -> int | None:
    """The integer after the last ``####`` in ``solution_str``, or None if there is none."""
    if not isinstance(solution_str, str):
        return None
    matches = _ANSWER_RE.findall(solution_str)
    if not matches:
        return None
    return int(matches[-1].replace(",", ""))


def score_final_answer(solution_str: object, ground_truth: object) -> float:
    """1.0 if the final answer equals ``ground_truth`` as an integer, else 0.0 (never raises)."""
    answer = extract_final_answer(solution_str)
    try:
        expected = int(str(ground_truth).strip().replace(",", ""))
    except ValueError:
        return 0.0
    return 1.0 if answer is not None and answer == expected else 0.0
