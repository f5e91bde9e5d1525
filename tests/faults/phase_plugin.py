"""Phase markers for the fault matrix, loaded as a user plugin (``trainer.plugins=[tests/faults/phase_plugin.py]``).

``phase_fsdp2`` is the FSDP2 engine and ``phase_vllm`` the vLLM rollout, each unchanged except
that entering a phase (``generate``; ``update``: a training ``forward_backward``; ``save``: an
engine checkpoint) appends ``<phase> <pid> <time>`` to ``$RLFLOW_FAULT_MARKERS/phases``, so a
test knows which process runs which phase and when to strike. The phase named by
``$RLFLOW_FAULT_HOLD`` is held for ``HOLD_S`` before and after its line is written: a window
in which a kill surely lands just before, or inside, that phase. Without the variables nothing
is written and nothing sleeps; the math is the stock engine's either way.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from rlflow.engines.fsdp2 import FSDP2Engine
from rlflow.engines.registry import ENGINE_REGISTRY
from rlflow.rollout.base import ROLLOUT_REGISTRY
from rlflow.rollout.vllm_rollout import VLLMRollout

MARKER_ENV = "RLFLOW_FAULT_MARKERS"
HOLD_ENV = "RLFLOW_FAULT_HOLD"
HOLD_S = 2.5


def enter(phase: str) -> None:
    """Record that this process enters ``phase`` (holding it if it is the held one)."""
    folder = os.environ.get(MARKER_ENV)
    if not folder:
        return
    held = os.environ.get(HOLD_ENV) == phase
    if held:
        time.sleep(HOLD_S)
    with open(Path(folder, "phases"), "a") as out:
        out.write(f"{phase} {os.getpid()} {time.time()!r}\n")
    if held:
        time.sleep(HOLD_S)


@ENGINE_REGISTRY.register("phase_fsdp2")
class PhaseFSDP2Engine(FSDP2Engine):
    """FSDP2 that marks its training ``forward_backward`` ("update") and ``save_checkpoint`` ("save")."""

    def forward_backward(self, batch: Any, loss_fn: Any = None, forward_only: bool = False) -> Any:
        if not forward_only:
            enter("update")
        return super().forward_backward(batch, loss_fn, forward_only)

    def save_checkpoint(self, path: str | Path) -> None:
        enter("save")
        super().save_checkpoint(path)


@ROLLOUT_REGISTRY.register("phase_vllm")
class PhaseVLLMRollout(VLLMRollout):
    """The vLLM rollout that marks each ``generate`` call ("generate")."""

    def generate(self, prompts: Any, sampling: Any = None) -> Any:
        enter("generate")
        return super().generate(prompts, sampling)
