"""The RL losses the roles hand to an engine (``rlflow.roles.losses``): the actor config is converted once,
not per micro-batch, and an on-policy batch takes the detached current log-probs as old."""

from __future__ import annotations

from types import SimpleNamespace

import torch
from roles_testlib import PROMPT, RESPONSE, ROWS, policy_config, rl_batch

from rlflow.algos import get_policy_loss_fn
from rlflow.engines import LossContext
from rlflow.protocol import DataProto
from rlflow.meta_info import OLD_LOG_PROBS_FROM_UPDATE
from rlflow.roles.losses import make_policy_loss_fn

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
