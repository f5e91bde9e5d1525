"""``async_training``: how generation and training overlap (docs/async.md); verl's section name.

``mode`` is one of the driver's training modes (``rlflow.trainer.training_modes``): ``sync`` runs a
step's phases in order; ``one_step_off`` generates the next step's samples while the current step
trains (the samples are one policy version old); ``fully_async`` keeps the rollout replicas generating
as far ahead as ``staleness_threshold`` allows. Asynchronous modes need split placement and turn
rollout correction on unless told not to (``rlflow.trainer.async_checks``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from rlflow.config.ranges import AT_LEAST_1, NON_NEGATIVE, Ranges


@dataclass
class AsyncTrainingConfig:
    """How generation and training overlap."""

    RANGES: ClassVar[Ranges] = {"staleness_threshold": NON_NEGATIVE, "trigger_parameter_sync_step": AT_LEAST_1,
                                "require_batches": AT_LEAST_1}

    mode: str = "sync"  # sync | one_step_off | fully_async
    rollout_correction: bool = True  # asynchronous modes: token TIS unless algorithm.rollout_correction sets one
    staleness_threshold: int = 1  # fully_async: most policy versions a trained sample may be behind the trainer
    trigger_parameter_sync_step: int = 1  # fully_async: actor updates between two weight publications
    require_batches: int = 1  # fully_async: generation calls a step's batch is split into (each sent on its own)
    partial_rollout: bool = False  # fully_async: a weight sync aborts the requests in flight, resumed with the new weights
    restart_rollout: bool = False  # asynchronous modes: a rollout pool that dies is started again (at most 3 times)
