"""What the start-up checks' tests share (importable from every test folder: pytest puts ``tests/`` on
``sys.path`` for its root ``conftest.py``): ``one_line_error`` for a check called in-process, ``cli_refusal``
for a command run the way a user runs it."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Optional, Sequence

import pytest

from rlflow.errors import UserError

REPO = Path(__file__).resolve().parents[1]
# A refused command spends its CPU on imports and the checks: 15 s of it at most. Its wall time is bounded
# more loosely, because the test boxes run several suites on two cores (a refusal took 36 s of wall time
# for 12 s of CPU at a load of 10 there).
REFUSAL_CPU_S = 15.0
REFUSAL_WALL_S = 120.0


def one_line_error(compose: Callable[[list[str]], object], overrides: list[str],
                   error: type[Exception] = UserError) -> str:
    """The message of the ``error`` that ``compose(overrides)`` raises, which must be one line."""
    with pytest.raises(error) as raised:
        compose(overrides)
    message = str(raised.value)
    assert "\n" not in message, message
    return message


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def cli_refusal(argv: Sequence[str], ray_dir: Optional[Path] = None, env: Optional[dict[str, str]] = None,
                cwd: Path = REPO) -> str:
    """Run ``python <argv>``; it must exit 2 with one line on stderr (returned without its ``error: ``), within
    ``REFUSAL_CPU_S`` of CPU, and leave ``ray_dir`` (the run's ``trainer.ray_temp_dir``) uncreated: Ray never started."""
    cpu_before, start = _children_cpu_s(), time.monotonic()
    result = subprocess.run([sys.executable, *argv], cwd=cwd, capture_output=True, text=True, timeout=REFUSAL_WALL_S,
                            env={**os.environ, **(env or {})})
    cpu_s, wall_s = _children_cpu_s() - cpu_before, time.monotonic() - start
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), \
        f"exit {result.returncode}, stderr:\n{result.stderr[-3000:]}"
    assert cpu_s < REFUSAL_CPU_S, f"the refusal took {cpu_s:.1f} s of CPU ({wall_s:.1f} s wall)"
    assert ray_dir is None or not ray_dir.exists(), f"Ray started: {ray_dir} exists"
    return lines[0].removeprefix("error: ")
