"""``fully_async``'s producer: the steps' generation calls, sent ahead of the trainer as far as the staleness bound allows.

The rollout replicas are Ray actors, which run their calls in the order they were sent: a generation call
sent after a weight sync samples with those weights, and one sent before it with the weights before. So
the producer knows each call's sampling version when it sends it: the version of the last weight sync
sent (``published``). Step ``s`` trains at version ``updates_before(s)``; its calls are sent only while
``updates_before(s) - published <= staleness_threshold`` (AReaL's and SkyRL's capacity rule), so no
trained sample is ever more than ``staleness_threshold`` versions behind the trainer and none is dropped.

A step's batch is split into ``require_batches`` calls, each sent on its own; the trainer takes a step's
calls in the order they were sent (``take``) and joins their samples (``StepSamples``).

With partial rollouts (``async_training.partial_rollout``) weight syncs reach the rollout beside the
generation in progress instead of after it; each call then names the oldest weights it may sample with
(``POLICY_VERSION``: ``published`` when sent), so its samples are never older than the bound assumes, and
the rollout reports the version of every token.

With ``async_training.restart_rollout`` a rollout pool that dies is started again with the actor's current
weights (``PlacedRoles.replace_dead_rollout``), wherever the death shows: waiting for a step's samples
(``StepSamples.get``), a weight sync, a validation. The calls in flight died with the pool; the producer sends
them again to the new one (``resend``), sampled at the version it started with, so they are regenerated as a
resume regenerates them: no sample is trained twice or skipped.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any, Callable

from rlflow.meta_info import METRICS, POLICY_VERSION
from rlflow.protocol import DataProto, DataProtoFuture
from rlflow.trainer.phases import PhaseContext, StepState
from rlflow.trainer.phases.context import updates_before
from rlflow.trainer.phases.generate import Generate
from rlflow.workers.errors import WorkerDiedError
from rlflow.workers.metrics import reduce_metrics

__all__ = ["AsyncProducer", "Pipeline", "SentCall", "StepSamples"]

CALL_METRICS_REDUCE = {"timing_s/generate": "sum", "rollout/generated_tokens": "sum"}  # calls run one after another


@dataclass(frozen=True)
class Pipeline:
    """How far generation runs ahead: the staleness bound, actor updates between weight publications, generation
    calls per step, and whether syncs reach the rollout mid-generation (partial rollouts)."""

    bound: int
    trigger: int = 1
    calls_per_step: int = 1
    partial: bool = False

    @classmethod
    def from_config(cls, section: Any) -> "Pipeline":
        """``fully_async``'s pipeline from the ``async_training`` section."""
        return cls(section.staleness_threshold, section.trigger_parameter_sync_step, section.require_batches,
                   section.partial_rollout)


@dataclass(frozen=True)
class SentCall:
    """One generation call of step ``step``'s batch (``drawn``: a ``DrawnBatch``; ``part``: the call's prompts) and
    the version that samples it."""

    step: int
    drawn: Any
    part: DataProto
    generation: DataProtoFuture
    version: int


class AsyncProducer:
    """Sends the generation calls of steps ``first`` to ``last``, each as soon as the staleness bound admits it (``fill``)."""

    def __init__(self, ctx: PhaseContext, draw: Callable[[], Any], first: int, last: int, pipeline: "Pipeline"):
        self.ctx, self.draw, self.last = ctx, draw, last
        self.bound, self.calls_per_step, self.partial = pipeline.bound, pipeline.calls_per_step, pipeline.partial
        self.next_step = first
        self.published = updates_before(ctx, first)  # the rollout holds the weights the first step starts from
        self.sent: deque[SentCall] = deque()
        self.pool_starts = len(ctx.roles.rollout_restarted_at)  # the rollout pool the calls in flight went to

    def fill(self) -> None:
        """Send the calls of every next step whose samples, sampled at ``published``, the bound admits."""
        self.resend()
        while self.next_step <= self.last and updates_before(self.ctx, self.next_step) - self.published <= self.bound:
            drawn = self.draw()
            self.sent.extend(self._send(self.next_step, drawn, part) for part in drawn.prompts.chunk(self.calls_per_step))
            self.next_step += 1

    def _send(self, step: int, drawn: Any, part: DataProto) -> SentCall:
        if self.partial:
            part.meta_info[POLICY_VERSION.name] = self.published
        state = StepState.begin(self.ctx, part, step)  # the sync run's seeds for this step
        return SentCall(step, drawn, part, Generate().start(self.ctx, part, state), self.published)

    def resend(self, calls: tuple[SentCall, ...] = ()) -> list[SentCall]:
        """If the rollout pool was started again since the calls in flight were sent, send ``calls`` (a step's, taken
        but not done), then the calls in flight, again to the new pool, sampled at the version it started with;
        returns ``calls`` as they now stand."""
        restarted_at = self.ctx.roles.rollout_restarted_at
        if len(restarted_at) == self.pool_starts:
            return list(calls)
        self.pool_starts, self.published = len(restarted_at), max(self.published, restarted_at[-1])
        again = [self._send(call.step, call.drawn, call.part) for call in calls]
        self.sent = deque(self._send(call.step, call.drawn, call.part) for call in self.sent)
        return again

    def take(self, step: int) -> "StepSamples":
        """Step ``step``'s calls, the oldest sent; ``RuntimeError`` if they were not sent (a bound that cannot hold)."""
        if not self.sent or self.sent[0].step != step:
            raise RuntimeError(f"step {step}'s samples were never sent: published version {self.published}, "
                               f"bound {self.bound}")
        return StepSamples(self, [self.sent.popleft() for _ in range(self.calls_per_step)], updates_before(self.ctx, step))


class StepSamples:
    """One step's generation calls (``calls``); ``get`` waits for their samples, joined. If the rollout pool dies,
    ``get`` has it started again (``PlacedRoles.replace_dead_rollout``, as the trainer's ``version``: the step has
    not updated yet), sends the calls and those in flight again, and waits for the new ones."""

    def __init__(self, producer: AsyncProducer, calls: list[SentCall], version: int):
        self.producer, self.calls, self.version = producer, calls, version

    def get(self) -> DataProto:
        while True:
            try:
                return _joined(self.calls).get()
            except WorkerDiedError as error:
                self.producer.ctx.roles.replace_dead_rollout(error, self.version)
                self.calls = self.producer.resend(tuple(self.calls))


def _join(outputs: list[DataProto]) -> DataProto:
    metrics = reduce_metrics([METRICS.pop(output.meta_info) for output in outputs], CALL_METRICS_REDUCE)
    batch = DataProto.concat(outputs)
    batch.meta_info[METRICS.name] = metrics
    return batch


def _joined(calls: list[SentCall]) -> DataProtoFuture:
    """One future of the calls' samples, in the order sent, with their metrics combined."""
    return DataProtoFuture([call.generation for call in calls], _join, lambda futures: [f.get() for f in futures])
