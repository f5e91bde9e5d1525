"""Optimizer construction and optimizer-state placement.

AdamW with two parameter groups: weights of dimension >= 2 (linear layers,
embeddings) decay; biases and normalization weights (1-D) do not. The split is
decided on the unwrapped model, by name, because sharding wrappers may flatten
parameters.
"""

from __future__ import annotations

from typing import Any, Iterable, Optional

import torch
from torch import nn

from rlflow.engines.config import OptimizerConfig

__all__ = ["DECAYS", "build_adamw", "clean_param_name", "move_optimizer_state", "no_decay_names", "use_kernels"]

# Param-group key: whether the group's parameters take weight decay (a per-step override applies to those only).
DECAYS = "decays"
_WRAPPER_PARTS = ("_fsdp_wrapped_module.", "_checkpoint_wrapped_module.", "_orig_mod.")
_DDP_PREFIX = "module."  # DistributedDataParallel's name for the module it wraps, at the front of every name
# OptimizerConfig.implementation (one of config.ADAMW_IMPLEMENTATIONS) -> the AdamW arguments that select it
_KERNEL_ARGS: dict[str, dict[str, Optional[bool]]] = {
    "fused": {"fused": True, "foreach": None},
    "foreach": {"fused": None, "foreach": True},
    "for-loop": {"fused": None, "foreach": False},
}


def clean_param_name(name: str) -> str:
    """A parameter name without sharding/checkpoint/compile wrapper components (FSDP1, DDP, activation
    checkpointing, ``torch.compile``)."""
    name = name.removeprefix(_DDP_PREFIX)
    for part in _WRAPPER_PARTS:
        name = name.replace(part, "")
    return name


def no_decay_names(module: nn.Module) -> set[str]:
    """Names (as in ``module.named_parameters()``) of 1-D parameters: biases and norm weights."""
    return {name for name, param in module.named_parameters() if param.ndim < 2}


def build_adamw(
    named_params: Iterable[tuple[str, nn.Parameter]], no_decay: set[str], config: OptimizerConfig
) -> torch.optim.AdamW:
    """AdamW over the trainable parameters, with the kernels ``config.implementation`` names; names (cleaned)
    in ``no_decay`` get weight_decay 0."""
    decay, skip = [], []
    for name, param in named_params:
        if param.requires_grad:
            (skip if clean_param_name(name) in no_decay else decay).append(param)
    groups = [
        {"params": decay, "weight_decay": config.weight_decay, DECAYS: True},
        {"params": skip, "weight_decay": 0.0, DECAYS: False},
    ]
    return torch.optim.AdamW(
        [g for g in groups if g["params"]], lr=config.lr, betas=tuple(config.betas), eps=config.eps,
        **_KERNEL_ARGS[config.implementation],
    )


def move_optimizer_state(optimizer: torch.optim.Optimizer, device: torch.device) -> None:
    """Move the optimizer's moment tensors to ``device`` (the ``step`` counter stays where torch keeps it)."""
    for state in optimizer.state.values():
        for key, value in state.items():
            if key != "step" and isinstance(value, torch.Tensor) and value.device != device:
                state[key] = value.to(device, non_blocking=True)


def use_kernels(optimizer: Any, implementation: str) -> None:
    """Run ``optimizer`` (an AdamW, or anything exposing its ``param_groups`` and ``state``) with the kernels
    ``implementation`` names, and keep each ``step`` counter where those kernels expect it (on the parameter's
    device for fused ones, in host memory otherwise, as torch places it).

    Loading an optimizer state dict replaces the groups' settings with the saved run's, its kernels
    included; the engine calls this after a load so the configured ``optimizer.implementation`` holds."""
    args = _KERNEL_ARGS[implementation]
    for group in optimizer.param_groups:
        group.update(args)
        on_device = bool(group["fused"]) or bool(group.get("capturable"))
        for param in group["params"]:
            step = optimizer.state.get(param, {}).get("step")
            if isinstance(step, torch.Tensor):
                optimizer.state[param]["step"] = step.to(param.device if on_device else "cpu")
