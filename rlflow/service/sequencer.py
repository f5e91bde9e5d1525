"""Per-model request order: the SDK numbers each training client's requests ``seq_id`` 1, 2, 3 ...

It sends the next request as soon as the previous one was accepted, so an ``optim_step`` can
arrive while its ``forward_backward`` is still being admitted, and two requests can overtake each
other on the wire. ``RequestSequencer.admit(seq_id)`` holds a request until every earlier one has
been admitted (queued for its model, or refused), so the model's work queue receives them in
``seq_id`` order. A missing ``seq_id`` (a request lost before the server could read it) holds
the next one for at most ``gap_wait_s``: that one is refused as a gap, and the model goes on
after it. A ``seq_id`` seen before returns the request id it got the first time (a client retry).

A request refused because its worker group's queue is full (``in_turn_with_room``) does not use up its ``seq_id``:
the SDK sends it again after a back-off, and until it is admitted the model's later requests are refused the same
way, so the retries come back in order instead of leaving a gap.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from typing import Callable, Optional

from rlflow.errors import UserError
from rlflow.service.scheduler import QueueFullError

_REMEMBERED = 256  # recent seq_id -> request id pairs kept to answer retries
ROOM_WAIT_S = 300.0  # how long the SDK resends a request refused for a full queue (execute_with_retries)


class SeqIdError(UserError, ValueError):
    """A ``seq_id`` was already used, or an earlier one never arrived."""


class RequestSequencer:
    """Admits one model's requests in ``seq_id`` order (on the server's event loop)."""

    def __init__(self, model_id: str, first_seq_id: int = 1, gap_wait_s: float = 10.0) -> None:
        self.model_id = model_id
        self.next_seq_id = first_seq_id
        self.gap_wait_s = gap_wait_s
        self._turn = asyncio.Condition()
        self._waiting: set[int] = set()
        self._request_ids: OrderedDict[int, str] = OrderedDict()
        self._refused_for_room: set[int] = set()

    def earlier_request(self, seq_id: Optional[int]) -> Optional[str]:
        """The request id an earlier submission of ``seq_id`` got (a retry of it), else None."""
        return None if seq_id is None else self._request_ids.get(seq_id)

    def in_turn_with_room(self, seq_id: Optional[int], check_room: Callable[[], None]) -> None:
        """Raise ``QueueFullError`` when ``check_room`` does (the queue is full) or an earlier ``seq_id`` was refused
        so and not admitted since; either way ``seq_id`` stays unused, for the client's retry."""
        earlier = min((refused for refused in self._refused_for_room if refused < (seq_id or 0)), default=None)
        try:
            if earlier is not None:
                raise QueueFullError(f"model {self.model_id}: seq_id {seq_id} waits for seq_id {earlier}, refused "
                                     "for a full queue; send both again")
            check_room()
        except QueueFullError:
            if seq_id is not None:
                self._refused_for_room.add(seq_id)
            raise

    async def admit(self, seq_id: Optional[int]) -> None:
        """Return when ``seq_id`` is next; a request without one is admitted at once.

        Raises ``SeqIdError`` for a ``seq_id`` below the next one (or waiting already), and for a gap
        that stays open ``gap_wait_s``; the gap is then skipped, so the requests after it go on. A missing
        ``seq_id`` that came and was refused for a full queue is no gap: the wait for its retry goes on, for up to
        ``ROOM_WAIT_S`` (how long the SDK resends it).
        """
        if seq_id is None:
            return
        self._refused_for_room.discard(seq_id)  # it came back: from now on it holds later ones back only by waiting
        if seq_id < self.next_seq_id or seq_id in self._waiting:
            raise SeqIdError(f"model {self.model_id}: seq_id {seq_id} was already used (the next is {self.next_seq_id})")
        self._waiting.add(seq_id)
        deadline = time.monotonic() + ROOM_WAIT_S
        try:
            while True:
                try:
                    async with self._turn:
                        await asyncio.wait_for(self._turn.wait_for(lambda: self.next_seq_id >= seq_id), self.gap_wait_s)
                    break
                except asyncio.TimeoutError:  # the missing one came: refused for room (its retry comes) or being admitted
                    came = self.next_seq_id in self._refused_for_room or self.next_seq_id in self._waiting
                    if not came or time.monotonic() > deadline:
                        raise
        except asyncio.TimeoutError:
            missing = self.next_seq_id
            await self.release(seq_id)
            raise SeqIdError(f"model {self.model_id}: seq_id {seq_id} came but {missing}..{seq_id - 1} never did "
                             f"(waited {self.gap_wait_s:g} s); requests go on from {seq_id + 1}") from None
        finally:
            self._waiting.discard(seq_id)

    async def release(self, seq_id: Optional[int], request_id: Optional[str] = None) -> None:
        """``seq_id`` is done being admitted (queued as ``request_id``, or refused): let the next one in."""
        if seq_id is None:
            return
        if request_id is not None:
            self._request_ids[seq_id] = request_id
            while len(self._request_ids) > _REMEMBERED:
                self._request_ids.popitem(last=False)
        async with self._turn:
            self.next_seq_id = max(self.next_seq_id, seq_id + 1)
            self._turn.notify_all()
