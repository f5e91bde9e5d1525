"""Test-only worker: an FSDP2 actor engine that trains and exports, with a colocated rollout replica.

Shipped to Ray workers by value (the test folder is not importable there).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from rlflow.engines import build_engine
from rlflow.protocol import DataProto
from rlflow.roles.rollout_worker import ROLLOUT_MESH, RolloutMethods
from rlflow.rollout import build_rollout, publish_weights
from rlflow.workers import ONE_TO_ALL, Worker, register

def training_batch(rows: int = 8, width: int = 20) -> DataProto:
    """Fixed random token rows (all real tokens) with the loss on the second half."""
    generator = torch.Generator().manual_seed(100)
    input_ids = torch.randint(3, 300, (rows, width), generator=generator)
    attention_mask = torch.ones(rows, width, dtype=torch.long)
    loss_mask = torch.zeros(rows, width)
    loss_mask[:, width // 2 :] = 1
    return DataProto.from_dict({"input_ids": input_ids, "attention_mask": attention_mask, "loss_mask": loss_mask})


def nll_token_mean(outputs: dict[str, torch.Tensor], micro: DataProto, ctx: Any) -> tuple[torch.Tensor, dict[str, float]]:
    mask = micro.batch["loss_mask"]
    return -(outputs["log_probs"] * mask).sum() / ctx.global_num_tokens * ctx.dp_size, {}


class TrainerWithRollout(RolloutMethods, Worker):
    """One FSDP2 rank that also hosts an in-process rollout replica (colocated), like ActorRolloutRef."""

    def __init__(self, engine_config: dict, model_path: str, rollout_config: Any):
        super().__init__()
        self.engine = build_engine(engine_config, model_path)
        self.engine.initialize()
        self.config = rollout_config
        self.register_mesh(ROLLOUT_MESH, dp_rank=self.rank, dp_size=self.world_size, is_collect=True)
        self.rollout = build_rollout(rollout_config, model_path, self.device, replica_rank=self.rank)

    @register(dispatch_mode=ONE_TO_ALL)
    def train(self, steps: int) -> list[float]:
        losses = []
        batch = training_batch().chunk(self.world_size)[self.rank]
        for _ in range(steps):
            _, metrics = self.engine.forward_backward(batch, nll_token_mean)
            self.engine.optim_step()
            losses.append(metrics["loss"])
        return losses

    @register(dispatch_mode=ONE_TO_ALL)
    def sync_in_process(self) -> int:
        return self.rollout.update_weights(self.engine.export_hf_weights())

    @register(dispatch_mode=ONE_TO_ALL)
    def publish(self, bucket_mb: float) -> list:
        return publish_weights(self.engine.export_hf_weights(), bucket_mb, publish=self.rank == 0)

    @register(dispatch_mode=ONE_TO_ALL)
    def save_hf(self, path: str) -> None:
        self.engine.save_hf(Path(path))

    @register(dispatch_mode=ONE_TO_ALL)
    def shutdown_rollout_then_all_reduce(self) -> float:
        """Shut the colocated engine down, then use the actor's process group (it must survive)."""
        self.rollout.shutdown()
        value = torch.tensor([float(self.rank + 1)])
        dist.all_reduce(value)
        return value.item()

