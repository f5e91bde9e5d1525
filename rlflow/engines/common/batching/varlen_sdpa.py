"""``attn_implementation=sdpa_varlen``: variable-length attention through torch's
``scaled_dot_product_attention``, so that no linear layer computes filler.

Why: sdpa has no variable-length form, so packed sequences share rows (``packing``) and every
matmul of a layer runs over the rows' filler slots too: 8% of the slots at the GRPO bench's
shape, after the row width search, in the projections and MLP that hold nearly all of the
update's FLOPs (attention was 5.7% of the update, ``packing``). Flash attention's varlen
kernels avoid that on GPUs; this is plain torch (tested on CPU).

How: the stream is one row of real tokens only, as for flash attention (``packing.VARLEN_ATTENTION``).
Inside each attention call, queries, keys and values are gathered into a grid
``[sequences, heads, longest, head_dim]`` (each sequence from column 0), sdpa runs causally on it,
and the real tokens' outputs are gathered back. The columns past a shorter sequence's end hold
copies of a real token: causality keeps them from every real query (a token at column j sees
columns <= j, all its own), their outputs are dropped, and so no gradient flows through them.
The two index maps are laid out on the host with the stream (``TokenStream.sequence_slots``,
``token_slots``) and reach this function as keyword arguments of the model call, which transformers
passes through every layer to the attention function. Sequences are gathered by their real
tokens, so the padded layout (``use_remove_padding=false``) runs the same way.

Cost: the grid repeats the attention input and output once per layer (three gathers and one
back), and the attention runs over ``sequences x longest`` slots. bf16 on a CPU runs the fp32 kernel on short
grids, where it is faster (``cpu_attention_dtype``). Registered with transformers'
``AttentionInterface`` on import; its mask function is flash attention's (no mask to build: a
packed stream gets none, a padded one only its 2-D padding mask, which the grid makes unneeded).
"""

from __future__ import annotations

from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch import nn
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask

from rlflow.engines.common.batching.cpu_attention_dtype import attention_compute_dtype

__all__ = ["SDPA_VARLEN", "sdpa_varlen_attention", "sequence_grid"]

SDPA_VARLEN = "sdpa_varlen"
# attention features a grid of whole sequences cannot honour
_UNSUPPORTED = ("sliding_window", "softcap", "s_aux")


def sequence_grid(sequences: list[torch.Tensor], num_slots: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The index maps of the attention grid for ``sequences`` (each a 1-D tensor of its stream slots, in order)
    in a stream of ``num_slots`` slots: ``sequence_slots`` ``[sequences, longest]``, the slot read into each
    grid cell (past a sequence's end: its last token), and ``token_slots`` ``[num_slots]``, the grid cell
    (flat) each slot's output is read from (slots outside every sequence: cell 0). A slot in several
    sequences (a prefix they share, ``prefix_sharing``) reads its output from the first of them."""
    lengths = torch.tensor([len(slots) for slots in sequences], dtype=torch.long)
    longest = int(lengths.max())
    sequence_slots = torch.stack([torch.cat([slots, slots[-1:].expand(longest - len(slots))]) for slots in sequences])
    real = torch.arange(longest)[None, :] < lengths[:, None]
    cells = torch.arange(len(sequences) * longest).reshape(len(sequences), longest)
    unread = len(sequences) * longest
    token_slots = torch.full((num_slots,), unread, dtype=torch.long)
    token_slots = token_slots.scatter_reduce(0, sequence_slots[real], cells[real], reduce="amin")
    return sequence_slots, token_slots.masked_fill(token_slots == unread, 0)


def sdpa_varlen_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: Optional[torch.Tensor],
    dropout: float = 0.0,
    scaling: Optional[float] = None,
    sequence_slots: Optional[torch.Tensor] = None,
    token_slots: Optional[torch.Tensor] = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function contract: ``query`` ``[b, heads, T, d]``, ``key`` / ``value``
    ``[b, kv_heads, T, d]`` -> output ``[b, T, heads, d]``. ``attention_mask`` is unused: the grid
    (``sequence_slots`` / ``token_slots``, from ``sequence_grid`` over the ``b x T`` slots) says which
    tokens attend to which."""
    if sequence_slots is None or token_slots is None:
        raise ValueError(f"attn_implementation={SDPA_VARLEN} needs the token stream's sequence_slots and token_slots "
                         "(an rlflow engine passes them); load the model with attn_implementation=sdpa to call it directly")
    used = [name for name in _UNSUPPORTED if kwargs.get(name) is not None]
    if used:
        raise ValueError(f"attn_implementation={SDPA_VARLEN} does not support {', '.join(used)}; use sdpa or flash_attention_2")
    batch, _, width, head_dim = query.shape

    def grid(states: torch.Tensor) -> torch.Tensor:  # [b, h, T, d] -> [sequences, h, longest, d]
        flat = states.transpose(0, 1).reshape(states.shape[1], batch * width, head_dim)
        return flat[:, sequence_slots].transpose(0, 1)

    grids = [grid(states) for states in (query, key, value)]
    compute = attention_compute_dtype(grids[0])  # bf16 on a CPU: the faster fp32 kernel (cpu_attention_dtype.py)
    if compute is not None:
        grids = [states.to(compute) for states in grids]
    output = F.scaled_dot_product_attention(*grids, is_causal=True, scale=scaling, dropout_p=dropout,
                                            enable_gqa=key.shape[1] != query.shape[1]).to(query.dtype)
    sequences, heads, longest, _ = output.shape
    output = output.transpose(1, 2).reshape(sequences * longest, heads, head_dim).index_select(0, token_slots)
    return output.reshape(batch, width, heads, head_dim), None


AttentionInterface.register(SDPA_VARLEN, sdpa_varlen_attention)
AttentionMaskInterface.register(SDPA_VARLEN, flash_attention_mask)
