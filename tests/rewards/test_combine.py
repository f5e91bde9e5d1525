"""``reward.combine``: the combine rules, and ``ResponseScorer`` around stand-ins for the rule-reward manager and
the reward-model role (unit tests of the scorer; the real pair runs in tests/ppo/test_hf_value_models.py)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from rlflow.config import ConfigError
from rlflow.protocol import DataProto
from rlflow.rewards.combine import REWARD_COMBINE_REGISTRY, needs_rule_scores
from rlflow.trainer.entry_points import compose_ppo_config
from rlflow.trainer.response_scoring import ResponseScorer

RULE = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 1.0]])
RM = torch.tensor([[0.0, 0.5, 0.0], [-2.0, 0.0, 0.0], [0.0, 0.0, 0.25]])


class StandInRuleRewards:
    """Returns fixed rule scores and one reward-function error; counts its calls."""

    calls = 0

    def __call__(self, batch: DataProto):
        self.calls += 1
        return RULE.clone(), {"reward/error_count": 1.0, "reward/source/synthetic/addition/mean": 2 / 3}


class StandInRewardModel:
    def __init__(self, scores: torch.Tensor):
        self.scores = scores

    def compute_rm_score(self, batch: DataProto) -> DataProto:
        return DataProto.from_dict({"rm_scores": self.scores.clone()})


def reward_config(combine: str = "replace", rm_weight: float = 1.0, enable: bool = True) -> SimpleNamespace:
    return SimpleNamespace(error_score=-1.0, rm_weight=rm_weight, combine=combine, reward_model=SimpleNamespace(enable=enable))


BATCH = DataProto.from_dict({"responses": torch.zeros(3, 3, dtype=torch.long)})


def test_rules_as_registered():
    assert REWARD_COMBINE_REGISTRY.names() == ["add", "replace"]
    assert needs_rule_scores("add") and not needs_rule_scores("replace")
    torch.testing.assert_close(REWARD_COMBINE_REGISTRY.get("add")(RULE, RM, 0.5), RULE + 0.5 * RM, rtol=0, atol=0)
    torch.testing.assert_close(REWARD_COMBINE_REGISTRY.get("replace")(None, RM, 2.0), 2.0 * RM, rtol=0, atol=0)


def test_add_scores_rule_plus_weighted_reward_model_and_counts_both_errors():
    rules = StandInRuleRewards()
    rm = RM.clone()
    rm[1, 0] = math.nan  # a non-finite reward-model score: error_score, and counted
    scorer = ResponseScorer(rules, reward_config("add", rm_weight=0.5))
    scores, metrics = scorer.score(BATCH, StandInRewardModel(rm))
    expected_rm = torch.where(torch.isnan(rm), torch.tensor(-1.0), rm)
    torch.testing.assert_close(scores, RULE + 0.5 * expected_rm, rtol=0, atol=0)
    assert metrics["reward/error_count"] == 2.0 and "reward/source/synthetic/addition/mean" in metrics
    assert metrics["reward/rm_score/mean"] == pytest.approx(float(expected_rm.sum(-1).mean()))
    assert scorer.scorer_name == "reward function and reward model"


def test_replace_never_computes_rule_rewards():
    rules = StandInRuleRewards()
    scorer = ResponseScorer(rules, reward_config("replace", rm_weight=2.0))
    scores, metrics = scorer.score(BATCH, StandInRewardModel(RM))
    torch.testing.assert_close(scores, 2.0 * RM, rtol=0, atol=0)
    assert rules.calls == 0 and metrics["reward/error_count"] == 0.0 and scorer.scorer_name == "reward model"


def test_without_a_reward_model_the_rule_rewards_score():
    scorer = ResponseScorer(StandInRuleRewards(), reward_config(enable=False))
    scores, metrics = scorer.score(BATCH, None)
    torch.testing.assert_close(scores, RULE, rtol=0, atol=0)
    assert "reward/rm_score/mean" not in metrics and scorer.scorer_name == "reward function"


def test_add_without_a_reward_model_names_the_key():
    with pytest.raises(ConfigError, match=r"^config key 'reward.combine': 'add' .*reward.reward_model.enable=true"):
        ResponseScorer(StandInRuleRewards(), reward_config("add", enable=False))


def test_config_defaults_and_an_unknown_rule_fail_at_config_loading():
    config = compose_ppo_config([])
    assert (config.reward.combine, config.reward.rm_weight, config.critic.model.path) == ("replace", 1.0, None)
    with pytest.raises(ValueError, match=r"unknown reward combine rule 'mul' \(config key reward.combine\); registered: add, replace"):
        compose_ppo_config(["reward.combine=mul"])
