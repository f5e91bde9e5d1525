"""A reward function that hangs (``reward.custom_function=tests/faults/hang_reward.py:sleeping_reward``).

Light on purpose (no torch import), so a reward worker process reaches the hang at once. Each
hang first leaves a marker file ``hang-<pid>`` holding ``time.time()`` in the folder named by
``$RLFLOW_FAULT_MARKERS`` (unset: none), so a test knows which process hung and when;
``timeout_plugin.py`` uses the same ``hang``.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

HANG_S = 3600.0
MARKER_ENV = "RLFLOW_FAULT_MARKERS"


def hang() -> None:
    """Leave the marker, then sleep past any test's lifetime."""
    folder = os.environ.get(MARKER_ENV)
    if folder:
        Path(folder, f"hang-{os.getpid()}").write_text(repr(time.time()))
    time.sleep(HANG_S)


def sleeping_reward(data_source: str, solution_str: str, ground_truth: Any, extra_info: Any) -> float:
    """Never returns within any test's lifetime."""
    hang()
    return 0.0
