"""``LiveWeights``: a rollout replica's policy version, and weight changes that reach it while it generates.

In ``fully_async`` training with partial rollouts, a weight sync reaches a rollout worker on its second
thread (``@register(concurrent=True)``) while a generation call is being served on the first. The
generation thread serves each call inside ``serving(server, min_version)``: it waits for the weights of
``min_version`` (a sync sent before the call may run after it starts, being on the other thread), then
registers its ``RequestServer``. ``change(version, install)`` parks the registered server between two
engine steps (``RequestServer.pause``: its requests in flight are aborted, to be resumed from their sampled
tokens), runs ``install`` (which puts the new weights in the engine), and resumes the server at
``version``; with nothing being served it just installs. Any other use of the engine (a batched
generation, an in-order weight sync) runs inside ``exclusive()``, which a change waits for, so the
engine is never used by both threads.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Callable, Iterator, Optional, TypeVar

from rlflow.rollout.request_server import RequestServer

T = TypeVar("T")


class LiveWeights:
    """The version of one replica's weights and the server (if any) generating with them."""

    def __init__(self, version: int = 0):
        self.version = version
        self._changed = threading.Condition()
        self._server: Optional[RequestServer] = None

    @contextmanager
    def serving(self, server: RequestServer, min_version: int, timeout_s: Optional[float]) -> Iterator[RequestServer]:
        """Generation thread: wait (at most ``timeout_s``; None: no limit) for weights of at least ``min_version``,
        then serve with ``server`` until the block ends."""
        with self._changed:
            if not self._changed.wait_for(lambda: self.version >= min_version, timeout=timeout_s):
                raise TimeoutError(f"the rollout holds policy version {self.version}; the weights of version "
                                   f"{min_version} did not arrive within {timeout_s:g} s")
            server.version, self._server = self.version, server
        try:
            yield server
        finally:
            server.release_pause()  # first: a change waiting for this server holds the lock below
            with self._changed:
                self._server = None

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        """Use the engine outside ``serving`` (a batched generation, an in-order weight sync); a change waits."""
        with self._changed:
            yield

    def change(self, version: int, install: Callable[[], T]) -> T:
        """Second thread: put new weights in the engine (``install``) as policy ``version``, parking the server in use
        meanwhile."""
        with self._changed:
            server = self._server
            if server is not None:
                server.pause()
            try:
                result = install()
                self.version = version
            finally:
                if server is not None:
                    server.resume(self.version)
                self._changed.notify_all()
        return result
