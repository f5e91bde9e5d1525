"""CPU workaround: on short grids, bf16 attention runs torch's fp32 kernel, which is faster there.

torch's CPU flash-attention kernel is slower in bf16 than in fp32 when the sequences are short.
Measured with torch 2.13 on a 2-core AMD EPYC (Zen 4, AVX-512 BF16), one thread, causal, forward
and backward together:

| grid: sequences x heads (KV heads) x positions x head dim | bf16 kernel | fp32 kernel on upcast inputs |
|---|---|---|
| 128 x 8 (4) x 88 x 64 (the GRPO bench's update) | 0.304 s | 0.154 s (0.51x) |
| 64 x 14 (2) x 128 x 64 | 0.363 s | 0.223 s (0.61x) |
| 64 x 8 (4) x 192 x 64 | 0.298 s | 0.271 s (0.91x) |
| 16 x 8 (4) x 384 x 64 | 0.229 s | 0.222 s (0.97x) |
| 16 x 8 (4) x 512 x 64 | 0.384 s | 0.429 s (1.12x) |
| 8 x 8 (4) x 1024 x 64 | 0.482 s | 0.589 s (1.22x) |

In the bench's bf16 update the bf16 kernel took 23% of the time for about 2% of the FLOPs. So
``sdpa_varlen`` (and Ulysses around it) computes bf16 attention in fp32 on a CPU for grids of at most
``FP32_UP_TO`` positions, and casts the output back: the same values up to one rounding of the output,
with no bf16 rounding inside the kernel. GPU kernels and fp16 (not measured) are left as they are.
"""

from __future__ import annotations

from typing import Optional

import torch

FP32_UP_TO = 384  # longest grid (positions) where the fp32 kernel was measured faster on a CPU


def attention_compute_dtype(query: torch.Tensor) -> Optional[torch.dtype]:
    """``torch.float32`` when the attention of ``query`` (``[sequences, heads, positions, head_dim]``) runs faster
    in fp32 than in its own dtype; None to leave it as it is."""
    short = query.shape[-2] <= FP32_UP_TO
    return torch.float32 if query.device.type == "cpu" and query.dtype == torch.bfloat16 and short else None
