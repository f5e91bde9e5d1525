"""A rollout replica's LoRA adapters for ``rollout.lora_sync=adapter``: a peft folder of its own, and the
vLLM request naming the current version.

vLLM loads an adapter from a folder and caches it by integer id: a new id per sync makes it read the
new weights, and the previous id is handed back for removal. The folder lives in a temporary
directory owned by the replica (written atomically, removed at shutdown).
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any, Optional

from rlflow.engines.common.checkpoint.hf_export import write_peft_adapter_folder
from rlflow.rollout.weight_sync import NamedTensors

__all__ = ["LORA_SYNC_MODES", "LocalAdapter", "syncs_adapters", "vllm_lora_rank"]

# rollout.lora_sync: what a LoRA actor sends the rollout after each update (docs/lora.md)
LORA_SYNC_MODES = ("merged", "adapter")

# The adapter ranks vLLM sizes its LoRA slots for (vllm.config.lora.MaxLoRARanks).
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def syncs_adapters(rollout_config: Any) -> bool:
    """Whether the weight sync sends the actor's LoRA adapters alone (``rollout.lora_sync=adapter`` with a LoRA actor)."""
    return rollout_config.lora_sync == "adapter" and int(rollout_config.lora_rank) > 0


def vllm_lora_rank(rank: int) -> int:
    """The smallest slot rank vLLM offers that holds adapters of ``rank``."""
    fitting = [slot for slot in VLLM_LORA_RANKS if slot >= rank]
    if not fitting:
        raise ValueError(f"LoRA rank {rank} is above the largest vLLM serves ({VLLM_LORA_RANKS[-1]})")
    return fitting[0]


class LocalAdapter:
    """The replica's adapter folder and the id of the version last written to it."""

    def __init__(self, config: Any) -> None:
        self.rank = int(config.lora_rank)
        self._dir = tempfile.TemporaryDirectory(prefix="rlflow-lora-")
        self.folder = Path(self._dir.name) / "policy"
        self.version = 0
        self.request: Optional[Any] = None  # vllm.lora.request.LoRARequest of the current version

    def engine_kwargs(self) -> dict[str, Any]:
        """``vllm.LLM`` arguments for one adapter slot of this rank."""
        return {"enable_lora": True, "max_lora_rank": vllm_lora_rank(self.rank), "max_loras": 1, "max_cpu_loras": 1}

    def write(self, adapter_config_json: str, named_tensors: NamedTensors) -> tuple[Any, Optional[int]]:
        """Write a new version; returns its request and the id of the version it replaces (None at first)."""
        from vllm.lora.request import LoRARequest

        write_peft_adapter_folder(self.folder, named_tensors, adapter_config_json)
        stale = self.request.lora_int_id if self.request is not None else None
        self.version += 1
        self.request = LoRARequest(f"policy-v{self.version}", self.version, str(self.folder))
        return self.request, stale

    def cleanup(self) -> None:
        """Remove the folder."""
        self._dir.cleanup()
