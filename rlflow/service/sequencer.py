"""Per-model request order: the SDK numbers each training client's requests ``seq_id`` 1, 2, 3 ...

It sends the next request as soon as the previous one was accepted, so an ``optim_step`` can
arrive while its ``forward_backward`` is still being admitted, and two requests can overtake each
other on the wire. ``RequestSequencer.admit(seq_id)`` holds a request until every earlier one has
been admitted (queued for its model, or refused), so the model's work queue receives them in
``seq_id`` order. A missing ``seq_id`` (a request lost before the server could read it) holds
the next one for at most ``gap_wait_s``: that one is refused as a gap, and the model goes on
after it. A ``seq_id`` seen before returns the request id it got the first time (a client retry).
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from typing import Optional

from rlflow.errors import UserError

_REMEMBERED = 256  # recent seq_id -> request id pairs kept to answer retries


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

    def earlier_request(self, seq_id: Optional[int]) -> Optional[str]:
        """The request id an earlier submission of ``seq_id`` got (a retry of it), else None."""
        return None if seq_id is None else self._request_ids.get(seq_id)

    async def admit(self, seq_id: Optional[int]) -> None:
        """Return when ``seq_id`` is next; a request without one is admitted at once.

        Raises ``SeqIdError`` for a ``seq_id`` below the next one (or waiting already), and for a gap
        that stays open ``gap_wait_s``; the gap is then skipped, so the requests after it go on.
        """
        if seq_id is None:
            return
        if seq_id < self.next_seq_id or seq_id in self._waiting:
            raise SeqIdError(f"model {self.model_id}: seq_id {seq_id} was already used (the next is {self.next_seq_id})")
        self._waiting.add(seq_id)
        try:
            async with self._turn:
                await asyncio.wait_for(self._turn.wait_for(lambda: self.next_seq_id >= seq_id), self.gap_wait_s)
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
