"""Exports of a LoRA model from its ``(parameter name, full tensor)`` stream, one module at a time.

* ``merged_lora_tensors``: the stream with each adapted linear layer merged,
  ``W = W_base + scaling * B @ A`` (computed in fp32, stored in the base weight's dtype),
  under the layer's plain name (``q_proj.base_layer.weight`` + its adapters -> ``q_proj.weight``).
  This is what the HF export and the merged weight sync send: names and shapes of the base model.
* ``adapter_tensors``: the adapters alone, under peft's adapter-file names.
* ``merged_peft_folder``: the merge of a saved peft folder over the base model's weights (the
  Tinker service's sampler snapshots).

Both consume the stream as the engines yield it (a module's base weight and adapters arrive
together), so at most one layer's tensors are held at a time.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable, Iterator, Optional

import torch
from safetensors.torch import load_file

from rlflow.engines.common.forward.lora import (
    ADAPTER_CONFIG_FILE,
    ADAPTER_NAME,
    ADAPTER_WEIGHTS_FILE,
    PEFT_PREFIX,
    is_adapter_param,
    peft_tensor_name,
)
from rlflow.engines.common.forward.models import FORWARD_PREFIX
from rlflow.engines.common.optim.optimizers import clean_param_name
from rlflow.errors import CheckpointError
from rlflow.utils.text_files import read_json

__all__ = ["adapter_tensors", "merged_lora_tensors", "merged_peft_folder"]

_PARTS = {"base_layer.weight": "base", f"lora_A.{ADAPTER_NAME}.weight": "A", f"lora_B.{ADAPTER_NAME}.weight": "B"}


def _lora_part(name: str) -> tuple[str, Optional[str]]:
    """``(module path, "base" | "A" | "B")`` for a LoRA layer's weight, ``(name, None)`` otherwise."""
    for suffix, part in _PARTS.items():
        if name.endswith("." + suffix):
            return name[: -len(suffix) - 1], part
    return name, None


def merged_lora_tensors(named_tensors: Iterable[tuple[str, torch.Tensor]], scaling: float) -> Iterator[tuple[str, torch.Tensor]]:
    """The stream with every LoRA layer merged into one plain weight (and ``base_layer.bias`` renamed ``bias``)."""
    pending: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in named_tensors:
        module, part = _lora_part(name)
        if part is None:
            yield name.replace(".base_layer.bias", ".bias"), tensor
            continue
        parts = pending.setdefault(module, {})
        parts[part] = tensor
        if len(parts) == len(_PARTS):
            del pending[module]
            yield f"{module}.weight", _merged(parts["base"], parts["A"], parts["B"], scaling)
    if pending:
        raise RuntimeError(f"LoRA layers {sorted(pending)[:3]} were exported without all of base, A and B")


def _merged(base: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor, scaling: float) -> torch.Tensor:
    """``W_base + scaling * B @ A``, computed in fp32 and stored in the base weight's dtype."""
    return (base.float() + scaling * (lora_b.float() @ lora_a.float())).to(base.dtype)


def merged_peft_folder(base: Iterable[tuple[str, torch.Tensor]], adapter_folder: str | Path) -> Iterator[tuple[str, torch.Tensor]]:
    """The base model's HF tensors with a saved peft adapter folder merged in, one tensor at a time.

    ``base`` is the HF ``(name, tensor)`` stream of the model the adapters were trained on (its
    safetensors); each ``<module>.weight`` with adapters becomes ``W + alpha / r * B @ A``. A full
    weight that peft saved beside the adapters (``<module>.base_layer.weight``, e.g. a tied LM head)
    replaces the base one first. An entry that matches no base weight raises ValueError (the folder
    belongs to another model).
    """
    folder = Path(adapter_folder)
    config = read_json(folder / ADAPTER_CONFIG_FILE, CheckpointError, "adapter config")
    try:
        scaling = float(config["lora_alpha"]) / float(config["r"])
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        raise CheckpointError(f"adapter config {folder / ADAPTER_CONFIG_FILE}: needs numbers 'lora_alpha' and 'r' > 0 "
                              "(a peft adapter folder)") from None
    adapters = load_file(str(folder / ADAPTER_WEIGHTS_FILE))
    for name, tensor in base:
        module = name.removesuffix(".weight")
        tensor = adapters.pop(f"{PEFT_PREFIX}{module}.base_layer.weight", tensor)
        lora_a = adapters.pop(f"{PEFT_PREFIX}{module}.lora_A.weight", None)
        if lora_a is None:
            yield name, tensor
            continue
        yield name, _merged(tensor, lora_a, adapters.pop(f"{PEFT_PREFIX}{module}.lora_B.weight"), scaling)
    if adapters:
        raise ValueError(f"adapter folder {folder} has weights {sorted(adapters)[:3]} that match no weight of the base model")


def adapter_tensors(
    named_tensors: Iterable[tuple[str, torch.Tensor]], dtype: Optional[torch.dtype] = None
) -> Iterator[tuple[str, torch.Tensor]]:
    """The adapter weights of the stream under peft's names (``base_model.model.<hf module>.lora_A.weight``)."""
    for name, tensor in named_tensors:
        if is_adapter_param(name):
            hf_name = clean_param_name(name).removeprefix(FORWARD_PREFIX)
            yield peft_tensor_name(hf_name), tensor if dtype is None else tensor.to(dtype)
