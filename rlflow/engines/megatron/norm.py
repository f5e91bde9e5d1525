"""The RMSNorm of a sequence-parallel megatron model built from megatron's local layer spec.

The local spec's norm (``WrappedTorchNorm``, torch's ``RMSNorm``) refuses ``sequence_parallel``. Under sequence
parallelism each tensor-parallel rank normalises its own slice of the sequence, so a norm weight's gradient on one
rank covers only that slice; megatron sums such gradients over the tensor-parallel ranks in
``finalize_model_grads`` for every parameter marked ``sequence_parallel`` (its TransformerEngine and apex norms
mark theirs). ``SequenceParallelRMSNorm`` is torch's ``RMSNorm`` with that mark: the computation is the same.
"""

from __future__ import annotations

from typing import Any

import torch
from megatron.core.transformer.transformer_config import TransformerConfig

__all__ = ["SequenceParallelRMSNorm"]


class SequenceParallelRMSNorm(torch.nn.RMSNorm):
    """torch's ``RMSNorm`` built as megatron builds a norm (``config, hidden_size, eps``), its weight marked
    ``sequence_parallel`` as the config says."""

    def __init__(self, config: TransformerConfig, hidden_size: int, eps: float = 1e-5, **_unused: Any) -> None:
        super().__init__(normalized_shape=hidden_size, eps=eps)
        self.weight.sequence_parallel = config.sequence_parallel
