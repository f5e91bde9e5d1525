"""The local cluster's watcher (rlflow/workers/cluster_reaper.py): nothing of a cluster outlives its driver.

A stand-in driver with children (one that ignores SIGTERM) and a grandchild checks the watcher
itself in a few seconds; one real ``init_ray`` cluster checks that Ray's agents, which otherwise
outlive a SIGKILLed driver by about a minute, end with it.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from rlflow.workers import cluster_reaper
from rlflow.workers.cluster_reaper import GRACE_S, POLL_S

REPO = Path(__file__).resolve().parents[2]
SLEEPER = [sys.executable, "-c", "import time; time.sleep(600)"]
STUBBORN = [sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); "
            "time.sleep(600)"]

STAND_IN_DRIVER = f"""
import importlib.util, subprocess, sys, time
spec = importlib.util.spec_from_file_location("cluster_reaper", {cluster_reaper.__file__!r})  # no Ray import: fast
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
older = subprocess.Popen({SLEEPER!r})  # the driver's child from before the watcher: never signalled
time.sleep(0.05)
reaper = module.ClusterReaper()
child = subprocess.Popen({SLEEPER!r})
stubborn = subprocess.Popen({STUBBORN!r}, stdout=subprocess.PIPE, text=True)
grandchild = subprocess.Popen([sys.executable, "-c", "import subprocess, time; p = subprocess.Popen({SLEEPER!r}); "
                               "print(p.pid, flush=True); time.sleep(600)"], stdout=subprocess.PIPE, text=True)
stubborn.stdout.readline()  # its SIGTERM handler is in place
print(child.pid, stubborn.pid, grandchild.stdout.readline().strip(), older.pid, flush=True)
time.sleep(2 * module.POLL_S)  # the watcher has looked them up
if sys.argv[1] == "stop":
    reaper.stop()
    print("stopped", flush=True)
time.sleep(600)
"""

RAY_DRIVER = """
import sys, time
from rlflow.workers import init_ray
init_ray(num_cpus=1, temp_dir=sys.argv[1])
print("up", flush=True)
time.sleep(600)
"""


def running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def gone_within(pids: list[int], timeout: float) -> list[int]:
    """The pids still running (zombies count as gone) after waiting up to ``timeout``."""
    deadline = time.monotonic() + timeout
    alive = pids
    while alive and time.monotonic() < deadline:
        time.sleep(0.1)
        alive = [pid for pid in alive if running(pid)]
    return alive


def kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def spawn_driver(code: str, *args: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, "-c", code, *args], cwd=REPO, env=env, stdout=subprocess.PIPE, text=True,
                            start_new_session=True)


def test_every_process_a_killed_driver_started_ends_within_the_grace_period():
    driver = spawn_driver(STAND_IN_DRIVER, "kill")
    try:
        child, stubborn, grandchild, older = (int(pid) for pid in driver.stdout.readline().split())
        time.sleep(2 * POLL_S)
        os.kill(driver.pid, signal.SIGKILL)
        driver.wait()
        struck = time.monotonic()
        assert gone_within([child, grandchild], timeout=2.0) == [], "SIGTERM did not reach the driver's descendants"
        assert gone_within([stubborn], timeout=GRACE_S + 3.0) == [], "the SIGTERM-proof process was not SIGKILLed"
        assert time.monotonic() - struck > GRACE_S - 0.5, "SIGKILL came before the grace period"
        assert running(older), "a child the driver had before the watcher started was signalled"
    finally:
        kill_group(driver.pid)  # anything left of a failed check


def test_a_stopped_watcher_signals_nothing_when_the_driver_ends_later():
    driver = spawn_driver(STAND_IN_DRIVER, "stop")
    try:
        pids = [int(pid) for pid in driver.stdout.readline().split()]
        assert driver.stdout.readline().strip() == "stopped"
        os.kill(driver.pid, signal.SIGKILL)
        driver.wait()
        time.sleep(GRACE_S + 1.0)
        assert all(running(pid) for pid in pids), "the watcher acted after stop()"
    finally:
        kill_group(driver.pid)


@pytest.mark.timeout(180)
def test_no_process_of_a_local_cluster_outlives_a_sigkilled_driver():
    ray_dir = tempfile.mkdtemp(prefix="r", dir="/tmp")  # Ray's socket paths must stay short
    driver = spawn_driver(RAY_DRIVER, ray_dir)
    try:
        assert driver.stdout.readline().strip() == "up"
        processes = psutil.Process(driver.pid).children(recursive=True)
        names = {process.name() for process in processes}
        assert {"ray::DashboardAgent", "ray::RuntimeEnvAgent"} <= names, names  # the two that used to stay ~60 s
        time.sleep(2 * POLL_S)  # the watcher has looked them up
        os.kill(driver.pid, signal.SIGKILL)
        driver.wait()
        left = gone_within([process.pid for process in processes], timeout=GRACE_S + 10.0)
        assert not left, f"still running after the driver's SIGKILL: {[p.name() for p in processes if p.pid in left]}"
    finally:
        kill_group(driver.pid)
        shutil.rmtree(ray_dir, ignore_errors=True)
