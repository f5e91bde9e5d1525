"""Offload bookkeeping: where parameters and optimizer state sit between engine calls.

``HostOffload`` tracks whether the parameters (with their gradients) and the optimizer
state are in host memory, moves them with callbacks the engine supplies (how to move
depends on the sharding), and applies the config's flags:

* ``param_offload``: parameters and gradients live on the host between calls; every
  call that computes with them runs inside ``params_resident()``;
* ``optimizer_offload``: optimizer state lives on the host between optimizer steps;
  ``optimizer_resident()`` brings it in for the step (and the checkpoint).

On a CPU-only engine host and device are the same and nothing moves.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator

import torch

from rlflow.engines.config import EngineConfig

__all__ = ["HOST", "HostOffload"]

HOST = torch.device("cpu")
MoveFn = Callable[[torch.device], None]


class HostOffload:
    """Moves parameters / optimizer state between the compute device and the host, driven by the offload flags."""

    def __init__(self, device: torch.device, config: EngineConfig, move_params: MoveFn, move_optimizer: MoveFn) -> None:
        """``move_params(device)`` moves this rank's parameters and gradients, ``move_optimizer(device)`` its optimizer state."""
        self.device = device
        self.param_offload = config.param_offload
        self.optimizer_offload = config.optimizer_offload
        self._move_params, self._move_optimizer = move_params, move_optimizer
        self.params_on_host = self.optimizer_on_host = False
        self.settle()

    def _place_params(self, device: torch.device) -> None:
        self._move_params(device)
        self.params_on_host = device == HOST and self.device != HOST

    def _place_optimizer(self, device: torch.device) -> None:
        self._move_optimizer(device)
        self.optimizer_on_host = device == HOST and self.device != HOST

    def offload(self) -> None:
        """Everything to the host (``BaseEngine.offload``)."""
        self._place_params(HOST)
        self._place_optimizer(HOST)

    def onload(self) -> None:
        """Everything back to the compute device (``BaseEngine.onload``)."""
        self._place_params(self.device)
        self._place_optimizer(self.device)

    def settle(self) -> None:
        """Apply the offload flags: the placement between calls."""
        if self.param_offload:
            self._place_params(HOST)
        if self.optimizer_offload:
            self._place_optimizer(HOST)

    @contextmanager
    def params_resident(self) -> Iterator[None]:
        """Parameters on the device inside; back on the host after when ``param_offload``."""
        if self.params_on_host:
            self._place_params(self.device)
        try:
            yield
        finally:
            if self.param_offload:
                self._place_params(HOST)

    @contextmanager
    def optimizer_resident(self) -> Iterator[None]:
        """Optimizer state on the device inside; back on the host after when ``optimizer_offload``."""
        if self.optimizer_on_host:
            self._place_optimizer(self.device)
        try:
            yield
        finally:
            if self.optimizer_offload:
                self._place_optimizer(HOST)

    @contextmanager
    def resident(self) -> Iterator[None]:
        """Parameters and optimizer state both on the device inside (optimizer step, checkpoints)."""
        with self.params_resident(), self.optimizer_resident():
            yield
