"""Wall-clock timers that accumulate into a metrics dict (``timing_s/<name>``)."""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Iterator


@contextmanager
def timed(name: str, timings: dict[str, float]) -> Iterator[None]:
    """Add the elapsed seconds of the block to ``timings[name]``."""
    start = time.perf_counter()
    try:
        yield
    finally:
        timings[name] = timings.get(name, 0.0) + time.perf_counter() - start
