"""The optimizer step as every engine runs it, whatever its parallelism.

``OptimizerStepper.step(lr, hyperparams)``: measure (and clip) the global gradient norm with
the engine's own norm function, skip the update when the norm is not finite (counted,
with a warning), otherwise run the optimizer at the scheduled LR or at ``lr`` for this
one step (and with ``hyperparams``' betas, eps, weight decay and clip where set), zero the
gradients and advance the LR schedule. A skipped step still
advances the schedule: it counts training steps, not successful updates.

The engine supplies only what depends on its layout: the norm function (FSDP reads a
DTensor norm, a TP/PP engine reduces over its model-parallel groups) and the optimizer
(an AdamW, or anything with its ``param_groups``, ``state``, ``step()`` and
``zero_grad(set_to_none=True)``). ``state_dict()`` is what a checkpoint must keep to resume the
schedule and the counter; ``load_state_dict`` also puts back the configured AdamW kernels, which
loading the optimizer's saved state replaced with the saved run's.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Optional

import torch

from rlflow.engines.common.optim.lr_schedulers import LRSchedule
from rlflow.engines.common.optim.optimizers import DECAYS, use_kernels
from rlflow.engines.config import EngineConfig, StepHyperparams
from rlflow.utils.logging import get_logger

__all__ = ["OptimizerStepper", "clip_to_norm"]

_logger = get_logger(__name__)


def clip_to_norm(grads: list[torch.Tensor], total_norm: float, max_norm: float) -> None:
    """Scale ``grads`` in place so their global norm ``total_norm`` is at most ``max_norm``, with
    ``torch.nn.utils.clip_grad_norm_``'s coefficient ``max_norm / (total_norm + 1e-6)`` (an engine's clip
    function computes the norm its own way, over its own groups, then calls this)."""
    coef = max_norm / (total_norm + 1e-6)
    if coef < 1.0:
        for grad in grads:
            grad.mul_(coef)


class OptimizerStepper:
    """Clip, non-finite skip, per-step LR override, zero grads and the LR schedule of one optimizer."""

    def __init__(
        self, optimizer: torch.optim.Optimizer, config: EngineConfig, clip_grad_norm: Callable[[float], float]
    ) -> None:
        """``clip_grad_norm(max_norm)`` clips in place and returns the global norm before clipping."""
        self.optimizer = optimizer
        self.clip_grad_norm = clip_grad_norm
        self.grad_clip = config.optimizer.grad_clip
        self.implementation = config.optimizer.implementation
        self.schedule = LRSchedule(config.lr_scheduler, config.optimizer.lr)
        self.skipped_steps = 0

    def step(self, lr: Optional[float] = None, hyperparams: Optional[StepHyperparams] = None) -> dict[str, Any]:
        """One optimizer step; returns ``{"grad_norm", "lr", "skipped", "skipped_steps"}``.

        ``hyperparams`` replace the configured AdamW settings for this step (they stay in the param
        groups until the next step that sets them)."""
        hyperparams = hyperparams or StepHyperparams()
        grad_clip = self.grad_clip if hyperparams.grad_clip is None else hyperparams.grad_clip
        grad_norm = float(self.clip_grad_norm(grad_clip if grad_clip > 0 else math.inf))
        step_lr = self.schedule.current_lr() if lr is None else float(lr)
        skipped = not math.isfinite(grad_norm)
        if skipped:
            self.skipped_steps += 1
            _logger.warning("grad norm is %s: skipping optimizer step %d", grad_norm, self.schedule.step_count)
        else:
            for group in self.optimizer.param_groups:
                group["lr"] = step_lr
                _apply(group, hyperparams)
            self.optimizer.step()
        self.zero_grad()
        self.schedule.advance()
        return {"grad_norm": grad_norm, "lr": step_lr, "skipped": skipped, "skipped_steps": self.skipped_steps}

    def zero_grad(self) -> None:
        """Drop accumulated gradients (set to None)."""
        self.optimizer.zero_grad(set_to_none=True)

    def reset(self) -> None:
        """Forget the optimizer's state and start the LR schedule and skip count over: the next step runs as a new
        optimizer's first (and a checkpoint written before it drops its placeholder state again on loading)."""
        self.optimizer.state.clear()
        self.schedule.load_state_dict({"step_count": 0})
        self.skipped_steps = 0

    def forget_placeholder_state(self) -> None:
        """Drop the optimizer state when no step has run yet. Writing or reading a checkpoint fills an
        un-stepped optimizer's state (torch.distributed.checkpoint runs one zero-lr step to create it), and
        AdamW would then bias-correct the first real step as its second."""
        if self.schedule.step_count == 0:
            self.optimizer.state.clear()

    def state_dict(self) -> dict[str, Any]:
        """The LR schedule's position and the skip counter (JSON-serialisable)."""
        return {"lr_schedule": self.schedule.state_dict(), "skipped_steps": self.skipped_steps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what ``state_dict`` returned (extra keys, such as a checkpoint's setup, are ignored), after the
        engine loaded the optimizer's own state: that brought the saved run's AdamW kernels along, and the
        configured ones are put back."""
        self.schedule.load_state_dict(state["lr_schedule"])
        self.skipped_steps = int(state["skipped_steps"])
        use_kernels(self.optimizer, self.implementation)


def _apply(group: dict[str, Any], hyperparams: StepHyperparams) -> None:
    """Set the given ``hyperparams`` on one AdamW param group (weight decay only on a group that decays)."""
    if hyperparams.betas is not None:
        group["betas"] = tuple(hyperparams.betas)
    if hyperparams.eps is not None:
        group["eps"] = float(hyperparams.eps)
    if hyperparams.weight_decay is not None and group.get(DECAYS, True):
        group["weight_decay"] = float(hyperparams.weight_decay)
