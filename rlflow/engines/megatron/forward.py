"""One pipeline stage of a megatron ``GPTModel`` as the module the engine runs: token stream in, per-token outputs out.

``StageForward`` calls the ``GPTModel``'s parts itself rather than ``GPTModel.forward``:

* rows of a ``TokenStream`` (several sequences packed back to back, or padded rows) go in as
  megatron's ``[s, b]`` layout; each layer attends under the block-causal document mask
  (``packing.document_causal_mask``; plain causal attention when every row is one sequence) with
  rotary positions taken per token from ``position_ids`` (``per_token_rotary``), so every
  sequence sees only itself and starts at position 0;
* under ``sequence_parallel`` the embeddings scatter the sequence over the TP ranks, each layer's
  column-parallel input gathers it and its row-parallel output scatters it again, and the last stage
  gathers the final hidden states (the engine widens the rows to a multiple of TP);
* a stage that is not the first takes its input from the previous stage (the schedule's
  ``set_input_tensor``), and a stage that is not the last returns its hidden states for the next;
* the last stage turns the final hidden states into per-token outputs: log-probs (and entropy)
  computed vocab-parallel from the output layer's vocabulary shard, a chunk of tokens at a time
  (``logprob.chunked_log_probs`` with ``vocab_parallel_log_probs``: the full vocabulary is never
  gathered on one rank), or a value model's ``value_head`` on every token.
"""

from __future__ import annotations

from functools import partial
from typing import Optional

import torch
import torch.distributed as dist
from megatron.core.models.gpt import GPTModel
from megatron.core.tensor_parallel import gather_from_sequence_parallel_region, reduce_from_tensor_model_parallel_region
from torch import nn

from rlflow.engines.common.batching.packing import TokenStream, document_causal_mask
from rlflow.engines.common.forward.logprob import chunked_log_probs
from rlflow.engines.common.forward.models import place_targets

__all__ = ["StageForward", "attention_mask", "per_token_rotary", "vocab_parallel_log_probs"]

_LEFT_OUT = -1e30  # the logit of a padding column of the vocabulary


def per_token_rotary(model: GPTModel, position_ids: torch.Tensor) -> torch.Tensor:
    """Rotary angles ``[s, b, 1, head_dim]`` for the ``[b, s]`` positions (megatron's own table, indexed per token)."""
    table = model.rotary_pos_emb(int(position_ids.max()) + 1)  # [positions, 1, 1, head_dim]
    return table[:, 0].index_select(0, position_ids.t().reshape(-1)).reshape(*position_ids.t().shape, 1, -1)


def attention_mask(position_ids: torch.Tensor) -> Optional[torch.Tensor]:
    """The block-causal document mask of ``[b, s]`` rows, or None when every row is one sequence from position 0
    (plain causal attention, which SDPA runs without a mask: its fastest kernel)."""
    single = torch.arange(position_ids.shape[-1], device=position_ids.device)
    if bool((position_ids == single).all()):
        return None
    return document_causal_mask(position_ids)


def vocab_parallel_log_probs(
    logits: torch.Tensor,
    labels: torch.Tensor,
    compute_entropy: bool,
    *,
    vocab_start: int,
    vocab_size: int,
    group: Optional[dist.ProcessGroup],
) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """``logprob.log_probs_from_logits`` over a vocabulary shard: ``logits`` ``[n, shard]`` hold columns
    ``vocab_start ..`` of the padded vocabulary on this rank; columns at or past ``vocab_size`` (padding)
    are left out. The sums go through megatron's all-reduce over the tensor-parallel ``group``
    (backward: identity), so every rank gets the same differentiable log-probs and entropy."""
    columns = torch.arange(vocab_start, vocab_start + logits.shape[-1], device=logits.device)
    logits = logits.masked_fill(columns >= vocab_size, _LEFT_OUT)  # exp() is exactly 0, and finite: no nan gradients
    local_max = logits.detach().max(dim=-1).values
    if group is not None and dist.get_world_size(group) > 1:
        dist.all_reduce(local_max, op=dist.ReduceOp.MAX, group=group)
    shifted = logits - local_max.unsqueeze(-1)
    exp = shifted.exp()
    log_norm = reduce_from_tensor_model_parallel_region(exp.sum(-1), group).log()
    local_label = labels - vocab_start
    owned = (local_label >= 0) & (local_label < logits.shape[-1])
    picked = shifted.gather(-1, local_label.clamp(0, logits.shape[-1] - 1).unsqueeze(-1)).squeeze(-1)
    log_probs = reduce_from_tensor_model_parallel_region(torch.where(owned, picked, torch.zeros_like(picked)), group) - log_norm
    if not compute_entropy:
        return log_probs, None
    expected_logit = reduce_from_tensor_model_parallel_region((exp * shifted).sum(-1), group) / log_norm.exp()
    return log_probs, log_norm - expected_logit


class StageForward(nn.Module):
    """This rank's pipeline stage of a ``GPTModel`` (``self.module``), run on ``TokenStream`` rows."""

    def __init__(
        self,
        model: GPTModel,
        *,
        value_head: Optional[nn.Linear],
        vocab_size: int,
        padding_idx: Optional[int],
        tp_rank: int,
        tp_group: Optional[dist.ProcessGroup],
        logprob_chunk_size: int,
    ) -> None:
        """``value_head``: a value model's score head (None: a causal LM); ``vocab_size``: the tokenizer's;
        ``padding_idx``: the HF embedding's padding token (its lookups pass no gradient to its row)."""
        super().__init__()
        self.module = model  # megatron finds the model's attributes through ``.module`` (get_attr_wrapped_model)
        self.value_head = value_head
        self.padding_idx = padding_idx
        self.logprob_chunk_size = logprob_chunk_size
        self.tp_group, self.tp_rank = tp_group, tp_rank
        self.tp_size = dist.get_world_size(tp_group) if tp_group is not None else 1
        self.sequence_parallel = model.config.sequence_parallel
        shard = model.vocab_size // (dist.get_world_size(tp_group) if tp_group is not None else 1)
        self.reduce = partial(vocab_parallel_log_probs, vocab_start=tp_rank * shard, vocab_size=vocab_size, group=tp_group)

    def set_input_tensor(self, input_tensor: torch.Tensor) -> None:
        """The previous stage's output (megatron's schedules call this before each forward)."""
        self.module.set_input_tensor(input_tensor)

    def forward(self, stream: TokenStream, temperature: float, compute_entropy: bool) -> torch.Tensor | dict[str, torch.Tensor]:
        model = self.module
        positions = stream.position_ids
        hidden = self._embed(stream.input_ids) if model.pre_process else None
        hidden = model.decoder(
            hidden_states=hidden,
            attention_mask=attention_mask(positions),
            rotary_pos_emb=per_token_rotary(model, positions),
        )
        if not model.post_process:
            return hidden  # [s, b, hidden] for the next stage ([s / TP, b, hidden] under sequence parallelism)
        if self.sequence_parallel:  # whole sequences on every TP rank; backward: this rank's slice of the gradient,
            # which the output layer's input-gradient all-reduce has made the same on every rank
            hidden = gather_from_sequence_parallel_region(hidden, tensor_parallel_output_grad=False,
                                                          group=self.tp_group)
        hidden = hidden.transpose(0, 1).reshape(-1, hidden.shape[-1])  # stream slots, row-major like the stream
        if self.value_head is not None:
            return {"values": stream.to_rows(self.value_head(hidden).reshape(-1))}
        return self._log_probs(hidden, stream, temperature, compute_entropy)

    def _embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """The first stage's ``[s, b, hidden]`` embeddings. transformers' ``nn.Embedding(padding_idx=...)`` gives
        the padding token's row no gradient from its lookups (the row still trains as a tied output layer);
        megatron's embedding has no such option, so the gradient of those lookups is dropped here."""
        hidden = self.module.embedding(input_ids=input_ids, position_ids=None)  # sequence-parallel: this rank's slice
        if self.padding_idx is not None and hidden.requires_grad:
            lookups = (input_ids == self.padding_idx).t().unsqueeze(-1)
            if self.sequence_parallel:
                lookups = lookups.chunk(self.tp_size)[self.tp_rank]
            hidden.register_hook(lambda grad: grad.masked_fill(lookups, 0.0))
        return hidden

    def _log_probs(self, hidden: torch.Tensor, stream: TokenStream, temperature: float, compute_entropy: bool) -> dict[str, torch.Tensor]:
        model = self.module
        weight = model.shared_embedding_or_output_weight() if model.share_embeddings_and_output_weights else None

        def head(chunk: torch.Tensor) -> torch.Tensor:  # megatron's linear layers take [s, b, hidden]
            return model.output_layer(chunk.unsqueeze(1), weight=weight)[0].squeeze(1)

        log_probs, entropy = chunked_log_probs(
            hidden.index_select(0, stream.source_index), head, stream.labels, temperature=temperature,
            chunk_size=self.logprob_chunk_size, compute_entropy=compute_entropy, reduce=self.reduce,
        )
        outputs = {"log_probs": place_targets(log_probs, stream)}
        if entropy is not None:
            outputs["entropy"] = place_targets(entropy, stream)
        return outputs
