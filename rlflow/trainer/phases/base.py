"""The phase contract, and ``StepRecord``: how a loop runs phases and keeps what they report.

A phase is one named part of a PPO step (generate, score, old log-probs, advantages, actor update
...). It declares the batch columns it reads and writes (``keys``; they may depend on the run's plan
and the step), and ``run`` returns a ``DataProto`` holding the columns it writes, its metrics under
``METRICS`` in ``meta_info``. A phase that is one worker-group call (``RolePass``) can also
``start`` without waiting, so independent passes overlap.

``StepRecord`` runs phases for a loop: it checks a phase's declared reads before it runs and its
declared writes after, moves its metrics into the step's metrics, and either merges its columns into
the batch (``add``) or hands its output on as the next batch (``produce``: generate, balance).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Sequence

from rlflow.meta_info import METRICS
from rlflow.protocol import DataProto, DataProtoFuture
from rlflow.trainer.phases.context import PhaseContext, StepState
from rlflow.utils.timer import timed

__all__ = ["BatchKeys", "Phase", "PhaseKeyError", "RolePass", "StepRecord"]


@dataclass(frozen=True)
class BatchKeys:
    """The columns (tensor or non-tensor) a phase reads from its input batch and writes into its output."""

    reads: tuple[str, ...] = ()
    writes: tuple[str, ...] = ()


class PhaseKeyError(RuntimeError):
    """A phase was given a batch without a column it reads, or returned other columns than it declares."""


class Phase(ABC):
    """One part of a PPO step: ``run`` takes the batch and returns the columns it writes (see the module doc).

    ``reads``/``writes`` are the columns of every run; a phase whose columns depend on the plan or the
    step overrides ``keys``.
    """

    name: str
    reads: tuple[str, ...] = ()
    writes: tuple[str, ...] = ()

    def keys(self, ctx: PhaseContext, state: StepState) -> BatchKeys:
        """The columns this phase reads and writes in ``ctx``'s run at ``state``'s step."""
        return BatchKeys(self.reads, self.writes)

    @abstractmethod
    def run(self, ctx: PhaseContext, batch: DataProto, state: StepState) -> DataProto:
        """The phase's output for ``batch``: the columns it writes, metrics under ``METRICS``."""


class RolePass(Phase):
    """A phase that is one call on a worker group; ``start`` sends it and returns its future."""

    @abstractmethod
    def start(self, ctx: PhaseContext, batch: DataProto, state: StepState) -> DataProtoFuture:
        """Send the call; the future's value is what ``run`` returns."""

    def run(self, ctx: PhaseContext, batch: DataProto, state: StepState) -> DataProto:
        return self.start(ctx, batch, state).get()


class StepRecord:
    """One step's metrics, in the order phases report them, and its wall-clock timings (``timing_s/<name>``)."""

    def __init__(self) -> None:
        self.metrics: dict[str, float] = {}
        self.timings: dict[str, float] = {}

    def timed(self, name: str) -> AbstractContextManager[None]:
        """Add the block's seconds to the timing ``name``."""
        return timed(name, self.timings)

    def produce(self, phase: Phase, ctx: PhaseContext, batch: DataProto, state: StepState) -> DataProto:
        """Run ``phase`` on ``batch`` and return its output, which holds at least the columns it writes."""
        keys = _checked_reads(phase, ctx, batch, state)
        return self._collect(phase, keys, phase.run(ctx, batch, state), exact=False)

    def add(self, phase: Phase, ctx: PhaseContext, batch: DataProto, state: StepState) -> None:
        """Run ``phase`` on ``batch`` and merge the columns it writes (exactly those) into ``batch``."""
        keys = _checked_reads(phase, ctx, batch, state)
        batch.union(self._collect(phase, keys, phase.run(ctx, batch, state), exact=True))

    def add_concurrently(self, passes: Sequence[RolePass], ctx: PhaseContext, batch: DataProto, state: StepState) -> None:
        """``add`` for independent worker calls: all are sent before any is waited for, then merged in order."""
        keys = [_checked_reads(phase, ctx, batch, state) for phase in passes]
        futures = [phase.start(ctx, batch, state) for phase in passes]
        for phase, phase_keys, future in zip(passes, keys, futures):
            batch.union(self._collect(phase, phase_keys, future.get(), exact=True))

    def _collect(self, phase: Phase, keys: BatchKeys, output: DataProto, exact: bool) -> DataProto:
        self.metrics.update(METRICS.pop(output.meta_info))
        held = set(output.keys())
        if not set(keys.writes) <= held or (exact and held != set(keys.writes)):
            raise PhaseKeyError(f"phase '{phase.name}' declares it writes {sorted(keys.writes)} but returned {sorted(held)}")
        return output


def _checked_reads(phase: Phase, ctx: PhaseContext, batch: DataProto, state: StepState) -> BatchKeys:
    keys = phase.keys(ctx, state)
    missing = [key for key in keys.reads if key not in batch]
    if missing:
        raise PhaseKeyError(f"phase '{phase.name}' reads {missing}, which its batch lacks (it holds {sorted(batch.keys())})")
    return keys
