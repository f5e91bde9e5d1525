"""In-process unit tests of ``rlflow.engines.common.fsdp``: the gradient clip of ``FullyShardEngine`` on plain
tensors (its DTensor groups run in the engine suite: fsdp2 and torchtitan, FSDP x TP in ``test_torchtitan.py``)
and the compiled decoder layer's shapes (fsdp2's ``compile``)."""

from __future__ import annotations

import math

import pytest
import torch
from torch._dynamo.testing import CompileCounter

from rlflow.engines.common.fsdp.fully_shard import clip_grad_norm
from rlflow.engines.common.fsdp.layer_compile import compile_layer_forward


def _grads(seed: int) -> list[torch.nn.Parameter]:
    torch.manual_seed(seed)
    params = [torch.nn.Parameter(torch.randn(shape)) for shape in [(5, 3), (3,), (7, 2, 2)]]
    for param in params[:2]:  # the last one has no gradient: left out of the norm
        param.grad = torch.randn_like(param) * 3
    return params


@pytest.mark.parametrize("max_norm", [0.5, 1e6, math.inf])
def test_clip_grad_norm_is_torchs_on_plain_tensors(max_norm: float) -> None:
    """One group of plain tensors: the norm is ``torch.nn.utils.clip_grad_norm_``'s bit for bit, the clipped
    gradients within float32 rounding of its coefficient; under ``max_norm`` nothing changes."""
    params, reference = _grads(0), _grads(0)
    before = [p.grad.clone() for p in params[:2]]
    norm = clip_grad_norm(params, max_norm)
    expected = torch.nn.utils.clip_grad_norm_(reference, max_norm).item()
    assert norm == expected and norm > 0.5
    for param, ref, grad in zip(params[:2], reference[:2], before):
        torch.testing.assert_close(param.grad, ref.grad, rtol=1e-6, atol=0)
        assert torch.equal(param.grad, grad) == (max_norm > norm)
    assert params[2].grad is None
    assert clip_grad_norm([torch.nn.Parameter(torch.ones(2))], 1.0) == 0.0


def _decoder_layer(hidden_states, attention_mask, position_embeddings, position_ids):
    """A decoder layer's inputs as HF passes them with packed rows: mask [R, 1, W, W], cos/sin [R, W, D]."""
    cos, sin = position_embeddings
    scores = (hidden_states[..., : cos.shape[-1]] * cos + sin) @ hidden_states[..., : cos.shape[-1]].transpose(1, 2)
    weights = scores.masked_fill(~attention_mask[:, 0], -1e9).softmax(-1)
    return weights @ hidden_states + position_ids[..., None]


def _layer_inputs(rows: int, width: int, hidden: int = 16, head: int = 8) -> tuple:
    mask = torch.ones(width, width, dtype=torch.bool).tril().expand(rows, 1, width, width)
    cos_sin = (torch.randn(rows, width, head), torch.randn(rows, width, head))
    return torch.randn(rows, width, hidden), mask, cos_sin, torch.arange(width).expand(rows, width)


@pytest.mark.parametrize("token_dims_dynamic, compiles", [(True, 1), (False, 3)])
def test_a_compiled_layer_compiles_once_across_packed_row_shapes(token_dims_dynamic, compiles):
    """Rows change, then the width: one compile with the token grid marked dynamic, three without
    (dynamo's static graph, then one recompile per dimension); outputs equal the eager layer's."""
    torch._dynamo.reset()
    counter = CompileCounter()
    layer = compile_layer_forward(_decoder_layer, backend=counter) if token_dims_dynamic else torch.compile(
        _decoder_layer, backend=counter)
    for rows, width in [(6, 20), (7, 20), (5, 23), (4, 31)]:
        inputs = _layer_inputs(rows, width)
        torch.testing.assert_close(layer(*inputs), _decoder_layer(*inputs))
    assert counter.frame_count == compiles


def _grid_layer(hidden_states, sequence_slots):
    """A layer reading an index map of the layout, as sdpa_varlen's attention reads its ``[sequences, longest]`` grid."""
    return hidden_states[0][sequence_slots].sum(1).sum(0) + hidden_states.mean()


def test_a_compiled_layer_compiles_once_across_index_map_shapes():
    """The grid's sequence count and longest sequence change independently of the token count: marked too."""
    torch._dynamo.reset()
    counter = CompileCounter()
    layer = compile_layer_forward(_grid_layer, backend=counter)
    for tokens, sequences, longest in [(40, 5, 8), (45, 5, 9), (50, 6, 9), (33, 4, 11)]:
        inputs = (torch.randn(1, tokens, 16), torch.randint(0, tokens, (sequences, longest)))
        torch.testing.assert_close(layer(*inputs), _grid_layer(*inputs))
    assert counter.frame_count == 1
