"""A host's job order: each client's jobs in order, oldest first across clients, and no other client's
engine job while one holds gradients (forward_backward without its optim_step), except sampling; a holder
that goes quiet loses its gradients before anyone else runs."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

from rlflow.service.scheduler import HostScheduler, Job


def _run(submissions: list[tuple[float, str | None, str, str]], hold_s: float = 5.0) -> list[str]:
    """Submit ``(delay, owner, name, kind)`` jobs (kind: fb | step | other) and return the order they ran in."""
    ran: list[str] = []

    async def main() -> None:
        executor = ThreadPoolExecutor(max_workers=1)
        scheduler = HostScheduler(executor, lambda owner: ran.append(f"drop {owner}"), hold_s)
        finished = asyncio.Event()
        count = len(submissions)

        def done(_task) -> None:
            nonlocal count
            count -= 1
            if count == 0:
                finished.set()

        for delay, owner, name, kind in submissions:
            await asyncio.sleep(delay)
            scheduler.submit(Job(owner, lambda name=name: ran.append(name), done,
                                 accumulates=kind == "fb", steps=kind == "step"))
        await asyncio.wait_for(finished.wait(), 10)
        executor.shutdown()

    asyncio.run(main())
    return ran


def test_no_other_client_runs_between_a_forward_backward_and_its_optim_step():
    order = _run([(0, "a", "a.fb", "fb"), (0, "b", "b.fb", "fb"), (0, None, "sample", "other"),
                  (0.05, "a", "a.step", "step"), (0, "b", "b.step", "step")])
    assert order == ["a.fb", "sample", "a.step", "b.fb", "b.step"]


def test_jobs_without_gradients_go_oldest_first():
    order = _run([(0, "a", "a.save", "other"), (0, "b", "b.save", "other"), (0, "a", "a.forward", "other")])
    assert order == ["a.save", "b.save", "a.forward"]


def test_a_holder_that_goes_quiet_loses_its_gradients_before_the_others_run():
    order = _run([(0, "a", "a.fb", "fb"), (0, "b", "b.fb", "fb"), (0, "b", "b.step", "step"),
                  (0.6, "a", "a.step", "step")], hold_s=0.2)
    assert order == ["a.fb", "drop a", "b.fb", "b.step", "a.step"]
