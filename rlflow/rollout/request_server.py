"""``RequestServer``: many concurrent ``generate`` calls from coroutines, served by one replica's engine.

The agent loops are coroutines: each awaits ``server.generate(...)`` for a model turn, runs its tools
or environment, and awaits the next turn. ``serve(work)`` runs ``work`` (usually ``asyncio.gather``
over every trajectory of this replica's share) on an event loop in the rollout worker's own
thread, stepping the engine whenever a request is queued, so every request in flight shares each
engine step (continuous batching) and weight sync stays in-process. One engine step blocks the
loop while it runs; tools that wait on processes (``python``) overlap with it.

**Weight changes while serving (partial rollouts).** Another thread can ``pause`` the server between
two engine steps, change the engine's weights while it is parked, and ``resume`` it with the new policy
version. At the pause every request in flight is aborted, keeping the tokens it has sampled
(``BaseRollout.abort_keeping``), and after the resume it is sent again as its prompt plus those tokens,
with the rest of its budget; its caller sees one completion. Every completion carries ``versions``, the
policy version that sampled each of its tokens.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from dataclasses import replace
from typing import Awaitable, Optional, TypeVar

from rlflow.rollout.base import BaseRollout
from rlflow.rollout.requests import Completion, GenerationRequest

T = TypeVar("T")
RESUMED = ".resumed-"  # a request id's suffix, with the part's number, when it is sent again after a pause


class RequestServer:
    """Serves ``generate`` requests from coroutines on ``rollout``; used inside ``serve`` only. ``version`` is the
    policy version of the engine's weights."""

    def __init__(self, rollout: BaseRollout, version: int = 0):
        self.rollout = rollout
        self.version = version
        self._waiting: dict[str, asyncio.Future] = {}
        self._ids = itertools.count()
        self._queued: Optional[asyncio.Event] = None
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._preempted: set[str] = set()
        self._pause_asked, self._parked, self._resumed = threading.Event(), threading.Event(), threading.Event()

    async def generate(self, request: GenerationRequest, request_id: Optional[str] = None) -> Completion:
        """Queue ``request`` and wait for its completion (``finish_reason`` ``abort`` if ``abort`` drops it); a
        request preempted by a pause is resumed from its sampled tokens and completes once."""
        if self._queued is None:
            raise RuntimeError("RequestServer.generate runs only inside RequestServer.serve(...)")
        request_id = request_id or f"req-{next(self._ids)}"
        tokens: list[int] = []
        log_probs: list[float] = []
        versions: list[int] = []
        part_id, parts = request_id, itertools.count(1)
        while True:
            sent = request if not tokens else replace(
                request, prompt_ids=request.prompt_ids + tuple(tokens),
                sampling=replace(request.sampling, max_new_tokens=request.sampling.max_new_tokens - len(tokens)))
            version = self.version
            completion = await self._submit(part_id, sent)
            tokens += completion.token_ids
            log_probs += completion.log_probs or ()
            versions += [version] * len(completion.token_ids)
            preempted = part_id in self._preempted
            self._preempted.discard(part_id)
            if not preempted or len(tokens) >= request.sampling.max_new_tokens:
                reason = completion.finish_reason if not preempted else "length"
                values = tuple(log_probs) if completion.log_probs is not None else None
                return Completion(tuple(tokens), values, reason, tuple(versions))
            part_id = f"{request_id}{RESUMED}{next(parts)}"

    async def _submit(self, request_id: str, request: GenerationRequest) -> Completion:
        if request_id in self._waiting:
            raise ValueError(f"request id {request_id!r} is already in flight")
        future = asyncio.get_running_loop().create_future()
        self._waiting[request_id] = future
        self.rollout.add_request(request_id, request)
        self._queued.set()
        return await future

    def abort(self, request_ids: list[str]) -> None:
        """Drop in-flight requests (resumed or not); their ``generate`` calls return an ``abort`` completion with
        the tokens of their parts before a pause, if any."""
        wanted = set(request_ids)
        request_ids = [part for part in self._waiting if part.split(RESUMED)[0] in wanted] or request_ids
        self.rollout.abort(request_ids)
        for request_id in request_ids:
            self._finish(request_id, Completion((), None if not self.rollout.calculate_log_probs else (), "abort"))

    def pause(self) -> None:
        """From another thread, while this server serves or is about to: park it between two engine steps (module
        doc); returns once parked, or once serving ended (``release_pause``). The caller may then change the
        engine's weights, then ``resume``."""
        self._pause_asked.set()
        loop, queued = self._loop, self._queued
        if loop is not None and queued is not None:
            try:
                loop.call_soon_threadsafe(queued.set)  # wake a loop that waits for requests
            except RuntimeError:  # the loop closed meanwhile: serving ended, release_pause unblocks us
                pass
        self._parked.wait()

    def release_pause(self) -> None:
        """Serving is over (or never started): a ``pause`` waiting for it returns."""
        if self._pause_asked.is_set():
            self._parked.set()

    def resume(self, version: int) -> None:
        """From another thread: the engine holds policy ``version``; go on serving (a no-op when not parked)."""
        self.version = version
        if self._parked.is_set():
            self._resumed.set()

    def serve(self, work: Awaitable[T]) -> T:
        """Run ``work`` to its end while stepping the engine; returns its result.

        An exception in ``work`` aborts what it left in flight and propagates.
        """
        try:
            self.rollout.check_weights()
            return asyncio.run(self._serve(work))
        finally:
            self.release_pause()

    async def _serve(self, work: Awaitable[T]) -> T:
        self._queued, self._loop = asyncio.Event(), asyncio.get_running_loop()
        task = asyncio.ensure_future(work)
        try:
            while not task.done():
                if self._pause_asked.is_set():
                    await self._park()
                    continue
                if self.rollout.has_unfinished():
                    self._step()
                    await asyncio.sleep(0)  # let the coroutines take their completions and queue their next turns
                    continue
                self._queued.clear()
                queued = asyncio.ensure_future(self._queued.wait())
                await asyncio.wait({task, queued}, return_when=asyncio.FIRST_COMPLETED)
                queued.cancel()
            return task.result()
        finally:
            self._loop = None
            if self._waiting:
                self.rollout.abort(list(self._waiting))

    def _step(self) -> None:
        for request_id, completion in self.rollout.step():
            self._finish(request_id, completion)

    def _finish(self, request_id: str, completion: Completion) -> None:
        future = self._waiting.pop(request_id, None)
        if future is not None and not future.done():
            future.set_result(completion)

    async def _park(self) -> None:
        for request_id, partial in self.rollout.abort_keeping(list(self._waiting)).items():
            self._preempted.add(request_id)
            self._finish(request_id, partial)
        self._parked.set()
        self._resumed.wait()  # the loop's thread waits here while the pausing thread changes the weights
        self._resumed.clear()
        self._pause_asked.clear()
        self._parked.clear()
