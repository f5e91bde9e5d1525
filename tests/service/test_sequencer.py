"""Per-model ordering: requests are admitted in seq_id order whatever order they arrive in; a gap is
refused once and skipped; a reused seq_id is refused, and a retry gets its first request id back."""

from __future__ import annotations

import asyncio

import pytest

from rlflow.service.scheduler import QueueFullError
from rlflow.service.sequencer import RequestSequencer, SeqIdError


async def _submit(sequencer: RequestSequencer, seq_id: int, order: list[int], delay: float = 0.0) -> None:
    await asyncio.sleep(delay)
    await sequencer.admit(seq_id)
    order.append(seq_id)
    await sequencer.release(seq_id, f"req-{seq_id}")


def test_requests_arriving_out_of_order_are_admitted_in_seq_id_order():
    async def run() -> list[int]:
        sequencer, order = RequestSequencer("m", first_seq_id=1, gap_wait_s=5.0), []
        arrivals = [(3, 0.0), (1, 0.02), (4, 0.01), (2, 0.03)]
        await asyncio.gather(*(_submit(sequencer, seq, order, delay) for seq, delay in arrivals))
        return order

    assert asyncio.run(run()) == [1, 2, 3, 4]


def test_a_gap_is_refused_once_and_the_requests_after_it_go_on():
    async def run() -> tuple[list[int], str]:
        sequencer, order = RequestSequencer("m", first_seq_id=1, gap_wait_s=0.2), []
        await _submit(sequencer, 1, order)
        with pytest.raises(SeqIdError) as refused:
            await _submit(sequencer, 3, order)  # 2 never comes
        await _submit(sequencer, 4, order)
        return order, str(refused.value)

    order, message = asyncio.run(run())
    assert order == [1, 4]
    assert "seq_id 3 came but 2..2 never did" in message


def test_a_used_seq_id_is_refused_and_a_retry_finds_its_request():
    async def run() -> None:
        sequencer, order = RequestSequencer("m"), []
        await _submit(sequencer, 1, order)
        assert sequencer.earlier_request(1) == "req-1"
        assert sequencer.earlier_request(2) is None
        with pytest.raises(SeqIdError, match="seq_id 1 was already used"):
            await sequencer.admit(1)

    asyncio.run(run())


class _Client:
    """Sends requests through ``sequencer`` to a queue whose room the test turns on and off (``room``)."""

    def __init__(self, gap_wait_s: float) -> None:
        self.sequencer, self.order, self.room = RequestSequencer("m", first_seq_id=1, gap_wait_s=gap_wait_s), [], False

    def check_room(self) -> None:
        if not self.room:
            raise QueueFullError("full")

    async def send(self, seq_id: int) -> None:
        self.sequencer.in_turn_with_room(seq_id, self.check_room)
        await _submit(self.sequencer, seq_id, self.order)


def test_a_request_refused_for_a_full_queue_keeps_its_seq_id_and_holds_back_the_later_ones():
    async def run() -> list[int]:
        client = _Client(gap_wait_s=5.0)
        for seq_id in (1, 2):
            with pytest.raises(QueueFullError, match="full"):
                await client.send(seq_id)
        client.room = True  # room again: 2's retry still waits for 1's, which then goes first
        with pytest.raises(QueueFullError, match="seq_id 2 waits for seq_id 1, refused for a full queue"):
            await client.send(2)
        await client.send(1)
        await client.send(2)
        return client.order

    assert asyncio.run(run()) == [1, 2]


def test_a_request_waiting_behind_one_refused_for_room_outwaits_the_gap_limit():
    async def run() -> list[int]:
        client = _Client(gap_wait_s=0.05)
        client.room = True
        second = asyncio.ensure_future(client.send(2))  # admitted past the room check, waits for 1
        await asyncio.sleep(0.01)
        client.room = False
        with pytest.raises(QueueFullError):
            await client.send(1)
        await asyncio.sleep(0.2)  # four gap limits: 1 came, so 2 keeps waiting for its retry
        client.room = True
        await client.send(1)
        await second
        return client.order

    assert asyncio.run(run()) == [1, 2]
