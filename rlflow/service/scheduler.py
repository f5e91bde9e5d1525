"""``HostScheduler``: the order a host's jobs run in, one at a time on its thread.

The training clients of a host take turns on one engine, and a turn must not end while the
active client has gradients accumulated by ``forward_backward`` and not yet used by its
``optim_step``: the engine's checkpoint, which swaps clients, holds weights and optimizer state,
not gradients, and the next client's gradients would add to them. So:

* each client's jobs run in the order they were submitted (its ``seq_id`` order);
* across clients the oldest job goes first, except while a client holds gradients: then only
  its own jobs and jobs that use the sampler alone (``owner`` None) run;
* a holder that sends nothing for ``hold_s`` seconds while others wait loses its gradients
  (``drop_gradients``): its next ``optim_step`` fails and says so, and the others go on.

Sampling jobs (owner None) that carry a ``JobBatch`` also run together: when one starts, the
queued jobs with its key (same sampler, same sampling parameters) start with it, up to
``max_batch`` in all, as one ``run_together`` call. Clients send a sampling request per prompt,
and an RL loop sends hundreds at once; one rollout call decodes them as a batch instead of
paying a worker round trip and a nearly empty decode per request (docs/service.md).

At most ``max_queued`` jobs wait: the service asks ``check_room`` before it queues a request, and a full queue
refuses it (``QueueFullError``, answered 429) instead of holding its data for as long as the queue takes.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import deque
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable, Optional

from rlflow.errors import UserError


class QueueFullError(UserError, RuntimeError):
    """A worker group's queue holds ``max_queued`` requests already."""


def _no_start_hook(jobs_in_call: int) -> None:
    pass


@dataclass(frozen=True)
class JobBatch:
    """How a sampler-only job runs together with others: queued jobs with an equal ``key`` run as one
    ``run_together([part, ...])`` call (the first job's), which returns one result per part, in order."""

    key: Hashable
    part: Any
    run_together: Callable[[list[Any]], list[Any]]


@dataclass
class Job:
    """One request's work on a host: whose engine state it uses (None: the sampler only), whether it
    accumulates gradients or consumes them, what to run, and what to call with its finished task."""

    owner: Optional[str]
    run: Callable[[], Any]
    on_done: Callable[[asyncio.Future], None]
    accumulates: bool = False  # forward_backward: gradients stay in the engine after it
    steps: bool = False  # optim_step: the gradients are used up
    on_start: Callable[[int], None] = _no_start_hook  # called with the number of jobs in its call when it starts
    batch: Optional[JobBatch] = None  # owner None only: run with queued jobs of the same key
    order: int = field(default=0)


class HostScheduler:
    """Picks and runs a host's jobs (on the server's event loop; the jobs themselves run on ``executor``).

    ``drop_gradients(owner)`` runs on ``executor`` too, before any other job, when a holder times out;
    ``max_batch`` bounds the jobs of one ``JobBatch`` call, ``max_queued`` the jobs waiting (``check_room``)."""

    def __init__(self, executor: Executor, drop_gradients: Callable[[str], None], hold_s: float,
                 max_batch: int = 1, max_queued: int = 512) -> None:
        if max_batch < 1 or max_queued < 1:
            raise ValueError(f"max_batch and max_queued must be >= 1, got {max_batch} and {max_queued}")
        self.max_queued = max_queued
        self.executor = executor
        self.drop_gradients = drop_gradients
        self.hold_s = hold_s
        self.max_batch = max_batch
        self.holder: Optional[str] = None
        self._queues: dict[Optional[str], deque[Job]] = {}
        self._orders = itertools.count()
        self._running = False
        self._hold_timer: Optional[asyncio.TimerHandle] = None

    @property
    def queued(self) -> int:
        """The jobs waiting to start."""
        return sum(len(queue) for queue in self._queues.values())

    def check_room(self, label: str) -> None:
        """Raise ``QueueFullError`` when ``max_queued`` jobs wait already."""
        if self.queued >= self.max_queued:
            raise QueueFullError(f"{label}: {self.queued} requests wait for this worker group already "
                                 f"(service.max_queued_requests={self.max_queued}); send it again when earlier ones finish")

    def submit(self, job: Job) -> None:
        """Queue ``job`` behind the earlier jobs of its owner (``check_room`` first: this does not refuse)."""
        job.order = next(self._orders)
        self._queues.setdefault(job.owner, deque()).append(job)
        self._pump()

    def _eligible(self) -> list[deque[Job]]:
        queues = [queue for queue in self._queues.values() if queue]
        if self.holder is None:
            return queues
        return [queue for queue in queues if queue[0].owner in (self.holder, None)]

    def _pump(self) -> None:
        if self._running:
            return
        ready = self._eligible()
        if not ready:
            self._arm_hold_timer()
            return
        queue = min(ready, key=lambda queue: queue[0].order)
        job = queue.popleft()
        self._cancel_hold_timer()
        if job.owner is not None and job.accumulates:
            self.holder = job.owner
        elif job.owner is not None and job.steps and job.owner == self.holder:
            self.holder = None
        self._start([job, *self._batch_mates(job, queue)])

    def _batch_mates(self, job: Job, queue: deque[Job]) -> list[Job]:
        """Take the queued jobs that run in ``job``'s call: same batch key, oldest first, up to ``max_batch``."""
        if job.batch is None or job.owner is not None:
            return []
        mates = [other for other in queue if other.batch is not None and other.batch.key == job.batch.key]
        mates = mates[:self.max_batch - 1]
        for mate in mates:
            queue.remove(mate)
        return mates

    def _start(self, jobs: list[Job]) -> None:
        self._running = True
        for job in jobs:
            job.on_start(len(jobs))
        if len(jobs) == 1:
            call: Callable[[], list[Any]] = lambda: [jobs[0].run()]
        else:
            parts = [job.batch.part for job in jobs]
            call = lambda: jobs[0].batch.run_together(parts)
        task = asyncio.get_running_loop().run_in_executor(self.executor, call)
        task.add_done_callback(lambda done: self._finished(jobs, done))

    def _finished(self, jobs: list[Job], done: asyncio.Future) -> None:
        self._running = False
        try:
            for index, job in enumerate(jobs):
                job.on_done(_result_slot(done, index, len(jobs)))
        finally:
            self._pump()

    def _arm_hold_timer(self) -> None:
        """A holder with nothing queued while others wait gets ``hold_s`` before it loses its gradients."""
        waiting = any(queue for owner, queue in self._queues.items() if owner not in (self.holder, None))
        if self.holder is None or not waiting or self._hold_timer is not None:
            return
        self._hold_timer = asyncio.get_running_loop().call_later(self.hold_s, self._release_holder)

    def _cancel_hold_timer(self) -> None:
        if self._hold_timer is not None:
            self._hold_timer.cancel()
            self._hold_timer = None

    def _release_holder(self) -> None:
        self._hold_timer = None
        if self.holder is None or self._running:
            return
        holder, self.holder = self.holder, None
        self._start([Job(owner=None, run=lambda: self.drop_gradients(holder), on_done=lambda done: None)])


def _result_slot(done: asyncio.Future, index: int, count: int) -> asyncio.Future:
    """A finished future holding result ``index`` of the call ``done`` (its list of ``count`` results), or its error."""
    slot = done.get_loop().create_future()
    if done.cancelled():
        slot.cancel()
        return slot
    error = done.exception()
    if error is None and len(done.result()) != count:
        error = RuntimeError(f"a batched call returned {len(done.result())} results for {count} jobs")
    if error is not None:
        slot.set_exception(error)
    else:
        slot.set_result(done.result()[index])
    return slot
