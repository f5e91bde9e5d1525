"""Token streams: how a padded micro-batch is laid out for one model call, and back.

A ``TokenStream`` is what the model sees:

* padded: the ``[b, T]`` rows as they are, with the 2-D attention mask;
* packed (remove-padding): the valid tokens of all rows concatenated into one
  ``[1, N]`` row, ``position_ids`` restarting at each sequence and no attention mask.
  transformers (>= 4.56, incl. 5.x) then builds a block-diagonal causal mask from the
  position resets for sdpa/eager/flex and uses varlen kernels for flash-attention; this
  needs ``use_cache=False`` (a KV cache switches the detection off). A new sequence is
  recognised wherever the position does not increase by exactly one.

Either way the model's per-token outputs come back as a flat tensor over the stream
(``[b*T]`` or ``[N]``) and ``to_rows`` scatters them into ``[b, T]`` (zeros at padding).
``source_index`` lists the stream positions whose next stream token is a real next
token of the same sequence: the logits there predict ``target_index = source_index + 1``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

__all__ = ["TokenStream", "default_position_ids", "make_token_stream"]


def default_position_ids(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions counting real tokens from 0 (left padding gets 0)."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


@dataclass
class TokenStream:
    """One model call's inputs plus the index maps between the stream and the ``[b, T]`` rows."""

    input_ids: torch.Tensor  # [1, N] packed or [b, T] padded
    position_ids: torch.Tensor
    attention_mask: Optional[torch.Tensor]  # None when packed
    source_index: torch.Tensor  # stream positions that predict a next token of the same sequence
    valid_index: Optional[torch.Tensor]  # packed: flat [b*T] index of each stream token; None when padded
    rows_shape: tuple[int, int]

    @property
    def target_index(self) -> torch.Tensor:
        return self.source_index + 1

    @property
    def labels(self) -> torch.Tensor:
        """The token each ``source_index`` position predicts."""
        return self.input_ids.reshape(-1).index_select(0, self.target_index)

    def to_rows(self, flat: torch.Tensor) -> torch.Tensor:
        """A flat per-stream-token tensor as ``[b, T]`` rows (zeros at padding); differentiable."""
        rows, width = self.rows_shape
        if self.valid_index is None:
            return flat.reshape(rows, width)
        out = flat.new_zeros(rows * width)
        return out.index_put((self.valid_index,), flat).reshape(rows, width)


def make_token_stream(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: Optional[torch.Tensor],
    remove_padding: bool,
) -> TokenStream:
    """Lay out a ``[b, T]`` micro-batch for one model call (see the module docstring)."""
    if position_ids is None:
        position_ids = default_position_ids(attention_mask)
    mask = attention_mask.bool()
    rows, width = input_ids.shape
    if not remove_padding:
        has_next = torch.zeros_like(mask)
        has_next[:, :-1] = mask[:, :-1] & mask[:, 1:]
        return TokenStream(
            input_ids=input_ids,
            position_ids=position_ids,
            attention_mask=attention_mask,
            source_index=has_next.reshape(-1).nonzero().squeeze(-1),
            valid_index=None,
            rows_shape=(rows, width),
        )
    valid_index = mask.reshape(-1).nonzero().squeeze(-1)
    lengths = mask.sum(-1)
    starts = torch.cumsum(lengths, 0) - lengths  # stream offset of each row's first token
    is_start = torch.zeros(int(lengths.sum()), dtype=torch.bool, device=input_ids.device)
    is_start[starts[lengths > 0]] = True
    has_next = torch.zeros_like(is_start)
    has_next[:-1] = ~is_start[1:]
    return TokenStream(
        input_ids=input_ids.reshape(-1).index_select(0, valid_index).unsqueeze(0),
        position_ids=position_ids.reshape(-1).index_select(0, valid_index).unsqueeze(0),
        attention_mask=None,
        source_index=has_next.nonzero().squeeze(-1),
        valid_index=valid_index,
        rows_shape=(rows, width),
    )
