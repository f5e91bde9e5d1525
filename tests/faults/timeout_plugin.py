"""A hung worker for the timeout tests, loaded as a user plugin (``trainer.plugins=[tests/faults/timeout_plugin.py]``).

``hang_fsdp2`` is the FSDP2 engine, except that rank 1's training ``forward_backward`` (the
actor update; log-prob passes run ``forward_only``) never returns, so its peers wait for it
inside the gradient collective. The hang leaves the marker of
``hang_reward.hang`` first.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlflow.engines.fsdp2 import FSDP2Engine
from rlflow.engines.registry import ENGINE_REGISTRY
from rlflow.utils.plugins import load_module_file

HUNG_RANK = 1
hang = load_module_file(Path(__file__).with_name("hang_reward.py")).hang


@ENGINE_REGISTRY.register("hang_fsdp2")
class HangingFSDP2Engine(FSDP2Engine):
    """FSDP2 whose rank ``HUNG_RANK`` sleeps in a training ``forward_backward`` instead of computing."""

    def forward_backward(self, batch: Any, loss_fn: Any = None, forward_only: bool = False) -> Any:
        if self.rank == HUNG_RANK and not forward_only:
            hang()
        return super().forward_backward(batch, loss_fn, forward_only)
