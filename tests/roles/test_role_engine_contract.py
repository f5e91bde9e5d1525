"""How the roles use the engine contract: outputs only on collect ranks, export in the rollout's dtype,
a policy loss that converts the actor config once, not per micro-batch, and rollout correction's weights
and bypass settings carried from the batch to the loss.

The engines here are stand-ins: these are unit tests of the roles around an engine, and each
stand-in records what the role asked of it. The real engines' side of the contract is tested in
tests/engines.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import asdict
from types import SimpleNamespace

import pytest
import torch

from rlflow.algos import compute_policy_loss_bypass_mode, get_policy_loss_fn
from rlflow.config.schema import RolloutCorrectionConfig
from rlflow.engines import EngineMesh, LossContext
from rlflow.meta_info import OLD_LOG_PROBS_FROM_UPDATE, ROLLOUT_CORRECTION, TEMPERATURE
from rlflow.protocol import DataProto
from rlflow.roles.actor import Actor
from rlflow.roles.actor_rollout_ref import ActorRolloutRef
from rlflow.roles.critic import Critic
from rlflow.roles.engine_role import response_log_probs
from rlflow.roles.losses import global_batch_info, make_policy_loss_fn
from rlflow.roles.reward_model import RewardModel

PROMPT, RESPONSE, ROWS = 3, 4, 2


def rl_batch() -> DataProto:
    width = PROMPT + RESPONSE
    return DataProto.from_dict(
        {
            "input_ids": torch.arange(ROWS * width).reshape(ROWS, width),
            "attention_mask": torch.ones(ROWS, width, dtype=torch.long),
            "responses": torch.zeros(ROWS, RESPONSE, dtype=torch.long),
            "response_mask": torch.ones(ROWS, RESPONSE),
        }
    )


class StandInEngine:
    """Returns fixed per-token outputs and records export requests."""

    def __init__(self, is_collect: bool):
        self.mesh = EngineMesh(dp_rank=0, dp_size=1, is_collect=is_collect)
        self.export_dtypes: list = []

    def eval_mode(self):
        return nullcontext()

    def forward_backward(self, batch: DataProto, loss_fn=None, forward_only: bool = False):
        if not self.mesh.is_collect:
            return DataProto(), {}
        shape = batch.batch["input_ids"].shape
        return DataProto.from_dict({"log_probs": -torch.ones(shape), "entropy": torch.ones(shape), "values": torch.ones(shape)}), {}

    def export_hf_weights(self, dtype=None):
        self.export_dtypes.append(dtype)
        yield "w", torch.ones(2, dtype=dtype or torch.float32)


@pytest.mark.parametrize(
    "call",
    [
        lambda role, data: Actor.compute_log_prob(role, data),
        lambda role, data: Critic.compute_values(role, data),
        lambda role, data: RewardModel.compute_rm_score(role, data),
        lambda role, data: ActorRolloutRef.compute_ref_log_prob(role, data),
    ],
    ids=["actor", "critic", "reward_model", "reference"],
)
def test_roles_return_an_empty_batch_on_ranks_that_do_not_collect(call):
    data = rl_batch()
    collecting = SimpleNamespace(engine=StandInEngine(True), ref_engine=StandInEngine(True))
    silent = SimpleNamespace(engine=StandInEngine(False), ref_engine=StandInEngine(False))
    assert len(call(collecting, data)) == ROWS
    empty = call(silent, data)
    assert isinstance(empty, DataProto) and len(empty) == 0 and not empty.batch


def test_response_log_probs_are_the_response_columns():
    out = response_log_probs(StandInEngine(True), rl_batch(), temperature=1.0, with_entropy=True)
    assert out.batch["log_probs"].shape == (ROWS, RESPONSE)
    assert response_log_probs(StandInEngine(False), rl_batch(), 1.0, True) is None


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_colocated_sync_exports_in_the_rollout_dtype(dtype):
    received = []
    role = SimpleNamespace(
        engine=StandInEngine(True),
        config=SimpleNamespace(dtype=dtype, lora_sync="merged", lora_rank=0),
        rollout=SimpleNamespace(update_weights=lambda tensors: received.extend(tensors) or 8),
    )
    ActorRolloutRef.sync_weights(role)
    assert role.engine.export_dtypes == [getattr(torch, dtype)]
    assert received[0][1].dtype == getattr(torch, dtype)


class CountingConfig(dict):
    """An actor config that counts how often the role reads all of its keys."""

    reads = 0

    def items(self):
        CountingConfig.reads += 1
        return super().items()

    def __getattr__(self, name):
        return self[name]


def test_policy_loss_converts_the_config_once_and_matches_the_registered_loss():
    config = CountingConfig(
        policy_loss=SimpleNamespace(loss_mode="vanilla"), loss_agg_mode="token-mean", clip_ratio=0.2,
        clip_ratio_low=None, clip_ratio_high=None, clip_ratio_c=3.0, entropy_coeff=0.0, use_kl_loss=False,
    )
    loss_fn = make_policy_loss_fn(config)
    torch.manual_seed(0)
    data = rl_batch()
    data.batch["old_log_probs"] = -torch.rand(ROWS, RESPONSE)
    data.batch["advantages"] = torch.randn(ROWS, RESPONSE)
    log_probs = -torch.rand(ROWS, PROMPT + RESPONSE)
    ctx = LossContext(global_num_tokens=ROWS * RESPONSE, global_num_seqs=ROWS, dp_size=1, num_micro_batches=1, micro_batch_index=0)
    losses = [loss_fn({"log_probs": log_probs}, data, ctx)[0] for _ in range(3)]
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


def _policy_config(entropy_coeff: float = 0.0) -> SimpleNamespace:
    return SimpleNamespace(
        policy_loss=SimpleNamespace(loss_mode="vanilla"), loss_agg_mode="token-mean", clip_ratio=0.2,
        clip_ratio_low=None, clip_ratio_high=None, clip_ratio_c=3.0, entropy_coeff=entropy_coeff, use_kl_loss=False,
    )


def test_on_policy_loss_takes_the_detached_current_log_probs_as_old():
    """Flagged batch: no ``old_log_probs`` needed, ratio 1, ``ppo_kl`` exactly 0, and the same loss and
    gradient as passing the current log-probs as old explicitly."""
    loss_fn = make_policy_loss_fn(_policy_config())
    torch.manual_seed(0)
    data = rl_batch()
    data.batch["advantages"] = torch.randn(ROWS, RESPONSE)
    log_probs = (-torch.rand(ROWS, PROMPT + RESPONSE)).requires_grad_()
    entropy = torch.rand(ROWS, PROMPT + RESPONSE, requires_grad=True)
    ctx = LossContext(global_num_tokens=ROWS * RESPONSE, global_num_seqs=ROWS, dp_size=1, num_micro_batches=1, micro_batch_index=0)
    on_policy = DataProto(dict(data.batch), {}, {OLD_LOG_PROBS_FROM_UPDATE.name: True})
    loss, metrics = loss_fn({"log_probs": log_probs, "entropy": entropy}, on_policy, ctx)
    grad, entropy_grad = torch.autograd.grad(loss, [log_probs, entropy], allow_unused=True)
    assert metrics["actor/ppo_kl"] == 0.0 and metrics["actor/pg_clipfrac"] == 0.0
    assert "actor/entropy" in metrics and entropy_grad is None  # reported, not in a loss with entropy_coeff 0

    explicit = DataProto(dict(data.batch), {}, {})
    explicit.batch["old_log_probs"] = log_probs[:, PROMPT:].detach().clone()
    expected, _ = loss_fn({"log_probs": log_probs}, explicit, ctx)
    (expected_grad,) = torch.autograd.grad(expected, log_probs)
    torch.testing.assert_close(loss, expected, rtol=0, atol=0)
    torch.testing.assert_close(grad, expected_grad, rtol=0, atol=0)


class RecordingEngine(StandInEngine):
    """A training stand-in: records the view and runs the loss once on it."""

    def __init__(self, is_collect: bool):
        super().__init__(is_collect)
        self.views: list[DataProto] = []

    def train_mode(self):
        return nullcontext()

    def forward_backward(self, batch: DataProto, loss_fn=None, forward_only: bool = False):
        self.views.append(batch)
        outputs, _ = super().forward_backward(batch)
        shape = batch.batch["input_ids"].shape
        ctx = LossContext(global_num_tokens=int(batch.batch["response_mask"].sum()), global_num_seqs=shape[0],
                          dp_size=1, num_micro_batches=1, micro_batch_index=0)
        _, metrics = loss_fn({"log_probs": -torch.ones(shape), "entropy": torch.ones(shape)}, batch, ctx)
        return outputs, {**metrics, "loss": 0.0}


@pytest.mark.parametrize("on_policy", [True, False])
def test_actor_forward_backward_hands_back_the_update_forward_per_token_when_on_policy(on_policy):
    data = rl_batch()
    data.batch["advantages"] = torch.randn(ROWS, RESPONSE)
    if not on_policy:
        data.batch["old_log_probs"] = -torch.ones(ROWS, RESPONSE)
    data.meta_info = {TEMPERATURE.name: 0.7, OLD_LOG_PROBS_FROM_UPDATE.name: on_policy}
    config = _policy_config()
    collecting = SimpleNamespace(engine=RecordingEngine(True), actor_config=config, loss_fn=make_policy_loss_fn(config))
    out = Actor.forward_backward(collecting, data)
    view = collecting.engine.views[0]
    assert ("old_log_probs" in view.batch) is not on_policy
    assert view.meta_info["compute_entropy"] is on_policy  # the entropy metric comes from the update then
    if on_policy:  # the update forward's columns become the batch's old log-probs and entropy
        assert out.batch["log_probs"].shape == out.batch["entropy"].shape == (ROWS, RESPONSE)
    else:  # the driver has them from the separate pass: nothing per-token travels back
        assert set(out.batch) == set()
    assert out.meta_info["metrics"]["actor/ppo_kl"] == 0.0 and "loss" not in out.meta_info["metrics"]
    silent = SimpleNamespace(engine=RecordingEngine(False), actor_config=config, loss_fn=make_policy_loss_fn(config))
    empty = Actor.forward_backward(silent, data)
    assert len(empty) == 0 and "actor/pg_loss" in empty.meta_info["metrics"]


def _loss_inputs():
    torch.manual_seed(0)
    data = rl_batch()
    data.batch["old_log_probs"] = -torch.rand(ROWS, RESPONSE)
    data.batch["advantages"] = torch.randn(ROWS, RESPONSE)
    ctx = LossContext(global_num_tokens=ROWS * RESPONSE, global_num_seqs=ROWS, dp_size=1, num_micro_batches=1, micro_batch_index=0)
    return data, -torch.rand(ROWS, PROMPT + RESPONSE), ctx


def test_policy_loss_hands_the_batchs_rollout_is_weights_to_the_loss():
    loss_fn = make_policy_loss_fn(_policy_config())
    data, log_probs, ctx = _loss_inputs()
    plain, _ = loss_fn({"log_probs": log_probs}, data, ctx)
    weights = torch.rand(ROWS, RESPONSE)
    data.batch["rollout_is_weights"] = weights
    weighted, _ = loss_fn({"log_probs": log_probs}, data, ctx)
    reference_config = SimpleNamespace(clip_ratio=0.2, clip_ratio_c=3.0, global_batch_info=global_batch_info(ctx))
    expected, _ = get_policy_loss_fn("vanilla")(
        data.batch["old_log_probs"], log_probs[:, PROMPT:], data.batch["advantages"], data.batch["response_mask"],
        "token-mean", reference_config, rollout_is_weights=weights)
    torch.testing.assert_close(weighted, expected, rtol=0, atol=0)
    assert not torch.equal(weighted, plain)


def test_bypass_settings_in_meta_info_run_the_bypass_loss():
    loss_fn = make_policy_loss_fn(_policy_config())
    data, log_probs, ctx = _loss_inputs()
    settings = RolloutCorrectionConfig(rollout_is="token", bypass_mode=True, loss_type="reinforce")
    data.meta_info[ROLLOUT_CORRECTION.name] = asdict(settings)
    loss, metrics = loss_fn({"log_probs": log_probs}, data, ctx)
    reference_config = SimpleNamespace(global_batch_info=global_batch_info(ctx), policy_loss=SimpleNamespace(
        rollout_correction=settings))
    expected, expected_metrics = compute_policy_loss_bypass_mode(
        data.batch["old_log_probs"], log_probs[:, PROMPT:], data.batch["advantages"], data.batch["response_mask"],
        "token-mean", reference_config)
    torch.testing.assert_close(loss, expected, rtol=0, atol=0)
    assert metrics["rollout_corr/kl"] == expected_metrics["rollout_corr/kl"] and "rollout_corr/rollout_is_mean" in metrics


def test_actor_forward_backward_carries_rollout_correction_to_the_loss_and_its_metrics_back():
    data = rl_batch()
    data.batch["advantages"] = torch.randn(ROWS, RESPONSE)
    data.batch["old_log_probs"] = -torch.ones(ROWS, RESPONSE)
    data.batch["rollout_is_weights"] = torch.full((ROWS, RESPONSE), 0.5)
    config = _policy_config()
    role = SimpleNamespace(engine=RecordingEngine(True), actor_config=config, loss_fn=make_policy_loss_fn(config))
    Actor.forward_backward(role, data)
    assert torch.equal(role.engine.views[0].batch["rollout_is_weights"], data.batch["rollout_is_weights"])
    data.batch.pop("rollout_is_weights")
    data.meta_info = {ROLLOUT_CORRECTION.name: asdict(RolloutCorrectionConfig(bypass_mode=True))}
    out = Actor.forward_backward(role, data)
    assert role.engine.views[1].meta_info[ROLLOUT_CORRECTION.name]["bypass_mode"] is True
    assert role.engine.views[1].meta_info["compute_entropy"] is True  # no old-log-prob pass: the update gives entropy
    assert role.engine.views[0].meta_info["compute_entropy"] is False
    assert "rollout_corr/kl" in out.meta_info["metrics"] and "actor/pg_loss" in out.meta_info["metrics"]
    data.meta_info[OLD_LOG_PROBS_FROM_UPDATE.name] = True
    with pytest.raises(ValueError, match="bypass mode"):
        Actor.forward_backward(role, data)
