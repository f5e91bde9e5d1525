"""Faults for the divergence guard, loaded as a user's plugin (``trainer.plugins=[this file]``).

* ``nan_grad_fsdp2``: the FSDP2 engine with every gradient made NaN before its optimizer step, so
  the real non-finite-norm skip in ``OptimizerStepper`` runs on every step;
* ``broken_reward``: a custom reward function that raises for some responses and returns NaN for
  the rest (every sample errors);
* ``digit_share``: a sane dense reward for the runs whose fault is elsewhere.
"""

from __future__ import annotations

from typing import Any, Optional

from rlflow.engines.config import StepHyperparams
from rlflow.engines.fsdp2 import FSDP2Engine
from rlflow.engines.registry import ENGINE_REGISTRY


@ENGINE_REGISTRY.register("nan_grad_fsdp2")
class NaNGradFSDP2Engine(FSDP2Engine):
    """FSDP2 whose loss has diverged: every gradient is NaN when the optimizer step comes."""

    def optim_step(self, lr: Optional[float] = None, hyperparams: Optional[StepHyperparams] = None) -> dict[str, Any]:
        for param in self.module.parameters():
            if param.grad is not None:
                param.grad.fill_(float("nan"))
        return super().optim_step(lr, hyperparams)


def broken_reward(data_source, solution_str, ground_truth, extra_info=None):
    """Raises on even-length responses, NaN on the others."""
    if len(solution_str) % 2 == 0:
        raise ValueError("the judge is down")
    return float("nan")


def digit_share(data_source, solution_str, ground_truth, extra_info=None):
    return sum(ch.isdigit() for ch in solution_str) / max(len(solution_str), 1)
