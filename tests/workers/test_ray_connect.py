"""Joining a Ray cluster is bounded: nothing listening is one line at once, a head that never answers ends the
process after ``trainer.timeouts.connect_s``, and SIGTERM while joining ends it at once.

The silent head is a TCP socket that completes connections (the kernel's backlog) and never speaks: ``ray.init``
would retry it forever.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from one_line_errors import cli_refusal
from ray._private.services import resolve_ip_for_localhost

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def silent_head():
    """``host:port`` of a listener that accepts TCP connections into its backlog and never answers."""
    host = resolve_ip_for_localhost("127.0.0.1")  # where ray.init (and the probe) will connect for 127.0.0.1
    with socket.socket() as listener:
        listener.bind((host, 0))
        listener.listen(16)
        yield listener, f"127.0.0.1:{listener.getsockname()[1]}"


def _join(address: str, timeout_s: float) -> subprocess.Popen:
    code = f"from rlflow.workers import init_ray; init_ray(address={address!r}, connect_timeout_s={timeout_s})"
    return subprocess.Popen([sys.executable, "-c", code], cwd=REPO, stderr=subprocess.PIPE, text=True)


def test_a_head_that_never_answers_ends_the_process_after_the_limit(silent_head):
    _, address = silent_head
    process = _join(address, 3.0)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 2, stderr[-2000:]
    assert stderr.strip().splitlines()[-1].startswith(f"error: connecting to the Ray cluster at {address!r} "
                                                      "(trainer.ray_address or RAY_ADDRESS) did not finish within 3 s")


def test_sigterm_while_joining_ends_the_process_at_once(silent_head):
    listener, address = silent_head
    process = _join(address, 600.0)
    listener.settimeout(120)
    listener.accept()[0].close()  # the probe's connection: the process is about to call ray.init
    time.sleep(2.0)  # inside ray.init now
    sent = time.monotonic()
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 128 + signal.SIGTERM and time.monotonic() - sent < 10, stderr[-2000:]
    assert stderr.strip().splitlines()[-1].startswith(f"error: SIGTERM while connecting to the Ray cluster at {address!r}")


def test_main_ppo_with_ray_address_pointing_nowhere_is_one_line_before_ray(tmp_path):
    line = cli_refusal(["-m", "rlflow.trainer.main_ppo", f"trainer.default_local_dir={tmp_path / 'run'}"],
                       env={"RAY_ADDRESS": "127.0.0.1:1"})
    assert line.startswith("cannot join the Ray cluster at '127.0.0.1:1' (trainer.ray_address or RAY_ADDRESS): "
                           "connection to ") and "refused, nothing listens there" in line, line
    assert not (tmp_path / "run").exists()
