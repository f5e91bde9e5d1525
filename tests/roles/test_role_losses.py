"""The RL losses the roles hand to an engine (``rlflow.roles.losses``): the actor config is converted once,
not per micro-batch, an on-policy batch takes the detached current log-probs as old, and rollout correction's
weights and bypass settings go from the batch to the loss."""

from __future__ import annotations

from dataclasses import asdict
from types import SimpleNamespace

import torch
from roles_testlib import PROMPT, RESPONSE, ROWS, policy_config, rl_batch

from rlflow.algos import compute_policy_loss_bypass_mode, get_policy_loss_fn
from rlflow.config.schema import RolloutCorrectionConfig
from rlflow.engines import LossContext
from rlflow.protocol import DataProto
from rlflow.meta_info import OLD_LOG_PROBS_FROM_UPDATE, ROLLOUT_CORRECTION, ROLLOUT_IS_IN_LOSS
from rlflow.roles.losses import global_batch_info, make_policy_loss_fn

CTX = LossContext(global_num_tokens=ROWS * RESPONSE, global_num_seqs=ROWS, dp_size=1, num_micro_batches=1,
                  micro_batch_index=0)


class CountingConfig(dict):
    """An actor config that counts how often the role reads all of its keys."""

    reads = 0

    def items(self):
        CountingConfig.reads += 1
        return super().items()

    def __getattr__(self, name):
        return self[name]


def test_policy_loss_converts_the_config_once_and_matches_the_registered_loss():
    loss_fn = make_policy_loss_fn(CountingConfig(vars(policy_config())))
    torch.manual_seed(0)
    data = rl_batch()
    data.batch["old_log_probs"] = -torch.rand(ROWS, RESPONSE)
    data.batch["advantages"] = torch.randn(ROWS, RESPONSE)
    log_probs = -torch.rand(ROWS, PROMPT + RESPONSE)
    losses = [loss_fn({"log_probs": log_probs}, data, CTX)[0] for _ in range(3)]
    assert CountingConfig.reads == 1
    reference_config = SimpleNamespace(
        clip_ratio=0.2, clip_ratio_c=3.0,
        global_batch_info={"dp_size": 1, "batch_num_tokens": ROWS * RESPONSE, "global_batch_size": ROWS},
    )
    expected, _ = get_policy_loss_fn("vanilla")(
        data.batch["old_log_probs"], log_probs[:, PROMPT:], data.batch["advantages"], data.batch["response_mask"],
        "token-mean", reference_config,
    )
    for loss in losses:
        torch.testing.assert_close(loss, expected, rtol=0, atol=0)


def test_on_policy_loss_takes_the_detached_current_log_probs_as_old():
    """Flagged batch: no ``old_log_probs`` needed, ratio 1, ``ppo_kl`` exactly 0, and the same loss and
    gradient as passing the current log-probs as old explicitly."""
    loss_fn = make_policy_loss_fn(policy_config())
    torch.manual_seed(0)
    data = rl_batch()
    data.batch["advantages"] = torch.randn(ROWS, RESPONSE)
    log_probs = (-torch.rand(ROWS, PROMPT + RESPONSE)).requires_grad_()
    entropy = torch.rand(ROWS, PROMPT + RESPONSE, requires_grad=True)
    on_policy = DataProto(dict(data.batch), {}, {OLD_LOG_PROBS_FROM_UPDATE.name: True})
    loss, metrics = loss_fn({"log_probs": log_probs, "entropy": entropy}, on_policy, CTX)
    grad, entropy_grad = torch.autograd.grad(loss, [log_probs, entropy], allow_unused=True)
    assert metrics["actor/ppo_kl"] == 0.0 and metrics["actor/pg_clipfrac"] == 0.0
    assert "actor/entropy" in metrics and entropy_grad is None  # reported, not in a loss with entropy_coeff 0

    explicit = DataProto(dict(data.batch), {}, {})
    explicit.batch["old_log_probs"] = log_probs[:, PROMPT:].detach().clone()
    expected, _ = loss_fn({"log_probs": log_probs}, explicit, CTX)
    (expected_grad,) = torch.autograd.grad(expected, log_probs)
    torch.testing.assert_close(loss, expected, rtol=0, atol=0)
    torch.testing.assert_close(grad, expected_grad, rtol=0, atol=0)


def _loss_inputs():
    torch.manual_seed(0)
    data = rl_batch()
    data.batch["old_log_probs"] = -torch.rand(ROWS, RESPONSE)
    data.batch["advantages"] = torch.randn(ROWS, RESPONSE)
    return data, -torch.rand(ROWS, PROMPT + RESPONSE)


def test_policy_loss_hands_the_batchs_rollout_is_weights_to_the_loss():
    loss_fn = make_policy_loss_fn(policy_config())
    data, log_probs = _loss_inputs()
    plain, _ = loss_fn({"log_probs": log_probs}, data, CTX)
    weights = torch.rand(ROWS, RESPONSE)
    data.batch["rollout_is_weights"] = weights
    weighted, _ = loss_fn({"log_probs": log_probs}, data, CTX)
    reference_config = SimpleNamespace(clip_ratio=0.2, clip_ratio_c=3.0, global_batch_info=global_batch_info(CTX))
    expected, _ = get_policy_loss_fn("vanilla")(
        data.batch["old_log_probs"], log_probs[:, PROMPT:], data.batch["advantages"], data.batch["response_mask"],
        "token-mean", reference_config, rollout_is_weights=weights)
    torch.testing.assert_close(weighted, expected, rtol=0, atol=0)
    assert not torch.equal(weighted, plain)


def test_bypass_settings_in_meta_info_run_the_bypass_loss():
    loss_fn = make_policy_loss_fn(policy_config())
    data, log_probs = _loss_inputs()
    settings = RolloutCorrectionConfig(rollout_is="token", bypass_mode=True, loss_type="reinforce")
    data.meta_info[ROLLOUT_CORRECTION.name] = asdict(settings)
    loss, metrics = loss_fn({"log_probs": log_probs}, data, CTX)
    reference_config = SimpleNamespace(global_batch_info=global_batch_info(CTX), policy_loss=SimpleNamespace(
        rollout_correction=settings))
    expected, expected_metrics = compute_policy_loss_bypass_mode(
        data.batch["old_log_probs"], log_probs[:, PROMPT:], data.batch["advantages"], data.batch["response_mask"],
        "token-mean", reference_config)
    torch.testing.assert_close(loss, expected, rtol=0, atol=0)
    assert metrics["rollout_corr/kl"] == expected_metrics["rollout_corr/kl"] and "rollout_corr/rollout_is_mean" in metrics


def test_on_policy_loss_computes_the_truncated_is_weights_from_its_own_log_probs():
    """``ROLLOUT_IS_IN_LOSS`` on an on-policy batch: the loss equals the one given the weights explicitly, with the
    weights written out in plain torch: ``min(exp(log pi - log pi_rollout), threshold)`` per token."""
    loss_fn = make_policy_loss_fn(policy_config())
    data, log_probs = _loss_inputs()
    log_probs.requires_grad_()
    data.batch["rollout_log_probs"] = log_probs[:, PROMPT:].detach() + 0.5 * torch.randn(ROWS, RESPONSE)
    flagged = DataProto(dict(data.batch), {}, {OLD_LOG_PROBS_FROM_UPDATE.name: True,
                                               ROLLOUT_IS_IN_LOSS.name: {"rollout_is": "token", "rollout_is_threshold": 1.5}})
    loss, _ = loss_fn({"log_probs": log_probs}, flagged, CTX)
    (grad,) = torch.autograd.grad(loss, log_probs)

    current = log_probs[:, PROMPT:].detach()
    weights = torch.exp(current - data.batch["rollout_log_probs"]).clamp(max=1.5) * data.batch["response_mask"]
    assert 0 < float((weights == 1.5).float().mean()) < 1  # some weights are cut, others are not
    explicit = DataProto(dict(data.batch), {}, {})
    explicit.batch["old_log_probs"] = current.clone()
    explicit.batch["rollout_is_weights"] = weights
    expected, _ = loss_fn({"log_probs": log_probs}, explicit, CTX)
    (expected_grad,) = torch.autograd.grad(expected, log_probs)
    torch.testing.assert_close(loss, expected, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(grad, expected_grad, rtol=1e-6, atol=1e-7)
    unweighted, _ = loss_fn({"log_probs": log_probs}, DataProto(dict(data.batch), {}, {OLD_LOG_PROBS_FROM_UPDATE.name: True}), CTX)
    assert not torch.allclose(loss, unweighted)
