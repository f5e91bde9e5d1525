"""``BaseModelWorker``: one rank of a base model's training engine plus a rollout replica, for the service.

The Tinker service runs one worker group per base model and LoRA shape (``rlflow.service.base_models``). Every
training client of that group is a set of LoRA adapters with its own Adam state (or, at rank 0, a whole model);
the group holds one of them at a time in its engine and swaps by checkpoint (``save_checkpoint`` /
``load_checkpoint``, a few MiB for adapters and their moments, the model's size and twice that for full fine-tuning). The rollout replica on each
rank serves the sampling clients, with whichever weights ``sync_sampler`` or ``load_sampler`` put
there last.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import torch

from rlflow.engines.common.checkpoint.lora_export import merged_peft_folder
from rlflow.engines.common.forward.lora import ADAPTER_CONFIG_FILE
from rlflow.engines.config import StepHyperparams
from rlflow.meta_info import CUSTOM_LOSS, FORWARD_ONLY, LOSS_FN, LOSS_FN_CONFIG, METRICS
from rlflow.models.hf_checkpoint import resolve_dtype, safetensors_weights
from rlflow.protocol import DataProto
from rlflow.roles.engine_role import EngineRole
from rlflow.roles.rollout_worker import ROLLOUT_MESH, RolloutMethods, sync_engine_into_rollout
from rlflow.rollout import build_rollout
from rlflow.service.custom_losses import custom_loss_fn
from rlflow.service.losses import make_loss_fn
from rlflow.workers import DP_COMPUTE, ONE_TO_ALL, register

TRAIN_MESH = "train"


class BaseModelWorker(RolloutMethods, EngineRole):
    """A LoRA training engine and a rollout replica of one base model, driven by the service."""

    def __init__(self, engine_config: Any, rollout_config: Any, model_path: str | Path):
        super().__init__(engine_config, model_path, TRAIN_MESH)
        self.config = rollout_config
        self.register_mesh(ROLLOUT_MESH, dp_rank=self.rank, dp_size=self.world_size, is_collect=True)
        self.rollout = build_rollout(rollout_config, model_path, self.device, replica_rank=self.rank)

    @register(dispatch_mode=DP_COMPUTE, mesh=TRAIN_MESH)
    def forward_backward(self, batch: DataProto) -> DataProto:
        """The Tinker loss ``LOSS_FN`` (options ``LOSS_FN_CONFIG``), or the server-side ``CUSTOM_LOSS``
        (``rlflow.meta_info``), on this rank's share: gradients accumulate unless ``FORWARD_ONLY``. Returns
        ``log_probs`` ``[B, T]`` (collect ranks) and ``METRICS`` (``loss:sum`` and a custom loss's
        ``custom/...`` metrics, global sums)."""
        custom = CUSTOM_LOSS.read(batch.meta_info)
        loss_fn = (custom_loss_fn(custom) if custom is not None
                   else make_loss_fn(LOSS_FN.read(batch.meta_info), LOSS_FN_CONFIG.read(batch.meta_info)))
        if FORWARD_ONLY.read(batch.meta_info):
            with self.engine.eval_mode(), torch.no_grad():
                outputs, metrics = self.engine.forward_backward(batch, loss_fn, forward_only=True)
        else:
            with self.engine.train_mode():
                outputs, metrics = self.engine.forward_backward(batch, loss_fn)
        result = outputs.select(batch_keys=["log_probs"]) if self.engine.mesh.is_collect else DataProto()
        result.meta_info[METRICS.name] = {key: value for key, value in metrics.items()
                                          if key == "loss:sum" or key.startswith("custom/")}
        return result

    @register(dispatch_mode=ONE_TO_ALL)
    def optim_step(self, lr: float, hyperparams: StepHyperparams) -> dict[str, Any]:
        """One AdamW step at ``lr`` with the client's ``hyperparams``; returns the engine's step metrics."""
        return self.engine.optim_step(lr, hyperparams)

    @register(dispatch_mode=ONE_TO_ALL)
    def zero_grad(self) -> None:
        """Drop the accumulated gradients without stepping."""
        self.engine.zero_grad()

    @register(dispatch_mode=ONE_TO_ALL)
    def reset_optimizer(self) -> None:
        """Forget the AdamW moments: the next step is a new optimizer's first."""
        self.engine.reset_optimizer()

    @register(dispatch_mode=ONE_TO_ALL)
    def sync_sampler(self) -> dict[str, float]:
        """Copy the engine's current weights (base + adapters, merged) into this rank's rollout replica."""
        return sync_engine_into_rollout(self.engine, self.rollout, self.config)

    @register(dispatch_mode=ONE_TO_ALL)
    def load_sampler(self, weights_folder: Optional[str]) -> int:
        """Load sampler weights into this rank's rollout replica: the base model's (``weights_folder`` None), with a
        peft adapter folder merged in, or an HF folder's own (a full fine-tuning client's). Returns the bytes loaded."""
        dtype = resolve_dtype(self.config.dtype)
        if weights_folder is not None and not (Path(weights_folder) / ADAPTER_CONFIG_FILE).exists():
            weights = safetensors_weights(weights_folder)
        else:
            weights = safetensors_weights(self.engine.model_path)
            if weights_folder is not None:
                weights = merged_peft_folder(weights, weights_folder)
        return self.rollout.update_weights((name, tensor.to(dtype)) for name, tensor in weights)
