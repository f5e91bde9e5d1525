"""Model kinds an engine can host, and the forward modules engines shard.

A model kind says how to load the model (always through ``rlflow.models.loading``, the
same path as any checkpoint), how to turn one ``TokenStream`` into per-token outputs,
and whether its exported HF folder takes the loaded model's config (a value model loaded
from a causal-LM folder is written as its classification class). Engines shard the *forward module*
(``ForwardModule`` subclasses): a thin ``nn.Module`` whose ``.model`` is the model (the HF
model itself for fsdp/fsdp2, so parameter names are ``"model." + hf_name``; another
implementation, such as torchtitan's, subclasses ``CausalLMForward`` and overrides only the
backbone call and the output embeddings).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Callable, Optional

import torch
from torch import nn
from transformers import PretrainedConfig

from rlflow.engines.common.batching.packing import TokenStream
from rlflow.engines.common.forward.logprob import chunked_log_probs
from rlflow.engines.common.forward.lora import LoraAdapters
from rlflow.engines.common.forward.ulysses import SequenceParallel
from rlflow.models.loading import load_causal_lm, load_value_model
from rlflow.models.value_models import per_token_values, value_model_export_config
from rlflow.utils.registry import Registry

__all__ = [
    "FORWARD_PREFIX",
    "MODEL_KIND_REGISTRY",
    "ModelKind",
    "decoder_layer_classes",
    "place_targets",
    "source_files_to_copy",
]

FORWARD_PREFIX = "model."


class ForwardModule(nn.Module):
    """Base of the modules engines shard: holds the model as ``self.model``.

    ``hidden_size`` sizes the packed rows of non-varlen attention (``packing.row_width``; None:
    rows as long as the longest sequence) and ``attn_implementation`` says which stream layout
    the model's attention takes (``packing.VARLEN_ATTENTION``: one row; otherwise rows). Both
    default to the HF config's values. ``lora`` describes the LoRA adapters injected into ``model``, if any.
    ``sequence_parallel`` splits each call's stream over an SP group (``ulysses``; the engine sets it)."""

    sequence_parallel: SequenceParallel = SequenceParallel()

    def __init__(
        self,
        model: nn.Module,
        logprob_chunk_size: int,
        hidden_size: Optional[int] = None,
        attn_implementation: Optional[str] = None,
        lora: Optional[LoraAdapters] = None,
    ) -> None:
        super().__init__()
        self.model = model
        self.lora = lora
        self.logprob_chunk_size = logprob_chunk_size
        config = getattr(model, "config", None)
        self.hidden_size: Optional[int] = hidden_size or getattr(config, "hidden_size", None)
        self.attn_implementation: str = attn_implementation or getattr(config, "_attn_implementation", None) or "sdpa"


class CausalLMForward(ForwardModule):
    """Backbone -> hidden states -> chunked log-probs (and entropy) of each next token in the stream."""

    def hidden_states(self, stream: TokenStream) -> torch.Tensor:
        """The backbone's last hidden states, ``[rows, width, hidden]`` (final norm applied)."""
        return self.model.base_model(
            input_ids=stream.input_ids,
            attention_mask=stream.attention_mask,
            position_ids=stream.position_ids,
            use_cache=False,
            **stream.attention_kwargs(),
        ).last_hidden_state

    def output_embeddings(self) -> Callable[[torch.Tensor], torch.Tensor]:
        """The LM head: hidden states ``[n, hidden]`` -> logits ``[n, vocab]``."""
        return self.model.get_output_embeddings()

    def forward(self, stream: TokenStream, temperature: float, compute_entropy: bool) -> dict[str, torch.Tensor]:
        shard = self.sequence_parallel.shard(stream)
        hidden = self.hidden_states(shard.stream)
        rows, labels = shard.prediction_rows()
        hidden = hidden.reshape(-1, hidden.shape[-1]).index_select(0, rows)
        log_probs, entropy = chunked_log_probs(
            hidden,
            self.output_embeddings(),
            labels,
            temperature=temperature,
            chunk_size=self.logprob_chunk_size,
            compute_entropy=compute_entropy,
        )
        outputs = {"log_probs": place_targets(shard.per_source(log_probs), stream)}
        if entropy is not None:
            outputs["entropy"] = place_targets(shard.per_source(entropy), stream)
        return outputs


class ValueForward(ForwardModule):
    """HF classification model with one label: the score head on every stream token."""

    def forward(self, stream: TokenStream, temperature: float, compute_entropy: bool) -> dict[str, torch.Tensor]:
        shard = self.sequence_parallel.shard(stream)
        call = shard.stream
        values = per_token_values(self.model, call.input_ids, call.attention_mask, call.position_ids,
                                  **call.attention_kwargs())
        return {"values": stream.to_rows(shard.per_slot(values.reshape(-1)))}


def place_targets(per_target: torch.Tensor, stream: TokenStream) -> torch.Tensor:
    """``[b, T]`` rows from values per ``source_index`` slot: values computed at ``source_index`` belong to the predicted token at ``target_index``."""
    flat = per_target.new_zeros(stream.input_ids.numel())
    return stream.to_rows(flat.index_put((stream.target_index,), per_target))


class ModelKind:
    """How one kind of model is loaded, run and written as an HF folder: subclass it and register the subclass.

    ``folder_export_config`` None: an export keeps the source folder's config.json. Otherwise the config an
    export of a model loaded from a folder writes (naming the model's class), read from the folder alone
    (offline export).
    """

    load: Callable[..., nn.Module]
    forward_cls: type[ForwardModule]
    output_keys: tuple[str, ...]
    folder_export_config: Optional[Callable[[Path], PretrainedConfig]] = None

    @classmethod
    def export_config(cls, forward_module: nn.Module) -> Optional[PretrainedConfig]:
        """The config an HF export of the live ``forward_module`` writes (naming the model's class), or None to
        keep the source folder's."""
        if cls.folder_export_config is None:
            return None
        model = forward_module.model
        config = copy.deepcopy(model.config)
        config.architectures = [type(model).__name__]
        return config


# the engines' ``model_kind`` (a role's): how its model is built and what its forward returns
MODEL_KIND_REGISTRY: Registry[type[ModelKind]] = Registry("model kind", base=ModelKind)


@MODEL_KIND_REGISTRY.register("causal_lm")
class CausalLMKind(ModelKind):
    """A causal LM (actor, reference, SFT): per-token log-probs and entropy."""

    load = staticmethod(load_causal_lm)
    forward_cls = CausalLMForward
    output_keys = ("log_probs", "entropy")


@MODEL_KIND_REGISTRY.register("value")
class ValueKind(ModelKind):
    """A value model (critic, reward model): per-token values from a one-label score head."""

    load = staticmethod(load_value_model)
    forward_cls = ValueForward
    output_keys = ("values",)
    folder_export_config = staticmethod(value_model_export_config)


def decoder_layer_classes(module: nn.Module, names: list[str]) -> set[type[nn.Module]]:
    """Classes to shard one-per-instance: ``names`` if given, else the HF models' ``_no_split_modules``."""
    wanted = set(names) or {n for m in module.modules() for n in (getattr(m, "_no_split_modules", None) or [])}
    found = {type(m) for m in module.modules() if type(m).__name__ in wanted}
    missing = wanted - {cls.__name__ for cls in found}
    if not found or (names and missing):
        raise ValueError(
            f"no modules of class {sorted(missing or wanted)} in the model; set the engine's wrap_layer_classes "
            f"to decoder-layer class names of {type(module).__name__}"
        )
    return found


def source_files_to_copy(model_path: Path) -> list[Path]:
    """Files of the source HF folder that an exported folder keeps (config, tokenizer, chat template ...)."""
    weights = (".safetensors", ".bin", ".pt", ".pth")
    return [
        p for p in sorted(model_path.iterdir()) if p.is_file() and not p.name.endswith(weights) and "index.json" not in p.name
    ]
