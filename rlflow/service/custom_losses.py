"""Server-side custom losses: the SDK's ``ServiceClient.create_custom_loss`` with ``custom_loss_server_side`` on.

``create_custom_loss`` uploads a traced per-datum loss (``rlflow.service.custom_loss_graph`` checks and rebuilds
it) and gets a loss id; ``forward_backward_custom`` with that handle sends ``forward_backward(data, "custom",
{"loss_id": id})``. The service runs the loss on every datum in the engine: ``logprobs`` is the datum's target
log-probs ``[N]``, each other input its ``loss_fn_inputs`` value as float32, ``[N]`` (rank 1) or a scalar
(rank 0). The request's loss is the sum of its datums' losses (Tinker's losses are sums) and is backpropagated
on the server; each ``custom/<name>:sum`` metric is summed over the datums and each ``:mean`` one averaged, as
the SDK does when it runs such a loss itself.

A loss belongs to the session that created it (and that session's account); another session's training clients
cannot name it. Losses live in the server's memory: a restarted server has none, and the SDK creates them again
in its new session.
"""

from __future__ import annotations

import itertools
import re
import uuid
from dataclasses import dataclass
from typing import Any, Mapping

import torch

from rlflow.engines import LossContext, LossFn
from rlflow.protocol import DataProto
from rlflow.service.batches import input_column
from rlflow.service.catalogue import UnknownModelError
from rlflow.service.custom_loss_graph import CustomLossError, GraphLoss, parse_graph

CUSTOM = "custom"  # the loss_fn name of a server-side custom loss
SAMPLE_POSITIONS = 4  # the length of the datum a new loss is tried on
_INPUT_NAME = re.compile(r"[a-z_][a-z0-9_]{0,63}")  # the SDK's rule for a loss's parameter names


@dataclass(frozen=True)
class StoredLoss:
    """A checked loss and the session (of ``account``) that created it."""

    loss: GraphLoss
    session_id: str
    account: str


def _inputs(raw: Any) -> list[tuple[str, int]]:
    if not isinstance(raw, list) or not raw or not all(isinstance(item, dict) for item in raw):
        raise CustomLossError("a custom loss declares its inputs, logprobs first, each with a name and a rank")
    inputs = [(str(item.get("name")), item.get("rank")) for item in raw]
    if inputs[0] != ("logprobs", 1):
        raise CustomLossError(f"unsupported: logprobs of rank {inputs[0][1]} (the service scores one target per "
                              "position: logprobs has rank 1)" if inputs[0][0] == "logprobs" else
                              "a custom loss's first input is logprobs")
    if len({name for name, _ in inputs}) != len(inputs) or not all(_INPUT_NAME.fullmatch(name) for name, _ in inputs):
        raise CustomLossError(f"a custom loss's inputs are distinct lowercase names, got {[name for name, _ in inputs]}")
    for name, rank in inputs[1:]:
        if rank not in (0, 1):
            raise CustomLossError(f"unsupported: input {name!r} of rank {rank} (loss_fn_inputs carry one value per "
                                  "position, rank 1, or one per datum, rank 0)")
    return inputs


def _try_on_a_sample(loss: GraphLoss) -> None:
    """Run ``loss`` on a sample datum (log-probs -1, inputs 0), so a loss that cannot run fails at creation."""
    logprobs = torch.full((SAMPLE_POSITIONS,), -1.0, requires_grad=True)
    values = [logprobs, *(torch.zeros((SAMPLE_POSITIONS,) if rank else ()) for _, rank in loss.inputs[1:])]
    value, _ = loss.run(values)
    if not value.requires_grad:
        raise CustomLossError(f"custom loss {loss.name!r} does not depend on logprobs, so it has no gradient to train on")


class CustomLossStore:
    """The custom losses sessions created, by loss id."""

    def __init__(self) -> None:
        self._losses: dict[str, StoredLoss] = {}
        self._ids = itertools.count()

    def create(self, body: Mapping[str, Any], session_id: str, account: str) -> str:
        """Check a ``CreateCustomLossRequest`` body and store its loss for ``session_id``; returns the loss id."""
        name = body.get("name")
        if not isinstance(name, str) or not name:
            raise CustomLossError("a custom loss needs a name")
        loss = parse_graph(name, _inputs(body.get("inputs")), body.get("graph") or {})
        _try_on_a_sample(loss)
        loss_id = f"loss-{next(self._ids)}-{uuid.uuid4().hex[:8]}"
        self._losses[loss_id] = StoredLoss(loss, session_id, account)
        return loss_id

    def get(self, loss_fn_config: Mapping[str, Any], session_id: str, account: str) -> GraphLoss:
        """The loss ``loss_fn_config["loss_id"]`` names, one ``session_id`` created (else ``UnknownModelError``)."""
        unknown = sorted(set(loss_fn_config) - {"loss_id"})
        if unknown:
            raise CustomLossError(f"loss_fn_config keys {unknown} are not read by 'custom' (it reads ['loss_id'])")
        loss_id = loss_fn_config.get("loss_id")
        stored = self._losses.get(loss_id) if isinstance(loss_id, str) else None
        if stored is None or (stored.session_id, stored.account) != (session_id, account):
            raise UnknownModelError(f"custom loss {loss_id!r} does not exist in session {session_id!r} "
                                    "(create it with ServiceClient.create_custom_loss in this session)")
        return stored.loss


def custom_loss_fn(loss: GraphLoss) -> LossFn:
    """The engine ``LossFn`` of ``loss``: the sum over a micro-batch's datums, scaled as ``losses.make_loss_fn``'s,
    with every metric as a sum (``request_metrics`` averages the ``:mean`` ones over the request)."""

    def loss_fn(outputs: dict[str, torch.Tensor], micro: DataProto, ctx: LossContext) -> tuple[torch.Tensor, dict]:
        log_probs = outputs["log_probs"]
        positions = micro.batch["loss_mask"].bool()
        total, sums = log_probs.new_zeros(()), {}
        for row in range(log_probs.shape[0]):
            if not positions[row].any():
                continue
            values = [log_probs[row][positions[row]]]
            for name, rank in loss.inputs[1:]:
                column = micro.batch[input_column(name, rank)][row].to(log_probs.device)
                values.append(column[positions[row]] if rank else column)
            value, metrics = loss.run(values)
            total = total + value
            for key, metric in metrics.items():
                sums[key] = sums.get(key, 0.0) + float(metric.detach())
        scale = ctx.dp_size * ctx.num_micro_batches
        return ctx.dp_size * total, {"loss:sum": float(total.detach()) * scale, **{k: v * scale for k, v in sums.items()}}

    return loss_fn


def request_metrics(metrics: Mapping[str, float], datums: int) -> dict[str, float]:
    """A request's metrics: each ``:mean`` metric (summed over its ``datums``) divided by their number."""
    return {key: value / datums if key.endswith(":mean") else value for key, value in metrics.items()}


__all__ = ["CUSTOM", "CustomLossError", "CustomLossStore", "StoredLoss", "custom_loss_fn", "request_metrics"]
