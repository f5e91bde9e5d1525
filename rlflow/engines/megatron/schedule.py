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

from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch
from megatron.core.distributed import DistributedDataParallel as MegatronDDP
from megatron.core.pipeline_parallel import get_forward_backward_func

from rlflow.engines.base import LossFn
from rlflow.engines.common.batching.micro_batching import plan_micro_batches
from rlflow.engines.common.batching.packing import TokenStream
from rlflow.engines.common.forward.forward_backward import check_batch
from rlflow.engines.common.forward.last_stage import LastStageRecord, PipelineGroup, stage_results
from rlflow.engines.common.forward.loss_scaling import global_counts
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
    record = LastStageRecord()

    def forward_step(data_iterator, stage_model):
        micro = next(data_iterator)
        output = stage_model(micro.stream, temperature, compute_entropy)
        # the schedule divides each micro-batch's loss by their number: rlflow's losses already sum to the mini-batch's
        return output, lambda outputs: (
            record.loss(micro.index, micro.data, outputs, loss_fn, counts, scale=len(plan.groups)), {})

    with torch.set_grad_enabled(training):
        get_forward_backward_func()(
            forward_step_func=forward_step, data_iterator=iter(micro_batches), model=[model],
            num_microbatches=len(micro_batches), seq_length=max(m.stream.input_ids.shape[1] for m in micro_batches),
            micro_batch_size=max(m.stream.input_ids.shape[0] for m in micro_batches), forward_only=not training,
        )
    if training:
        model.finish_grad_sync()
    pipeline = PipelineGroup(ranks.pp_size, ranks.pp_group, ranks.pp_ranks[-1], ranks.is_collect)
    return stage_results(record, plan, counts, ranks.dp_group, pipeline, device)
