"""The threshold specs of rollout correction, parsed by one set of functions for the runtime and the config check.

* ``rollout_is_threshold``: a positive number ``u`` (truncated IS, TIS: weights are capped at ``u``;
  the metrics' lower bound is ``1/u``), or a ``"lower_upper"`` string (IcePop-style masked IS: a
  weight outside ``[lower, upper]`` becomes 0, the others are kept as they are).
* ``rollout_rs_threshold``: one spec per rejection option, comma-separated, or one spec shared by
  every option. A two-sided option (the ``*_k1`` ones) takes ``"lower_upper"`` bounds on the ratio
  ``exp(k1)``, or one number ``u`` meaning ``1/u .. u``; the others take one positive upper bound.

Every malformed spec raises ``ValueError`` with a one-line reason; the config check adds the key.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Optional

BOUND_SEPARATOR = "_"  # "0.5_2.0": lower_upper
OPTION_SEPARATOR = ","  # "token_k1,seq_mean_k3" and "0.5_2.0,0.01"


@dataclass(frozen=True)
class ISThreshold:
    """Where IS weights are cut: ``masks`` false truncates at ``upper`` (``lower`` is ``1/upper``, for the
    metrics only); ``masks`` true zeroes every weight outside ``[lower, upper]``."""

    lower: float
    upper: float
    masks: bool


@dataclass(frozen=True)
class RejectionBounds:
    """Bounds of one rejection statistic, in the statistic's own space (log space for the two-sided
    ``k1`` options): a value is kept when ``lower <= value <= upper`` (``lower`` None: no lower bound)."""

    lower: Optional[float]
    upper: float


def _positive_number(text: Any, what: str) -> float:
    if isinstance(text, bool):
        raise ValueError(f"{what} must be a positive number, got {text!r}")
    try:
        value = float(text)
    except (TypeError, ValueError):
        raise ValueError(f"{what} must be a positive number, got {text!r}") from None
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"{what} must be a positive finite number, got {text!r}")
    return value


def _lower_upper(spec: str, what: str) -> tuple[float, float]:
    lower_text, upper_text = spec.split(BOUND_SEPARATOR, 1)
    lower, upper = _positive_number(lower_text, f"{what} lower bound"), _positive_number(upper_text, f"{what} upper bound")
    if lower >= upper:
        raise ValueError(f"{what} {spec!r}: the lower bound must be below the upper bound")
    return lower, upper


def parse_is_threshold(spec: Any) -> ISThreshold:
    """``rollout_is_threshold`` as bounds: a number truncates (TIS), ``"lower_upper"`` masks (IcePop)."""
    if isinstance(spec, str) and BOUND_SEPARATOR in spec:
        lower, upper = _lower_upper(spec.strip(), "rollout_is_threshold")
        return ISThreshold(lower, upper, masks=True)
    upper = _positive_number(spec, "rollout_is_threshold")
    return ISThreshold(1.0 / upper, upper, masks=False)


def split_options(spec: Any) -> list[str]:
    """The options of a comma-joined ``rollout_rs`` string, in order, duplicates dropped."""
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"rollout_rs must be a non-empty string of comma-separated options, got {spec!r}")
    options = [part.strip() for part in spec.split(OPTION_SEPARATOR) if part.strip()]
    if not options:
        raise ValueError(f"rollout_rs names no option: {spec!r}")
    return list(dict.fromkeys(options))


def _specs(spec: Any, count: int) -> list[str]:
    if spec is None:
        raise ValueError("rejection sampling needs rollout_rs_threshold (one threshold per rollout_rs option)")
    if isinstance(spec, bool) or not isinstance(spec, (int, float, str)):
        raise ValueError(f"rollout_rs_threshold must be a number or a string, got {spec!r}")
    parts = [str(spec)] if not isinstance(spec, str) else [p.strip() for p in spec.split(OPTION_SEPARATOR) if p.strip()]
    if len(parts) not in (1, count):
        raise ValueError(f"rollout_rs_threshold {spec!r} has {len(parts)} entries; give one shared entry or one per "
                         f"rollout_rs option ({count})")
    return parts * count if len(parts) == 1 else parts


def _rejection_bounds(option: str, spec: str, two_sided: bool) -> RejectionBounds:
    what = f"rollout_rs_threshold for {option}"
    if two_sided and BOUND_SEPARATOR in spec:
        lower, upper = _lower_upper(spec, what)
        return RejectionBounds(math.log(lower), math.log(upper))
    if two_sided:
        upper = _positive_number(spec, what)
        if upper <= 1.0:
            raise ValueError(f"{what}: one number u means the ratio bounds 1/u .. u, so it must exceed 1, got {spec!r}")
        return RejectionBounds(-math.log(upper), math.log(upper))
    if BOUND_SEPARATOR in spec:
        raise ValueError(f"{what} takes one upper bound, not lower_upper bounds: {spec!r}")
    return RejectionBounds(None, _positive_number(spec, what))


def parse_rejection_thresholds(two_sided: Mapping[str, bool], spec: Any) -> dict[str, RejectionBounds]:
    """Each option's bounds from ``rollout_rs_threshold``; ``two_sided`` maps the options, in order, to whether
    they take lower and upper ratio bounds (converted to log space here)."""
    options = list(two_sided)
    return {option: _rejection_bounds(option, part, two_sided[option])
            for option, part in zip(options, _specs(spec, len(options)))}
