"""``async_training``: how generation and training overlap (docs/async.md); verl's section name.

``mode`` is one of the driver's training modes (``rlflow.trainer.training_modes``): ``sync`` runs a
step's phases in order; ``one_step_off`` generates the next step's samples while the current step
trains (the samples are one policy version old). Asynchronous modes need split placement and turn
rollout correction on unless told not to (``rlflow.trainer.async_checks``).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class AsyncTrainingConfig:
    """How generation and training overlap."""

    mode: str = "sync"  # sync | one_step_off
    rollout_correction: bool = True  # asynchronous modes: token TIS unless algorithm.rollout_correction sets one
