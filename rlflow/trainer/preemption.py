"""Preemption: SIGTERM asks the driver to checkpoint at the next safe point and exit cleanly.

A scheduler that preempts a job sends SIGTERM and, after a grace period, SIGKILL. Inside
``with PreemptionFlag() as flag:`` the first SIGTERM only sets ``flag.requested``; the driver
loop checks it at the end of each step, logs and checkpoints that step, and returns without the
final export, so the process exits with status 0 and the same command resumes the run.

Install it after ``ray.init`` (Ray sets its own SIGTERM handler there); on leaving the block the
previous handler is back. In any thread but the main one the flag is inert (Python delivers
signals to the main thread only).
"""

from __future__ import annotations

import signal
import threading
from types import FrameType
from typing import Any, Optional

from rlflow.utils.logging import get_logger

logger = get_logger(__name__)


class PreemptionFlag:
    """Context manager whose ``requested`` turns true when the process receives SIGTERM."""

    def __init__(self) -> None:
        self.requested = False
        self._previous: Any = None
        self._installed = False

    def _handle(self, signum: int, frame: Optional[FrameType]) -> None:
        if not self.requested:
            logger.warning("SIGTERM received: checkpointing at the end of the current step, then exiting")
        self.requested = True

    def __enter__(self) -> "PreemptionFlag":
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, self._handle)
            self._installed = True
        return self

    def __exit__(self, *exc_info: Any) -> None:
        if self._installed:
            signal.signal(signal.SIGTERM, self._previous)
            self._installed = False
