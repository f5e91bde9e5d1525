"""What a pipeline engine's last stage keeps of each micro-batch, and the ``forward_backward`` result built from it.

A pipeline schedule (megatron's, torch's) calls a loss function on the last stage once per micro-batch with that
stage's per-token outputs. ``LastStageRecord.loss`` keeps the outputs, runs the role's ``loss_fn`` and keeps its
loss and metrics; ``stage_results`` turns the record into what ``BaseEngine.forward_backward`` returns: the loss
and metrics on every stage (broadcast from the last), the outputs in input row order on the collecting ranks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch
import torch.distributed as dist

from rlflow.engines.base import LossFn
from rlflow.engines.common.batching.micro_batching import MicroBatchPlan
from rlflow.engines.common.forward.forward_backward import MicroBatchMetrics
from rlflow.engines.common.forward.loss_scaling import GlobalCounts, global_loss
from rlflow.protocol import DataProto

__all__ = ["LastStageRecord", "PipelineGroup", "stage_results"]


@dataclass(frozen=True)
class PipelineGroup:
    """The ranks one pipeline spans: its group, the last stage's global rank, and whether this rank collects."""

    size: int
    group: Optional[dist.ProcessGroup]
    last_rank: int
    is_collect: bool


class LastStageRecord:
    """What the last stage's loss functions see: per-token outputs, losses and metrics of each micro-batch, by its
    index. A schedule may call the loss function of a micro-batch more than once (torch's stages run a first
    micro-batch to learn the shapes they exchange, on stand-in inputs): the last call of an index is the one kept."""

    def __init__(self) -> None:
        self.outputs: dict[int, dict[str, torch.Tensor]] = {}
        self.losses: dict[int, torch.Tensor] = {}
        self.metrics: dict[int, dict[str, Any]] = {}

    def loss(self, index: int, micro: DataProto, outputs: dict[str, torch.Tensor], loss_fn: Optional[LossFn],
             counts: Optional[GlobalCounts], scale: float = 1.0) -> torch.Tensor:
        """Keep micro-batch ``index``'s outputs; its ``loss_fn`` loss times ``scale`` (what the schedule backprops:
        a schedule that averages over micro-batches needs their number), zero without a loss function."""
        self.outputs[index] = {key: value.detach() for key, value in outputs.items()}
        if loss_fn is None:
            return torch.zeros((), device=next(iter(outputs.values())).device)
        loss, metrics = loss_fn(outputs, micro, counts.context(index))
        self.losses[index] = loss.detach()
        self.metrics[index] = metrics
        return loss * scale


def stage_results(record: LastStageRecord, plan: MicroBatchPlan, counts: Optional[GlobalCounts],
                  dp_group: Optional[dist.ProcessGroup], pipeline: PipelineGroup,
                  device: torch.device) -> tuple[DataProto, dict[str, Any]]:
    """``(outputs, metrics)`` of ``forward_backward`` from the last stage's ``record`` (collective over the
    pipeline: every stage calls it)."""
    per_micro_batch = MicroBatchMetrics()
    for index in sorted(record.metrics):
        per_micro_batch.add(record.metrics[index])
    metrics: dict[str, Any] = per_micro_batch.means()
    metrics["num_micro_batches"] = len(plan.groups)
    if counts is not None:
        metrics["loss"] = global_loss(list(record.losses.values()), counts.dp_size, dp_group, device)
        metrics["num_tokens"], metrics["num_seqs"] = counts.num_tokens, counts.num_seqs
    if pipeline.size > 1:  # the last stage's loss and metrics, on every stage
        shared = [metrics]
        dist.broadcast_object_list(shared, src=pipeline.last_rank, group=pipeline.group)
        metrics = shared[0]
    if not pipeline.is_collect:
        return DataProto.from_dict({}), metrics
    ordered = [record.outputs[index] for index in range(len(plan.groups))]
    outputs = {key: plan.restore(torch.cat([micro[key] for micro in ordered])) for key in ordered[0]}
    return DataProto.from_dict(outputs), metrics
