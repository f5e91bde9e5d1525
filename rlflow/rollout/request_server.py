"""``RequestServer``: many concurrent ``generate`` calls from coroutines, served by one replica's engine.

The agent loops are coroutines: each awaits ``server.generate(...)`` for a model turn, runs its tools
or environment, and awaits the next turn. ``serve(work)`` runs ``work`` (usually ``asyncio.gather``
over every trajectory of this replica's share) on an event loop in the rollout worker's own
thread, stepping the engine whenever a request is queued, so every request in flight shares each
engine step (continuous batching) and weight sync stays in-process. One engine step blocks the
loop while it runs; tools that wait on processes (``python``) overlap with it.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Awaitable, Optional, TypeVar

from rlflow.rollout.base import BaseRollout
from rlflow.rollout.requests import Completion, GenerationRequest

T = TypeVar("T")


class RequestServer:
    """Serves ``generate`` requests from coroutines on ``rollout``; used inside ``serve`` only."""

    def __init__(self, rollout: BaseRollout):
        self.rollout = rollout
        self._waiting: dict[str, asyncio.Future] = {}
        self._ids = itertools.count()
        self._queued: Optional[asyncio.Event] = None

    async def generate(self, request: GenerationRequest, request_id: Optional[str] = None) -> Completion:
        """Queue ``request`` and wait for its completion (``finish_reason`` ``abort`` if ``abort`` drops it)."""
        if self._queued is None:
            raise RuntimeError("RequestServer.generate runs only inside RequestServer.serve(...)")
        request_id = request_id or f"req-{next(self._ids)}"
        if request_id in self._waiting:
            raise ValueError(f"request id {request_id!r} is already in flight")
        future = asyncio.get_running_loop().create_future()
        self._waiting[request_id] = future
        self.rollout.add_request(request_id, request)
        self._queued.set()
        return await future

    def abort(self, request_ids: list[str]) -> None:
        """Drop in-flight requests; their ``generate`` calls return an empty ``abort`` completion."""
        self.rollout.abort(request_ids)
        for request_id in request_ids:
            future = self._waiting.pop(request_id, None)
            if future is not None and not future.done():
                future.set_result(Completion((), None if not self.rollout.calculate_log_probs else (), "abort"))

    def serve(self, work: Awaitable[T]) -> T:
        """Run ``work`` to its end while stepping the engine; returns its result.

        An exception in ``work`` aborts what it left in flight and propagates.
        """
        self.rollout.check_weights()
        return asyncio.run(self._serve(work))

    async def _serve(self, work: Awaitable[T]) -> T:
        self._queued = asyncio.Event()
        task = asyncio.ensure_future(work)
        try:
            while not task.done():
                if self.rollout.has_unfinished():
                    for request_id, completion in self.rollout.step():
                        future = self._waiting.pop(request_id, None)
                        if future is not None and not future.done():
                            future.set_result(completion)
                    await asyncio.sleep(0)  # let the coroutines take their completions and queue their next turns
                    continue
                self._queued.clear()
                queued = asyncio.ensure_future(self._queued.wait())
                await asyncio.wait({task, queued}, return_when=asyncio.FIRST_COMPLETED)
                queued.cancel()
            return task.result()
        finally:
            if self._waiting:
                self.rollout.abort(list(self._waiting))
                self._waiting.clear()
            if not task.done():
                task.cancel()
            self._queued = None
