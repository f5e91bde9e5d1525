"""The architectures a preset can be built in: one registered function per HF model family.

Each function takes the preset's config fields (sizes, vocabulary, special-token ids, ...) and
returns the randomly initialised HF causal LM, so every architecture goes through the same
preset builder. What distinguishes the families lives in the HF classes themselves:

- ``qwen2``: ``Qwen2ForCausalLM``, bias on the q/k/v projections;
- ``qwen3``: ``Qwen3ForCausalLM``, RMSNorm on each head's queries and keys (``q_norm``/``k_norm``), no bias;
- ``llama``: ``LlamaForCausalLM``, no bias, no qk-norm.

All three take grouped-query attention (``num_key_value_heads``) and tied or untied embeddings.
"""

from __future__ import annotations

from typing import Any, Callable

from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from rlflow.utils.registry import Registry

PRESET_ARCHITECTURE_REGISTRY: Registry[Callable[[dict[str, Any]], PreTrainedModel]] = Registry(
    "preset architecture", "the preset's `architecture` option"
)


@PRESET_ARCHITECTURE_REGISTRY.register("qwen2")
def qwen2(fields: dict[str, Any]) -> PreTrainedModel:
    """A ``Qwen2ForCausalLM`` (full attention in every layer)."""
    return Qwen2ForCausalLM(Qwen2Config(**fields, use_sliding_window=False))


@PRESET_ARCHITECTURE_REGISTRY.register("qwen3")
def qwen3(fields: dict[str, Any]) -> PreTrainedModel:
    """A ``Qwen3ForCausalLM`` (qk-norm, full attention in every layer)."""
    return Qwen3ForCausalLM(Qwen3Config(**fields, use_sliding_window=False))


@PRESET_ARCHITECTURE_REGISTRY.register("llama")
def llama(fields: dict[str, Any]) -> PreTrainedModel:
    """A ``LlamaForCausalLM``."""
    return LlamaForCausalLM(LlamaConfig(**fields))
