"""How RL batches map onto engine batches: one place that knows the response sits in the last columns.

An RL batch holds ``input_ids``/``attention_mask``/``position_ids`` for prompt + response
(prompt left-padded, response right-padded) and ``responses``/``response_mask`` ``[B, R]``.
Engines return per-token outputs over the whole sequence ``[B, T]``; the response tokens are
its last ``R`` columns.
"""

from __future__ import annotations

import torch

from rlflow.protocol import DataProto

SEQUENCE_KEYS = ("input_ids", "attention_mask", "position_ids")


def response_length(data: DataProto) -> int:
    """``R``: the width of the response block."""
    return data.batch["responses"].shape[1]


def response_slice(per_token: torch.Tensor, length: int) -> torch.Tensor:
    """The response columns of a ``[B, T]`` per-token tensor (the log-prob *of* each response token)."""
    return per_token[:, per_token.shape[1] - length :]


def state_values_slice(values: torch.Tensor, length: int) -> torch.Tensor:
    """Values of the states each response token is generated from: positions ``T-R-1 .. T-2``."""
    end = values.shape[1] - 1
    return values[:, end - length : end]


def engine_batch(data: DataProto, extra_keys: tuple[str, ...] = ()) -> DataProto:
    """The engine's view: sequence tensors, a ``loss_mask`` covering the response, plus ``extra_keys``."""
    mask = data.batch["response_mask"]
    prompt_width = data.batch["input_ids"].shape[1] - mask.shape[1]
    loss_mask = torch.cat([mask.new_zeros(mask.shape[0], prompt_width), mask], dim=1)
    keys = [k for k in SEQUENCE_KEYS if k in data.batch] + ["responses", "response_mask", *extra_keys]
    view = data.select(batch_keys=keys, non_tensor_batch_keys=[])
    view.batch["loss_mask"] = loss_mask
    return view
