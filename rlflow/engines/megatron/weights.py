"""HF <-> megatron ``GPTModel`` weights, aware of tensor and pipeline parallelism in both directions.

Three forms of each weight:

* **HF**: the checkpoint's tensors (``model.layers.3.self_attn.q_proj.weight`` ...);
* **whole**: the tensor a single-rank ``GPTModel`` holds, named with the global layer index
  (``decoder.layers.3.self_attention.linear_qkv.weight``);
* **shard**: what one tensor-parallel rank of one pipeline stage holds, named with the stage's
  local layer index (``decoder.layers.1...`` on stage 1 of a 4-layer, 2-stage model).

HF -> whole (``whole_from_hf``) fuses: q/k/v (and Qwen2's biases) into ``linear_qkv`` interleaved per
KV group (``[q heads of group g, k_g, v_g]`` for each group, so a tensor-parallel split along dim 0
keeps whole groups); ``linear_fc1 = cat([gate_proj, up_proj])``; the embeddings (and an untied
output layer) padded to the padded vocabulary; norms under megatron's names. whole -> HF
(``hf_from_whole``) undoes it. whole <-> shard (``shard_of`` / ``whole_of``) splits along
the tensor-parallel dimension of each weight: columns (dim 0) for qkv, fc1 and the vocabulary,
rows (dim 1) for the output projection and fc2, nothing for norms; fc1 is split as gate and up
separately (each rank holds ``[gate_r; up_r]``). Pipeline stages only rename layers
(``global_name``).

A value model (critic) has ``value_head.{weight,bias}`` where the HF classification model has ``score.*``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Mapping, Optional

import torch

__all__ = [
    "ModelShape",
    "global_name",
    "hf_from_whole",
    "shard_of",
    "tensor_parallel_dim",
    "whole_from_hf",
    "whole_of",
]

_LAYER = re.compile(r"^decoder\.layers\.(\d+)\.(.+)$")

# megatron suffix in a layer -> HF suffix in a layer (one-to-one weights)
_LAYER_RENAMES = {
    "input_layernorm.weight": "input_layernorm.weight",
    "pre_mlp_layernorm.weight": "post_attention_layernorm.weight",
    "self_attention.linear_proj.weight": "self_attn.o_proj.weight",
    "self_attention.q_layernorm.weight": "self_attn.q_norm.weight",
    "self_attention.k_layernorm.weight": "self_attn.k_norm.weight",
    "mlp.linear_fc2.weight": "mlp.down_proj.weight",
}
_TOP_RENAMES = {
    "decoder.final_layernorm.weight": "model.norm.weight",
    "value_head.weight": "score.weight",  # the llama/qwen2/qwen3 classification classes all call their head score
    "value_head.bias": "score.bias",
}
_VOCAB = {"embedding.word_embeddings.weight": "model.embed_tokens.weight", "output_layer.weight": "lm_head.weight"}
_QKV = ("self_attention.linear_qkv.weight", "self_attention.linear_qkv.bias")
_FC1 = "mlp.linear_fc1.weight"
_ROW_PARALLEL = ("self_attention.linear_proj.weight", "mlp.linear_fc2.weight")


@dataclass(frozen=True)
class ModelShape:
    """What the q/k/v fusion and the vocabulary padding need from the model config."""

    num_heads: int
    num_groups: int
    head_dim: int
    vocab_size: int  # the tokenizer's (HF) vocabulary
    padded_vocab_size: int


def _suffix(name: str) -> str:
    match = _LAYER.match(name)
    return match.group(2) if match else name


def tensor_parallel_dim(name: str) -> Optional[int]:
    """The dimension tensor parallelism splits ``name`` along (None: replicated)."""
    suffix = _suffix(name)
    if suffix in _QKV or suffix == _FC1 or name in _VOCAB:
        return 0
    if suffix in _ROW_PARALLEL:
        return 1
    return None


def shard_of(name: str, whole: torch.Tensor, tp_rank: int, tp_size: int) -> torch.Tensor:
    """The slice of the whole tensor ``name`` that tensor-parallel rank ``tp_rank`` holds."""
    dim = tensor_parallel_dim(name)
    if dim is None or tp_size == 1:
        return whole
    if _suffix(name) == _FC1:
        gate, up = whole.chunk(2, dim=0)
        return torch.cat([gate.chunk(tp_size, dim=0)[tp_rank], up.chunk(tp_size, dim=0)[tp_rank]])
    return whole.chunk(tp_size, dim=dim)[tp_rank]


def whole_of(name: str, shards: list[torch.Tensor]) -> torch.Tensor:
    """The whole tensor ``name`` from every tensor-parallel rank's shard, in rank order."""
    dim = tensor_parallel_dim(name)
    if dim is None or len(shards) == 1:
        return shards[0]
    if _suffix(name) == _FC1:
        halves = [shard.chunk(2, dim=0) for shard in shards]
        return torch.cat([half[0] for half in halves] + [half[1] for half in halves])
    return torch.cat(shards, dim=dim)


def global_name(name: str, layer_offset: int) -> str:
    """A stage's local name with the global layer index (``layer_offset``: the stage's first layer)."""
    match = _LAYER.match(name)
    return f"decoder.layers.{int(match.group(1)) + layer_offset}.{match.group(2)}" if match else name


def _fuse_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, shape: ModelShape) -> torch.Tensor:
    groups = shape.num_groups
    rest = q.shape[1:]
    parts = [q.reshape(groups, -1, *rest), k.reshape(groups, -1, *rest), v.reshape(groups, -1, *rest)]
    return torch.cat(parts, dim=1).reshape(-1, *rest)


def _split_qkv(fused: torch.Tensor, shape: ModelShape) -> list[torch.Tensor]:
    groups, d = shape.num_groups, shape.head_dim
    rest = fused.shape[1:]
    per_group = fused.reshape(groups, -1, *rest)
    q, k, v = per_group.split([shape.num_heads // groups * d, d, d], dim=1)
    return [part.reshape(-1, *rest) for part in (q, k, v)]


def _pad_vocab(tensor: torch.Tensor, shape: ModelShape) -> torch.Tensor:
    padding = shape.padded_vocab_size - tensor.shape[0]
    return torch.cat([tensor, tensor.new_zeros(padding, *tensor.shape[1:])]) if padding else tensor


def whole_from_hf(name: str, hf: Mapping[str, torch.Tensor], shape: ModelShape, tied: bool) -> torch.Tensor:
    """The whole tensor ``name`` from the HF state ``hf`` (``tied``: the output layer is the input embeddings)."""
    if name in _VOCAB:
        source = _VOCAB["embedding.word_embeddings.weight"] if tied else _VOCAB[name]
        return _pad_vocab(hf[source], shape)
    if name in _TOP_RENAMES:
        return hf[_TOP_RENAMES[name]]
    layer, suffix = _LAYER.match(name).groups()
    prefix = f"model.layers.{layer}."
    if suffix in _QKV:
        kind = suffix.rsplit(".", 1)[1]
        return _fuse_qkv(*(hf[f"{prefix}self_attn.{p}_proj.{kind}"] for p in "qkv"), shape)
    if suffix == _FC1:
        return torch.cat([hf[f"{prefix}mlp.gate_proj.weight"], hf[f"{prefix}mlp.up_proj.weight"]])
    return hf[prefix + _LAYER_RENAMES[suffix]]


def hf_from_whole(name: str, whole: torch.Tensor, shape: ModelShape) -> list[tuple[str, torch.Tensor]]:
    """The HF ``(name, tensor)`` pairs that the whole megatron tensor ``name`` holds."""
    if name in _VOCAB:
        return [(_VOCAB[name], whole[: shape.vocab_size])]
    if name in _TOP_RENAMES:
        return [(_TOP_RENAMES[name], whole)]
    layer, suffix = _LAYER.match(name).groups()
    prefix = f"model.layers.{layer}."
    if suffix in _QKV:
        kind = suffix.rsplit(".", 1)[1]
        return [(f"{prefix}self_attn.{p}_proj.{kind}", part) for p, part in zip("qkv", _split_qkv(whole, shape))]
    if suffix == _FC1:
        gate, up = whole.chunk(2, dim=0)
        return [(f"{prefix}mlp.gate_proj.weight", gate), (f"{prefix}mlp.up_proj.weight", up)]
    return [(prefix + _LAYER_RENAMES[suffix], whole)]
