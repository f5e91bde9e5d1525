"""``Actor``: its registered methods on a real engine in this process, against independent HF references.

The log-probs (temperature-scaled, entropy too) are the HF model's; an on-policy update hands back the
same per-token log-probs as ``compute_log_prob``, reports the policy loss of ratio 1 and moves the policy
up the advantages; a LoRA actor's reference is its base model after training; an empty batch gives
empty log-probs, also through the worker group, and a training call on one fails in one line.
"""

from __future__ import annotations

from dataclasses import asdict
from types import SimpleNamespace

import pytest
import torch
from roles_testlib import (ATOL, ROWS, RESPONSE, TEMPERATURE, RecordingEngine, assert_response_close, engine_params,
                           hf_response_log_probs, policy_config, rl_batch, role_config, token_batch)

from rlflow.config.schema import RolloutCorrectionConfig
from rlflow.engines.base import Capability
from rlflow.protocol import DataProto
from rlflow.roles.actor import Actor
from rlflow.meta_info import COMPUTE_ENTROPY, METRICS, OLD_LOG_PROBS_FROM_UPDATE, ROLLOUT_CORRECTION
from rlflow.meta_info import TEMPERATURE as TEMPERATURE_KEY
from rlflow.roles.losses import make_policy_loss_fn
from rlflow.workers.local_group import LocalWorkerGroup


def build_actor(models: SimpleNamespace, engine: str, *overrides: str) -> Actor:
    config = role_config(models.causal, engine, *overrides)
    return Actor(config.actor, str(models.causal))


@pytest.fixture(scope="module", params=engine_params())
def engine(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def actor(models, engine, worker_env) -> Actor:
    return build_actor(models, engine)


def on_policy_batch(seed: int, vocab: int, advantage_signs: list[float]) -> DataProto:
    data = token_batch(seed, vocab, rows=len(advantage_signs))
    data.batch["advantages"] = torch.tensor(advantage_signs)[:, None] * data.batch["response_mask"]
    data.meta_info = {TEMPERATURE_KEY.name: 1.0, OLD_LOG_PROBS_FROM_UPDATE.name: True}
    return data


def test_compute_log_prob_is_the_hf_models_log_prob_and_entropy_of_each_response_token(actor, models, hf_causal):
    data = token_batch(0, models.vocab)
    data.meta_info[TEMPERATURE_KEY.name] = TEMPERATURE
    out = actor.compute_log_prob(data)
    log_probs, entropy = hf_response_log_probs(hf_causal, data, TEMPERATURE)
    assert_response_close(out.batch["old_log_probs"], log_probs, data.batch["response_mask"])
    assert_response_close(out.batch["entropys"], entropy, data.batch["response_mask"])


def test_compute_ref_log_prob_needs_lora_adapters(actor, models):
    with pytest.raises(RuntimeError, match="its reference is a separate engine"):
        actor.compute_ref_log_prob(token_batch(0, models.vocab))


def test_an_on_policy_update_returns_its_log_probs_reports_its_loss_and_follows_the_advantages(models, engine, worker_env):
    actor = build_actor(models, engine)
    data = on_policy_batch(1, models.vocab, [1.0, 1.0, -1.0, 1.0, -1.0])
    mask = data.batch["response_mask"].bool()
    before = actor.compute_log_prob(data).batch["old_log_probs"]
    out = actor.forward_backward(data)
    torch.testing.assert_close(out.batch["log_probs"][mask], before[mask], atol=ATOL, rtol=0)
    advantages = data.batch["advantages"]
    # ratio 1: the vanilla PPO loss is minus the token-mean advantage
    assert out.meta_info[METRICS.name]["actor/pg_loss"] == pytest.approx(-float(advantages[mask].mean()), abs=1e-6)
    actor.optim_step()
    after = actor.compute_log_prob(data).batch["old_log_probs"]
    gain = float((advantages * (after - before))[mask].sum())
    assert gain > 0, f"one step moved the log-probs against the advantages (sum A * change = {gain:.3g})"


def test_a_lora_actors_reference_is_its_base_model_after_training(models, worker_env, hf_causal, lora_engine):
    actor = build_actor(models, lora_engine, "actor.engine.lora.rank=4", "actor.engine.optimizer.lr=1e-2")
    data = on_policy_batch(2, models.vocab, [1.0, -1.0, 1.0])
    for _ in range(2):
        actor.forward_backward(data)
        actor.optim_step()
    data.meta_info[TEMPERATURE_KEY.name] = TEMPERATURE
    mask = data.batch["response_mask"].bool()
    base, _ = hf_response_log_probs(hf_causal, data, TEMPERATURE)
    reference = actor.compute_ref_log_prob(data).batch["ref_log_prob"]
    torch.testing.assert_close(reference[mask], base[mask], atol=ATOL, rtol=0)
    trained = actor.compute_log_prob(data).batch["old_log_probs"]
    assert (trained - base)[mask].abs().max() > 100 * ATOL, "the adapters did not train, so the check above shows nothing"


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "lora_engine" in metafunc.fixturenames:
        metafunc.parametrize("lora_engine", engine_params(Capability.LORA))


def test_an_empty_batch_gives_empty_log_probs_and_cannot_be_trained_on(actor, models):
    empty = token_batch(0, models.vocab)[0:0]
    for out in (actor.compute_log_prob(empty), LocalWorkerGroup(actor).compute_log_prob(empty)):
        assert out.batch["old_log_probs"].shape == out.batch["entropys"].shape == (0, empty.batch["responses"].shape[1])
    empty.batch["advantages"] = empty.batch["response_mask"]
    with pytest.raises(ValueError, match=r"Actor.forward_backward got an empty batch \(0 rows\)"):
        actor.forward_backward(empty)


@pytest.mark.parametrize("on_policy", [True, False])
def test_forward_backward_hands_back_the_update_forward_per_token_when_on_policy(on_policy):
    """Stand-in engine: what the role asks of the engine and what it hands back."""
    data = rl_batch()
    data.batch["advantages"] = torch.randn(ROWS, RESPONSE)
    if not on_policy:
        data.batch["old_log_probs"] = -torch.ones(ROWS, RESPONSE)
    data.meta_info = {TEMPERATURE_KEY.name: 0.7, OLD_LOG_PROBS_FROM_UPDATE.name: on_policy}
    config = policy_config()
    collecting = SimpleNamespace(engine=RecordingEngine(True), actor_config=config, loss_fn=make_policy_loss_fn(config))
    out = Actor.forward_backward(collecting, data)
    view = collecting.engine.views[0]
    assert ("old_log_probs" in view.batch) is not on_policy
    assert view.meta_info[COMPUTE_ENTROPY.name] is on_policy  # the entropy metric comes from the update then
    if on_policy:  # the update forward's columns become the batch's old log-probs and entropy
        assert out.batch["log_probs"].shape == out.batch["entropy"].shape == (ROWS, RESPONSE)
    else:  # the driver has them from the separate pass: nothing per-token travels back
        assert set(out.batch) == set()
    assert out.meta_info[METRICS.name]["actor/ppo_kl"] == 0.0 and "loss" not in out.meta_info[METRICS.name]
    silent = SimpleNamespace(engine=RecordingEngine(False), actor_config=config, loss_fn=make_policy_loss_fn(config))
    empty = Actor.forward_backward(silent, data)
    assert len(empty) == 0 and "actor/pg_loss" in empty.meta_info[METRICS.name]


def test_forward_backward_carries_rollout_correction_to_the_loss_and_its_metrics_back():
    """Stand-in engine: decoupled weights travel in the view; bypass settings select the bypass loss, whose
    ``rollout_corr/*`` metrics come back, and make the update forward compute the entropy."""
    data = rl_batch()
    data.batch["advantages"] = torch.randn(ROWS, RESPONSE)
    data.batch["old_log_probs"] = -torch.ones(ROWS, RESPONSE)
    data.batch["rollout_is_weights"] = torch.full((ROWS, RESPONSE), 0.5)
    config = policy_config()
    role = SimpleNamespace(engine=RecordingEngine(True), actor_config=config, loss_fn=make_policy_loss_fn(config))
    Actor.forward_backward(role, data)
    assert torch.equal(role.engine.views[0].batch["rollout_is_weights"], data.batch["rollout_is_weights"])
    data.batch.pop("rollout_is_weights")
    data.meta_info = {ROLLOUT_CORRECTION.name: asdict(RolloutCorrectionConfig(bypass_mode=True))}
    out = Actor.forward_backward(role, data)
    assert role.engine.views[1].meta_info[ROLLOUT_CORRECTION.name]["bypass_mode"] is True
    assert role.engine.views[1].meta_info[COMPUTE_ENTROPY.name] is True  # no old-log-prob pass: the update gives entropy
    assert role.engine.views[0].meta_info[COMPUTE_ENTROPY.name] is False
    assert "rollout_corr/kl" in out.meta_info[METRICS.name] and "actor/pg_loss" in out.meta_info[METRICS.name]
    data.meta_info[OLD_LOG_PROBS_FROM_UPDATE.name] = True
    with pytest.raises(ValueError, match="bypass mode"):
        Actor.forward_backward(role, data)
