"""The megatron engine's core attention: SDPA under the block-causal document mask of packed rows.

megatron's local layer spec attends with ``DotProductAttention``, which refuses packed-sequence
parameters (those need TransformerEngine's THD kernels) and masks with a causal mask or a given
one through an explicit ``[b * heads, s, s]`` score tensor. The engine's rows hold several
sequences back to back (``packing.make_token_stream``), so each layer's core attention is
``MaskedSDPAttention``: ``F.scaled_dot_product_attention`` under the boolean mask
``packing.document_causal_mask(position_ids)`` (a token sees the earlier tokens of its own
sequence), with grouped-query attention handled by SDPA itself. Rotary positions restart with
each sequence (``forward.per_token_rotary``), so a packed row gives each sequence's own outputs.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
import torch.nn.functional as F
from megatron.core.transformer.module import MegatronModule
from megatron.core.transformer.transformer_config import TransformerConfig

__all__ = ["MaskedSDPAttention"]


class MaskedSDPAttention(MegatronModule):
    """Core attention under a given boolean mask (True = may attend; None: causal), by ``F.scaled_dot_product_attention``.

    Takes ``DotProductAttention``'s place in the local layer spec. Inputs are megatron's
    ``[s, b, heads, head_dim]`` query / key / value with this rank's heads (key and value with its
    query groups); the output is ``[s, b, heads * head_dim]``."""

    def __init__(
        self,
        config: TransformerConfig,
        layer_number: int,
        attn_mask_type: Any,
        attention_type: str,
        attention_dropout: Optional[float] = None,
        softmax_scale: Optional[float] = None,
        **unused: Any,
    ) -> None:
        super().__init__(config=config)
        self.dropout = config.attention_dropout if attention_dropout is None else attention_dropout
        self.softmax_scale = softmax_scale

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: Optional[torch.Tensor],
        attn_mask_type: Any = None,
        attention_bias: Any = None,
        packed_seq_params: Any = None,
    ) -> torch.Tensor:
        if attention_bias is not None or packed_seq_params is not None:
            raise ValueError("MaskedSDPAttention takes no attention bias or packed-sequence parameters")
        q, k, v = (tensor.permute(1, 2, 0, 3) for tensor in (query, key, value))  # [b, heads, s, d]
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=attention_mask, is_causal=attention_mask is None,
            dropout_p=self.dropout if self.training else 0.0, scale=self.softmax_scale, enable_gqa=q.shape[1] != k.shape[1],
        )
        seq, batch = query.shape[0], query.shape[1]
        return out.permute(2, 0, 1, 3).reshape(seq, batch, -1)
