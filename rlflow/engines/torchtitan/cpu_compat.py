"""What the torchtitan engine changes on CPU, and only there (measured facts: ``../shared/PLATFORM.md``).

Each patch names the torchtitan call it replaces. ``apply_cpu_compat`` runs them when the
engine's device is the CPU; on CUDA none of this runs and torchtitan's own calls do.

* **Attention.** torchtitan's language models take ``flex`` or ``varlen`` attention. On CPU,
  flex attention has no backward and varlen needs flash attention. ``DenseMaskAttention``
  replaces ``FlexAttention`` (``torchtitan.models.common.attention``) and takes, instead of the
  model's ``BlockMask``, ``document_causal_mask(positions)``: the same mask (causal, and a
  document starts where the positions reset to 0, as in torchtitan's packed-document mask)
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
from typing import Any, Iterator

import torch
import torch.nn.functional as F
from torch import nn
from torchtitan.distributed import parallel_dims as titan_parallel_dims
from torchtitan.models.common.attention import FlexAttention

__all__ = ["CPU_STREAM_ATTENTION", "DenseMaskAttention", "apply_cpu_compat", "cpu_device_type", "document_causal_mask"]

# the packed layout for DenseMaskAttention: rows sized like sdpa's (packing.row_width), not one row
CPU_STREAM_ATTENTION = "sdpa"


def document_causal_mask(positions: torch.Tensor) -> torch.Tensor:
    """``[B, 1, L, L]`` bool: query i may see key j when j <= i and both are in the same document."""
    document = (positions == 0).cumsum(-1)
    same_document = document[:, :, None] == document[:, None, :]
    length = positions.shape[-1]
    causal = torch.ones(length, length, dtype=torch.bool, device=positions.device).tril()
    return (same_document & causal).unsqueeze(1)


class DenseMaskAttention(nn.Module):
    """``FlexAttention`` for CPU: SDPA under a dense boolean mask (inputs and output ``[B, L, N, H]``)."""

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
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
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=attention_masks, scale=scale,
            enable_gqa=enable_gqa,
        )
        return out.transpose(1, 2)


def apply_cpu_compat(model: nn.Module) -> None:
    """Swap every ``FlexAttention`` inner attention of ``model`` for ``DenseMaskAttention`` (in place)."""
    for layer in model.modules():
        for name, child in list(layer.named_children()):
            if isinstance(child, FlexAttention):
                setattr(layer, name, DenseMaskAttention())


@contextmanager
def cpu_device_type() -> Iterator[None]:
    """Inside: torchtitan's ``ParallelDims`` builds its meshes on ``"cpu"`` (then restored)."""
    saved = titan_parallel_dims.device_type
    titan_parallel_dims.device_type = "cpu"
    try:
        yield
    finally:
        titan_parallel_dims.device_type = saved
