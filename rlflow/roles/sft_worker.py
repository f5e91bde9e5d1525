"""``SFTWorker``: one engine rank for supervised fine-tuning, driven by ``rlflow.trainer.sft_trainer``.

The same class runs inside a Ray worker group (``RayWorkerGroup(pool, WorkerSpec(SFTWorker, ...))``)
and in-process under ``torchrun`` (``rlflow.workers.local_group.LocalWorkerGroup``); either way
the controller calls the ``@register``-ed methods below and the batch methods split the global
batch over the engine's data-parallel ranks (``DP_COMPUTE`` on the ``sft`` mesh).

The loss is the negative log-likelihood of the tokens whose ``loss_mask`` is 1 (the
assistant's tokens), averaged over every such token of the global mini-batch, whatever the
micro-batch and data-parallel split (``sft_loss``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import torch

from rlflow.algos import agg_loss
from rlflow.engines import LossContext
from rlflow.protocol import DataProto
from rlflow.roles.engine_role import EngineRole, require_rows
from rlflow.workers import DP_COMPUTE, ONE_TO_ALL, register

SFT_MESH = "sft"


def sft_loss(outputs: dict[str, torch.Tensor], micro_batch: DataProto, ctx: LossContext) -> tuple[torch.Tensor, dict[str, float]]:
    """Token-mean negative log-likelihood over the global mini-batch's ``loss_mask`` tokens (an engine ``LossFn``)."""
    nll = -outputs["log_probs"]
    loss = agg_loss(
        nll,
        micro_batch.batch["loss_mask"],
        "token-mean",
        dp_size=ctx.dp_size,
        batch_num_tokens=ctx.global_num_tokens,
        global_batch_size=ctx.global_num_seqs,
    )
    return loss, {}


class SFTWorker(EngineRole):
    """Holds one rank of a training engine and exposes SFT's train and eval calls (plus ``EngineRole``'s
    ``save_checkpoint`` / ``load_checkpoint`` / ``save_hf``)."""

    def __init__(self, engine_config: Mapping[str, Any], model_path: str | Path):
        super().__init__(engine_config, model_path, SFT_MESH)

    @register(dispatch_mode=DP_COMPUTE, mesh=SFT_MESH)
    def forward_backward(self, batch: DataProto) -> dict[str, float]:
        """Accumulate the gradient of the global batch's SFT loss (this rank's share); returns the engine's metrics.
        An empty batch raises ``ValueError`` (it has no loss)."""
        require_rows(batch, "SFTWorker.forward_backward")
        with self.engine.train_mode():
            _, metrics = self.engine.forward_backward(batch, sft_loss)
        return metrics

    @register(dispatch_mode=ONE_TO_ALL)
    def optim_step(self) -> dict[str, Any]:
        """Clip, step and zero the gradients; returns ``grad_norm``, ``lr``, ``skipped``, ``skipped_steps``."""
        return self.engine.optim_step()

    @register(dispatch_mode=DP_COMPUTE, mesh=SFT_MESH)
    def evaluate(self, batch: DataProto) -> dict[str, float]:
        """The SFT loss of ``batch`` without gradients (dropout off); ``loss`` and ``num_tokens`` are global.
        An empty batch raises ``ValueError`` (it has no loss)."""
        require_rows(batch, "SFTWorker.evaluate")
        with self.engine.eval_mode():
            _, metrics = self.engine.forward_backward(batch, sft_loss, forward_only=True)
        return metrics
