"""How a reward model's scores and the rule rewards make a response's score (``reward.combine``).

Both inputs are ``[B, R]`` token-level tensors with each response's score on its last token, so
combining them token-wise combines them per response. ``reward.rm_weight`` scales the reward
model's score in every rule:

- ``replace`` (default; verl's behaviour with ``reward_model.enable``): ``rm_weight * rm``. The
  rule rewards are not computed for training batches.
- ``add``: ``rule + rm_weight * rm``: the rule (or custom) reward plus the weighted reward-model
  score, e.g. a correctness check plus a learned style score.

Validation always uses the rule rewards. A rule is registered with
``@REWARD_COMBINE_REGISTRY.register(name, needs_rule_scores=...)``.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch

from rlflow.utils.registry import Registry

__all__ = ["REWARD_COMBINE_REGISTRY", "CombineFn", "needs_rule_scores"]

CombineFn = Callable[[Optional[torch.Tensor], torch.Tensor, float], torch.Tensor]

REWARD_COMBINE_REGISTRY: Registry[CombineFn] = Registry("reward combine rule", "reward.combine")


@REWARD_COMBINE_REGISTRY.register("replace", needs_rule_scores=False)
def replace_with_reward_model(rule_scores: Optional[torch.Tensor], rm_scores: torch.Tensor, rm_weight: float) -> torch.Tensor:
    """The weighted reward-model score alone."""
    return rm_weight * rm_scores


@REWARD_COMBINE_REGISTRY.register("add", needs_rule_scores=True)
def add_reward_model(rule_scores: Optional[torch.Tensor], rm_scores: torch.Tensor, rm_weight: float) -> torch.Tensor:
    """The rule reward plus the weighted reward-model score."""
    return rule_scores + rm_weight * rm_scores


def needs_rule_scores(name: str) -> bool:
    """Whether the rule ``name`` reads the rule rewards (so the driver must compute them)."""
    return bool(REWARD_COMBINE_REGISTRY.metadata(name).get("needs_rule_scores", True))
