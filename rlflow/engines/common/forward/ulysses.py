"""Ulysses sequence parallelism (``ulysses_sequence_parallel_size``) for engines that run the HF module.

``size`` adjacent ranks form one sequence-parallel (SP) group. They take the same micro-batches (mesh dispatch
gives them one data-parallel rank) and split each micro-batch's packed token stream into ``size`` equal slices of
slots, one per rank: every rank runs the decoder layers on its own slice, so activations shrink by ``size``.
Attention is the one place that needs whole sequences; there the ranks trade heads for sequence by all-to-all
(``ulysses_attention``): queries, keys and values ``[b, heads, slice, d]`` become ``[b, heads / size, stream, d]``,
the attention kernel runs on whole sequences for its share of the heads, and the output goes back the same way.

Per-token outputs (log-probs, entropy, values) are computed on each rank's own slots and gathered
(``UlyssesShard``), so every rank of the group computes the same loss from the same outputs. The gather's
backward keeps this rank's own slice of the gradient, times ``size``: the engine's gradient reduction averages
over every rank (data-parallel x SP), and the factor makes that the average over data-parallel ranks alone, as
the loss scaling (``LossContext.dp_size``) expects. The counts behind that scaling are reduced over ``dp_group``,
the ranks at the same place of every SP group.

Needs the stream laid out as one row with no attention mask: ``use_remove_padding=true`` and a kernel of
``ULYSSES_KERNELS`` (mask-free, variable-length: the exchange hands it whole sequences plus the full stream's
position ids and grid). Heads and key/value heads must divide by ``size``; ``check_heads`` says so before any
worker starts. Without SP (``size`` 1) ``shard`` returns the stream untouched (``WholeStream``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Optional, Protocol

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from transformers import AttentionInterface, PretrainedConfig
from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from rlflow.engines.common.batching.packing import TokenStream
from rlflow.engines.common.batching.varlen_sdpa import SDPA_VARLEN
from rlflow.engines.config import ULYSSES_KERNELS

__all__ = [
    "ULYSSES_ATTENTION",
    "SequenceParallel",
    "StreamShard",
    "UlyssesExchange",
    "UlyssesShard",
    "WholeStream",
    "check_heads",
    "ulysses_attention",
]

ULYSSES_ATTENTION = "ulysses"  # the attention implementation an SP model runs (it wraps the configured kernel)


def check_heads(hf_config: PretrainedConfig, size: int) -> Optional[str]:
    """Why a model with ``hf_config`` cannot be split over ``size`` SP ranks (its heads must divide), or None."""
    heads = hf_config.num_attention_heads
    kv_heads = getattr(hf_config, "num_key_value_heads", None) or heads
    if heads % size or kv_heads % size:
        return (f"ulysses_sequence_parallel_size={size} must divide the model's attention heads ({heads}) and "
                f"key/value heads ({kv_heads})")
    return None


def _exchange(tensor: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    tensor = tensor.contiguous()
    exchanged = torch.empty_like(tensor)
    dist.all_to_all_single(exchanged, tensor, group=group)
    return exchanged


class _AllToAll(torch.autograd.Function):
    """Block j of dim 0 goes to rank j, block i of the result came from rank i. The exchange is its own inverse,
    so its backward is the same exchange of the gradient."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        ctx.group = group
        return _exchange(tensor, group)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return _exchange(grad, ctx.group), None


class _GatherSlices(torch.autograd.Function):
    """Every rank's equal-length slice, concatenated in rank order, on every rank. Backward: this rank's own
    slice of the gradient times the group size (module docstring: every rank computes the same loss)."""

    @staticmethod
    def forward(ctx: Any, local: torch.Tensor, rank: int, group: dist.ProcessGroup) -> torch.Tensor:
        size = dist.get_world_size(group)
        ctx.rank, ctx.size, ctx.length = rank, size, local.shape[0]
        slices = [torch.empty_like(local) for _ in range(size)]
        dist.all_gather(slices, local.contiguous(), group=group)
        return torch.cat(slices)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        start = ctx.rank * ctx.length
        return grad[start:start + ctx.length] * ctx.size, None, None


@dataclass(frozen=True)
class UlyssesExchange:
    """What one SP model call's attention needs: the group, the wrapped kernel, the whole stream's position ids."""

    group: dist.ProcessGroup
    size: int
    kernel: str
    position_ids: torch.Tensor  # [1, stream slots]

    def heads_to_sequence(self, states: torch.Tensor) -> torch.Tensor:
        """``[b, heads, slice, d]`` (this rank's slots, every head) -> ``[b, heads / size, stream, d]``."""
        batch, heads, length, dim = states.shape
        blocks = states.reshape(batch, self.size, heads // self.size, length, dim).transpose(0, 1)
        received = _AllToAll.apply(blocks, self.group)  # [source rank = slice, b, heads / size, slice, d]
        return received.permute(1, 2, 0, 3, 4).reshape(batch, heads // self.size, self.size * length, dim)

    def sequence_to_heads(self, output: torch.Tensor) -> torch.Tensor:
        """The kernel's ``[b, stream, heads / size, d]`` -> ``[b, slice, heads, d]``."""
        batch, slots, heads, dim = output.shape
        blocks = output.reshape(batch, self.size, slots // self.size, heads, dim).transpose(0, 1)
        received = _AllToAll.apply(blocks, self.group)  # [source rank = head block, b, slice, heads / size, d]
        return received.permute(1, 2, 0, 3, 4).reshape(batch, slots // self.size, self.size * heads, dim)


def ulysses_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: Optional[torch.Tensor],
    *,
    ulysses: Optional[UlyssesExchange] = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function contract on this rank's slice of the stream: the configured kernel
    (``ulysses.kernel``) runs on whole sequences for ``heads / size`` of the heads."""
    if ulysses is None:
        raise ValueError(f"attn_implementation={ULYSSES_ATTENTION} runs inside an rlflow engine with "
                         "ulysses_sequence_parallel_size > 1, which passes the exchange to every call")
    heads, kv_heads = query.shape[1], key.shape[1]
    if heads % ulysses.size or kv_heads % ulysses.size:
        raise ValueError(f"ulysses_sequence_parallel_size={ulysses.size} must divide the attention heads ({heads}) "
                         f"and key/value heads ({kv_heads})")
    kernel = ALL_ATTENTION_FUNCTIONS[ulysses.kernel]
    kwargs["position_ids"] = ulysses.position_ids  # a varlen kernel finds the sequences in the whole stream
    query, key, value = (ulysses.heads_to_sequence(states) for states in (query, key, value))
    output, _ = kernel(module, query, key, value, attention_mask, **kwargs)
    return ulysses.sequence_to_heads(output), None


AttentionInterface.register(ULYSSES_ATTENTION, ulysses_attention)
AttentionMaskInterface.register(ULYSSES_ATTENTION, flash_attention_mask)


class StreamShard(Protocol):
    """One rank's part of a model call on a token stream, and the way back to the whole stream's outputs."""

    stream: TokenStream  # the model call's inputs on this rank (index maps: the whole stream's)

    def prediction_rows(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The rows of this rank's hidden states ``[slots, hidden]`` to turn into log-probs, and their labels."""

    def per_source(self, values: torch.Tensor) -> torch.Tensor:
        """Values per ``source_index`` slot of the whole stream, from this rank's values per prediction row."""

    def per_slot(self, values: torch.Tensor) -> torch.Tensor:
        """Values per slot of the whole stream, from this rank's values per slot of its call."""


@dataclass(frozen=True)
class WholeStream:
    """No sequence parallelism: the call is the whole stream; log-probs only where a next token exists."""

    stream: TokenStream

    def prediction_rows(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.stream.source_index, self.stream.labels

    def per_source(self, values: torch.Tensor) -> torch.Tensor:
        return values

    def per_slot(self, values: torch.Tensor) -> torch.Tensor:
        return values


class UlyssesShard:
    """This rank's equal slice of a one-row stream padded to a multiple of the group size (filler slots at the
    end: their own positions from 0, outside every sequence). Every slot of the slice predicts the stream's next
    slot, so each rank's outputs depend on all of its hidden states (every rank's backward reaches every layer's
    exchange); ``per_source`` keeps the whole stream's ``source_index`` slots of the gathered values."""

    def __init__(self, whole: TokenStream, group: dist.ProcessGroup, size: int, rank: int, kernel: str) -> None:
        if whole.input_ids.shape[0] != 1 or whole.attention_mask is not None:
            raise ValueError("ulysses sequence parallelism splits a packed one-row stream (use_remove_padding=true "
                             f"and an attention kernel of {list(ULYSSES_KERNELS)})")
        self.whole, self.group, self.rank = whole, group, rank
        self.num_slots = whole.input_ids.shape[1]
        filler = -self.num_slots % size
        self.length = (self.num_slots + filler) // size
        ids = F.pad(whole.input_ids.reshape(-1), (0, filler))
        filler_positions = torch.arange(filler, device=ids.device).to(whole.position_ids)
        positions = torch.cat([whole.position_ids.reshape(-1), filler_positions])
        own = slice(rank * self.length, (rank + 1) * self.length)
        self.labels = F.pad(whole.next_tokens.reshape(-1), (0, filler))[own]  # the last slot's is never read
        grid = {} if whole.token_slots is None else {"token_slots": F.pad(whole.token_slots, (0, filler))}
        exchange = UlyssesExchange(group, size, kernel, positions[None])
        self.stream = replace(whole, input_ids=ids[own][None], position_ids=positions[own][None], label_ids=None,
                              attention_extras={"ulysses": exchange}, **grid)

    def prediction_rows(self) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.arange(self.length, device=self.labels.device), self.labels

    def per_source(self, values: torch.Tensor) -> torch.Tensor:
        return self.per_slot(values).index_select(0, self.whole.source_index)

    def per_slot(self, values: torch.Tensor) -> torch.Tensor:
        return _GatherSlices.apply(values, self.rank, self.group)[: self.num_slots]


@dataclass(frozen=True)
class SequenceParallel:
    """This rank's place in Ulysses sequence parallelism (module docstring). ``size`` 1: none."""

    size: int = 1
    rank: int = 0  # within the SP group
    group: Optional[dist.ProcessGroup] = None
    dp_group: Optional[dist.ProcessGroup] = None  # the ranks at this rank's place of every SP group
    kernel: str = SDPA_VARLEN  # the attention kernel the exchange wraps

    @classmethod
    def build(cls, size: int, rank: int, world_size: int, kernel: str) -> "SequenceParallel":
        """Collective (every rank creates every group): SP groups of ``size`` adjacent ranks of the default group."""
        if size == 1:
            return cls()
        if world_size % size:
            raise ValueError(f"ulysses_sequence_parallel_size={size} must divide the world size {world_size}")
        sp_groups = [dist.new_group(list(range(start, start + size))) for start in range(0, world_size, size)]
        dp_groups = [dist.new_group(list(range(place, world_size, size))) for place in range(size)]
        return cls(size, rank % size, sp_groups[rank // size], dp_groups[rank % size], kernel)

    def install(self, model: nn.Module) -> None:
        """Route the HF ``model``'s attention through ``ulysses_attention`` (nothing without SP)."""
        if self.size == 1:
            return
        if self.kernel not in ULYSSES_KERNELS:
            raise ValueError(f"ulysses_sequence_parallel_size={self.size} needs attn_implementation in "
                             f"{list(ULYSSES_KERNELS)}, got {self.kernel}")
        model.config._attn_implementation = ULYSSES_ATTENTION

    def shard(self, stream: TokenStream) -> StreamShard:
        """This rank's part of a model call on ``stream``."""
        if self.size == 1:
            return WholeStream(stream)
        return UlyssesShard(stream, self.group, self.size, self.rank, self.kernel)
