"""Every policy loss takes ``rollout_is_weights`` as verl applies them; with equal rollout and old log-probs the
corrected loss is the uncorrected one exactly; the bypass-mode loss (ppo_clip, reinforce) against closed forms."""

from __future__ import annotations

import math

import pytest
import torch
from rollout_correction_cases import RATIOS, tensors
from test_policy_losses import LOSS_NAMES, make_config

from rlflow.algos import (
    agg_loss,
    compute_policy_loss_bypass_mode,
    compute_policy_loss_vanilla,
    compute_rollout_correction_and_rejection_mask,
    get_policy_loss_fn,
)
from rlflow.config.schema import RolloutCorrectionConfig


def inputs(seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    old = -torch.rand(4, 6, generator=generator, dtype=torch.float64) * 2
    log_prob = (old + (torch.rand(4, 6, generator=generator, dtype=torch.float64) - 0.5) * 0.6).requires_grad_()
    advantages = torch.randn(4, 1, generator=generator, dtype=torch.float64).expand(4, 6).contiguous()
    mask = torch.ones(4, 6)
    mask[1, 4:] = 0
    mask[3, 2:] = 0
    return old, log_prob, advantages, mask


def run(name: str, weights=None, mode: str = "token-mean"):
    old, log_prob, advantages, mask = inputs()
    torch.manual_seed(7)  # clip_cov draws the tokens it detaches from torch's global RNG
    extra = {} if weights is None else {"rollout_is_weights": weights}
    loss, _ = get_policy_loss_fn(name)(old, log_prob, advantages, mask, mode, make_config(), **extra)
    (grad,) = torch.autograd.grad(loss, log_prob)
    return loss.detach(), grad


@pytest.mark.parametrize("name", LOSS_NAMES)
def test_equal_rollout_and_old_log_probs_leave_every_loss_exactly_as_it_was(name):
    old, _, _, mask = inputs()
    weights, kept, _ = compute_rollout_correction_and_rejection_mask(
        old, old.clone(), mask, rollout_is="token", rollout_rs="token_k1,seq_mean_k3", rollout_rs_threshold="1.5,1e-9")
    assert torch.equal(kept, mask)
    corrected, plain = run(name, weights.batch["rollout_is_weights"]), run(name)
    assert torch.equal(corrected[0], plain[0]) and torch.equal(corrected[1], plain[1])


@pytest.mark.parametrize("name", LOSS_NAMES)
def test_a_constant_weight_scales_every_loss_and_its_gradient(name):
    _, _, _, mask = inputs()
    scaled, plain = run(name, 1.75 * mask.double()), run(name)
    torch.testing.assert_close(scaled[0], 1.75 * plain[0], rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(scaled[1], 1.75 * plain[1], rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("name", ["vanilla", "gpg", "cispo"])
def test_token_weights_multiply_each_tokens_loss(name):
    """token-sum of the weighted loss = sum over tokens of w_t x (the token's own loss, from a one-token mask)."""
    old, log_prob, advantages, mask = inputs()
    weights = torch.rand(4, 6, generator=torch.Generator().manual_seed(3), dtype=torch.float64) * 2
    loss_fn, config = get_policy_loss_fn(name), make_config()
    expected = 0.0
    for row, column in mask.nonzero().tolist():
        alone = torch.zeros_like(mask)
        alone[row, column] = 1
        token_loss, _ = loss_fn(old, log_prob, advantages, alone, "token-sum", config)
        expected += float(weights[row, column]) * float(token_loss.detach())
    weighted, _ = loss_fn(old, log_prob, advantages, mask, "token-sum", config, rollout_is_weights=weights)
    assert float(weighted.detach()) == pytest.approx(expected, rel=1e-12)


def test_geo_mean_weights_each_sequence_by_the_geometric_mean_of_its_token_weights():
    old, log_prob, advantages, mask = inputs()
    weights = torch.rand(4, 6, generator=torch.Generator().manual_seed(3), dtype=torch.float64) + 0.5
    loss_fn, config = get_policy_loss_fn("geo_mean"), make_config()
    expected = 0.0
    for row in range(4):
        only_row = torch.zeros_like(mask)
        only_row[row] = mask[row]
        row_loss, _ = loss_fn(old, log_prob, advantages, only_row, "token-mean", config)  # mean over the 1 row
        kept = weights[row][mask[row].bool()].tolist()
        expected += math.exp(sum(map(math.log, kept)) / len(kept)) * float(row_loss.detach()) / 4
    weighted, _ = loss_fn(old, log_prob, advantages, mask, "token-mean", config, rollout_is_weights=weights)
    assert float(weighted.detach()) == pytest.approx(expected, rel=1e-12)


def bypass(log_prob, rollout, advantages, mask, **settings):
    config = make_config()
    config.policy_loss.rollout_correction = RolloutCorrectionConfig(bypass_mode=True, **settings)
    return compute_policy_loss_bypass_mode(rollout, log_prob, advantages, mask, "seq-mean-token-sum", config)


def test_bypass_ppo_clip_is_vanilla_ppo_against_the_rollout_on_the_kept_tokens():
    rollout, log_prob, advantages, mask = inputs()
    loss, metrics = bypass(log_prob, rollout, advantages, mask, rollout_is="token", loss_type="ppo_clip")
    expected, _ = compute_policy_loss_vanilla(rollout, log_prob, advantages, mask, "seq-mean-token-sum", make_config())
    assert torch.equal(loss, expected)  # the ratio is the correction: the IS weights are not applied again
    assert metrics["rollout_corr/kl"] == pytest.approx(float(((rollout - log_prob.detach()) * mask).sum() / mask.sum()), rel=1e-9)
    rejected, _ = bypass(log_prob, rollout, advantages, mask, rollout_rs="token_k2", rollout_rs_threshold=1e-3)
    kept = (0.5 * (log_prob - rollout) ** 2 <= 1e-3).to(mask.dtype) * mask
    expected, _ = compute_policy_loss_vanilla(rollout, log_prob, advantages, kept, "seq-mean-token-sum", make_config())
    assert 0 < kept.sum() < mask.sum() and torch.equal(rejected, expected)


def test_bypass_reinforce_weights_minus_advantage_log_prob_by_the_detached_sequence_ratio():
    log_prob, rollout, mask = tensors()  # the current policy's ratios to the rollout are RATIOS
    log_prob.requires_grad_()
    advantages = torch.tensor([[1.0] * 4, [-2.0] * 4], dtype=torch.float64)
    loss, metrics = bypass(log_prob, rollout, advantages, mask, rollout_is="sequence", rollout_is_threshold=2.0,
                           loss_type="reinforce")
    weights = [min(math.prod(row), 2.0) for row in RATIOS]  # 2.0 (truncated from 2.7) and 0.3
    values = log_prob.detach().tolist()
    expected = sum(-a * w * sum(values[row][: len(RATIOS[row])])
                   for row, (a, w) in enumerate(zip((1.0, -2.0), weights))) / 2  # seq-mean-token-sum
    assert float(loss.detach()) == pytest.approx(expected, rel=1e-12)
    (grad,) = torch.autograd.grad(loss, log_prob)
    expected_grad = torch.tensor([[-1.0 * weights[0] / 2] * 3 + [0.0], [2.0 * weights[1] / 2] * 2 + [0.0] * 2],
                                 dtype=torch.float64)
    torch.testing.assert_close(grad, expected_grad, rtol=1e-12, atol=0)  # no gradient through the weights
    assert metrics["rollout_corr/rollout_is_max"] == pytest.approx(2.7, rel=1e-9)
    assert metrics["actor/ppo_kl"] == pytest.approx(float(((rollout - log_prob.detach()) * mask).sum() / 5), rel=1e-9)


def test_bypass_loss_needs_its_settings():
    rollout, log_prob, advantages, mask = inputs()
    with pytest.raises(ValueError, match="rollout_correction"):
        compute_policy_loss_bypass_mode(rollout, log_prob, advantages, mask, "token-mean", make_config())


def test_reinforce_aggregates_like_the_other_losses():
    old, log_prob, advantages, mask = inputs()
    loss, _ = bypass(log_prob, old, advantages, mask, loss_type="reinforce")
    expected = agg_loss(-advantages * log_prob, mask, "seq-mean-token-sum")
    assert torch.equal(loss, expected)
