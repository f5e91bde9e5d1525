"""``RewardModel``: sequence scores from a value-head model, placed on each response's last token."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from rlflow.protocol import DataProto
from rlflow.roles.batch_views import engine_batch, response_length, response_slice
from rlflow.roles.engine_role import EngineRole, forward_only
from rlflow.workers import DP_COMPUTE, register

REWARD_MESH = "reward"


def last_token_scores(per_token: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """``[B, R]`` zeros except each row's last response token, which holds that token's value."""
    last = (response_mask.sum(-1).long() - 1).clamp(min=0)
    rows = torch.arange(per_token.shape[0])
    scores = torch.zeros_like(per_token)
    scores[rows, last] = per_token[rows, last] * (response_mask.sum(-1) > 0)
    return scores


class RewardModel(EngineRole):
    """Hosts a value-head reward model: ``compute_rm_score`` gives ``rm_scores`` ``[B, R]``."""

    model_kind = "value"

    def __init__(self, reward_model_config: Any, model_path: str | Path):
        super().__init__(reward_model_config.engine, model_path, REWARD_MESH)

    @register(dispatch_mode=DP_COMPUTE, mesh=REWARD_MESH)
    def compute_rm_score(self, data: DataProto) -> DataProto:
        outputs = forward_only(self.engine, engine_batch(data))
        if outputs is None:
            return DataProto()
        per_token = response_slice(outputs.batch["values"], response_length(data))
        return DataProto.from_dict({"rm_scores": last_token_scores(per_token, data.batch["response_mask"])})
