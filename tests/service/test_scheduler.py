"""A host's job order: each client's jobs in order, oldest first across clients, and no other client's
engine job while one holds gradients (forward_backward without its optim_step), except sampling; a holder
that goes quiet loses its gradients before anyone else runs."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from rlflow.service.scheduler import HostScheduler, Job, JobBatch, QueueFullError


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


def _run_sampling(jobs: list[tuple[str, object]], max_batch: int, fail: bool = False) -> tuple[list[list[str]], dict]:
    """Queue ``(name, batch key)`` sampler-only jobs behind a running job, then let them run. Returns the calls
    (the names each ran), and per job its result or error and the call size its ``on_start`` saw."""
    calls: list[list[str]] = []
    seen: dict[str, dict] = {}

    def together(names: list[str]) -> list[str]:
        calls.append(list(names))
        if fail:
            raise RuntimeError("the rollout failed")
        return [f"{name} sampled" for name in names]

    async def main() -> None:
        executor = ThreadPoolExecutor(max_workers=1)
        scheduler = HostScheduler(executor, lambda owner: None, 5.0, max_batch=max_batch)
        release, finished, count = asyncio.Event(), asyncio.Event(), len(jobs)
        loop = asyncio.get_running_loop()

        def done(name: str, task: asyncio.Future) -> None:
            nonlocal count
            seen[name]["outcome"] = str(task.exception()) if task.exception() else task.result()
            count -= 1
            if count == 0:
                finished.set()

        first = asyncio.run_coroutine_threadsafe(release.wait(), loop)
        scheduler.submit(Job("a", lambda: first.result(5), lambda task: None))  # holds the host while the rest queue
        for name, key in jobs:
            seen[name] = {}
            batch = None if key is None else JobBatch(key, name, together)
            scheduler.submit(Job(None, lambda name=name: together([name])[0], lambda task, name=name: done(name, task),
                                 on_start=lambda size, name=name: seen[name].update(call_size=size), batch=batch))
        release.set()
        await asyncio.wait_for(finished.wait(), 10)
        executor.shutdown()

    asyncio.run(main())
    return calls, seen


def test_queued_samples_with_one_key_run_as_one_call_in_order_up_to_max_batch():
    jobs = [("s1", "k"), ("s2", "k"), ("other", "j"), ("s3", "k"), ("seeded", None), ("s4", "k"), ("s5", "k")]
    calls, seen = _run_sampling(jobs, max_batch=3)
    assert calls == [["s1", "s2", "s3"], ["other"], ["seeded"], ["s4", "s5"]]
    assert {name: entry["outcome"] for name, entry in seen.items()} == {name: f"{name} sampled" for name, _ in jobs}
    assert [seen[name]["call_size"] for name, _ in jobs] == [3, 3, 1, 3, 1, 2, 2]


def test_a_failed_batched_call_fails_each_of_its_requests():
    calls, seen = _run_sampling([("s1", "k"), ("s2", "k")], max_batch=8, fail=True)
    assert calls == [["s1", "s2"]]
    assert all(entry["outcome"] == "the rollout failed" for entry in seen.values())


def test_max_batch_one_runs_each_request_alone():
    calls, _ = _run_sampling([("s1", "k"), ("s2", "k")], max_batch=1)
    assert calls == [["s1"], ["s2"]]


def test_at_most_max_queued_jobs_wait_and_room_comes_back_as_they_start():
    async def main() -> tuple[int, int]:
        executor = ThreadPoolExecutor(max_workers=1)
        release = threading.Event()
        scheduler = HostScheduler(executor, lambda owner: None, 5.0, max_queued=2)
        started = []
        for index in range(3):  # the first starts at once (it blocks), two wait
            scheduler.check_room(f"job {index}")
            scheduler.submit(Job(None, lambda: release.wait(10), lambda task: started.append(task)))
        with pytest.raises(QueueFullError, match=r"job 3: 2 requests wait .*service.max_queued_requests=2"):
            scheduler.check_room("job 3")
        queued = scheduler.queued
        release.set()
        while len(started) < 3:
            await asyncio.sleep(0.01)
        scheduler.check_room("job 4")  # the queue drained: room again
        executor.shutdown()
        return queued, scheduler.queued

    assert asyncio.run(main()) == (2, 0)
