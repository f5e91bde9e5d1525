"""Advantage estimators as a registry: built-in names, the unknown-name error, user estimators, dispatch."""

from __future__ import annotations

import pytest
import torch

from rlflow.algos import (
    ADV_ESTIMATOR_REGISTRY,
    AdvantageEstimator,
    compute_advantage,
    compute_gae_advantage_return,
    compute_grpo_outcome_advantage,
    compute_remax_outcome_advantage,
    get_adv_estimator_fn,
)

TOL = {"rel": 1e-7, "abs": 1e-7}


def _t(rows) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float64)


def _close(actual: torch.Tensor, expected) -> None:
    torch.testing.assert_close(actual, _t(expected), **{"rtol": TOL["rel"], "atol": TOL["abs"]})


def test_builtin_names_and_enum_lookup():
    expected = {"gae", "grpo", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "remax", "opo", "gpg"}
    assert set(ADV_ESTIMATOR_REGISTRY.names()) == expected
    assert get_adv_estimator_fn(AdvantageEstimator.GRPO) is compute_grpo_outcome_advantage
    assert get_adv_estimator_fn("gae") is compute_gae_advantage_return


def test_unknown_estimator_lists_valid_names():
    with pytest.raises(ValueError, match="algorithm.adv_estimator") as error:
        get_adv_estimator_fn("ppo")
    assert "grpo" in str(error.value) and "reinforce_plus_plus_baseline" in str(error.value)


def test_register_new_estimator_and_dispatch_by_signature():
    with ADV_ESTIMATOR_REGISTRY.temporary():
        @ADV_ESTIMATOR_REGISTRY.register("test_sign_of_outcome")
        def sign_of_outcome(token_level_rewards, response_mask):
            per_row = torch.sign(token_level_rewards.sum(-1))
            return per_row.unsqueeze(-1) * response_mask, per_row.unsqueeze(-1) * response_mask

        advantages, _ = compute_advantage(
            "test_sign_of_outcome",
            token_level_rewards=_t([[-2.0, 0.0], [0.0, 3.0]]),
            response_mask=torch.ones(2, 2),
            index=["x", "y"],  # not in the signature: filtered out
            gamma=1.0,
        )
        _close(advantages, [[-1.0, -1.0], [1.0, 1.0]])
        with pytest.raises(ValueError, match="already registered"):
            ADV_ESTIMATOR_REGISTRY.register("test_sign_of_outcome")(lambda token_level_rewards, response_mask: None)
    assert "test_sign_of_outcome" not in ADV_ESTIMATOR_REGISTRY


def test_dispatch_matches_direct_calls_and_names_missing_inputs():
    rewards, mask, index = _t([[1.0, 0.0], [0.0, 0.0]]), torch.ones(2, 2), ["a", "a"]
    via_registry = compute_advantage(
        "grpo", token_level_rewards=rewards, response_mask=mask, index=index, norm_adv_by_std_in_grpo=False, gamma=1.0
    )
    direct = compute_grpo_outcome_advantage(rewards, mask, index, norm_adv_by_std_in_grpo=False)
    assert torch.equal(via_registry[0], direct[0])
    with pytest.raises(ValueError, match="values"):
        compute_advantage("gae", token_level_rewards=rewards, response_mask=mask, gamma=1.0, lam=1.0)
    with pytest.raises(ValueError, match="values"):  # None counts as absent
        compute_advantage("gae", token_level_rewards=rewards, response_mask=mask, values=None, gamma=1.0, lam=1.0)


def test_bad_shapes_are_rejected():
    with pytest.raises(ValueError, match="one group id per row"):
        compute_grpo_outcome_advantage(torch.zeros(3, 2), torch.ones(3, 2), ["a", "b"])
    with pytest.raises(ValueError, match="response_mask shape"):
        compute_grpo_outcome_advantage(torch.zeros(3, 2), torch.ones(3, 3), ["a", "b", "c"])
    with pytest.raises(ValueError, match="reward_baselines"):
        compute_remax_outcome_advantage(torch.zeros(3, 2), torch.zeros(2), torch.ones(3, 2))
