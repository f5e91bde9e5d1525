"""Reading numeric answers written the way people write them ("1,234", "$5", "-0.50", "3/4")."""

from __future__ import annotations

import math
import re
from typing import Optional

_NUMBER = re.compile(r"^[-+]?(\d+(\.\d*)?|\.\d+)$")
_FRACTION = re.compile(r"^([-+]?\d+)/(\d+)$")


def parse_number(text: str) -> Optional[float]:
    """The value of ``text`` as a number after dropping ``$``, ``,``, ``%`` and spaces; None if it is not one."""
    cleaned = re.sub(r"[\s$,%]", "", text)
    if _NUMBER.match(cleaned):
        return float(cleaned)
    fraction = _FRACTION.match(cleaned)
    if fraction and int(fraction.group(2)) != 0:
        return int(fraction.group(1)) / int(fraction.group(2))
    return None


def same_number(a: Optional[float], b: Optional[float]) -> bool:
    """Both parsed and equal up to float rounding."""
    return a is not None and b is not None and math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)
