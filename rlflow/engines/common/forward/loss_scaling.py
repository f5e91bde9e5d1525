"""Global counts for gradient-accumulation scaling, and the global loss metric.

The engine backprops each micro-batch loss as the loss_fn returns it and the DP
gradient reduction averages over ranks; the loss_fn scales its micro-batch loss with
the global counts computed here (see ``rlflow.engines.base.LossContext``).
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist

from rlflow.engines.base import LossContext
from rlflow.engines.common.distributed import all_reduce_sum
from rlflow.protocol import DataProto

__all__ = ["GlobalCounts", "global_counts", "global_loss"]


class GlobalCounts:
    """Token and sequence counts of a whole mini-batch (all micro-batches, all DP ranks)."""

    def __init__(self, num_tokens: int, num_seqs: int, dp_size: int, num_micro_batches: int) -> None:
        self.num_tokens = num_tokens
        self.num_seqs = num_seqs
        self.dp_size = dp_size
        self.num_micro_batches = num_micro_batches

    def context(self, micro_batch_index: int) -> LossContext:
        return LossContext(
            global_num_tokens=self.num_tokens,
            global_num_seqs=self.num_seqs,
            dp_size=self.dp_size,
            num_micro_batches=self.num_micro_batches,
            micro_batch_index=micro_batch_index,
        )


def global_counts(
    batch: DataProto, num_micro_batches: int, group: Optional[dist.ProcessGroup], device: torch.device
) -> GlobalCounts:
    """Sum of ``loss_mask`` and the number of rows over the DP group (collective)."""
    if "loss_mask" not in batch.batch:
        raise ValueError(
            f"a loss_fn needs batch['loss_mask'] ([B, T], 1 where the loss applies); batch has {sorted(batch.batch)}"
        )
    loss_mask = batch.batch["loss_mask"]
    if loss_mask.shape != batch.batch["input_ids"].shape:
        raise ValueError(
            f"loss_mask has shape {tuple(loss_mask.shape)}, input_ids {tuple(batch.batch['input_ids'].shape)}; "
            "the loss mask is token-aligned with input_ids"
        )
    tokens, rows = all_reduce_sum([float(loss_mask.sum().item()), float(len(batch))], group, device)
    dp_size = dist.get_world_size(group) if dist.is_initialized() else 1
    return GlobalCounts(int(tokens), int(rows), dp_size, num_micro_batches)


def global_loss(micro_batch_losses: list[torch.Tensor], dp_size: int, group: Optional[dist.ProcessGroup], device: torch.device) -> float:
    """The mini-batch loss: sum of every rank's micro-batch losses, divided by ``dp_size`` (undoes their scaling)."""
    local = float(sum(loss.item() for loss in micro_batch_losses))
    return all_reduce_sum([local], group, device)[0] / dp_size
