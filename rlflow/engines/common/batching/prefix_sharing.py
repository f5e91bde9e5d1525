"""``share_prefix``: a prefix that several rows of a micro-batch begin with is computed once.

Why: GRPO samples ``n`` responses per prompt, and the update runs every row's prompt through
every layer again: at the GRPO bench's shape (26-token prompts, ~55-token responses, ``n=8``) a
third of the update's tokens are prompt copies. A prompt's hidden states do not depend on what
follows it (causal attention), so one copy serves every row of its group: the linear layers, which
hold nearly all of the FLOPs, see each prompt once.

Which rows share: those whose real tokens before their first ``loss_mask`` column (an RL row's
prompt) are the same tokens at the same positions. The engine compares the tokens themselves, so
no group id is trusted. A row whose loss covers all of its tokens has no prefix to share.

How: the stream is one row of real tokens (as for ``packing.VARLEN_ATTENTION``) holding each
distinct prefix once, then the rest of each row that shares it. sdpa_varlen's attention grid
(``varlen_sdpa``) gives every row the prefix's slots followed by its own, so each token attends
to exactly what it would in its padded row; the prefix's outputs are read from the first row of
its group, and the gradients of the other rows reach the shared keys and values through the
grid's gather. The prefix's last slot predicts the first own token of every row of its group
(``TokenStream.target_index``), and ``to_rows`` writes the prefix's per-token outputs into each
row. Log-probs, values and gradients equal those of the unshared stream (within the fp32
summation order: ``tests/engines/test_prefix_sharing.py``).

A prefix runs once per micro-batch that holds its rows, so the micro-batch planner keeps them together
(``prefix_row_groups``, ``micro_batching``).

Needs ``attn_implementation=sdpa_varlen`` and ``use_remove_padding`` (``EngineConfig``): other
kernels find sequences by position resets or row bounds, which a shared prefix breaks.
"""

from __future__ import annotations

from typing import Optional

import torch

from rlflow.engines.common.batching.packing import TokenStream, grid_fields, real_columns
from rlflow.engines.config import EngineConfig, HFModuleEngineConfig
from rlflow.protocol import DataProto

__all__ = ["prefix_row_groups", "shared_prefix_stream", "shares_prefix"]


def shares_prefix(config: EngineConfig, batch: DataProto) -> bool:
    """Whether ``batch``'s shared prefixes are laid out once: the HF-module option ``share_prefix`` is on, a
    ``loss_mask`` marks where each row's prefix ends, and no ``target_ids`` give rows their own targets inside
    a prefix. Read by the shared forward and micro-batch loop, so every engine built on them honours the option."""
    return (isinstance(config, HFModuleEngineConfig) and config.share_prefix and "loss_mask" in batch.batch
            and "target_ids" not in batch.batch)


def _prefix_lengths(mask: torch.Tensor, loss_mask: torch.Tensor) -> list[int]:
    """Per row, how many real tokens come before its first loss column (all of them without one)."""
    has_loss = loss_mask.bool() & mask
    no_loss = torch.full_like(mask[:, 0], mask.shape[1], dtype=torch.long)
    first_loss = torch.where(has_loss.any(-1), has_loss.int().argmax(-1), no_loss)
    before = torch.arange(mask.shape[1])[None, :] < first_loss[:, None]
    return (mask & before).sum(-1).tolist()


def _rows_by_prefix(
    input_ids: torch.Tensor, mask: torch.Tensor, position_ids: torch.Tensor, real_cols: list[torch.Tensor],
    loss_mask: torch.Tensor,
) -> list[tuple[int, list[int]]]:
    """``(prefix length, rows)`` per distinct shared prefix (tokens and positions), in order of first appearance;
    rows without real tokens are left out."""
    groups: dict[tuple, list[int]] = {}
    for row, prefix in enumerate(_prefix_lengths(mask, loss_mask)):
        if len(real_cols[row]):
            cols = real_cols[row][:prefix]
            key = (prefix, tuple(input_ids[row, cols].tolist()), tuple(position_ids[row, cols].tolist()))
            groups.setdefault(key, []).append(row)
    return [(key[0], rows) for key, rows in groups.items()]


def prefix_row_groups(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: Optional[torch.Tensor],
    loss_mask: torch.Tensor,
) -> list[list[int]]:
    """Every row of a ``[b, T]`` batch once, the rows that share a prefix together: what the micro-batch planner
    keeps in one micro-batch where its limits allow, since a prefix runs once per micro-batch that holds it.
    A row that shares nothing (no prefix, or no real tokens) is a group of its own."""
    position_ids, mask, real_cols = real_columns(attention_mask, position_ids)
    groups: list[list[int]] = []
    for prefix, rows in _rows_by_prefix(input_ids, mask, position_ids, real_cols, loss_mask):
        groups += [rows] if prefix else [[row] for row in rows]
    return groups + [[row] for row in range(len(real_cols)) if not len(real_cols[row])]


def shared_prefix_stream(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: Optional[torch.Tensor],
    loss_mask: torch.Tensor,
) -> TokenStream:
    """Lay out a ``[b, T]`` micro-batch as one row of real tokens with every shared prefix once (module docstring)."""
    width = input_ids.shape[1]
    position_ids, mask, real_cols = real_columns(attention_mask, position_ids)
    slot, tokens, sequences, sources, targets = 0, [], [], [], []
    for prefix, rows in _rows_by_prefix(input_ids, mask, position_ids, real_cols, loss_mask):
        prefix_slots = torch.arange(slot, slot + prefix)
        slot += prefix
        for member, row in enumerate(rows):
            own = len(real_cols[row]) - prefix
            sequence = torch.cat([prefix_slots, torch.arange(slot, slot + own)])
            slot += own
            sequences.append(sequence)  # the row's real tokens' slots, in order
            tokens.append(row * width + real_cols[row])
            first = 0 if member == 0 else max(prefix - 1, 0)  # the prefix's own predictions once per group
            sources.append(sequence[first:-1])
            targets.append(sequence[first + 1:])
    slot_index, batch_index = torch.cat(sequences), torch.cat(tokens)
    stream_ids = torch.zeros(slot, dtype=input_ids.dtype)
    stream_positions = torch.zeros(slot, dtype=position_ids.dtype)
    stream_ids[slot_index] = input_ids.reshape(-1)[batch_index]  # a shared slot gets the same token from each row
    stream_positions[slot_index] = position_ids.reshape(-1)[batch_index]
    return TokenStream(
        input_ids=stream_ids.reshape(1, slot),
        position_ids=stream_positions.reshape(1, slot),
        attention_mask=None,
        slot_index=slot_index,
        batch_index=batch_index,
        source_index=torch.cat(sources),
        target_index=torch.cat(targets),
        rows_shape=(input_ids.shape[0], width),
        **grid_fields(sequences, slot, input_ids.device),
    )
