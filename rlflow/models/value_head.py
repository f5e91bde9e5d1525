"""A causal-LM backbone with a scalar value head: the model of the critic and the reward model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import PretrainedConfig, PreTrainedModel

from rlflow.models.hf_checkpoint import load_backbone

VALUE_HEAD_FILE = "value_head.safetensors"
VALUE_HEAD_PREFIX = "value_head."


class ValueHeadModel(nn.Module):
    """Per-token scalar values from an HF decoder's last hidden states through ``Linear(hidden, 1)``.

    Parameter names are the HF causal-LM names for the backbone (``model.layers.0...``) plus
    ``value_head.weight`` / ``value_head.bias``. On disk it is the backbone's HF folder with the
    head in ``value_head.safetensors`` beside it.
    """

    def __init__(self, backbone: PreTrainedModel, config: PretrainedConfig | None = None):
        super().__init__()
        self.model = backbone
        self.config = config if config is not None else backbone.config
        dtype = next(backbone.parameters()).dtype
        self.value_head = nn.Linear(self.config.hidden_size, 1, bias=True, dtype=dtype)
        self.reset_value_head()

    def reset_value_head(self) -> None:
        """Initialise the head: weight ~ N(0, initializer_range) (default 0.02), bias 0; uses torch's RNG."""
        std = getattr(self.config, "initializer_range", 0.02)
        nn.init.normal_(self.value_head.weight, mean=0.0, std=std)
        nn.init.zeros_(self.value_head.bias)

    @classmethod
    def from_pretrained(
        cls,
        path: str | Path,
        torch_dtype: str | torch.dtype = "float32",
        attn_implementation: str = "sdpa",
        **kwargs: Any,
    ) -> "ValueHeadModel":
        """Load the backbone from any local HF causal-LM (or backbone) folder; the head from
        ``value_head.safetensors`` there if present, else freshly initialised."""
        backbone = load_backbone(path, dtype=torch_dtype, attn_implementation=attn_implementation, **kwargs)
        model = cls(backbone)
        head_file = Path(path) / VALUE_HEAD_FILE
        if head_file.is_file():
            model.load_value_head(head_file)
        return model

    def load_value_head(self, head_file: str | Path) -> None:
        """Load the head's weights from a ``value_head.safetensors`` file (shape mismatch raises)."""
        state = load_file(str(head_file))
        expected = {VALUE_HEAD_PREFIX + k for k in self.value_head.state_dict()}
        if set(state) != expected:
            raise ValueError(f"{head_file} holds {sorted(state)}, expected {sorted(expected)}")
        head_state = {k.removeprefix(VALUE_HEAD_PREFIX): v for k, v in state.items()}
        dtype = self.value_head.weight.dtype
        self.value_head.load_state_dict({k: v.to(dtype) for k, v in head_state.items()})

    def save_pretrained(self, path: str | Path, **kwargs: Any) -> None:
        """Write the backbone as an HF folder and the head as ``value_head.safetensors`` beside it."""
        folder = Path(path)
        folder.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(folder, **kwargs)
        head = {VALUE_HEAD_PREFIX + k: v.detach().contiguous().cpu() for k, v in self.value_head.state_dict().items()}
        save_file(head, str(folder / VALUE_HEAD_FILE), metadata={"format": "pt"})

    def gradient_checkpointing_enable(self, **kwargs: Any) -> None:
        """Turn on activation checkpointing in the backbone (same switch as an HF model)."""
        self.model.gradient_checkpointing_enable(**kwargs)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        **backbone_kwargs: Any,
    ) -> torch.Tensor:
        """Values ``[B, T]`` in float32, one per input token."""
        hidden = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=False,
            **backbone_kwargs,
        ).last_hidden_state
        return self.value_head(hidden).squeeze(-1).float()

