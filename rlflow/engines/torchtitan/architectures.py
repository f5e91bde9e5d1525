"""HF config -> torchtitan model: the model families the ``torchtitan`` engine builds, by HF ``model_type``.

Each ``TitanArchitecture`` names torchtitan's own pieces for one family: the model config
(derived here from the HF ``config.json``, so any checkpoint of the family loads, not only
torchtitan's named sizes), its HF state-dict adapter (``from_hf`` / ``to_hf``) and its
parallelize function. Adding a family is one registered ``TitanArchitecture`` subclass.

What the derivation takes from the HF config: hidden size, layers, heads, KV heads, head dim,
MLP width, vocabulary, RMSNorm eps, rotary base (and Llama-3 rotary scaling), tied embeddings,
Qwen3's q/k norms and Qwen2's q/k/v biases. What torchtitan's dense families do not have is
refused in one line: other attention or MLP biases, sliding-window attention, other rotary
scalings, an MLP activation other than SiLU.

torchtitan ships no Qwen2 model; Qwen2 is Qwen3's decoder without q/k norms and with biases on
the q/k/v projections, so ``qwen2`` builds torchtitan's ``Qwen3Model`` that way and converts its
weights with Qwen3's adapter plus the three bias names (``Qwen2StateDictAdapter``).

Q, K and V stay separate projections (``fuse_qkv=False``): torchtitan's fused QKV module renames
its parameter in state-dict hooks, which DCP's ``get_state_dict`` (rlflow's checkpoints) rejects.
Parameters are initialised by ``param_init`` only to give the meta-built model real storage;
every one of them is then overwritten by the checkpoint.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

from torch import nn
from torchtitan.models.common import ComplexRoPE, CosSinRoPE, Embedding, Linear, RoPE
from torchtitan.models.common.attention import GQAttention
from torchtitan.models.common.config_utils import make_ffn_config, make_gqa_config
from torchtitan.models.common.decoder import Decoder
from torchtitan.models.common.nn_modules import RMSNorm
from torchtitan.models.llama3 import Llama3Model, parallelize_llama
from torchtitan.models.llama3.model import Llama3TransformerBlock
from torchtitan.models.llama3.state_dict_adapter import Llama3StateDictAdapter
from torchtitan.models.qwen3 import Qwen3Model, parallelize_qwen3
from torchtitan.models.qwen3.model import Qwen3TransformerBlock
from torchtitan.models.qwen3.state_dict_adapter import Qwen3StateDictAdapter
from torchtitan.protocols.module import Module
from transformers import PretrainedConfig

from rlflow.engines.common.forward.hf_config import head_dim, rope_parameters
from rlflow.engines.config import EngineConfigError
from rlflow.utils.registry import Registry

# builds each layer's inner-attention config: torchtitan's FlexAttention, or the CPU fallback (cpu_compat)
AttentionConfig = Callable[[], Module.Config]

__all__ = ["TITAN_ARCHITECTURE_REGISTRY", "AttentionConfig", "Qwen2StateDictAdapter", "TitanArchitecture", "titan_architecture"]

_INIT = {"weight": nn.init.ones_, "bias": nn.init.zeros_}  # storage only: the checkpoint overwrites every parameter


class TitanArchitecture:
    """torchtitan's pieces for one HF model family: subclass it and register the subclass.

    ``model_config(hf_config, inner_attention)`` builds torchtitan's model config, ``adapter`` is the
    ``StateDictAdapter`` subclass (``from_hf`` / ``to_hf``) and ``parallelize`` torchtitan's
    ``parallelize_<family>``; both functions are static methods.
    """

    adapter: type
    parallelize: Callable[..., nn.Module]

    @staticmethod
    def model_config(hf: PretrainedConfig, inner_attention: AttentionConfig) -> Decoder.Config:
        raise NotImplementedError


TITAN_ARCHITECTURE_REGISTRY: Registry[type[TitanArchitecture]] = Registry(
    "torchtitan model family", "config.json model_type", error=EngineConfigError, base=TitanArchitecture)


def titan_architecture(hf_config: PretrainedConfig) -> type[TitanArchitecture]:
    """The registered family of ``hf_config.model_type`` (error lists the supported ones)."""
    return TITAN_ARCHITECTURE_REGISTRY.get(str(getattr(hf_config, "model_type", "")))


def _refuse_unsupported(hf: PretrainedConfig) -> None:
    unsupported = {
        "attention_bias": bool(getattr(hf, "attention_bias", False)),
        "mlp_bias": bool(getattr(hf, "mlp_bias", False)),
        "use_sliding_window": bool(getattr(hf, "use_sliding_window", False)),
        f"hidden_act={getattr(hf, 'hidden_act', 'silu')!r} (torchtitan's MLP is SiLU-gated)":
            getattr(hf, "hidden_act", "silu") != "silu",
    }
    found = [key for key, on in unsupported.items() if on]
    if found:
        raise EngineConfigError(
            f"the torchtitan engine's {hf.model_type} model has no {', '.join(found)}; "
            "use the fsdp2 engine for this checkpoint"
        )


def _decoder_config(
    hf: PretrainedConfig,
    model_cls: type[Decoder],
    block_cls: type,
    rope: RoPE.Config,
    inner_attention: AttentionConfig,
    qk_norm: bool,
    qkv_bias: bool = False,
) -> Decoder.Config:
    _refuse_unsupported(hf)
    dim, head_size = hf.hidden_size, head_dim(hf)

    def attention() -> GQAttention.Config:
        config = make_gqa_config(
            dim=dim, n_heads=hf.num_attention_heads, n_kv_heads=hf.num_key_value_heads, head_dim=head_size,
            wqkv_param_init=_INIT, wo_param_init=_INIT, inner_attention=inner_attention(),
            fuse_qkv=False, rope=rope, qk_norm=norm(head_size) if qk_norm else None,
        )
        if qkv_bias:
            qkv = config.qkv_linear
            config.qkv_linear = replace(qkv, wq=replace(qkv.wq, bias=True), wkv=replace(qkv.wkv, bias=True))
        return config

    def norm(size: int) -> RMSNorm.Config:
        return RMSNorm.Config(normalized_shape=size, eps=hf.rms_norm_eps, param_init=_INIT)

    layers = [
        block_cls.Config(
            attention_norm=norm(dim),
            ffn_norm=norm(dim),
            attention=attention(),
            feed_forward=make_ffn_config(dim=dim, hidden_dim=hf.intermediate_size, w1_param_init=_INIT,
                                         w2w3_param_init=_INIT),
        )
        for _ in range(hf.num_hidden_layers)
    ]
    return model_cls.Config(
        dim=dim,
        vocab_size=hf.vocab_size,
        norm=norm(dim),
        enable_weight_tying=bool(getattr(hf, "tie_word_embeddings", False)),
        tok_embeddings=Embedding.Config(num_embeddings=hf.vocab_size, embedding_dim=dim, param_init=_INIT),
        lm_head=Linear.Config(in_features=dim, out_features=hf.vocab_size, param_init=_INIT),
        layers=layers,
    )


def _qwen_rope(hf: PretrainedConfig) -> CosSinRoPE.Config:
    rope = rope_parameters(hf)
    if rope["rope_type"] != "default":
        raise EngineConfigError(f"the torchtitan engine's {hf.model_type} model has no rope_type={rope['rope_type']!r} scaling")
    return CosSinRoPE.Config(dim=head_dim(hf), max_seq_len=hf.max_position_embeddings, theta=rope["rope_theta"])


class Qwen2StateDictAdapter(Qwen3StateDictAdapter):
    """Qwen3's HF <-> torchtitan names plus Qwen2's q/k/v projection biases."""

    def __init__(self, model_config: Qwen3Model.Config, hf_assets_path: str | None) -> None:
        super().__init__(model_config, hf_assets_path)
        for hf_proj, titan_proj in (("q_proj", "wq"), ("k_proj", "wk"), ("v_proj", "wv")):
            self.from_hf_map[f"model.layers.{{}}.self_attn.{hf_proj}.bias"] = (
                f"layers.{{}}.attention.qkv_linear.{titan_proj}.bias"
            )


# HF rope_type -> torchtitan ComplexRoPE scaling, with the HF keys of its parameters
_LLAMA_ROPE_SCALING: dict[str, tuple[str, dict[str, str]]] = {
    "default": ("none", {}),
    "llama3": ("llama", {"scaling_factor": "factor", "low_freq_factor": "low_freq_factor",
                         "high_freq_factor": "high_freq_factor",
                         "original_max_position_embeddings": "original_max_position_embeddings"}),
}


@TITAN_ARCHITECTURE_REGISTRY.register("qwen2")
class Qwen2Architecture(TitanArchitecture):
    """Qwen2 on torchtitan's Qwen3 decoder: q/k/v biases, no q/k norms."""

    adapter = Qwen2StateDictAdapter
    parallelize = staticmethod(parallelize_qwen3)

    @staticmethod
    def model_config(hf: PretrainedConfig, inner_attention: AttentionConfig) -> Decoder.Config:
        return _decoder_config(hf, Qwen3Model, Qwen3TransformerBlock, _qwen_rope(hf), inner_attention, qk_norm=False,
                               qkv_bias=True)


@TITAN_ARCHITECTURE_REGISTRY.register("qwen3")
class Qwen3Architecture(TitanArchitecture):
    """Qwen3: RMSNorm on each head's queries and keys."""

    adapter = Qwen3StateDictAdapter
    parallelize = staticmethod(parallelize_qwen3)

    @staticmethod
    def model_config(hf: PretrainedConfig, inner_attention: AttentionConfig) -> Decoder.Config:
        return _decoder_config(hf, Qwen3Model, Qwen3TransformerBlock, _qwen_rope(hf), inner_attention, qk_norm=True)


@TITAN_ARCHITECTURE_REGISTRY.register("llama")
class LlamaArchitecture(TitanArchitecture):
    """Llama 3 (and Llama 2's plain rotary): torchtitan's Llama3 decoder, with llama3 rotary scaling."""

    adapter = Llama3StateDictAdapter
    parallelize = staticmethod(parallelize_llama)

    @staticmethod
    def model_config(hf: PretrainedConfig, inner_attention: AttentionConfig) -> Decoder.Config:
        rope = rope_parameters(hf)
        if rope["rope_type"] not in _LLAMA_ROPE_SCALING:
            raise EngineConfigError(f"the torchtitan engine's llama model has no rope_type={rope['rope_type']!r} "
                                    f"scaling; supported: {sorted(_LLAMA_ROPE_SCALING)}")
        scaling, keys = _LLAMA_ROPE_SCALING[rope["rope_type"]]
        rope_config = ComplexRoPE.Config(dim=head_dim(hf), max_seq_len=hf.max_position_embeddings,
                                         theta=rope["rope_theta"], scaling=scaling,
                                         **{titan: rope[key] for titan, key in keys.items()})
        return _decoder_config(hf, Llama3Model, Llama3TransformerBlock, rope_config, inner_attention, qk_norm=False)
