"""``DelegatingEngine``: the ``BaseEngine`` methods that only hand the call on, shared by every built-in engine.

An engine built from the shared parts holds its model as ``self.module`` (None until ``initialize``),
its optimizer step as ``self.stepper`` (``optim.optimizer_step.OptimizerStepper``) and its placement as
``self.offloader`` (``optim.offload.HostOffload``); ``zero_grad``, the train/eval modes and ``offload`` /
``onload`` are then the same few lines whatever the parallelism. ``ModuleEngine`` (fsdp, fsdp2,
torchtitan) builds on it, and so does an engine that is not one sharded module (megatron: tensor and
pipeline parallel, its own schedule), which writes the rest of the contract itself.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, contextmanager
from typing import Any, Iterator, Optional, Sequence

from torch import nn

from rlflow.engines.base import BaseEngine
from rlflow.engines.common.optim.offload import HostOffload
from rlflow.engines.common.optim.optimizer_step import OptimizerStepper

__all__ = ["DelegatingEngine", "module_mode"]


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

    def reset_optimizer(self) -> None:
        self._require_initialized()
        self.stepper.reset()

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


@contextmanager
def module_mode(modules: Sequence[nn.Module], training: bool) -> Iterator[None]:
    """Inside: every module in ``training`` mode; after: each one's mode as before (``train_mode`` / ``eval_mode``)."""
    previous = [module.training for module in modules]
    for module in modules:
        module.train(training)
    try:
        yield
    finally:
        for module, mode in zip(modules, previous):
            module.train(mode)
