"""Token streams: how a padded micro-batch is laid out for one model call, and back.

A ``TokenStream`` is what the model sees:

* padded: the ``[b, T]`` rows as they are, with the 2-D attention mask;
* packed (remove-padding): the real tokens of all sequences placed back to back,
  ``position_ids`` restarting at 0 for each sequence and no attention mask (with
  ``sdpa_varlen``, ``varlen_sdpa.py``, also the index maps of its attention grid).
  transformers (>= 4.56, incl. 5.x) builds a block-diagonal causal mask from the
  position resets for sdpa/eager/flex and uses varlen kernels for flash-attention;
  this needs ``use_cache=False`` (a KV cache switches the detection off). A new
  sequence is recognised wherever the position does not increase by exactly one.

Packed row length: attention implementations with variable-length kernels
(``VARLEN_ATTENTION``) get all tokens in one row. The others (sdpa, eager) attend over
the whole row, so a single row of N tokens would cost N^2; their sequences are packed
first-fit into rows of a width ``W`` between one and four times the longest sequence, and
the tail of each row is filler tokens forming their own block (causal attention: real tokens
never see them). Rows exactly as long as the longest sequence waste the most filler when most
sequences are longer than half of it (an RL batch of similar-length responses: ~16% of the
slots, measured); wider rows fill up but make every slot's attention dearer. ``row_width``
tries every width from the longest sequence to four times it in steps of an eighth of it (the
best fit often lies between two multiples: under a longest sequence of 100, rows of 124 take
two sequences of 60 where rows of 100 take one) and picks the ``W`` with the lowest estimated
cost ``slots(W) * (1 + W / (3 * hidden_size))``:
per slot and layer the linear layers cost ~72 h^2 FLOPs (forward and backward) and masked
attention over a row ~12 W h, and the CPU flash kernel runs at about half the GEMM rate
(measured: 5.7% of the update at W=84, h=512), hence ``3 h``. Without a hidden size the
rows are as long as the longest sequence.

Model outputs come back as a flat tensor over the stream slots (``[rows * width]``)
and ``to_rows`` puts them into ``[b, T]`` (zeros at padding). ``source_index`` lists
the slots whose logits predict a next token of the same sequence, ``target_index`` the
slot of that token: here always the next slot (``prefix_sharing`` lays out streams where
a shared prefix's last slot predicts the first token of each sequence that shares it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace
from typing import Any, Optional

import torch

from rlflow.engines.common.batching.varlen_sdpa import SDPA_VARLEN, sequence_grid
from rlflow.utils.device import host_to_device

__all__ = [
    "VARLEN_ATTENTION",
    "TokenStream",
    "default_position_ids",
    "document_causal_mask",
    "first_fit_rows",
    "grid_fields",
    "make_token_stream",
    "real_columns",
    "row_width",
]

VARLEN_ATTENTION = frozenset({"flash_attention_2", "flash_attention_3", "flex_attention", SDPA_VARLEN})


def default_position_ids(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions counting real tokens from 0 (left padding gets 0)."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def document_causal_mask(positions: torch.Tensor) -> torch.Tensor:
    """``[B, 1, L, L]`` bool: query i may see key j when j <= i and both are in the same document (a document
    starts wherever the position resets to 0: packed sequences, and each left-padding slot on its own)."""
    document = (positions == 0).cumsum(-1)
    same_document = document[:, :, None] == document[:, None, :]
    length = positions.shape[-1]
    causal = torch.ones(length, length, dtype=torch.bool, device=positions.device).tril()
    return (same_document & causal).unsqueeze(1)


def real_columns(
    attention_mask: torch.Tensor, position_ids: Optional[torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """What every layout starts from: the position ids (counted from the mask when None), the mask as bool,
    and each row's real columns."""
    if position_ids is None:
        position_ids = default_position_ids(attention_mask)
    mask = attention_mask.bool()
    return position_ids, mask, [mask[row].nonzero().squeeze(-1) for row in range(mask.shape[0])]


@dataclass
class TokenStream:
    """One model call's inputs plus the index maps between stream slots and the ``[b, T]`` rows."""

    input_ids: torch.Tensor  # [rows, width]
    position_ids: torch.Tensor  # [rows, width]
    attention_mask: Optional[torch.Tensor]  # None when packed
    slot_index: torch.Tensor  # flat stream slot of each real token
    batch_index: torch.Tensor  # flat [b*T] position of the same token
    source_index: torch.Tensor  # slots that predict the next token of the same sequence
    target_index: torch.Tensor  # the slot of the token each source_index slot predicts
    rows_shape: tuple[int, int]  # (b, T) of the micro-batch
    sequence_slots: Optional[torch.Tensor] = None  # sdpa_varlen's attention grid (varlen_sdpa.sequence_grid)
    token_slots: Optional[torch.Tensor] = None
    attention_extras: dict[str, Any] = field(default_factory=dict)  # more for the attention function (ulysses.py)
    label_ids: Optional[torch.Tensor] = None  # [rows, width]: the token each slot is scored as (None: its input token)

    def attention_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of the model call that its attention function reads (sdpa_varlen's grid, extras)."""
        if self.sequence_slots is None:
            return dict(self.attention_extras)
        return {"sequence_slots": self.sequence_slots, "token_slots": self.token_slots, **self.attention_extras}

    @property
    def scored_ids(self) -> torch.Tensor:
        """``[rows, width]``: the token each slot's log-prob is computed for: ``label_ids`` where a batch gave
        ``target_ids`` (``with_target_ids``), else the slot's input token."""
        return self.input_ids if self.label_ids is None else self.label_ids

    @property
    def next_tokens(self) -> torch.Tensor:
        """``[rows, width]``: the scored token of each slot's next slot of its row (0 in a row's last slot): what every
        slot predicts where every slot's log-prob is computed (sequence and pipeline parallelism); ``source_index``
        keeps the predictions of a token of the same sequence."""
        return torch.nn.functional.pad(self.scored_ids[:, 1:], (0, 1))

    @property
    def labels(self) -> torch.Tensor:
        """The token each ``source_index`` slot predicts."""
        return self.scored_ids.reshape(-1).index_select(0, self.target_index)

    def with_target_ids(self, target_ids: torch.Tensor) -> "TokenStream":
        """The same stream scoring ``target_ids`` (``[b, T]``, aligned with the micro-batch's rows) instead of the
        input tokens: each real token's slot gets its row position's target. A layout that lays one slot out for
        several row positions (``prefix_sharing``) cannot take per-row targets; ``shares_prefix`` keeps such
        batches unshared."""
        flat = self.input_ids.reshape(-1).clone()
        flat[self.slot_index] = target_ids.reshape(-1).to(flat).index_select(0, self.batch_index)
        return replace(self, label_ids=flat.view_as(self.input_ids))

    def to(self, device: torch.device) -> "TokenStream":
        """The same stream with its tensors on ``device`` (a layout is computed on the host, where its
        ``nonzero`` calls cost no device synchronisation, then moved)."""
        moved = {field.name: host_to_device(value, device) for field in fields(self)
                 if isinstance(value := getattr(self, field.name), torch.Tensor)}
        return replace(self, **moved)

    def widened(self, multiple: int) -> "TokenStream":
        """The same stream with its rows padded to a width ``multiple`` divides (sequence parallelism splits the
        width): filler columns of token 0 at positions counting from 0 (a document of their own), index maps moved
        to the new width. For the row layouts only (no attention grid)."""
        rows, width = self.input_ids.shape
        extra = -width % multiple
        if extra == 0:
            return self
        if self.sequence_slots is not None:
            raise ValueError("widening a stream with an attention grid (sdpa_varlen) is not supported")
        new_width = width + extra

        def moved(index: torch.Tensor) -> torch.Tensor:
            return index // width * new_width + index % width

        filler = torch.arange(extra, device=self.position_ids.device).to(self.position_ids).expand(rows, extra)
        mask = None if self.attention_mask is None else torch.nn.functional.pad(self.attention_mask, (0, extra))
        labels = None if self.label_ids is None else torch.nn.functional.pad(self.label_ids, (0, extra))
        return replace(self, input_ids=torch.nn.functional.pad(self.input_ids, (0, extra)), label_ids=labels,
                       position_ids=torch.cat([self.position_ids, filler], dim=1), attention_mask=mask,
                       slot_index=moved(self.slot_index), source_index=moved(self.source_index),
                       target_index=moved(self.target_index))

    def to_rows(self, flat: torch.Tensor) -> torch.Tensor:
        """Per-slot values as a new ``[b, T]`` tensor (zeros at padding); differentiable, never a view
        (FSDP2's hooks on module outputs do not survive in-place ops on views)."""
        rows, width = self.rows_shape
        values = flat.index_select(0, self.slot_index)
        return flat.new_zeros(rows, width).index_put((self.batch_index // width, self.batch_index % width), values)


def first_fit_rows(lengths: list[int], capacity: int) -> list[list[int]]:
    """Sequence indices per packed row (longest first, each into the first row it fits).

    A row with less room left than the shortest sequence can take nothing more, so the scan skips
    it: at rows about as wide as the longest sequence most rows close after one or two sequences."""
    order = sorted((i for i in range(len(lengths)) if lengths[i] > 0), key=lambda i: (-lengths[i], i))
    if not order:
        return []
    shortest = lengths[order[-1]]
    rows: list[list[int]] = []
    room: list[int] = []
    open_rows: list[int] = []  # rows that can still take the shortest sequence, in row order
    for index in order:
        length = lengths[index]
        for position, row in enumerate(open_rows):
            if room[row] >= length:
                break
        else:
            position, row = len(open_rows), len(rows)
            rows.append([])
            room.append(capacity)
            open_rows.append(row)
        rows[row].append(index)
        room[row] -= length
        if room[row] < shortest:
            del open_rows[position]
    return rows


# the packed row widths tried: the longest sequence up to ROW_WIDTH_MAX_MULTIPLE times it, in steps of
# 1 / ROW_WIDTH_STEPS of it, narrowest first, until no wider row can cost less
ROW_WIDTH_MAX_MULTIPLE = 4
ROW_WIDTH_STEPS = 8


def row_width(lengths: list[int], hidden_size: Optional[int]) -> int:
    """Packed row width for non-varlen attention: of the widths tried, the one with the lowest estimated
    cost, the narrowest on a tie (module docstring); the longest sequence itself without ``hidden_size``.

    ``rows x width`` slots hold at least every token, so ``tokens x (1 + width / 3h)`` bounds a width's
    cost from below and grows with the width: once it reaches the best cost found, the search stops
    (same answer, a fraction of the first-fit runs)."""
    longest = max(lengths)
    if not hidden_size:
        return longest
    tokens, best_width, best_cost = sum(lengths), longest, math.inf
    step = max(1, longest // ROW_WIDTH_STEPS)
    for width in range(longest, ROW_WIDTH_MAX_MULTIPLE * longest + 1, step):
        attention_factor = 1.0 + width / (3.0 * hidden_size)
        if tokens * attention_factor >= best_cost:
            break
        cost = len(first_fit_rows(lengths, width)) * width * attention_factor
        if cost < best_cost:
            best_width, best_cost = width, cost
    return best_width


def _source_index(num_slots: int, slot_index: torch.Tensor, start_slots: torch.Tensor) -> torch.Tensor:
    real = torch.zeros(num_slots, dtype=torch.bool, device=slot_index.device)
    real[slot_index] = True
    start = torch.zeros_like(real)
    start[start_slots] = True
    has_next = real[:-1] & real[1:] & ~start[1:]
    return has_next.nonzero().squeeze(-1)


def make_token_stream(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: Optional[torch.Tensor],
    remove_padding: bool,
    attn_implementation: str = "sdpa",
    hidden_size: Optional[int] = None,
    target_ids: Optional[torch.Tensor] = None,
) -> TokenStream:
    """Lay out a ``[b, T]`` micro-batch for one model call (see the module docstring); with ``target_ids``
    (``[b, T]``, the batch's optional column of that name) the stream scores them instead of the input tokens."""
    stream = _layout(input_ids, attention_mask, position_ids, remove_padding, attn_implementation, hidden_size)
    return stream if target_ids is None else stream.with_target_ids(target_ids)


def _layout(input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: Optional[torch.Tensor],
            remove_padding: bool, attn_implementation: str, hidden_size: Optional[int]) -> TokenStream:
    batch_rows, width = input_ids.shape
    position_ids, mask, real_cols = real_columns(attention_mask, position_ids)
    device = input_ids.device
    if not remove_padding:
        batch_index = mask.reshape(-1).nonzero().squeeze(-1)
        row_starts = [row * width + int(cols[0]) for row, cols in enumerate(real_cols) if len(cols)]
        row_lengths = [len(cols) for cols in real_cols if len(cols)]
        starts = torch.tensor(row_starts, dtype=torch.long, device=device)
        source_index = _source_index(batch_rows * width, batch_index, starts)
        return TokenStream(
            input_ids=input_ids,
            position_ids=position_ids,
            attention_mask=attention_mask,
            slot_index=batch_index,
            batch_index=batch_index,
            source_index=source_index,
            target_index=source_index + 1,
            rows_shape=(batch_rows, width),
            **_grid(attn_implementation, row_starts, row_lengths, batch_rows * width, device, row_cols=real_cols),
        )
    lengths = [len(cols) for cols in real_cols]
    capacity = sum(lengths) if attn_implementation in VARLEN_ATTENTION else row_width(lengths, hidden_size)
    packed_rows = first_fit_rows(lengths, capacity)
    slots, tokens, starts, filler_slots, filler_positions = [], [], [], [], []
    for row, members in enumerate(packed_rows):
        offset = row * capacity
        for seq in members:
            starts.append(offset)
            slots.append(torch.arange(offset, offset + lengths[seq], device=device))
            tokens.append(seq * width + real_cols[seq])
            offset += lengths[seq]
        filler = (row + 1) * capacity - offset
        filler_slots.append(torch.arange(offset, offset + filler, device=device))
        filler_positions.append(torch.arange(filler, device=device))
    slot_index, batch_index = torch.cat(slots), torch.cat(tokens)
    num_slots = len(packed_rows) * capacity
    stream_ids = torch.zeros(num_slots, dtype=input_ids.dtype, device=device)
    stream_positions = torch.zeros(num_slots, dtype=position_ids.dtype, device=device)
    stream_ids[slot_index] = input_ids.reshape(-1)[batch_index]
    stream_positions[slot_index] = position_ids.reshape(-1)[batch_index]
    stream_positions[torch.cat(filler_slots)] = torch.cat(filler_positions).to(position_ids.dtype)
    source_index = _source_index(num_slots, slot_index, torch.tensor(starts, dtype=torch.long, device=device))
    return TokenStream(
        input_ids=stream_ids.reshape(-1, capacity),
        position_ids=stream_positions.reshape(-1, capacity),
        attention_mask=None,
        slot_index=slot_index,
        batch_index=batch_index,
        source_index=source_index,
        target_index=source_index + 1,
        rows_shape=(batch_rows, width),
        **_grid(attn_implementation, starts, [lengths[seq] for members in packed_rows for seq in members], num_slots, device),
    )


def _grid(attn_implementation: str, starts: list[int], lengths: list[int], num_slots: int, device: torch.device,
          row_cols: Optional[list[torch.Tensor]] = None) -> dict[str, torch.Tensor]:
    """sdpa_varlen's grid over the sequences at slots ``starts`` (``TokenStream`` fields); nothing for other kernels.
    ``row_cols``: the padded layout's real columns per row, which must have no holes (packed sequences never do)."""
    if attn_implementation != SDPA_VARLEN or not lengths:
        return {}
    if row_cols is not None and any(len(cols) and int(cols[-1] - cols[0]) + 1 != len(cols) for cols in row_cols):
        raise ValueError(f"attn_implementation={SDPA_VARLEN} needs each row's real tokens side by side (an attention "
                         "mask without holes); use sdpa for this batch")
    return grid_fields([torch.arange(start, start + length) for start, length in zip(starts, lengths)], num_slots, device)


def grid_fields(sequences: list[torch.Tensor], num_slots: int, device: torch.device) -> dict[str, torch.Tensor]:
    """sdpa_varlen's grid over ``sequences`` (each its stream slots in order) as ``TokenStream`` fields on ``device``."""
    sequence_slots, token_slots = sequence_grid(sequences, num_slots)
    return {"sequence_slots": sequence_slots.to(device), "token_slots": token_slots.to(device)}
