"""Tinker data as engine batches, and the engine's per-token outputs as Tinker's per-datum results.

A ``Datum`` of N positions (``model_input`` tokens ``x``, ``target_tokens`` ``y``, position ``i``
predicting ``y[i]``) becomes the engine row ``x + [y[-1]]`` (N + 1 tokens, right-padded): the
engine scores column ``t + 1`` given the tokens before it, which is ``y[t]`` when the targets are the inputs
shifted by one (``y[:-1] == x[1:]``, how a supervised datum is built). Targets that are not that shift (the
cookbook's RL loop puts 0 at prompt positions, whose advantage is 0) go to the engine as ``target_ids``
(``rlflow.engines.base``): column ``t + 1`` then scores ``y[t]`` whatever the row holds there. A batch whose
data are all shifts carries no such column, so the engines' prefix sharing stays open to it.

Each per-position ``loss_fn_input`` moves to the same columns (``losses.INPUT_COLUMNS``), and
``loss_mask`` marks columns ``1..N``. A custom loss's other inputs (``rlflow.service.custom_losses``) get columns
of their own (``input_column``): ``[B, T]`` for one value per position, ``[B]`` for one per datum (rank 0).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

import torch

from rlflow.protocol import DataProto
from rlflow.service.catalogue import check_token_ids
from rlflow.service.losses import INPUT_COLUMNS, LossInputError


@dataclass
class Datum:
    """One training sequence as the service received it: its tokens and per-position loss inputs."""

    tokens: list[int]
    loss_fn_inputs: dict[str, list[float]] = field(default_factory=dict)


class SequenceTooLongError(LossInputError):
    """A datum is longer than the model's context (``service.max_seq_len``)."""


def input_column(name: str, rank: int) -> str:
    """The batch column of loss input ``name`` of ``rank`` (1: a value per position, 0: one per datum)."""
    return INPUT_COLUMNS[name] if rank == 1 and name in INPUT_COLUMNS else f"custom_input:{name}"


def _check(index: int, datum: Datum, needed: Mapping[str, int], max_len: int, vocab_size: int) -> None:
    n = len(datum.tokens)
    if n == 0:
        raise LossInputError(f"datum {index}: model_input is empty")
    if n + 1 > max_len:
        raise SequenceTooLongError(f"datum {index}: {n} positions + 1 target exceed the model's context of {max_len} tokens")
    check_token_ids(datum.tokens, vocab_size, f"datum {index}: model_input", LossInputError)
    per_position = {name: 1 for name in INPUT_COLUMNS if name in datum.loss_fn_inputs}  # each checked when present
    for name, rank in {"target_tokens": 1, **per_position, **needed}.items():
        values = datum.loss_fn_inputs.get(name)
        if values is None:
            raise LossInputError(f"datum {index}: loss_fn_inputs lacks {name!r} (this loss needs target_tokens, {', '.join(needed)})")
        if len(values) != (n if rank == 1 else 1):
            raise LossInputError(f"datum {index}: loss_fn_inputs[{name!r}] has {len(values)} values for "
                                 f"{f'{n} positions' if rank == 1 else 'one per datum (rank 0)'}")
    check_token_ids(datum.loss_fn_inputs["target_tokens"], vocab_size, f"datum {index}: target_tokens", LossInputError)


def training_batch(data: list[Datum], needed: Mapping[str, int], pad_token_id: int, max_len: int,
                   vocab_size: int) -> DataProto:
    """The engine batch of ``data`` for a loss reading the inputs ``needed`` (name -> rank) besides ``target_tokens``;
    ``LossInputError`` names what a datum lacks or a token outside the model's ``vocab_size``."""
    if not data:
        raise LossInputError("the request holds no data")
    for index, datum in enumerate(data):
        _check(index, datum, needed, max_len, vocab_size)
    width = max(len(datum.tokens) for datum in data) + 1
    rows = len(data)
    input_ids = torch.full((rows, width), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((rows, width), dtype=torch.long)
    columns = {column: torch.zeros((rows, width), dtype=torch.float32) for column in INPUT_COLUMNS.values()}
    custom = {name: rank for name, rank in needed.items() if input_column(name, rank) not in columns}
    columns.update({input_column(name, rank): torch.zeros((rows, width) if rank else (rows,)) for name, rank in custom.items()})
    for row, datum in enumerate(data):
        n = len(datum.tokens)
        input_ids[row, : n + 1] = torch.tensor([*datum.tokens, int(datum.loss_fn_inputs["target_tokens"][-1])])
        attention_mask[row, : n + 1] = 1
        columns["target_weights"][row, 1 : n + 1] = 1.0  # cross_entropy without weights: every target counts
        for name, column in INPUT_COLUMNS.items():
            if name in datum.loss_fn_inputs and needed.get(name, 1) == 1:
                columns[column][row, 1 : n + 1] = torch.tensor(datum.loss_fn_inputs[name], dtype=torch.float32)
        for name, rank in custom.items():
            values = torch.tensor(datum.loss_fn_inputs[name], dtype=torch.float32)
            if rank:
                columns[input_column(name, rank)][row, 1 : n + 1] = values
            else:
                columns[input_column(name, rank)][row] = values[0]
    loss_mask = attention_mask.clone()
    loss_mask[:, 0] = 0
    targets = [[int(t) for t in datum.loss_fn_inputs["target_tokens"]] for datum in data]
    if any(row_targets[:-1] != [int(t) for t in datum.tokens[1:]] for row_targets, datum in zip(targets, data)):
        columns["target_ids"] = input_ids.clone()
        for row, row_targets in enumerate(targets):
            columns["target_ids"][row, 1 : len(row_targets) + 1] = torch.tensor(row_targets, dtype=torch.long)
    return DataProto.from_dict({"input_ids": input_ids, "attention_mask": attention_mask, "loss_mask": loss_mask, **columns})


def per_datum_logprobs(log_probs: torch.Tensor, data: list[Datum]) -> list[list[float]]:
    """The log-prob of each datum's targets (N values per datum) from the engine's ``[B, T]`` output."""
    return [log_probs[row, 1 : len(datum.tokens) + 1].tolist() for row, datum in enumerate(data)]
