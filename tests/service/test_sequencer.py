"""Per-model ordering: requests are admitted in seq_id order whatever order they arrive in; a gap is
refused once and skipped; a reused seq_id is refused, and a retry gets its first request id back."""

from __future__ import annotations

import asyncio

import pytest

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
