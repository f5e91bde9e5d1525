"""Joining a running Ray cluster without an unbounded wait.

``ray.init(address=...)`` retries a head that does not answer forever (measured: over 90 s of
"Failed to connect to GCS" lines for ``127.0.0.1:1``), and it cannot be interrupted from Python while
it does. So before it is called:

* ``join_address`` is the cluster a run joins: ``trainer.ray_address``, else ``RAY_ADDRESS`` (which
  ``ray.init`` would read too);
* ``probe_cluster`` opens a TCP connection to the head's GCS port: refused is one line at once
  (nothing listens there), an unreachable head is retried until the limit, then one line;
* ``connect_deadline`` guards the ``ray.init`` call itself: a SIGTERM ends the process at once
  (status 143), and a connection still not made at the limit ends it with one line and exit status 2.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading
import time
from contextlib import contextmanager
from typing import Any, Iterator, Optional

from ray._private.services import canonicalize_bootstrap_address, parse_address

from rlflow.errors import UserError

ADDRESS_KEY = "trainer.ray_address"
TIMEOUT_KEY = "trainer.timeouts.connect_s"
_PROBE_INTERVAL_S = 1.0
_SIGNAL_POLL_S = 0.2  # how often the SIGTERM waiter looks whether the connection is made
_SIGTERM_STATUS = 128 + signal.SIGTERM


class RayConnectError(UserError, ConnectionError):
    """The Ray cluster a run joins cannot be reached; the message names the address and the key."""


def join_address(address: Optional[str]) -> Optional[str]:
    """The cluster a run joins: ``address`` (``trainer.ray_address``), else ``RAY_ADDRESS``; None: start a local one."""
    joined = address if address is not None else os.environ.get("RAY_ADDRESS") or None
    return None if joined == "local" else joined


def _where(address: str) -> str:
    return f"Ray cluster at {address!r} ({ADDRESS_KEY} or RAY_ADDRESS)"


def probe_cluster(address: str, timeout_s: float) -> str:
    """The head's ``host:port`` once it accepts a TCP connection; ``RayConnectError`` if nothing listens there, or if it
    is not reachable within ``timeout_s``. A Ray Client address (``ray://host:port``) is returned as it is: the client
    connects with bounded retries of its own (and ``connect_deadline`` bounds the call)."""
    if "://" in address:
        return address
    try:
        bootstrap = canonicalize_bootstrap_address(address)
    except (ConnectionError, ValueError) as error:
        raise RayConnectError(f"cannot join the {_where(address)}: {str(error).splitlines()[0]}") from None
    if bootstrap is None:
        raise RayConnectError(f"cannot join the {_where(address)}: no running cluster found on this machine; start one "
                              "with `ray start --head`, or unset it to start a local cluster")
    host, port = parse_address(bootstrap)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with socket.create_connection((host, int(port)), timeout=max(0.1, min(5.0, deadline - time.monotonic()))):
                return bootstrap
        except ConnectionRefusedError:
            raise RayConnectError(f"cannot join the {_where(address)}: connection to {bootstrap} refused, nothing listens "
                                  "there; start the cluster (`ray start --head`) or fix the address") from None
        except OSError as error:
            if time.monotonic() >= deadline:
                raise RayConnectError(f"cannot join the {_where(address)}: {bootstrap} did not answer within "
                                      f"{timeout_s:g} s ({error.strerror or error}); check the address and the network, "
                                      f"or raise {TIMEOUT_KEY}") from None
            time.sleep(_PROBE_INTERVAL_S)


def check_cluster_reachable(trainer: Any) -> None:
    """Config loading's check of a run that joins a cluster: its head answers (``probe_cluster``), before Ray starts."""
    joined = join_address(trainer.ray_address)
    if joined is not None:
        probe_cluster(joined, float(trainer.timeouts.connect_s))


def _exit_now(message: str, status: int) -> None:
    print(f"error: {message}", file=sys.stderr, flush=True)
    os._exit(status)  # ray.init is in native code: no exception reaches it, and the process must not linger


@contextmanager
def connect_deadline(address: str, timeout_s: float) -> Iterator[None]:
    """Around ``ray.init``: SIGTERM exits at once with one line (status 143), and a connection not made within
    ``timeout_s`` exits with one line (status 2).

    ``ray.init`` loops in native code and runs Python signal handlers only between its retries (tens of seconds
    apart), so SIGTERM is blocked in this thread (and the threads Ray starts inherit that) and taken by a thread
    of its own that waits for it. Should it reach Ray's own handler anyway (``sys.exit(15)``, installed for the
    call), that ``SystemExit`` becomes the same line.
    """
    message = f"SIGTERM while connecting to the {_where(address)}; nothing was started"
    watchdog = threading.Timer(timeout_s, _exit_now, (f"connecting to the {_where(address)} did not finish within "
                                                      f"{timeout_s:g} s; raise {TIMEOUT_KEY} or check the cluster", 2))
    watchdog.daemon = True
    done = threading.Event()

    def wait_for_sigterm() -> None:
        while not done.is_set():
            if signal.sigtimedwait([signal.SIGTERM], _SIGNAL_POLL_S) is not None:
                _exit_now(message, _SIGTERM_STATUS)

    previous_mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    waiter = threading.Thread(target=wait_for_sigterm, name="rlflow-connect-sigterm", daemon=True)
    waiter.start()
    watchdog.start()
    try:
        yield
    except SystemExit as stop:
        if stop.code == signal.SIGTERM:
            _exit_now(message, _SIGTERM_STATUS)
        raise
    finally:
        watchdog.cancel()
        done.set()
        waiter.join()
        signal.pthread_sigmask(signal.SIG_SETMASK, previous_mask)
