"""End every process a driver started when the driver is gone, however it went (a SIGKILL included).

**Why rlflow needs it.** A local cluster's GCS, raylet and helpers are started by ``ray.init``
with ``PR_SET_PDEATHSIG=SIGKILL``, so they die with the driver, and the workers die with the
raylet. The raylet's two agents (``ray::DashboardAgent``, ``ray::RuntimeEnvAgent``) notice the
raylet's death at once (a pipe from it closes), but when the raylet did not log a SIGTERM (it
was killed) each agent first reports "Termination is unexpected" to the GCS
(``ray._private.process_watcher.report_raylet_error_logs`` -> ``publish_error_to_driver``, with
a fixed 60 s timeout) before it exits. The GCS is dead too, so each agent outlives a SIGKILLed
driver by about a minute, re-parented to init. Ray 2.60 has no setting for that timeout.

**How.** ``init_ray`` starts this file as a small watcher process before it starts the cluster
(``ClusterReaper``: no Ray or rlflow import, in its own session so that a Ctrl-C or a kill of
the job's process group does not stop it first). While the driver lives, the watcher looks up
the driver's descendants every ``POLL_S`` and holds a pidfd for each: a pidfd keeps naming
that one process after it is re-parented, and a reused pid is never hit. When the driver is
gone, the watcher sends SIGTERM to every one of them still alive, SIGKILL to those alive
``GRACE_S`` later, and exits. ``shutdown_ray`` stops it first (``stop``): after a clean
``ray.shutdown`` nothing is left to end, and the driver's other children are not the watcher's
business while the driver lives. Only the driver's own descendants that started after the watcher
are ever signalled: no other run's or user's processes, and none the driver had before the cluster
(a notebook kernel's other children, say). A process started less than ``POLL_S`` before the driver died
can be missed; Ray's agents start with the cluster. Linux only (``/proc``, pidfds), like Ray's
own fate-sharing; elsewhere no watcher is started.

Tagging the cluster's processes through an environment variable was tried first and dropped:
``/proc/<pid>/environ`` of the agents, which set their process title, intermittently no longer
shows the variable.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

GRACE_S = 3.0  # from SIGTERM to SIGKILL
POLL_S = 1.0  # how often the watcher looks up the driver's descendants
STOP = b"stop\n"  # what ``ClusterReaper.stop`` writes: the cluster was shut down, end nothing
_STOP_WAIT_S = 10.0


class ClusterReaper:
    """The watcher of the driver's processes, seen from the driver: start it before the cluster, stop it after."""

    def __init__(self) -> None:
        self._process: Optional[subprocess.Popen] = None
        if sys.platform.startswith("linux"):
            self._process = subprocess.Popen(
                [sys.executable, "-I", str(Path(__file__).resolve()), str(os.getpid())],
                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, start_new_session=True,
            )

    def stop(self) -> None:
        """The cluster is shut down (or failed to start): the watcher exits without signalling anything."""
        if self._process is None:
            return
        try:
            self._process.stdin.write(STOP)
            self._process.stdin.close()
        except BrokenPipeError:  # it is gone already
            pass
        try:
            self._process.wait(timeout=_STOP_WAIT_S)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        self._process = None


def _stat(pid: int) -> tuple[int, str]:
    """``(parent pid, start time)`` of ``pid`` from ``/proc/<pid>/stat``."""
    with open(f"/proc/{pid}/stat", "rb") as handle:
        fields = handle.read().rsplit(b")", 1)[1].split()  # after "pid (comm)", which may hold spaces
    return int(fields[1]), fields[19].decode()


def _children_by_parent() -> dict[int, list[tuple[int, str]]]:
    """``{parent pid: [(pid, start time), ...]}`` of every process."""
    children: dict[int, list[tuple[int, str]]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                parent, started = _stat(int(entry))
            except (OSError, IndexError):  # ended meanwhile
                continue
            children.setdefault(parent, []).append((int(entry), started))
    return children


def _descendants(root: int) -> list[tuple[int, str]]:
    """``(pid, start time)`` of every descendant of ``root``."""
    children, found, queue = _children_by_parent(), [], [root]
    while queue:
        for child in children.get(queue.pop(), []):
            found.append(child)
            queue.append(child[0])
    return found


class _Tracked:
    """Pidfds of the driver's descendants seen so far, dropped once their process has ended."""

    def __init__(self, driver: int):
        self.driver = driver
        self.pidfds: dict[int, int] = {}
        self.since = int(_stat(os.getpid())[1])  # start time in clock ticks: older descendants are not tracked

    def update(self) -> None:
        for pid, started in _descendants(self.driver):
            if pid in self.pidfds or pid == os.getpid() or int(started) < self.since:
                continue
            try:
                pidfd = os.pidfd_open(pid)
                if _stat(pid)[1] != started:  # the pid was reused since the lookup: not a descendant
                    os.close(pidfd)
                    continue
            except OSError:
                continue
            self.pidfds[pid] = pidfd
        ended, _, _ = select.select(list(self.pidfds.values()), [], [], 0)
        for pid, pidfd in list(self.pidfds.items()):
            if pidfd in ended:
                os.close(self.pidfds.pop(pid))

    def end_all(self) -> None:
        """SIGTERM each, then SIGKILL the ones alive ``GRACE_S`` later."""
        pidfds = list(self.pidfds.values())
        _signal_all(pidfds, signal.SIGTERM)
        _signal_all(_still_alive(pidfds, GRACE_S), signal.SIGKILL)


def _signal_all(pidfds: list[int], signum: int) -> None:
    for pidfd in pidfds:
        try:
            signal.pidfd_send_signal(pidfd, signum)
        except ProcessLookupError:
            pass


def _still_alive(pidfds: list[int], timeout: float) -> list[int]:
    """Wait up to ``timeout`` for the processes to end; returns the pidfds of those still alive."""
    deadline = time.monotonic() + timeout
    alive = list(pidfds)
    while alive and (remaining := deadline - time.monotonic()) > 0:
        ended, _, _ = select.select(alive, [], [], remaining)  # a pidfd is readable once its process ended
        alive = [pidfd for pidfd in alive if pidfd not in ended]
    return alive


def watch(driver_pid: int) -> None:
    """Track the driver's descendants until it stops us (``STOP`` on stdin) or ends; then end what it left."""
    try:
        driver = os.pidfd_open(driver_pid)
    except OSError:  # gone before we started: its children are re-parented already
        return
    tracked = _Tracked(driver_pid)
    while True:
        tracked.update()
        ready, _, _ = select.select([driver, sys.stdin.fileno()], [], [], POLL_S)
        if driver in ready:
            break
        if ready:  # stdin: STOP, or EOF when the driver died (its exit closes the pipe before the pidfd fires)
            if os.read(sys.stdin.fileno(), len(STOP)) == STOP:
                return
            break
    tracked.end_all()


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    watch(int(sys.argv[1]))
