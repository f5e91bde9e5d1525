r"""MATH's final-answer convention: the answer is the content of the last ``\boxed{...}`` (or ``\fbox{...}``).

Shared by the MATH reward (``rlflow.rewards.math_boxed``) and the MATH converter
(``rlflow.data.converters.math``), which takes a solution's last box as the ground truth.
"""

from __future__ import annotations

from typing import Optional

_BOX_COMMANDS = ("\\boxed", "\\fbox")


def last_boxed(text: str) -> Optional[str]:
    r"""The content of the last ``\boxed{...}`` with balanced braces (or ``\boxed x``); None if absent or unclosed."""
    start = max(text.rfind(command) for command in _BOX_COMMANDS)
    if start < 0:
        return None
    command = next(c for c in _BOX_COMMANDS if text.startswith(c, start))
    after = text[start + len(command):]
    braced = after.lstrip()
    if braced.startswith("{"):
        depth = 0
        for position, char in enumerate(braced):
            depth += {"{": 1, "}": -1}.get(char, 0)
            if depth == 0:
                return braced[1:position]
        return None
    if after.startswith(" "):  # "\boxed 5$"
        return after.strip().split("$")[0].strip() or None
    return None
