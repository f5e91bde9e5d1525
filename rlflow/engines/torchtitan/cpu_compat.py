"""What the torchtitan engine changes on CPU, and only there (measured facts: ``../shared/PLATFORM.md``).

Each piece names the torchtitan call it replaces. The engine uses them when its device is the
CPU; on CUDA none of this runs and torchtitan's own calls do.

* **Attention.** torchtitan's language models take ``flex`` or ``varlen`` attention. On CPU,
  flex attention has no backward and varlen needs flash attention. The model config gets
  ``DenseMaskAttention`` as its inner attention instead of ``FlexAttention``
  (``torchtitan.models.common.attention``), and it takes, instead of the model's ``BlockMask``
  (``Decoder.get_attention_masks``), ``packing.document_causal_mask(positions)``: the same mask (causal,
  and a document starts where the positions reset to 0, as in torchtitan's packed-document mask)
  as a dense boolean ``[B, 1, L, L]`` tensor, built with a few tensor ops rather than by
  evaluating a mask function per element; SDPA then applies it. Its cost grows with the square
  of the row, so on CPU the engine packs sequences into rows (``CPU_STREAM_ATTENTION``) instead
  of one row per micro-batch.
* **Device mesh.** ``ParallelDims.build_mesh`` calls ``init_device_mesh`` with torchtitan's
  module-level ``device_type``, which falls back to ``"cuda"`` on a machine without an
  accelerator; ``cpu_device_type`` sets it to ``"cpu"`` while the mesh is built.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator

import torch
import torch.nn.functional as F
from torchtitan.distributed import parallel_dims as titan_parallel_dims
from torchtitan.protocols.module import Module

__all__ = ["CPU_STREAM_ATTENTION", "DenseMaskAttention", "cpu_device_type"]

# the packed layout for DenseMaskAttention: rows sized like sdpa's (packing.row_width), not one row
CPU_STREAM_ATTENTION = "sdpa"


class DenseMaskAttention(Module):
    """The inner attention in ``FlexAttention``'s place on CPU: SDPA under a dense boolean mask.

    A torchtitan ``Module`` built from its own config in the model config, so tensor parallelism's
    local_map (installed on whatever inner-attention config the layer has) hands it local q/k/v
    with this rank's heads, as it does for ``FlexAttention``. Inputs and output ``[B, L, N, H]``."""

    @dataclass(kw_only=True, slots=True)
    class Config(Module.Config):
        pass

    def __init__(self, config: Config) -> None:
        super().__init__()

    def forward(
        self,
        q_BLNH: torch.Tensor,
        k_BLNH: torch.Tensor,
        v_BLNH: torch.Tensor,
        *,
        attention_masks: torch.Tensor,
        scale: float | None = None,
        enable_gqa: bool = False,
        **unsupported: Any,
    ) -> torch.Tensor:
        extra = [name for name, value in unsupported.items() if value is not None]
        if extra:
            raise NotImplementedError(f"the CPU attention fallback does not take {extra} (flex attention options)")
        out = F.scaled_dot_product_attention(
            q_BLNH.transpose(1, 2), k_BLNH.transpose(1, 2), v_BLNH.transpose(1, 2), attn_mask=attention_masks,
            scale=scale, enable_gqa=enable_gqa,
        )
        return out.transpose(1, 2)


@contextmanager
def cpu_device_type() -> Iterator[None]:
    """Inside: torchtitan's ``ParallelDims`` builds its meshes on ``"cpu"`` (then restored)."""
    saved = titan_parallel_dims.device_type
    titan_parallel_dims.device_type = "cpu"
    try:
        yield
    finally:
        titan_parallel_dims.device_type = saved
