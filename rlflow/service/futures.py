"""Futures: what an asynchronous Tinker request returns at once, polled later through ``retrieve_future``.

Every training or sampling request is answered with a request id before any work runs (the SDK
times a submission out after 60 s and would resubmit). The result is kept until the client
fetches it, and then for ``keep_s`` more seconds in case the fetch's answer was lost; a result
nobody fetches expires after ``expire_s``. A poll waits for the result up to ``poll_wait_s``
(long polling: the SDK polls again at once on "try again", so answering immediately would spin it).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from dataclasses import dataclass, field
from typing import Any, Optional, Union

from rlflow.errors import UserError

# A finished request's answer: a JSON-able dict, or (content type, bytes) for protobuf results.
Payload = Union[dict[str, Any], tuple[str, bytes]]


@dataclass
class Outcome:
    """A finished request: its payload, or an error message with the SDK's category (user | server)."""

    payload: Optional[Payload] = None
    error: Optional[str] = None
    category: str = "server"

    def as_json(self) -> Payload:
        """The body ``retrieve_future`` answers with."""
        if self.error is not None:
            return {"error": self.error, "category": self.category}
        return self.payload


@dataclass
class _Entry:
    account: str
    done: asyncio.Event = field(default_factory=asyncio.Event)
    outcome: Optional[Outcome] = None
    created: float = field(default_factory=time.monotonic)
    fetched: Optional[float] = None


class UnknownFutureError(UserError, KeyError):
    """No request with this id is pending or kept (never made, or expired)."""

    def __str__(self) -> str:  # KeyError quotes its message; this is a sentence
        return f"request {self.args[0]!r} is unknown or its result expired"


class FutureStore:
    """Request ids and their outcomes, on the server's event loop (not thread-safe: call from the loop)."""

    def __init__(self, poll_wait_s: float = 25.0, keep_s: float = 300.0, expire_s: float = 3600.0) -> None:
        self.poll_wait_s = poll_wait_s
        self.keep_s = keep_s
        self.expire_s = expire_s
        self._entries: dict[str, _Entry] = {}
        self._ids = itertools.count()

    def create(self, account: str) -> str:
        """A new pending request id, which only ``account`` may retrieve."""
        self._expire()
        request_id = f"req-{next(self._ids)}"
        self._entries[request_id] = _Entry(account)
        return request_id

    def finish(self, request_id: str, outcome: Outcome) -> None:
        """Record ``outcome`` and wake the polls waiting on it."""
        entry = self._entries.get(request_id)
        if entry is not None and entry.outcome is None:
            entry.outcome = outcome
            entry.done.set()

    async def retrieve(self, request_id: str, account: str) -> Optional[Outcome]:
        """The outcome, waiting up to ``poll_wait_s``; None if the request is still running. Another account's
        request is unknown (``UnknownFutureError``)."""
        entry = self._entries.get(request_id)
        if entry is None or entry.account != account:
            raise UnknownFutureError(request_id)
        try:
            await asyncio.wait_for(entry.done.wait(), self.poll_wait_s)
        except asyncio.TimeoutError:
            return None
        entry.fetched = entry.fetched or time.monotonic()
        return entry.outcome

    def _expire(self) -> None:
        now = time.monotonic()
        stale = [
            request_id
            for request_id, entry in self._entries.items()
            if (entry.fetched is not None and now - entry.fetched > self.keep_s)
            or (entry.outcome is not None and now - entry.created > self.expire_s)
        ]
        for request_id in stale:
            del self._entries[request_id]
