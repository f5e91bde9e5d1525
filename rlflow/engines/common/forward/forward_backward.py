"""The micro-batch loop of ``forward_backward`` for engines that run each micro-batch as one call.

``run_forward_backward`` checks the batch, plans the micro-batches (agreed across the
DP group), computes the global counts a loss needs, and for each micro-batch calls the
engine's ``forward`` (one model call on one micro-batch, returning differentiable
per-token outputs), the ``loss_fn`` and, when training, ``backward``. Outputs come back
in the input row order; the metrics follow ``BaseEngine.forward_backward``.

Nothing in the loop waits for the device: ``forward`` gets the micro-batch on the host (it lays
the model's input out there and copies it over), the loss gets a non-blocking copy, and the
loss function's metrics are read once after the last micro-batch. On a GPU the host then queues
micro-batch i+1 while the device still runs micro-batch i.

The engine supplies ``forward`` and, if its gradient reduction can be deferred,
``no_sync`` (a context manager that suspends it, like DDP's): every micro-batch but
the last then runs inside it, so gradients are reduced once per mini-batch.
A pipeline engine has its own schedule and composes the pieces (``check_batch``, ``plan_micro_batches``,
``global_counts``, ``global_loss``) directly instead.
"""

from __future__ import annotations

from collections import defaultdict
from contextlib import AbstractContextManager, nullcontext
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist

from rlflow.engines.base import LossFn
from rlflow.engines.common.batching.micro_batching import plan_micro_batches
from rlflow.engines.common.batching.prefix_sharing import prefix_row_groups, shares_prefix
from rlflow.engines.common.forward.loss_scaling import global_counts, global_loss
from rlflow.engines.config import EngineConfig
from rlflow.protocol import DataProto

__all__ = ["MicroBatchMetrics", "check_batch", "run_forward_backward"]

MicroBatchForward = Callable[[DataProto], dict[str, torch.Tensor]]  # host micro-batch -> outputs on the device


class MicroBatchMetrics:
    """The loss function's metrics of each micro-batch, kept as given (device scalars too) and read once,
    as means, after the last micro-batch: reading a device scalar per micro-batch would wait for the device."""

    def __init__(self) -> None:
        self.values: dict[str, list[Any]] = defaultdict(list)

    def add(self, metrics: Optional[dict[str, Any]]) -> None:
        for key, value in (metrics or {}).items():
            self.values[key].append(value.detach() if isinstance(value, torch.Tensor) else value)

    def means(self) -> dict[str, float]:
        return {key: sum(float(v) for v in values) / len(values) for key, values in self.values.items()}


def check_batch(batch: DataProto, loss_fn: Optional[LossFn], forward_only: bool) -> None:
    """ValueError (one line) for a call ``forward_backward`` cannot run: training without a loss, missing keys."""
    if loss_fn is None and not forward_only:
        raise ValueError("forward_backward needs a loss_fn unless forward_only=True")
    for key in ("input_ids", "attention_mask"):
        if key not in batch.batch:
            raise ValueError(f"engine batch needs '{key}' ([B, T]); batch has {sorted(batch.batch)}")


def run_forward_backward(
    batch: DataProto,
    forward: MicroBatchForward,
    loss_fn: Optional[LossFn],
    forward_only: bool,
    config: EngineConfig,
    *,
    group: Optional[dist.ProcessGroup],
    device: torch.device,
    no_sync: Optional[Callable[[], AbstractContextManager[Any]]] = None,
) -> tuple[DataProto, dict[str, Any]]:
    """``BaseEngine.forward_backward`` for a DP ``group``; ``forward(micro_batch)`` runs one micro-batch, given on the
    host, on ``device``. With ``share_prefix`` (``forward`` runs each shared prefix once per micro-batch) the rows
    that share one are planned into one micro-batch where the limits allow."""
    check_batch(batch, loss_fn, forward_only)
    fields = batch.batch
    row_groups = None
    if shares_prefix(config, batch):
        row_groups = prefix_row_groups(fields["input_ids"], fields["attention_mask"], fields.get("position_ids"),
                                       fields["loss_mask"])
    training = loss_fn is not None and not forward_only
    plan = plan_micro_batches(
        fields["attention_mask"].sum(-1).tolist(),
        **config.micro_batch_limits(training),
        group=group,
        device=device,
        row_groups=row_groups,
    )
    counts = global_counts(batch, len(plan.groups), group, device) if loss_fn is not None else None
    outputs: dict[str, list[torch.Tensor]] = defaultdict(list)
    losses: list[torch.Tensor] = []
    metric_record = MicroBatchMetrics()
    last = len(plan.groups) - 1
    with torch.set_grad_enabled(not forward_only):
        for index, rows in enumerate(plan.groups):
            deferred = training and no_sync is not None and index < last
            with no_sync() if deferred else nullcontext():
                host_micro = batch[rows]
                model_out = forward(host_micro)
                if loss_fn is not None:
                    micro = host_micro.to(device)
                    loss, metrics = loss_fn(model_out, micro, counts.context(index))
                    if training:
                        loss.backward()
                    losses.append(loss.detach())
                    metric_record.add(metrics)
            for key, value in model_out.items():
                outputs[key].append(value.detach())
    result = DataProto.from_dict({key: plan.restore(torch.cat(parts)) for key, parts in outputs.items()})
    metrics_out: dict[str, Any] = metric_record.means()
    metrics_out["num_micro_batches"] = len(plan.groups)
    if counts is not None:
        metrics_out["loss"] = global_loss(losses, counts.dp_size, group, device)
        metrics_out["num_tokens"] = counts.num_tokens
        metrics_out["num_seqs"] = counts.num_seqs
    return result, metrics_out
