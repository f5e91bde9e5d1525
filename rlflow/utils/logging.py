"""One logging format for the controller and every worker."""

from __future__ import annotations

import logging
import os

_FORMAT = "%(asctime)s %(levelname).1s [%(name)s] %(message)s"


def get_logger(name: str) -> logging.Logger:
    """A logger under the ``rlflow`` namespace; level from ``RLFLOW_LOG_LEVEL`` (default INFO)."""
    root = logging.getLogger("rlflow")
    if not root.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter(_FORMAT, datefmt="%H:%M:%S"))
        root.addHandler(handler)
        root.setLevel(os.environ.get("RLFLOW_LOG_LEVEL", "INFO").upper())
        root.propagate = False
    return logging.getLogger(name if name.startswith("rlflow") else f"rlflow.{name}")
