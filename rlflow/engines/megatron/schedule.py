"""``forward_backward`` through megatron's pipeline schedules (``get_forward_backward_func``).

The micro-batches are planned before the schedule runs, as every engine plans them
(``plan_micro_batches``: the count agreed across the data-parallel group) and laid out as token
streams (``packing.make_token_stream``). Every rank of a pipeline holds the same mini-batch (mesh
dispatch sends a data-parallel shard to all its tensor and pipeline ranks), so each stage walks
the same list: the first stage embeds the tokens, the others take the previous stage's hidden
states (megatron's p2p, shapes exchanged per micro-batch: ``variable_seq_lengths``), and every
stage builds its masks and rotary positions from the stream.

On the last stage the schedule calls the loss function of each micro-batch: rlflow's ``loss_fn``
on the per-token outputs, scaled as ``LossContext`` says, times the number of micro-batches,
because the schedule divides each micro-batch loss by that number (its average over
micro-batches; rlflow's losses are already scaled to sum to the mini-batch loss). The outputs,
losses and metrics exist on the last stage only; the loss and metrics are broadcast to the
other stages, the outputs stay on the ranks that collect (``ParallelRanks.is_collect``).
After a training pass, megatron DDP's data-parallel gradient all-reduce runs once
(``finish_grad_sync``: averaging an already averaged buffer changes nothing, so several
``forward_backward`` calls before one ``optim_step`` accumulate correctly).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist
from megatron.core.distributed import DistributedDataParallel as MegatronDDP
from megatron.core.pipeline_parallel import get_forward_backward_func

from rlflow.engines.base import LossFn
from rlflow.engines.common.batching.micro_batching import MicroBatchPlan, plan_micro_batches
from rlflow.engines.common.batching.packing import TokenStream
from rlflow.engines.common.forward.forward_backward import MicroBatchMetrics, check_batch
from rlflow.engines.common.forward.loss_scaling import GlobalCounts, global_counts, global_loss
from rlflow.engines.config import EngineConfig
from rlflow.engines.megatron.parallel import ParallelRanks
from rlflow.meta_info import COMPUTE_ENTROPY, TEMPERATURE
from rlflow.protocol import DataProto

__all__ = ["run_schedule"]


@dataclass
class _MicroBatch:
    index: int
    data: DataProto
    stream: TokenStream


class _LastStageRecord:
    """What the last stage's loss functions see: per-token outputs, losses and metrics of each micro-batch."""

    def __init__(self) -> None:
        self.outputs: dict[str, list[torch.Tensor]] = defaultdict(list)
        self.losses: list[torch.Tensor] = []
        self.metrics = MicroBatchMetrics()

    def loss_func(
        self, micro: _MicroBatch, loss_fn: Optional[LossFn], counts: Optional[GlobalCounts], num_micro_batches: int,
        outputs: dict[str, torch.Tensor],
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        for key, value in outputs.items():
            self.outputs[key].append(value.detach())
        if loss_fn is None:
            return torch.zeros((), device=next(iter(outputs.values())).device), {}
        loss, metrics = loss_fn(outputs, micro.data, counts.context(micro.index))
        self.losses.append(loss.detach())
        self.metrics.add(metrics)
        return loss * num_micro_batches, {}  # the schedule divides by num_micro_batches


def run_schedule(
    batch: DataProto,
    model: MegatronDDP,
    loss_fn: Optional[LossFn],
    forward_only: bool,
    config: EngineConfig,
    ranks: ParallelRanks,
    device: torch.device,
    stream_layout: Callable[[DataProto], TokenStream],
) -> tuple[DataProto, dict[str, Any]]:
    """``BaseEngine.forward_backward`` for one megatron model (``model``: the DDP-wrapped ``StageForward``);
    ``stream_layout(micro_batch)`` lays a micro-batch out for the model."""
    check_batch(batch, loss_fn, forward_only)
    training = loss_fn is not None and not forward_only
    plan = plan_micro_batches(
        batch.batch["attention_mask"].sum(-1).tolist(), **config.micro_batch_limits(training),
        group=ranks.dp_group, device=device,
    )
    counts = global_counts(batch, len(plan.groups), ranks.dp_group, device) if loss_fn is not None else None
    micro_batches = []
    for index, rows in enumerate(plan.groups):  # laid out on the host, then copied (forward_backward.py)
        micro = batch[rows]
        stream = stream_layout(micro).to(device)
        micro_batches.append(_MicroBatch(index, micro.to(device), stream))
    temperature = TEMPERATURE.read(batch.meta_info)
    compute_entropy = COMPUTE_ENTROPY.read(batch.meta_info)
    record = _LastStageRecord()

    def forward_step(data_iterator, stage_model):
        micro = next(data_iterator)
        output = stage_model(micro.stream, temperature, compute_entropy)
        return output, lambda outputs: record.loss_func(micro, loss_fn, counts, len(plan.groups), outputs)

    with torch.set_grad_enabled(training):
        get_forward_backward_func()(
            forward_step_func=forward_step, data_iterator=iter(micro_batches), model=[model],
            num_microbatches=len(micro_batches), seq_length=max(m.stream.input_ids.shape[1] for m in micro_batches),
            micro_batch_size=max(m.stream.input_ids.shape[0] for m in micro_batches), forward_only=not training,
        )
    if training:
        model.finish_grad_sync()
    return _results(record, plan, counts, ranks, device)


def _results(record: _LastStageRecord, plan: MicroBatchPlan, counts: Optional[GlobalCounts], ranks: ParallelRanks,
             device: torch.device) -> tuple[DataProto, dict[str, Any]]:
    metrics: dict[str, Any] = record.metrics.means()
    metrics["num_micro_batches"] = len(plan.groups)
    if counts is not None:
        metrics["loss"] = global_loss(record.losses, counts.dp_size, ranks.dp_group, device)
        metrics["num_tokens"], metrics["num_seqs"] = counts.num_tokens, counts.num_seqs
    if ranks.pp_size > 1:  # the last stage's loss and metrics, on every stage
        shared = [metrics]
        dist.broadcast_object_list(shared, src=ranks.pp_ranks[-1], group=ranks.pp_group)
        metrics = shared[0]
    if not ranks.is_collect:
        return DataProto.from_dict({}), metrics
    outputs = {key: plan.restore(torch.cat(parts)) for key, parts in record.outputs.items()}
    return DataProto.from_dict(outputs), metrics
