"""Watching a ``main_ppo`` run from a test: the phases its processes entered (``phase_plugin.py``'s markers), the
steps it logged, and the worker processes it started."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Callable

import psutil

from tests.ppo.conftest import read_jsonl


def phase_lines(markers: Path, phase: str) -> list[tuple[int, float]]:
    """(pid, time) of each entry into ``phase`` so far."""
    path = markers / "phases"
    lines = path.read_text().splitlines() if path.exists() else []
    return [(int(pid), float(when)) for name, pid, when in (line.split() for line in lines) if name == phase]


def logged_steps(run_dir: Path) -> list[int]:
    """The steps of the run's ``metrics.jsonl`` so far, in the order logged."""
    path = run_dir / "metrics.jsonl"
    return [record["step"] for record in read_jsonl(path)] if path.exists() else []


def wait_for(proc: subprocess.Popen, ready: Callable[[], object], what: str, timeout: float = 900):
    """Poll ``ready`` until it gives a true value, which is returned; fails if the run ends first or ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    while not (value := ready()):
        assert proc.poll() is None, f"main_ppo exited with {proc.returncode} before {what}:\n{proc.stdout.read()[-3000:]}"
        assert time.monotonic() < deadline, f"never saw {what}"
        time.sleep(0.05)
    return value


def worker_hosts(driver: int) -> list[psutil.Process]:
    """The ``WorkerHost`` processes (Ray workers of rlflow's groups) among the driver's descendants."""
    hosts = []
    for child in psutil.Process(driver).children(recursive=True):
        try:
            if "WorkerHost" in " ".join(child.cmdline()):
                hosts.append(child)
        except psutil.NoSuchProcess:
            pass
    return hosts
