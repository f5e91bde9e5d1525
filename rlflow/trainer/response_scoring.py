"""``ResponseScorer``: the token-level scores of a training batch from the rule rewards, the reward
model, or both combined by ``reward.combine`` (``rlflow/rewards/combine.py``).

Non-finite reward-model scores get ``reward.error_score`` like failed reward functions; the errors
of both scorers are added into ``reward/error_count``, which the driver checks against
``reward.max_error_fraction``.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from rlflow.config import ConfigError
from rlflow.protocol import DataProto
from rlflow.rewards.combine import REWARD_COMBINE_REGISTRY, needs_rule_scores
from rlflow.trainer.divergence import replace_non_finite

__all__ = ["ResponseScorer"]


class ResponseScorer:
    """Scores training batches with ``reward_manager`` (rule/custom rewards) and, when enabled, the reward model."""

    def __init__(self, reward_manager: Any, reward_config: Any):
        self.reward_manager = reward_manager
        self.error_score = float(reward_config.error_score)
        self.rm_weight = float(reward_config.rm_weight)
        self.use_reward_model = bool(reward_config.reward_model.enable)
        self.combine = REWARD_COMBINE_REGISTRY.get(reward_config.combine, "reward.combine")
        if needs_rule_scores(reward_config.combine) and not self.use_reward_model:
            raise ConfigError(
                f"config key 'reward.combine': {reward_config.combine!r} combines a reward model with the rule rewards; "
                "set reward.reward_model.enable=true, or leave reward.combine at replace"
            )
        self.use_rules = not self.use_reward_model or needs_rule_scores(reward_config.combine)

    @property
    def scorer_name(self) -> str:
        """How error messages name what scored the batch."""
        parts = (["reward function"] if self.use_rules else []) + (["reward model"] if self.use_reward_model else [])
        return " and ".join(parts)

    def score(self, batch: DataProto, reward_model: Optional[Any]) -> tuple[torch.Tensor, dict[str, float]]:
        """``(token_level_scores [B, R], metrics)``; ``reward_model`` is the reward-model role (None when off)."""
        rule_scores, metrics = self.reward_manager(batch) if self.use_rules else (None, {"reward/error_count": 0.0})
        if not self.use_reward_model:
            return rule_scores, metrics
        raw = reward_model.compute_rm_score(batch).batch["rm_scores"]
        rm_scores, errors = replace_non_finite(raw, self.error_score)
        metrics["reward/error_count"] += float(errors)
        metrics["reward/rm_score/mean"] = float(rm_scores.sum(-1).mean())
        return self.combine(rule_scores, rm_scores, self.rm_weight), metrics
