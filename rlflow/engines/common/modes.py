"""``train_mode`` / ``eval_mode`` for any engine: set the mode of its modules, restore each one's after."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator, Sequence

from torch import nn

__all__ = ["module_mode"]


@contextmanager
def module_mode(modules: Sequence[nn.Module], training: bool) -> Iterator[None]:
    """Inside: every module in ``training`` mode (a pipeline engine passes its model chunks); after: as before."""
    previous = [module.training for module in modules]
    for module in modules:
        module.train(training)
    try:
        yield
    finally:
        for module, mode in zip(modules, previous):
            module.train(mode)
