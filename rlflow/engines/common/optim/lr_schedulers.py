"""Learning-rate schedules: linear warmup, then a registered decay shape.

Warmup never spends a step at LR 0: optimizer step ``s`` (0-based) with
``s < warmup_steps`` runs at ``lr * (s + 1) / warmup_steps``, so the first step
already moves the weights and step ``warmup_steps - 1`` runs at the full LR.
After warmup the decay shape maps progress ``p`` in [0, 1] (0 at the first
post-warmup step, 1 at ``total_steps``) to a multiplier between ``min_lr_ratio``
and 1. Add a shape with ``@LR_SCHEDULE_REGISTRY.register("name", needs_total_steps=...)``
(``needs_total_steps``: it uses progress, so ``total_steps`` must be set).

A driver gives each trained engine's schedule the run's length before any worker starts
(``fit_schedule_to_run``): ``total_steps: 0`` becomes the run's optimizer steps, and a warmup
longer than a run whose length was derived (a short smoke run under the SFT default's 20 warmup
steps) is shortened to fit, with a line saying so; a ``total_steps`` the user set that a decaying
shape cannot use is refused there, naming the key.
"""

from __future__ import annotations

import math
from typing import Any, Callable, MutableMapping, Optional

from rlflow.engines.config import EngineConfigError, LRSchedulerConfig
from rlflow.utils.registry import Registry

__all__ = ["LRSchedule", "LR_SCHEDULE_REGISTRY", "fit_schedule_to_run"]

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


def _schedule_problem(name: str, warmup_steps: int, total_steps: int) -> Optional[str]:
    """Why a schedule of shape ``name`` cannot run (a decaying shape's ``total_steps`` not past its warmup), or None."""
    if LR_SCHEDULE_REGISTRY.metadata(name)["needs_total_steps"] and total_steps <= warmup_steps:
        return (f"lr_scheduler.name={name} decays over lr_scheduler.total_steps, which must exceed "
                f"warmup_steps={warmup_steps}; got total_steps={total_steps}")
    return None


def fit_schedule_to_run(schedule: MutableMapping[str, Any], run_steps: int, key: str) -> Optional[str]:
    """Give one engine's ``lr_scheduler`` node (at config key ``key``) the run's ``run_steps`` optimizer steps.

    ``total_steps: 0`` becomes ``run_steps``; a decaying shape's warmup that would not end before then is
    shortened to ``run_steps - 1`` steps and the returned line says so. A ``total_steps`` the user set that the
    shape cannot use raises ``EngineConfigError`` naming ``key``. Returns None when nothing was shortened.
    """
    name, warmup = str(schedule.get("name", "constant")), int(schedule.get("warmup_steps", 0))
    derived = not schedule.get("total_steps")
    if derived:
        schedule["total_steps"] = run_steps
    problem = _schedule_problem(name, warmup, int(schedule["total_steps"]))
    if problem is None:
        return None
    if not derived:
        raise EngineConfigError(f"config key '{key}.total_steps': {problem}; raise it, or set 0 (the run's length)")
    schedule["warmup_steps"] = max(run_steps - 1, 0)
    return (f"{key}.warmup_steps={warmup} does not end within the run's {run_steps} optimizer steps; "
            f"warming up over {schedule['warmup_steps']}")


class LRSchedule:
    """The LR of each optimizer step; counts steps and checkpoints that count."""

    def __init__(self, config: LRSchedulerConfig, base_lr: float) -> None:
        self.decay_shape = LR_SCHEDULE_REGISTRY.get(config.name)
        problem = _schedule_problem(config.name, config.warmup_steps, config.total_steps)
        if problem is not None:
            raise EngineConfigError(problem)
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
