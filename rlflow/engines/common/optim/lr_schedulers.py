"""Learning-rate schedules: linear warmup, then a registered decay shape.

Warmup never spends a step at LR 0: optimizer step ``s`` (0-based) with
``s < warmup_steps`` runs at ``lr * (s + 1) / warmup_steps``, so the first step
already moves the weights and step ``warmup_steps - 1`` runs at the full LR.
After warmup the decay shape maps progress ``p`` in [0, 1] (0 at the first
post-warmup step, 1 at ``total_steps``) to a multiplier between ``min_lr_ratio``
and 1. Add a shape with ``@LR_SCHEDULE_REGISTRY.register("name", needs_total_steps=...)``
(``needs_total_steps``: it uses progress, so ``total_steps`` must be set).
"""

from __future__ import annotations

import math
from typing import Callable

from rlflow.engines.config import EngineConfigError, LRSchedulerConfig
from rlflow.utils.registry import Registry

__all__ = ["LRSchedule", "LR_SCHEDULE_REGISTRY"]

DecayShape = Callable[[float, float], float]  # (progress, min_lr_ratio) -> multiplier
LR_SCHEDULE_REGISTRY: Registry[DecayShape] = Registry("LR schedule", "engine.lr_scheduler.name", error=EngineConfigError)


@LR_SCHEDULE_REGISTRY.register("constant", needs_total_steps=False)
def _constant(progress: float, min_lr_ratio: float) -> float:
    return 1.0


@LR_SCHEDULE_REGISTRY.register("linear", needs_total_steps=True)
def _linear(progress: float, min_lr_ratio: float) -> float:
    return min_lr_ratio + (1.0 - min_lr_ratio) * (1.0 - progress)


@LR_SCHEDULE_REGISTRY.register("cosine", needs_total_steps=True)
def _cosine(progress: float, min_lr_ratio: float) -> float:
    return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


class LRSchedule:
    """The LR of each optimizer step; counts steps and checkpoints that count."""

    def __init__(self, config: LRSchedulerConfig, base_lr: float) -> None:
        self.decay_shape = LR_SCHEDULE_REGISTRY.get(config.name)
        needs_total_steps = LR_SCHEDULE_REGISTRY.metadata(config.name)["needs_total_steps"]
        if needs_total_steps and config.total_steps <= config.warmup_steps:
            raise EngineConfigError(
                f"lr_scheduler.name={config.name} decays over lr_scheduler.total_steps, which must exceed "
                f"warmup_steps={config.warmup_steps}; got total_steps={config.total_steps}"
            )
        self.config = config
        self.base_lr = base_lr
        self.step_count = 0

    def multiplier(self, step: int) -> float:
        """LR multiplier of 0-based optimizer step ``step``."""
        warmup = self.config.warmup_steps
        if step < warmup:
            return (step + 1) / warmup
        span = max(1, self.config.total_steps - warmup)
        progress = min(1.0, (step - warmup) / span)
        return self.decay_shape(progress, self.config.min_lr_ratio)

    def current_lr(self) -> float:
        """The LR the next optimizer step runs at."""
        return self.base_lr * self.multiplier(self.step_count)

    def advance(self) -> None:
        self.step_count += 1

    def state_dict(self) -> dict[str, int]:
        return {"step_count": self.step_count}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.step_count = int(state["step_count"])
