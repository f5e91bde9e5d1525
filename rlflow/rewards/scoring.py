"""Scoring samples with the error policy: a reward that raises or returns a bad value never stops the run.

``score_samples`` is what runs in-process and in every reward worker process, so parallel
scoring gives exactly the serial results. A sample whose function raises, or returns
something other than a finite number (or a dict whose ``score`` is one), gets ``error_score``
and a description of what went wrong, for the caller to log. A dict's other numbers are kept as
extras, and its ``pred`` (the answer the function extracted) as a string.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

from rlflow.errors import UserError
from rlflow.rewards.custom import load_custom_function
from rlflow.rewards.registry import RewardFn, describe_function


@dataclass(frozen=True)
class RewardInput:
    """One decoded response and what it is scored against."""

    data_source: str
    solution_str: str
    ground_truth: Any
    extra_info: dict


@dataclass(frozen=True)
class ScoreResult:
    """A sample's score, the extra numbers its function reported, its extracted answer (``pred``, for
    majority voting in validation; None when the function reports none) and the error if it failed (else None)."""

    score: float
    extras: dict[str, float] = field(default_factory=dict)
    error: Optional[str] = None
    pred: Optional[str] = None


def _as_float(value: Any) -> Optional[float]:
    if isinstance(value, (str, bytes)):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def to_result(value: Any, error_score: float) -> ScoreResult:
    """Check a reward function's return value and turn it into a ``ScoreResult``."""
    extras: dict[str, float] = {}
    pred = None
    if isinstance(value, Mapping):
        if "score" not in value:
            return ScoreResult(error_score, error=f"returned a dict without a 'score' key (keys: {sorted(value)})")
        extras = {k: v for k, v in ((k, _as_float(v)) for k, v in value.items() if k not in ("score", "pred")) if v is not None}
        pred = None if value.get("pred") is None else str(value["pred"])
        value = value["score"]
    score = _as_float(value)
    if score is None:
        return ScoreResult(error_score, error=f"returned {type(value).__name__} {value!r:.80}, expected a float or dict(score=...)")
    if not math.isfinite(score):
        return ScoreResult(error_score, error=f"returned a non-finite score {score}")
    return ScoreResult(score, extras, pred=pred)


def score_one(fn: RewardFn, sample: RewardInput, error_score: float) -> ScoreResult:
    """``fn`` applied to one sample under the error policy; a ``SystemExit``, ``KeyboardInterrupt`` or other
    ``BaseException`` from it is no score but a ``UserError`` naming the function and its file, which ends the run."""
    try:
        value = fn(sample.data_source, sample.solution_str, sample.ground_truth, sample.extra_info)
    except Exception as error:  # noqa: BLE001 - any failure of a reward function scores error_score
        return ScoreResult(error_score, error=f"raised {type(error).__name__}: {error}")
    except BaseException as error:  # noqa: BLE001 - sys.exit() in a reward function must not end the run with its status
        raise UserError(f"reward function {describe_function(fn)} raised {type(error).__name__}({error}) while scoring "
                        f"a sample of data_source {sample.data_source!r}; a reward function must return a score") from None
    return to_result(value, error_score)


@functools.lru_cache(maxsize=None)
def _custom_function(spec: str) -> RewardFn:
    return load_custom_function(spec)


def score_samples(
    samples: list[RewardInput],
    functions: Optional[Mapping[str, RewardFn]],
    custom_function: Optional[str],
    error_score: float,
) -> list[ScoreResult]:
    """Score every sample: with the custom function when one is named, else with ``functions[data_source]``."""
    if custom_function:
        fn = _custom_function(custom_function)
        return [score_one(fn, sample, error_score) for sample in samples]
    return [score_one(functions[sample.data_source], sample, error_score) for sample in samples]
