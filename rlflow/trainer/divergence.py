"""The divergence guard: stop a run whose rewards or gradients have gone bad, instead of training on nothing.

Two limits, both counted in the step's metrics:

* ``reward.max_error_fraction``: a reward function that raises or returns a non-finite value
  scores ``reward.error_score`` (the documented policy, ``rlflow.rewards.scoring``), and so does
  a reward model whose score is not finite (``replace_non_finite``). A batch in which more than
  this fraction of the samples got ``error_score`` aborts the run (``reward/error_fraction``).
* ``trainer.max_consecutive_skipped_steps``: an optimizer step whose gradient norm is not finite
  is skipped by the engine; this many skipped in a row, per model, aborts the run
  (``actor/consecutive_skipped_steps``, ``critic/consecutive_skipped_steps``,
  ``train/consecutive_skipped_steps``). 0: never abort. The counts are part of the driver's
  checkpoint (``state_dict``), so a resumed run continues them.

The abort is a ``DivergenceError`` (a ``UserError``): the entry points print its one line and exit 2.
"""

from __future__ import annotations

from typing import Any

import torch

from rlflow.config import ConfigError
from rlflow.errors import UserError

ERROR_FRACTION_KEY = "reward.max_error_fraction"
SKIPPED_STEPS_KEY = "trainer.max_consecutive_skipped_steps"


class DivergenceError(UserError, RuntimeError):
    """The run stopped learning: too many reward errors in a batch, or too many skipped optimizer steps in a row."""


def replace_non_finite(scores: torch.Tensor, error_score: float) -> tuple[torch.Tensor, int]:
    """``scores [B, T]`` with every non-finite entry set to ``error_score``, and the number of rows that had one."""
    finite = torch.isfinite(scores)
    bad_rows = int((~finite).any(dim=-1).sum())
    return torch.where(finite, scores, torch.full_like(scores, error_score)), bad_rows


class DivergenceGuard:
    """Checks each training batch's reward errors and each optimizer step's skip flag against the limits."""

    def __init__(self, max_error_fraction: float = 0.5, max_consecutive_skipped_steps: int = 5):
        if not 0.0 <= max_error_fraction <= 1.0:
            raise ConfigError(f"config key '{ERROR_FRACTION_KEY}': must be in [0, 1] (1: never abort), got {max_error_fraction}")
        if max_consecutive_skipped_steps < 0:
            raise ConfigError(f"config key '{SKIPPED_STEPS_KEY}': must be >= 0 (0: never abort), got "
                              f"{max_consecutive_skipped_steps}")
        self.max_error_fraction = float(max_error_fraction)
        self.max_consecutive_skipped_steps = int(max_consecutive_skipped_steps)
        self.consecutive_skipped: dict[str, int] = {}

    @classmethod
    def from_config(cls, config: Any) -> "DivergenceGuard":
        """The guard of a run config: ``reward.max_error_fraction`` (when it has a reward group) and the trainer key."""
        reward = getattr(config, "reward", None)
        fraction = 1.0 if reward is None else float(reward.max_error_fraction)
        return cls(fraction, int(config.trainer.max_consecutive_skipped_steps))

    def check_reward_errors(self, errors: int, total: int, scorer: str) -> dict[str, float]:
        """``reward/error_fraction`` of a training batch; raises ``DivergenceError`` above the limit."""
        fraction = errors / total if total else 0.0
        if fraction > self.max_error_fraction:
            raise DivergenceError(
                f"{errors} of {total} samples in this batch ({fraction:.0%}) could not be scored by the {scorer} and got "
                f"reward.error_score, more than {ERROR_FRACTION_KEY}={self.max_error_fraction}; fix the {scorer} or "
                f"raise the limit"
            )
        return {"reward/error_fraction": fraction}

    def check_optim_step(self, model: str, skipped: bool) -> dict[str, float]:
        """``<model>/consecutive_skipped_steps`` after one optimizer step; raises ``DivergenceError`` at the limit."""
        return self.check_optim_steps(model, steps=1, trailing_skipped=int(skipped))

    def check_optim_steps(self, model: str, steps: int, trailing_skipped: int) -> dict[str, float]:
        """The same after ``steps`` optimizer steps run together (a worker-side update, such as the critic's),
        of which the last ``trailing_skipped`` were skipped.

        When every one of them was skipped the run of skipped steps continues the previous count;
        otherwise it restarts at ``trailing_skipped``. Raises ``DivergenceError`` once it reaches the limit.
        """
        if not 0 <= trailing_skipped <= steps:
            raise ValueError(f"{model}: {trailing_skipped} trailing skipped steps out of {steps} optimizer steps")
        previous = self.consecutive_skipped.get(model, 0) if trailing_skipped == steps else 0
        count = previous + trailing_skipped
        self.consecutive_skipped[model] = count
        limit = self.max_consecutive_skipped_steps
        if limit and count >= limit:
            raise DivergenceError(
                f"{model}: {count} optimizer steps in a row were skipped because the gradient norm was not finite "
                f"({SKIPPED_STEPS_KEY}={limit}); the loss has diverged: lower the learning rate, check the rewards "
                f"and the data, or resume from an earlier checkpoint"
            )
        return {f"{model}/consecutive_skipped_steps": float(count)}

    def state_dict(self) -> dict[str, Any]:
        """What the guard has counted so far (the runs of skipped steps per model), for the driver's checkpoint."""
        return {"consecutive_skipped": dict(self.consecutive_skipped)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state_dict()``'s counts."""
        self.consecutive_skipped = {str(model): int(count) for model, count in state["consecutive_skipped"].items()}
