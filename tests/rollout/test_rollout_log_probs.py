"""``rollout.calculate_log_probs``: log-probs are computed only when asked for, and then equal the trainer's.

The trainer's log-probs are the actor's own path (``response_log_probs`` on an FSDP2 engine, logits
divided by the rollout temperature). At fp32 on the tiny preset both backends' ``rollout_log_probs``
(``processed_logprobs``: the distribution sampled from, which with top-k/top-p off is ``softmax(logits / T)``)
match them within 1e-5, at temperature 1 and 0.7. Also the test-only ``rollout.debug_skip_weight_sync_steps``.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from rollout_testlib import make_prompts, perturbed_state, rollout_config

from rlflow.config.schema import SamplingConfig
from rlflow.engines import build_engine
from rlflow.models.loading import load_causal_lm
from rlflow.roles.engine_role import response_log_probs
from rlflow.rollout import build_rollout
from rlflow.rollout.sampling import resolve_sampling

TOLERANCE = 1e-5  # fp32 engine vs the fp32 trainer


@pytest.fixture(scope="module")
def trainer(tiny_path):
    """The actor's engine (FSDP2, fp32, one rank); it creates this process's group, which vLLM then joins."""
    assert not dist.is_initialized(), "an earlier test left a default process group behind"
    engine = build_engine({"name": "fsdp2", "device": "cpu", "micro_batch_size": 4}, tiny_path)
    engine.initialize()
    yield engine
    dist.destroy_process_group()


@pytest.fixture(scope="module", params=["hf", "vllm"])
def rollout(request, tiny_path, trainer):
    engine = build_rollout(rollout_config(request.param, prompt_length=300, response_length=12), tiny_path, "cpu")
    yield engine
    engine.shutdown()


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_rollout_log_probs_equal_the_trainers(rollout, trainer, tokenizer, temperature):
    out = rollout.generate(make_prompts(tokenizer), SamplingConfig(n=2, temperature=temperature, seed=5))
    expected = response_log_probs(trainer, out, temperature, with_entropy=False).batch["log_probs"]
    mask = out.batch["response_mask"].bool()
    assert mask.sum() > 20
    error = (out.batch["rollout_log_probs"].double() - expected.double()).abs()[mask].max().item()
    assert error <= TOLERANCE, f"{rollout.config.name} at T={temperature}: max |rollout - trainer| = {error:.2e}"
    if temperature != 1.0:  # the trainer's temperature matters: the untempered log-probs are far off
        untempered = response_log_probs(trainer, out, 1.0, with_entropy=False).batch["log_probs"]
        assert (out.batch["rollout_log_probs"] - untempered).abs()[mask].max() > 100 * TOLERANCE


def test_without_calculate_log_probs_no_log_probs_are_computed(rollout, tokenizer, monkeypatch):
    prompts, sampling = make_prompts(tokenizer), SamplingConfig(n=2, temperature=0.7, seed=5)
    with_log_probs = rollout.generate(prompts, sampling)
    monkeypatch.setattr(rollout, "calculate_log_probs", False)
    requested = []
    if rollout.config.name == "vllm":
        add_request = rollout._llm.llm_engine.add_request
        monkeypatch.setattr(rollout._llm.llm_engine, "add_request", lambda request_id, prompt, params, **kw: requested.append(
            params.logprobs) or add_request(request_id, prompt, params, **kw))
    else:
        config = rollout._generation_config(resolve_sampling(sampling, rollout.config.response_length))
        requested += [config.output_scores, config.output_logits]
    without = rollout.generate(prompts, sampling)
    assert "rollout_log_probs" not in without.batch and requested and not any(requested)
    assert torch.equal(without.batch["responses"], with_log_probs.batch["responses"])  # the samples are the same


def test_skipped_syncs_keep_the_rollouts_weights(tiny_path, tokenizer, hf_model):
    """``debug_skip_weight_sync_steps=1``: the first sync loads nothing (the rollout stays off-policy), the next one loads."""
    config = rollout_config("hf", debug_skip_weight_sync_steps=1)
    greedy = SamplingConfig(n=1, do_sample=False)
    new_weights = perturbed_state(hf_model, scale=0.2)
    with build_rollout(config, tiny_path, "cpu") as rollout:
        before = rollout.generate(make_prompts(tokenizer), greedy)
        assert rollout.update_weights(iter(new_weights.items())) == 0
        stale = rollout.generate(make_prompts(tokenizer), greedy)
        assert rollout.update_weights(iter(new_weights.items())) > 0
        synced = rollout.generate(make_prompts(tokenizer), greedy)
    assert torch.equal(stale.batch["rollout_log_probs"], before.batch["rollout_log_probs"])
    updated = load_causal_lm(tiny_path, dtype="float32").eval()
    updated.load_state_dict(new_weights)
    first = synced.batch["responses"][:, :1]
    with torch.no_grad():  # the first response token's log-prob under the new weights, from a plain forward
        prompts = make_prompts(tokenizer)
        logits = updated(input_ids=prompts.batch["input_ids"], attention_mask=prompts.batch["attention_mask"]).logits
    expected = logits[:, -1].log_softmax(-1).gather(-1, first)[:, 0]
    torch.testing.assert_close(synced.batch["rollout_log_probs"][:, 0], expected, rtol=0, atol=1e-4)
    assert (synced.batch["rollout_log_probs"][:, 0] - before.batch["rollout_log_probs"][:, 0]).abs().max() > 1e-3
