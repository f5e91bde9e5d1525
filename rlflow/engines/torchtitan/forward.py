"""The torchtitan decoder as rlflow's causal-LM forward module.

``TitanCausalLMForward`` reuses ``CausalLMForward``'s chunked log-prob head and overrides only
the two model calls: the backbone is torchtitan's ``Decoder`` run with ``_skip_lm_head`` (its
output is the final-norm hidden states) and document masks built from ``position_ids`` (a
sequence starts where the positions reset to 0, so packed rows and left padding both mask
correctly): by the model itself (``get_attention_masks``, a flex ``BlockMask``) or, on CPU, by
``packing.document_causal_mask``; the output embeddings are its ``lm_head``.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch
from torch.distributed.tensor import DTensor
from torchtitan.models.common.decoder import Decoder

from rlflow.engines.common.batching.packing import TokenStream
from rlflow.engines.common.forward.logprob import chunked_log_probs
from rlflow.engines.common.forward.models import CausalLMForward

__all__ = ["TitanCausalLMForward", "TitanPipelineStageForward"]


class TitanCausalLMForward(CausalLMForward):
    """Per-token log-probs (and entropy) from a torchtitan ``Decoder`` held as ``self.model``."""

    def __init__(
        self,
        model: Decoder,
        logprob_chunk_size: int,
        attn_implementation: str,
        attention_masks: Optional[Callable[[torch.Tensor], Any]] = None,
    ) -> None:
        """``attention_masks(position_ids)`` builds what the model's attention takes (default: its own)."""
        super().__init__(model, logprob_chunk_size, hidden_size=model.config.dim, attn_implementation=attn_implementation)
        model._skip_lm_head = True  # the head runs chunked in CausalLMForward, never as full [tokens, vocab] logits
        self.attention_masks = attention_masks or model.get_attention_masks

    def hidden_states(self, stream: TokenStream) -> torch.Tensor:
        positions = stream.position_ids
        return _whole(self.model(stream.input_ids, positions, self.attention_masks(positions)))

    def output_embeddings(self) -> Callable[[torch.Tensor], torch.Tensor]:
        head = self.model.lm_head
        return lambda hidden: _whole(head(hidden))


class TitanPipelineStageForward(TitanCausalLMForward):
    """One pipeline stage of the decoder (``self.model`` holds this stage's modules only), as the module torch's
    pipeline stage calls: tensors in, tensors out. A stage before the last returns its hidden states; the last
    returns ``[rows, width, k]``: the log-prob of each slot's ``labels`` token, and its entropy when
    ``compute_entropy`` (k = 2). ``temperature`` and ``compute_entropy`` are set before each call: every input of
    a pipeline stage must be a tensor."""

    temperature: float = 1.0
    compute_entropy: bool = False

    def forward(self, inputs: torch.Tensor, positions: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        hidden = self.model(inputs, positions, self.attention_masks(positions))
        if self.model.lm_head is None:
            return hidden
        rows, width, size = hidden.shape
        log_probs, entropy = chunked_log_probs(hidden.reshape(-1, size), self.output_embeddings(), labels.reshape(-1),
                                               temperature=self.temperature, chunk_size=self.logprob_chunk_size,
                                               compute_entropy=self.compute_entropy)
        per_slot = [log_probs] if entropy is None else [log_probs, entropy]
        return torch.stack(per_slot, -1).reshape(rows, width, len(per_slot))


def _whole(tensor: torch.Tensor) -> torch.Tensor:
    """Under tensor parallelism the decoder's output is a replicated DTensor and the LM head's logits are
    vocab-sharded: the plain whole tensor either way (a chunk of logits at a time), differentiable."""
    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor
