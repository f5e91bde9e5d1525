"""``rollout.calculate_log_probs``: log-probs are computed only when asked for, and then equal the trainer's.

The trainer's log-probs are the actor's own path (``response_log_probs`` on an FSDP2 engine, logits
divided by the rollout temperature). At fp32 on the tiny preset both backends' ``rollout_log_probs``
(``processed_logprobs``: the distribution sampled from, which with top-k/top-p off is ``softmax(logits / T)``)
match them within 1e-5, at temperature 1 and 0.7. ``score_prompts`` (Tinker's ``compute_logprobs``) gives every prompt
token's log-prob within 1e-5 of the trainer's forward, and top-k tokens equal to a plain HF forward's. Also the
test-only ``rollout.debug_skip_weight_sync_steps``.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from rollout_testlib import PROMPTS, make_prompts, perturbed_state, rollout_config

from rlflow.config.schema import SamplingConfig
from rlflow.engines import build_engine
from rlflow.models.loading import load_causal_lm
from rlflow.protocol import DataProto
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


def prompt_as_response_batch(token_lists: list[list[int]]) -> DataProto:
    """Each prompt's first token as a one-token prompt and the rest as its response: the trainer's response
    log-probs are then the prompt's scores."""
    width = max(len(tokens) for tokens in token_lists) - 1
    responses = torch.zeros(len(token_lists), width, dtype=torch.long)
    response_mask = torch.zeros_like(responses)
    for row, tokens in enumerate(token_lists):
        responses[row, : len(tokens) - 1] = torch.tensor(tokens[1:])
        response_mask[row, : len(tokens) - 1] = 1
    firsts = torch.tensor([[tokens[0]] for tokens in token_lists])
    mask = torch.cat([torch.ones_like(firsts), response_mask], dim=1)
    return DataProto.from_dict({"prompts": firsts, "responses": responses, "response_mask": response_mask,
                                "input_ids": torch.cat([firsts, responses], dim=1), "attention_mask": mask,
                                "position_ids": (mask.cumsum(1) - 1).clamp(min=0)})


def test_prompt_scores_equal_the_trainers_forward_and_the_hf_top_k(rollout, trainer, tokenizer, hf_model):
    token_lists = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in PROMPTS]
    scores = rollout.score_prompts([tuple(tokens) for tokens in token_lists], top_k=3)
    expected = response_log_probs(trainer, prompt_as_response_batch(token_lists), 1.0, with_entropy=False).batch["log_probs"]
    for row, (tokens, score) in enumerate(zip(token_lists, scores)):
        assert len(score.log_probs) == len(tokens) - 1 and len(score.top_ids) == len(tokens) - 1
        error = (torch.tensor(score.log_probs, dtype=torch.float64) - expected[row, : len(tokens) - 1].double()).abs().max()
        assert error <= TOLERANCE, f"{rollout.config.name} prompt {row}: max |score - trainer| = {error:.2e}"
        with torch.no_grad():
            reference = hf_model(torch.tensor([tokens])).logits[0, :-1].double().log_softmax(-1).topk(3, dim=-1)
        assert [list(ids) for ids in score.top_ids] == reference.indices.tolist()
        torch.testing.assert_close(torch.tensor(score.top_log_probs, dtype=torch.float64), reference.values,
                                   rtol=0, atol=TOLERANCE)
    without_top_k = rollout.score_prompts([tuple(token_lists[0])])[0]
    assert without_top_k.top_ids == () and without_top_k.log_probs == scores[0].log_probs


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
