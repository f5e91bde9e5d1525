"""``Critic``: the value model on a real engine in this process. ``values`` are the HF score head's outputs at
the state each response token is generated from (zero on padding); ``update_critic`` reports the clipped
value loss of its first step exactly and moves the values toward the returns; an empty batch gives empty
values and no optimizer step."""

from __future__ import annotations

import pytest
import torch
from roles_testlib import ATOL, engine_params, hf_token_scores, prompt_lengths, role_config, token_batch

from rlflow.engines.base import Capability
from rlflow.roles.critic import Critic

ENGINES = engine_params(Capability.VALUE_MODEL)


def build_critic(models, engine: str, *overrides: str) -> Critic:
    config = role_config(models.causal, engine, *overrides)
    return Critic(config.critic, str(models.value))


@pytest.fixture(scope="module", params=ENGINES)
def critic(request, models, worker_env) -> Critic:
    return build_critic(models, request.param)


def test_values_are_the_hf_score_at_the_state_before_each_response_token(critic, models, hf_value):
    data = token_batch(5, models.vocab)
    values = critic.compute_values(data).batch["values"]
    mask = data.batch["response_mask"]
    expected = torch.zeros_like(values)
    for row, (scores, prompt_length) in enumerate(zip(hf_token_scores(hf_value, data), prompt_lengths(data))):
        length = int(mask[row].sum())
        expected[row, :length] = scores[prompt_length - 1 : prompt_length + length - 1]
    torch.testing.assert_close(values, expected, atol=ATOL, rtol=0)


@pytest.mark.parametrize("engine", ENGINES)
def test_update_critic_reports_its_value_loss_and_moves_the_values_toward_the_returns(models, engine, worker_env):
    """One step from values 1 below the returns: every token's clipped loss is 0.5 * 1^2, so ``critic/vf_loss``
    is 0.5, and the step closes part of the gap."""
    critic = build_critic(models, engine, "critic.ppo_epochs=1")
    data = token_batch(6, models.vocab, rows=4)
    mask = data.batch["response_mask"]
    data.batch["values"] = critic.compute_values(data).batch["values"]
    data.batch["returns"] = (data.batch["values"] + 1.0) * mask
    data.meta_info["mini_batch_size"] = 4
    metrics = critic.update_critic(data)
    assert metrics["critic/optim_steps"] == 1 and metrics["critic/trailing_skipped_steps"] == 0
    assert metrics["critic/vf_loss"] == pytest.approx(0.5, abs=1e-5)
    after = critic.compute_values(data).batch["values"]
    gap_after = float(((data.batch["returns"] - after) * mask).sum() / mask.sum())
    assert gap_after < 1.0 - 0.01, f"the values did not move toward the returns (mean gap 1 -> {gap_after:.4f})"


def test_an_empty_batch_gives_empty_values_and_no_optimizer_step(critic, models):
    data = token_batch(5, models.vocab)
    values = critic.compute_values(data).batch["values"]
    empty = data[0:0]
    assert critic.compute_values(empty).batch["values"].shape == (0, 6)
    empty.batch["values"], empty.batch["returns"] = empty.batch["response_mask"], empty.batch["response_mask"]
    empty.meta_info["mini_batch_size"] = 4
    assert critic.update_critic(empty) == {"critic/optim_steps": 0.0, "critic/trailing_skipped_steps": 0.0}
    assert torch.equal(critic.compute_values(data).batch["values"], values)
