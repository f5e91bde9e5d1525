"""KL coefficient controllers for KL-in-reward (``algorithm.kl_ctrl``).

``fixed`` keeps ``kl_coef``; ``adaptive`` (Ziegler et al. 2019, arXiv:1909.08593) moves it
towards ``target_kl`` with a proportional controller over ``horizon`` samples.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol

import numpy as np

from rlflow.utils.registry import Registry


class KLController(Protocol):
    """Anything with a current coefficient ``value`` and ``update(current_kl, n_steps)``."""

    value: float

    def update(self, current_kl: float, n_steps: int) -> None: ...


class FixedKLController:
    """A constant KL coefficient."""

    def __init__(self, kl_coef: float) -> None:
        self.value = float(kl_coef)

    def update(self, current_kl: float, n_steps: int) -> None:
        """No-op: the coefficient never changes."""


class AdaptiveKLController:
    """Proportional controller: ``value *= 1 + clip(kl / target - 1, -0.2, 0.2) * n_steps / horizon``."""

    def __init__(self, init_kl_coef: float, target_kl: float, horizon: int) -> None:
        if target_kl <= 0:
            raise ValueError(f"algorithm.kl_ctrl.target_kl must be > 0 for the adaptive controller, got {target_kl}")
        if horizon <= 0:
            raise ValueError(f"algorithm.kl_ctrl.horizon must be > 0 for the adaptive controller, got {horizon}")
        self.value = float(init_kl_coef)
        self.target = float(target_kl)
        self.horizon = horizon

    def update(self, current_kl: float, n_steps: int) -> None:
        """Raise the coefficient when KL is above target, lower it when below."""
        proportional_error = float(np.clip(current_kl / self.target - 1.0, -0.2, 0.2))
        self.value *= 1.0 + proportional_error * n_steps / self.horizon


KL_CONTROLLER_REGISTRY: Registry[Callable[[Any], KLController]] = Registry(
    "KL controller type", "algorithm.kl_ctrl.type"
)


@KL_CONTROLLER_REGISTRY.register("fixed")
def _build_fixed(kl_ctrl: Any) -> KLController:
    return FixedKLController(kl_coef=kl_ctrl.kl_coef)


@KL_CONTROLLER_REGISTRY.register("adaptive")
def _build_adaptive(kl_ctrl: Any) -> KLController:
    return AdaptiveKLController(init_kl_coef=kl_ctrl.kl_coef, target_kl=kl_ctrl.target_kl, horizon=kl_ctrl.horizon)


def get_kl_controller(kl_ctrl: Any) -> KLController:
    """Build the controller named by ``kl_ctrl.type`` from a config with ``kl_coef`` (+ ``target_kl``, ``horizon``)."""
    return KL_CONTROLLER_REGISTRY.get(kl_ctrl.type)(kl_ctrl)
