"""Helpers for engines that run the Hugging Face module itself (``HFModuleEngineConfig``).

Such an engine wraps one ``ForwardModule`` (``models.py``) in its parallelism
(FSDP, FSDP2, DDP ...) and composes:

* ``load_forward_module``: load the HF model of a model kind with the config's dtype,
  attention kernel, LoRA adapters (``lora.py``) and activation checkpointing, seeded identically
  on every rank (a freshly initialised value head or adapter agrees), then per-rank seeds for
  dropout/sampling;
* ``forward_micro_batch``: lay one micro-batch out as a ``TokenStream`` (packed or
  padded) and call the wrapped module, reading ``temperature`` / ``compute_entropy``
  from the micro-batch's ``meta_info``;
* ``hf_named_tensors``: turn the wrapped module's ``(parameter name, full tensor)``
  pairs into HF names, cast one tensor at a time to the requested export dtype.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable, Iterator, Optional

import torch
from torch import nn

from rlflow.engines.common.batching.packing import TokenStream, make_token_stream
from rlflow.engines.common.batching.prefix_sharing import shared_prefix_stream, shares_prefix
from rlflow.engines.common.forward.lora import add_lora_adapters
from rlflow.engines.common.forward.models import FORWARD_PREFIX, ForwardModule, ModelKind
from rlflow.engines.common.optim.optimizers import clean_param_name
from rlflow.engines.config import EngineConfig, HFModuleEngineConfig
from rlflow.meta_info import COMPUTE_ENTROPY, TEMPERATURE
from rlflow.protocol import DataProto
from rlflow.utils.seed import set_seed

__all__ = ["forward_micro_batch", "hf_named_tensors", "load_forward_module", "micro_batch_stream"]


def load_forward_module(kind: type[ModelKind], model_path: Path, config: HFModuleEngineConfig, rank: int) -> ForwardModule:
    """The model of ``kind`` from ``model_path`` as an (unwrapped) forward module; seeds ``config.seed + rank`` after."""
    set_seed(config.seed)  # identical on every rank: any freshly initialised weights (a new value head) agree
    model = kind.load(model_path, dtype=config.dtype, attn_implementation=config.attn_implementation,
                      trust_remote_code=config.trust_remote_code)
    lora = add_lora_adapters(model, config.lora, model_path, config.seed) if config.lora.enabled else None
    set_seed(config.seed + rank)  # per-rank streams for dropout and sampling
    if config.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return kind.forward_cls(model, config.logprob_chunk_size, lora=lora)


def forward_micro_batch(
    module: nn.Module,
    micro: DataProto,
    config: EngineConfig,
    attn_implementation: str,
    device: torch.device,
    hidden_size: Optional[int] = None,
) -> dict[str, torch.Tensor]:
    """Per-token outputs of one micro-batch (``[b, T]``, differentiable, on ``device``) from the wrapped
    forward module. ``micro`` is on the host: the stream is laid out there and then moved, so the layout's
    data-dependent shapes never synchronise the device. ``attn_implementation`` and ``hidden_size``
    (the ``ForwardModule``'s) choose the packed layout; with ``share_prefix`` (``HFModuleEngineConfig``) and a
    ``loss_mask`` the rows' shared prefixes are laid out once (``prefix_sharing``)."""
    stream = micro_batch_stream(micro, config, attn_implementation, hidden_size)
    return module(stream.to(device), TEMPERATURE.read(micro.meta_info), COMPUTE_ENTROPY.read(micro.meta_info))


def micro_batch_stream(
    micro: DataProto, config: EngineConfig, attn_implementation: str, hidden_size: Optional[int] = None
) -> TokenStream:
    """``micro``'s layout for one model call, on the host (``forward_micro_batch``'s, which says how)."""
    ids, mask, positions = micro.batch["input_ids"], micro.batch["attention_mask"], micro.batch.get("position_ids")
    if shares_prefix(config, micro):
        return shared_prefix_stream(ids, mask, positions, micro.batch["loss_mask"])
    return make_token_stream(ids, mask, positions, remove_padding=config.use_remove_padding,
                             attn_implementation=attn_implementation, hidden_size=hidden_size,
                             target_ids=micro.batch.get("target_ids"))


def hf_named_tensors(
    named_full_tensors: Iterable[tuple[str, torch.Tensor]], dtype: Optional[torch.dtype] = None
) -> Iterator[tuple[str, torch.Tensor]]:
    """``(hf_name, tensor)`` from the forward module's parameter names; cast to ``dtype`` unless None."""
    for name, tensor in named_full_tensors:
        yield clean_param_name(name).removeprefix(FORWARD_PREFIX), tensor if dtype is None else tensor.to(dtype)
