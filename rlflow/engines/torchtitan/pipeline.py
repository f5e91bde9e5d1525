"""Pipeline parallelism for the torchtitan engine (``pipeline_parallel_size``), on torch's pipeline schedules.

The split is torchtitan's: each rank of a pipeline group keeps a copy of the decoder with only its stage's modules
(``torchtitan.distributed.pipeline_parallel._split_module``: the first stage also holds the token embeddings, the
last the final norm and the LM head; a missing module is skipped by the decoder's forward), and the family's
parallelize function shards that part over data parallelism as it shards a whole model. The schedule is torch's
``torch.distributed.pipelining`` (``pipeline_parallel_schedule``: ``1F1B`` or ``GPipe``, one stage per rank),
what torchtitan's trainer runs; a call with fewer micro-batches than stages runs GPipe (1F1B needs one a stage).

``run_pipeline`` is ``forward_backward``: micro-batches planned as every engine plans them, each laid out as a
token stream, labels set to each slot's next token, all padded to one shape and stacked; the schedule sends
micro-batch i's activations to the next stage while this one runs micro-batch i+1. The last stage's module
returns log-probs (and entropy) of every slot; the schedule's loss function, given the micro-batch's index as its
target, keeps the stream's slots that predict a token of their sequence and calls the role's ``loss_fn``
(``LastStageRecord``). A torch pipeline stage infers the shapes it exchanges once, on its first micro-batch, and
packed streams change shape from call to call, so every call builds its own ``PipelineStage`` and schedule around
the same module (one small shape message per stage).

``pipeline_tensors`` gives every rank every stage's parameters, one at a time (weight export and sync), and
``PipelineRanks.norm`` joins the stages' gradient norms.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining.schedules import get_schedule_class

from rlflow.engines.base import LossFn
from rlflow.engines.common.batching.micro_batching import plan_micro_batches
from rlflow.engines.common.batching.packing import TokenStream
from rlflow.engines.common.forward.forward_backward import check_batch
from rlflow.engines.common.forward.last_stage import LastStageRecord, PipelineGroup, stage_results
from rlflow.engines.common.forward.loss_scaling import global_counts
from rlflow.engines.common.forward.models import place_targets
from rlflow.engines.config import EngineConfig
from rlflow.meta_info import COMPUTE_ENTROPY, TEMPERATURE
from rlflow.protocol import DataProto

__all__ = ["PIPELINE_SCHEDULES", "PipelineRanks", "layer_count_error", "pipeline_tensors", "run_pipeline",
           "stage_module_names"]

PIPELINE_SCHEDULES = ("1F1B", "GPipe")  # torch's single-stage schedules: one stage per rank


def stage_module_names(num_layers: int, stages: int) -> list[list[str]]:
    """torchtitan module names of each stage: the layers in ``stages`` consecutive runs (the earlier stages take
    one more where they do not divide), the token embeddings on the first stage, final norm and LM head on the last."""
    per_stage, extra = divmod(num_layers, stages)
    names, start = [], 0
    for stage in range(stages):
        end = start + per_stage + (stage < extra)
        names.append([f"layers.{layer}" for layer in range(start, end)])
        start = end
    names[0].insert(0, "tok_embeddings")
    names[-1].extend(["norm", "lm_head"])
    return names


@dataclass(frozen=True)
class PipelineRanks:
    """This rank's stage and its pipeline group (global ranks of every stage, in stage order)."""

    stage: int
    group: dist.ProcessGroup
    stage_ranks: tuple[int, ...]
    dp_group: Optional[dist.ProcessGroup]

    @property
    def size(self) -> int:
        return len(self.stage_ranks)

    @property
    def is_first(self) -> bool:
        return self.stage == 0

    @property
    def is_last(self) -> bool:
        return self.stage == self.size - 1

    def norm(self, stage_norm: torch.Tensor) -> torch.Tensor:
        """The whole model's L2 norm from this stage's (collective over the pipeline)."""
        squared = stage_norm.detach().double() ** 2
        dist.all_reduce(squared, group=self.group)
        return squared.sqrt().to(stage_norm.dtype)


def _stacked(streams: list[TokenStream], device: torch.device) -> dict[str, torch.Tensor]:
    """Inputs, positions and next-slot labels of every stream, padded to one ``[rows, width]`` and stacked along rows
    (padding: token 0 at positions counting from 0, a document of its own that no real token attends to)."""
    rows = max(stream.input_ids.shape[0] for stream in streams)
    width = max(stream.input_ids.shape[1] for stream in streams)
    parts: dict[str, list[torch.Tensor]] = {"inputs": [], "positions": [], "labels": []}
    filler_positions = torch.arange(width).expand(rows, width)
    for stream in streams:
        ids = stream.input_ids
        fields = {"inputs": ids, "positions": stream.position_ids, "labels": stream.next_tokens}
        for key, value in fields.items():
            padded = filler_positions.clone() if key == "positions" else torch.zeros(rows, width, dtype=ids.dtype)
            padded[: value.shape[0], : value.shape[1]] = value
            parts[key].append(padded)
    return {key: torch.cat(values).to(device) for key, values in parts.items()}


def run_pipeline(
    batch: DataProto,
    module: nn.Module,
    loss_fn: Optional[LossFn],
    forward_only: bool,
    config: EngineConfig,
    ranks: PipelineRanks,
    device: torch.device,
    stream_layout: Callable[[DataProto], TokenStream],
    schedule: str,
) -> tuple[DataProto, dict[str, Any]]:
    """``BaseEngine.forward_backward`` through the pipeline (module docstring); ``module`` is this rank's stage
    (``TitanPipelineStageForward`` under FSDP), ``stream_layout(micro_batch)`` lays a micro-batch out on the host."""
    check_batch(batch, loss_fn, forward_only)
    training = loss_fn is not None and not forward_only
    plan = plan_micro_batches(batch.batch["attention_mask"].sum(-1).tolist(), **config.micro_batch_limits(training),
                              group=ranks.dp_group, device=device)
    counts = global_counts(batch, len(plan.groups), ranks.dp_group, device) if loss_fn is not None else None
    micros = [batch[rows] for rows in plan.groups]
    streams = [stream_layout(micro) for micro in micros]
    inputs = _stacked(streams, device)
    rows, width = inputs["inputs"].shape[0] // len(streams), inputs["inputs"].shape[1]
    module.temperature, module.compute_entropy = TEMPERATURE.read(batch.meta_info), COMPUTE_ENTROPY.read(batch.meta_info)
    record = LastStageRecord()

    def loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        index = int(target.reshape(-1)[0])
        stream = streams[index].to(device)
        own_rows, own_width = stream.input_ids.shape
        per_slot = output.reshape(rows, width, -1)[:own_rows, :own_width].reshape(own_rows * own_width, -1)
        per_source = per_slot.index_select(0, stream.source_index)
        outputs = {"log_probs": place_targets(per_source[:, 0], stream)}
        if module.compute_entropy:
            outputs["entropy"] = place_targets(per_source[:, 1], stream)
        return record.loss(index, micros[index].to(device), outputs, loss_fn, counts)

    stage = PipelineStage(module, ranks.stage, ranks.size, device, group=ranks.group)
    if len(streams) < ranks.size:  # 1F1B needs a micro-batch per stage; with fewer, all forwards then all backwards
        schedule = "GPipe"
    runner = get_schedule_class(schedule)(stage, n_microbatches=len(streams), loss_fn=loss, scale_grads=False)
    args = (inputs["inputs"],) if ranks.is_first else ()
    target = torch.arange(len(streams), device=device)[:, None] if ranks.is_last else None
    kwargs = {"positions": inputs["positions"], "labels": inputs["labels"]}
    if training:
        runner.step(*args, target=target, losses=[] if ranks.is_last else None, return_outputs=False, **kwargs)
    else:
        with torch.no_grad():
            runner.eval(*args, target=target, losses=[] if ranks.is_last else None, **kwargs)
    pipeline = PipelineGroup(ranks.size, ranks.group, ranks.stage_ranks[-1], ranks.is_last)
    return stage_results(record, plan, counts, ranks.dp_group, pipeline, device)


def pipeline_tensors(local: Iterator[tuple[str, torch.Tensor]], names: list[tuple[str, tuple[int, ...], torch.dtype]],
                     ranks: PipelineRanks, device: torch.device) -> Iterator[tuple[str, torch.Tensor]]:
    """Every stage's ``(name, whole tensor)``, stage by stage, on every rank of the pipeline, one tensor at a time:
    this stage's from ``local`` (in the order of ``names``: its ``(name, shape, dtype)``), the others' broadcast
    from their stage (collective over the pipeline)."""
    every_stage: list[Any] = [None] * ranks.size
    dist.all_gather_object(every_stage, names, group=ranks.group)
    for stage, entries in enumerate(every_stage):
        for name, shape, dtype in entries:
            if stage == ranks.stage:
                local_name, tensor = next(local)
                assert local_name == name, (local_name, name)
                tensor = tensor.to(device).contiguous()
            else:
                tensor = torch.empty(shape, dtype=dtype, device=device)
            dist.broadcast(tensor, src=ranks.stage_ranks[stage], group=ranks.group)
            yield name, tensor


def layer_count_error(num_layers: int, stages: int) -> Optional[str]:
    """Why ``stages`` pipeline stages cannot split ``num_layers`` decoder layers, or None."""
    if stages > num_layers:
        return f"pipeline_parallel_size={stages} is more stages than num_hidden_layers={num_layers}"
    return None
