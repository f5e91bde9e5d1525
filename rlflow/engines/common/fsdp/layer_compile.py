"""``torch.compile`` of one decoder layer's forward, compiled once for every batch shape.

An RL batch has a new shape every step: packed rows (``rows x width``) change with the
sampled lengths. Left to itself, dynamo compiles a static graph first, recompiles with the row
count dynamic when it changes, and again with the width dynamic when that changes: three
compiles of every layer over the first steps (measured on the GRPO bench's update: 34, 32 and
25 s against 14 s once compiled). Every call marks the token-grid dimensions of its inputs
dynamic before the compiled code sees them (microseconds per layer), so the first compile already
gives the graph of the last of those, and a recompile for any other reason keeps them dynamic.

The token grid is read off ``hidden_states`` (its first two dimensions); every dimension of an
input tensor with one of those two sizes is marked, except the last dimension of a float tensor
(its features: the hidden size of the states, the head size of the rotary tables), which never
changes. Every dimension of an integer tensor other than the token grid's is marked as well: such
tensors are index maps of the batch's layout (``sdpa_varlen``'s ``[sequences, longest]`` grid),
sized by it. A dimension missed here only costs dynamo's own automatic recompile, and one marked
needlessly only a more general graph: never a wrong result.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Iterator

import torch


def _tensors(value: Any) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (tuple, list)):
        for item in value:
            yield from _tensors(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _tensors(item)


def mark_token_dims_dynamic(hidden_states: torch.Tensor, inputs: Any) -> None:
    """Mark every dimension of the tensors in ``inputs`` sized like ``hidden_states``' rows or width dynamic, and
    every dimension of an integer tensor (an index map of the layout)."""
    grid = {size for size in hidden_states.shape[:2] if size > 1}  # size-1 dims are specialised by dynamo anyway
    for tensor in _tensors(inputs):
        last = tensor.ndim - 1
        index_map = not tensor.is_floating_point() and tensor.dtype != torch.bool
        for dim, size in enumerate(tensor.shape):
            if size > 1 and (index_map or (size in grid and not (dim == last and tensor.is_floating_point()))):
                torch._dynamo.maybe_mark_dynamic(tensor, dim)


def compile_layer_forward(forward: Callable[..., Any], backend: str | Callable[..., Any] = "inductor") -> Callable[..., Any]:
    """``forward`` compiled by ``backend``, with the token-grid dimensions of its inputs dynamic from the first call."""
    compiled = torch.compile(forward, backend=backend)

    @functools.wraps(forward)
    def call(hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        mark_token_dims_dynamic(hidden_states, (hidden_states, args, kwargs))
        return compiled(hidden_states, *args, **kwargs)

    return call
