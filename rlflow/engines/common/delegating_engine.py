"""``DelegatingEngine``: the ``BaseEngine`` methods that only hand the call on, shared by every built-in engine.

An engine built from the shared parts holds its model as ``self.module`` (None until ``initialize``),
its optimizer step as ``self.stepper`` (``OptimizerStepper``) and its placement as ``self.offloader``
(``HostOffload``); ``zero_grad``, the train/eval modes and ``offload`` / ``onload`` are then the same
few lines whatever the parallelism (``ModuleEngine``: FSDP, FSDP2, torchtitan; the megatron engine).
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any, Optional

from rlflow.engines.base import BaseEngine
from rlflow.engines.common.modes import module_mode
from rlflow.engines.common.offload import HostOffload
from rlflow.engines.common.optimizer_step import OptimizerStepper

__all__ = ["DelegatingEngine"]


class DelegatingEngine(BaseEngine):
    """The delegating part of ``BaseEngine`` for engines with ``module``, ``stepper`` and ``offloader``."""

    module: Optional[Any] = None
    stepper: OptimizerStepper
    offloader: HostOffload

    def _require_initialized(self) -> None:
        if self.module is None:
            raise RuntimeError(f"{type(self).__name__} is not initialized; call initialize() first")

    def zero_grad(self) -> None:
        self._require_initialized()
        self.stepper.zero_grad()

    def train_mode(self) -> AbstractContextManager[None]:
        self._require_initialized()
        return module_mode([self.module], True)

    def eval_mode(self) -> AbstractContextManager[None]:
        self._require_initialized()
        return module_mode([self.module], False)

    def offload(self) -> None:
        self._require_initialized()
        self.offloader.offload()

    def onload(self) -> None:
        self._require_initialized()
        self.offloader.onload()
