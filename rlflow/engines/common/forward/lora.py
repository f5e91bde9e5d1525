"""LoRA adapters (``peft``) injected into the HF module that fsdp and fsdp2 shard.

``add_lora_adapters`` replaces each targeted ``nn.Linear`` of the model, in place, by peft's
LoRA layer (the original becomes ``<module>.base_layer``, the adapters
``<module>.lora_A.default`` / ``lora_B.default``) and freezes every other parameter, so the
optimizer, the gradient reduction and the checkpoint see only the adapters. The model stays
the HF model: the engines' forward path, decoder-layer wrapping and HF names are unchanged.

The adapters start fresh (A random from the engine's seed, identical on every rank; B zero:
the model starts as the base model) or from a saved peft adapter folder (``lora.adapter_path``).
``adapters_disabled`` runs the base model (the reference policy of a LoRA actor) without a
second copy of the weights.

Names: ``peft_tensor_name`` maps an adapter's parameter name to its peft adapter-file name
(``base_model.model.<hf module>.lora_A.weight``); the merged and adapter-only exports are
``checkpoint/lora_export.py``.
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Optional

import torch
from safetensors.torch import load_file
from torch import nn

from rlflow.engines.config import EngineConfigError, LoRAConfig
from rlflow.utils.seed import set_seed

__all__ = [
    "ADAPTER_CONFIG_FILE",
    "ADAPTER_WEIGHTS_FILE",
    "LoraAdapters",
    "add_lora_adapters",
    "adapters_disabled",
    "check_adapter_folder",
    "target_module_names",
]

ADAPTER_NAME = "default"
ADAPTER_CONFIG_FILE = "adapter_config.json"
ADAPTER_WEIGHTS_FILE = "adapter_model.safetensors"
PEFT_PREFIX = "base_model.model."
ALL_LINEAR = "all-linear"
# module-path components that mark a linear layer's part of the model (all-linear with lora.parts)
_PART_COMPONENTS = {
    "attention": frozenset({"self_attn", "attn", "attention", "self_attention"}),
    "mlp": frozenset({"mlp", "feed_forward", "ffn"}),
}


@dataclass(frozen=True)
class LoraAdapters:
    """The adapters injected into a model: their peft config and the output scale ``alpha / rank``."""

    peft_config: Any  # peft.LoraConfig (its adapter_config.json is what a peft folder carries)
    scaling: float

    def adapter_config_json(self) -> str:
        """The ``adapter_config.json`` text of a peft folder holding these adapters."""
        return json.dumps(self.peft_config.to_dict(), indent=2, sort_keys=True, default=sorted) + "\n"


def _part_of(name: str, module: nn.Module, output_embeddings: Optional[nn.Module]) -> Optional[str]:
    if module is output_embeddings:
        return "unembedding"
    components = set(name.split("."))
    return next((part for part, marks in _PART_COMPONENTS.items() if components & marks), None)


def target_module_names(model: nn.Module, config: LoRAConfig) -> list[str]:
    """Full module paths of the linear layers ``config`` adapts (``target_modules`` / ``parts``)."""
    linears = [(name, module) for name, module in model.named_modules() if isinstance(module, nn.Linear)]
    output_embeddings = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if list(config.target_modules) == [ALL_LINEAR]:
        names = [name for name, module in linears if _part_of(name, module, output_embeddings) in config.parts]
    else:
        wanted = set(config.target_modules)
        names = [name for name, _ in linears if name in wanted or name.rsplit(".", 1)[-1] in wanted]
        found = set(names) | {name.rsplit(".", 1)[-1] for name in names}
        if wanted - found:
            raise EngineConfigError(
                f"lora.target_modules {sorted(wanted - found)} match no linear layer of {type(model).__name__}; "
                f"its linear layers end in {sorted({n.rsplit('.', 1)[-1] for n, _ in linears})}"
            )
    if not names:
        raise EngineConfigError(f"lora selects no linear layer of {type(model).__name__} (lora.parts={list(config.parts)})")
    tied = getattr(getattr(model, "config", None), "tie_word_embeddings", False)
    if tied and output_embeddings is not None and any(model.get_submodule(n) is output_embeddings for n in names):
        raise EngineConfigError(
            "lora on the LM head of a model with tied input/output embeddings would untie them; "
            "drop unembedding from lora.parts (or lm_head from lora.target_modules)"
        )
    return names


def _peft_config(config: LoRAConfig, targets: list[str], base_path: Path):
    from peft import LoraConfig

    return LoraConfig(r=config.rank, lora_alpha=config.alpha, lora_dropout=config.dropout, target_modules=targets,
                      bias="none", task_type="CAUSAL_LM", base_model_name_or_path=str(base_path))


def check_adapter_folder(config: LoRAConfig):
    """The peft config of ``config.adapter_path``; ``EngineConfigError`` (one line) when the folder is not a peft
    adapter folder or its rank and alpha differ from ``config``'s. Config loading calls it before Ray starts."""
    from peft import LoraConfig

    folder = Path(str(config.adapter_path))
    if not (folder / ADAPTER_CONFIG_FILE).is_file() or not (folder / ADAPTER_WEIGHTS_FILE).is_file():
        raise EngineConfigError(f"lora.adapter_path={folder} is not a peft adapter folder "
                                f"(needs {ADAPTER_CONFIG_FILE} and {ADAPTER_WEIGHTS_FILE})")
    saved = LoraConfig.from_pretrained(str(folder))
    if (saved.r, float(saved.lora_alpha)) != (config.rank, float(config.alpha)):
        raise EngineConfigError(f"lora.adapter_path={folder} has rank {saved.r}, alpha {saved.lora_alpha}; "
                                f"set lora.rank={saved.r} lora.alpha={saved.lora_alpha}")
    return saved


def _saved_peft_config(config: LoRAConfig):
    saved = check_adapter_folder(config)
    saved.lora_dropout = config.dropout
    saved.inference_mode = False
    return saved


def peft_tensor_name(param_name: str) -> str:
    """``<hf module>.lora_A.default.weight`` -> ``base_model.model.<hf module>.lora_A.weight`` (peft's file names)."""
    return PEFT_PREFIX + param_name.replace(f".{ADAPTER_NAME}.", ".")


def is_adapter_param(name: str) -> bool:
    """Whether a (wrapped) model's parameter name is a LoRA adapter weight."""
    return f".lora_A.{ADAPTER_NAME}." in name or f".lora_B.{ADAPTER_NAME}." in name


def _load_adapter_weights(model: nn.Module, folder: Path) -> None:
    saved = load_file(str(folder / ADAPTER_WEIGHTS_FILE))
    params = {peft_tensor_name(name): param for name, param in model.named_parameters() if is_adapter_param(name)}
    if set(saved) != set(params):
        missing, unknown = sorted(set(params) - set(saved)), sorted(set(saved) - set(params))
        raise EngineConfigError(f"lora.adapter_path={folder} does not fit the model: missing {missing[:3]}, "
                                f"unexpected {unknown[:3]}")
    with torch.no_grad():
        for name, param in params.items():
            param.copy_(saved[name])


def add_lora_adapters(model: nn.Module, config: LoRAConfig, base_path: Path, seed: int) -> LoraAdapters:
    """Inject LoRA layers into ``model`` in place and freeze the rest; fresh adapters are drawn from ``seed``."""
    from peft import inject_adapter_in_model

    if config.adapter_path:
        peft_config = _saved_peft_config(config)
    else:
        peft_config = _peft_config(config, target_module_names(model, config), base_path)
    set_seed(seed)  # lora_A's init: the same on every rank, and the same as peft on this model with this seed
    inject_adapter_in_model(peft_config, model, adapter_name=ADAPTER_NAME)
    if config.adapter_path:
        _load_adapter_weights(model, Path(config.adapter_path))
    for name, param in model.named_parameters():
        param.requires_grad_(is_adapter_param(name))
    return LoraAdapters(peft_config, config.alpha / config.rank)


@contextmanager
def adapters_disabled(module: nn.Module) -> Iterator[None]:
    """Inside: every LoRA layer of ``module`` runs its base layer only (the base model's outputs)."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    layers = [m for m in module.modules() if isinstance(m, BaseTunerLayer)]
    flags = {id(p): p.requires_grad for layer in layers for p in layer.parameters()}
    for layer in layers:
        layer.enable_adapters(False)
    try:
        yield
    finally:
        for layer in layers:
            layer.enable_adapters(True)
            for param in layer.parameters():
                param.requires_grad_(flags[id(param)])
