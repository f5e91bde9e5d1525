r"""MATH-style rewards: the answer is the content of the last ``\boxed{...}`` (or ``\fbox{...}``).

The boxed answer and the ground truth (itself reduced to its last box if it has one) are
normalized the way MATH answers are usually compared: spacing, ``\left``/``\right``,
``\dfrac``/``\tfrac``, dollar signs, degrees, percent signs and ``\text{}`` wrappers do not
matter, and two answers that both read as numbers (``0.5``, ``\frac{1}{2}``, ``1/2``) compare
by value. Anything else must match exactly after normalization. A response with no box scores 0.
"""

from __future__ import annotations

import re
from typing import Any, Optional

from rlflow.data.boxed import last_boxed
from rlflow.rewards.numbers import parse_number, same_number
from rlflow.rewards.registry import REWARD_REGISTRY, any_ground_truth

_REMOVALS = ("\\left", "\\right", "\\!", "\\,", "\\;", "\\:", "\\$", "$", "^{\\circ}", "^\\circ", "\\%", "%")
_WRAPPERS = re.compile(r"\\(?:text|textbf|mathrm|mbox)\{([^{}]*)\}")
_SHORT_FRAC = re.compile(r"\\frac(\d)(\d)")
_FRAC = re.compile(r"^([-+]?)\\frac\{([-+]?\d+)\}\{(\d+)\}$")


def normalize_answer(answer: str) -> str:
    """A canonical string form of a MATH answer (see the module docstring)."""
    text = answer.strip().replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    text = _WRAPPERS.sub(r"\1", text)
    for token in _REMOVALS:
        text = text.replace(token, "")
    text = re.sub(r"\s+", "", text).rstrip(".")
    text = _SHORT_FRAC.sub(r"\\frac{\1}{\2}", text)
    if "=" in text and len(text.split("=")[0]) <= 2:  # "x=5" -> "5"
        text = text.split("=", 1)[1]
    return text


def answer_value(normalized: str) -> Optional[float]:
    """The numeric value of a normalized answer (a number, ``a/b`` or ``\\frac{a}{b}``), or None."""
    fraction = _FRAC.match(normalized)
    if fraction:
        sign, numerator, denominator = fraction.groups()
        if int(denominator) == 0:
            return None
        return (-1 if sign == "-" else 1) * int(numerator) / int(denominator)
    return parse_number(normalized)


def answers_match(answer: str, truth: str) -> bool:
    """Whether two answers agree after normalization (by value when both are numbers)."""
    a, b = normalize_answer(answer), normalize_answer(truth)
    return a == b or same_number(answer_value(a), answer_value(b))


@REWARD_REGISTRY.register("math", "lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500")
def boxed_math_score(data_source: str, solution_str: str, ground_truth: Any, extra_info: Optional[dict] = None) -> float:
    r"""1.0 if the response's last ``\boxed{}`` matches the ground truth, else 0.0."""
    answer = last_boxed(solution_str)
    if answer is None:
        return 0.0

    def correct(truth: Any) -> bool:
        text = str(truth)
        return answers_match(answer, last_boxed(text) or text)

    return any_ground_truth(ground_truth, correct)
