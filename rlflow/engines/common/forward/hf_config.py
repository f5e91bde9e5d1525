"""Facts read from an HF model config the same way by every engine that builds its own model from it
(torchtitan, megatron): the rotary parameters and the attention head size."""

from __future__ import annotations

from typing import Any

from transformers import PretrainedConfig

__all__ = ["head_dim", "rope_parameters"]


def rope_parameters(hf: PretrainedConfig) -> dict[str, Any]:
    """``rope_parameters`` (transformers 5) or the older ``rope_theta`` / ``rope_scaling`` pair."""
    params = dict(getattr(hf, "rope_parameters", None) or getattr(hf, "rope_scaling", None) or {})
    params.setdefault("rope_theta", getattr(hf, "rope_theta", 10000.0))
    params.setdefault("rope_type", params.get("type", "default"))
    return params


def head_dim(hf: PretrainedConfig) -> int:
    """The attention head size: ``head_dim`` when the config sets it, else hidden size / heads."""
    return getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads
