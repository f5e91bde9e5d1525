"""HF config -> megatron-core ``GPTModel``: the transformer config, the layer spec and the model's arguments.

The families the engine builds are registered by HF ``model_type`` (``MEGATRON_FAMILY_REGISTRY``): Llama, Qwen2 and
Qwen3 are one decoder in megatron (``GPTModel``) and differ in two switches, Qwen2's q/k/v biases and
Qwen3's q/k RMSNorms. Everything else comes from the HF config, so any checkpoint of a family loads:
layers, hidden and MLP sizes, heads and query groups (GQA), head size (``kv_channels``), RMSNorm
eps, SiLU-gated MLP (``gated_linear_unit``), rotary base (non-interleaved halves, as HF rotates),
tied embeddings, and the vocabulary padded so tensor parallelism splits it evenly
(``padded_vocab_size``; the padding rows never reach a log-prob). What megatron's GPT decoder or
this mapping does not have is refused in one line: another activation, MLP or output biases,
sliding-window attention, rotary scaling.

The layer spec is megatron's local spec (``get_gpt_layer_local_spec``) with the engine's core
attention (``attention.MaskedSDPAttention``) in place of ``DotProductAttention``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.transformer.spec_utils import ModuleSpec
from megatron.core.transformer.transformer_block import TransformerBlockSubmodules, get_num_layers_to_build
from megatron.core.transformer.transformer_config import TransformerConfig
from transformers import PretrainedConfig

from rlflow.engines.common.forward.hf_config import head_dim, rope_parameters
from rlflow.engines.config import EngineConfigError
from rlflow.engines.megatron.attention import MaskedSDPAttention
from rlflow.engines.megatron.norm import SequenceParallelRMSNorm
from rlflow.utils.registry import Registry

__all__ = ["MEGATRON_FAMILY_REGISTRY", "Family", "ModelLayout", "gpt_model_kwargs", "layer_spec", "padded_vocab_size", "transformer_config"]


class Family:
    """The switches of one HF model family on megatron's GPT decoder: subclass it and register the subclass."""

    qkv_bias: bool = False  # biases on the q/k/v projections (and none on the output projection)
    qk_norm: bool = False  # RMSNorm on each head's queries and keys


MEGATRON_FAMILY_REGISTRY: Registry[type[Family]] = Registry("megatron model family", "config.json model_type",
                                                            error=EngineConfigError, base=Family)


@MEGATRON_FAMILY_REGISTRY.register("llama")
class Llama(Family):
    """Llama: the plain decoder."""


@MEGATRON_FAMILY_REGISTRY.register("qwen2")
class Qwen2(Family):
    """Qwen2: biases on the q/k/v projections."""

    qkv_bias = True


@MEGATRON_FAMILY_REGISTRY.register("qwen3")
class Qwen3(Family):
    """Qwen3: RMSNorm on each head's queries and keys."""

    qk_norm = True


@dataclass(frozen=True)
class ModelLayout:
    """The parallel layout the model is built for."""

    tensor_parallel: int
    pipeline_parallel: int
    vocab_multiple: int  # the vocabulary is padded to a multiple of this times ``tensor_parallel``

    def first_stage_layers(self, num_layers: int) -> int:
        """Layers of the first stage: an equal share plus the remainder (the other stages get equal shares)."""
        return num_layers // self.pipeline_parallel + num_layers % self.pipeline_parallel

    def layer_offset(self, stage: int, num_layers: int) -> int:
        """The global index of stage ``stage``'s first layer."""
        if stage == 0:
            return 0
        return self.first_stage_layers(num_layers) + (stage - 1) * (num_layers // self.pipeline_parallel)


def _family(hf: PretrainedConfig) -> type[Family]:
    return MEGATRON_FAMILY_REGISTRY.get(str(getattr(hf, "model_type", "")))


def _refuse_unsupported(hf: PretrainedConfig, layout: ModelLayout) -> None:
    rope = rope_parameters(hf)
    unsupported = {
        f"hidden_act={getattr(hf, 'hidden_act', 'silu')!r} (the MLP is SiLU-gated)": getattr(hf, "hidden_act", "silu") != "silu",
        "mlp_bias": bool(getattr(hf, "mlp_bias", False)),
        "use_sliding_window": bool(getattr(hf, "use_sliding_window", False)),
        f"rope_type={rope['rope_type']!r} (rotary scaling)": rope["rope_type"] != "default",
        "attention_bias": bool(getattr(hf, "attention_bias", False)) and not _family(hf).qkv_bias,
    }
    found = [key for key, on in unsupported.items() if on]
    if found:
        raise EngineConfigError(f"the megatron engine's {hf.model_type} model has no {', '.join(found)}; use the fsdp2 engine")
    tp, pp = layout.tensor_parallel, layout.pipeline_parallel
    divisible = {
        f"num_key_value_heads={hf.num_key_value_heads}": hf.num_key_value_heads % tp == 0,
        f"num_attention_heads={hf.num_attention_heads}": hf.num_attention_heads % tp == 0,
        f"intermediate_size={hf.intermediate_size}": hf.intermediate_size % tp == 0,
    }
    bad = [what for what, ok in divisible.items() if not ok]
    if bad:
        raise EngineConfigError(f"tensor_model_parallel_size={tp} must divide {', '.join(bad)}")
    if hf.num_hidden_layers < pp:
        raise EngineConfigError(
            f"pipeline_model_parallel_size={pp} is more stages than num_hidden_layers={hf.num_hidden_layers}"
        )


def transformer_config(
    hf: PretrainedConfig, layout: ModelLayout, dtype: torch.dtype, gradient_checkpointing: bool, fused_swiglu: bool,
    sequence_parallel: bool = False,
) -> TransformerConfig:
    """megatron's ``TransformerConfig`` for ``hf`` under ``layout`` (weights come from the checkpoint: no init);
    ``fused_swiglu``: megatron's fused SwiGLU (``bias_activation_fusion``, compiled by ``torch.compile``);
    ``sequence_parallel``: megatron's, with tensor parallelism (``norm.py``)."""
    family = _family(hf)
    _refuse_unsupported(hf, layout)
    uneven = hf.num_hidden_layers % layout.pipeline_parallel != 0  # the first stage takes the remainder
    stages: dict[str, Any] = (
        {"num_layers_in_first_pipeline_stage": layout.first_stage_layers(hf.num_hidden_layers)} if uneven else {}
    )
    recompute: dict[str, Any] = (
        {"recompute_granularity": "full", "recompute_method": "uniform", "recompute_num_layers": 1}
        if gradient_checkpointing else {}
    )
    return TransformerConfig(
        num_layers=hf.num_hidden_layers,
        hidden_size=hf.hidden_size,
        ffn_hidden_size=hf.intermediate_size,
        num_attention_heads=hf.num_attention_heads,
        num_query_groups=hf.num_key_value_heads,
        kv_channels=head_dim(hf),
        normalization="RMSNorm",
        layernorm_epsilon=hf.rms_norm_eps,
        gated_linear_unit=True,
        activation_func=F.silu,
        add_bias_linear=False,
        add_qkv_bias=family.qkv_bias,
        qk_layernorm=family.qk_norm,
        hidden_dropout=0.0,
        attention_dropout=float(getattr(hf, "attention_dropout", 0.0) or 0.0),
        rotary_interleaved=False,
        tensor_model_parallel_size=layout.tensor_parallel,
        pipeline_model_parallel_size=layout.pipeline_parallel,
        sequence_parallel=sequence_parallel,
        params_dtype=dtype,
        pipeline_dtype=dtype,
        variable_seq_lengths=True,  # packed rows differ in shape from one micro-batch to the next
        moe_token_dispatcher_type="alltoall",  # no experts here; the config refuses the default with variable lengths
        use_cpu_initialization=True,
        perform_initialization=False,  # every weight is overwritten by the checkpoint's
        bias_activation_fusion=fused_swiglu,
        bias_dropout_fusion=False,
        masked_softmax_fusion=False,
        apply_rope_fusion=False,
        persist_layer_norm=False,
        gradient_accumulation_fusion=False,
        **stages,
        **recompute,
    )


def layer_spec(config: TransformerConfig, pp_rank: int) -> ModuleSpec | TransformerBlockSubmodules:
    """megatron's local GPT layer spec with ``MaskedSDPAttention`` as each layer's core attention; under sequence
    parallelism every norm (the final one of pipeline stage ``pp_rank`` too) is ``SequenceParallelRMSNorm``."""
    spec = get_gpt_layer_local_spec(qk_layernorm=config.qk_layernorm, normalization="RMSNorm")
    attention = spec.submodules.self_attention.submodules
    attention.core_attention = MaskedSDPAttention
    if not config.sequence_parallel:
        return spec
    spec.submodules.input_layernorm = spec.submodules.pre_mlp_layernorm = SequenceParallelRMSNorm
    if config.qk_layernorm:
        attention.q_layernorm = attention.k_layernorm = SequenceParallelRMSNorm
    return TransformerBlockSubmodules(layer_specs=[spec] * get_num_layers_to_build(config, pp_rank=pp_rank),
                                      layer_norm=SequenceParallelRMSNorm)


def padded_vocab_size(vocab_size: int, layout: ModelLayout) -> int:
    """The vocabulary rounded up to a multiple of ``vocab_multiple * tensor_parallel`` (megatron's padding)."""
    multiple = layout.vocab_multiple * layout.tensor_parallel
    return -(-vocab_size // multiple) * multiple


def gpt_model_kwargs(hf: PretrainedConfig, layout: ModelLayout, tie_output: bool) -> dict[str, Any]:
    """``GPTModel``'s arguments besides the config, spec and pipeline flags."""
    return {
        "vocab_size": padded_vocab_size(hf.vocab_size, layout),
        "max_sequence_length": hf.max_position_embeddings,
        "share_embeddings_and_output_weights": tie_output,
        "position_embedding_type": "rope",
        "rotary_percent": 1.0,
        "rotary_base": rope_parameters(hf)["rope_theta"],
        "parallel_output": True,  # logits stay vocab-sharded: log-probs are computed vocab-parallel
    }
