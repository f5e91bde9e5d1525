"""Both rollout backends (HF generate, in-process vLLM) on the tiny preset, against an HF-forward reference.

One engine per backend for the whole module (params run one after the other, so at most one
vLLM engine is alive). Tests that change weights or config put them back.
"""

from __future__ import annotations

import pytest
import torch
from rollout_testlib import PROMPTS, make_prompts, max_log_prob_error, perturbed_state, rollout_config

from rlflow.config.schema import SamplingConfig
from rlflow.rollout import PromptTooLongError, WeightSyncError, build_rollout
from rlflow.rollout.processing import OUTPUT_TENSOR_KEYS

TOLERANCE = 1e-4  # fp32 engine vs fp32 HF forward
GREEDY = SamplingConfig(n=1, do_sample=False)


@pytest.fixture(scope="module", params=["hf", "vllm"])
def rollout(request, tiny_path):
    engine = build_rollout(rollout_config(request.param, prompt_length=300, response_length=8), tiny_path, "cpu")
    yield engine
    engine.shutdown()


def test_greedy_log_probs_match_hf_forward(rollout, tokenizer, hf_model):
    out = rollout.generate(make_prompts(tokenizer), GREEDY)
    assert out.batch["response_mask"].sum() > 0
    assert max_log_prob_error(hf_model, out) <= TOLERANCE


def test_sampled_log_probs_are_temperature_scaled(rollout, tokenizer, hf_model):
    sampling = SamplingConfig(n=2, temperature=0.7, seed=11)
    out = rollout.generate(make_prompts(tokenizer), sampling)
    assert max_log_prob_error(hf_model, out, temperature=0.7) <= TOLERANCE
    assert max_log_prob_error(hf_model, out, temperature=1.0) > 10 * TOLERANCE  # the scaling is really there


def test_top_k_top_p_log_probs_are_of_the_filtered_distribution(rollout, tokenizer, hf_model):
    sampling = SamplingConfig(n=2, temperature=0.8, top_k=20, top_p=0.9, seed=3)
    out = rollout.generate(make_prompts(tokenizer), sampling)
    assert max_log_prob_error(hf_model, out, temperature=0.8, top_k=20, top_p=0.9) <= TOLERANCE
    assert max_log_prob_error(hf_model, out, temperature=0.8) > 10 * TOLERANCE


def _first_new_token(response: list[int]) -> int:
    return next(k for k in range(1, len(response)) if response[k] not in response[:k])


def test_eos_ends_response_mask_at_the_eos_token(rollout, tokenizer, monkeypatch):
    prompts = make_prompts(tokenizer, PROMPTS[:1])
    free = rollout.generate(prompts, GREEDY).batch["responses"][0].tolist()
    k = _first_new_token(free)
    monkeypatch.setattr(rollout, "eos_ids", frozenset({free[k]}))  # make that token an EOS
    out = rollout.generate(prompts, GREEDY)
    assert out.batch["response_mask"][0].tolist() == [1] * (k + 1) + [0] * (len(free) - k - 1)
    assert out.batch["responses"][0, : k + 1].tolist() == free[: k + 1]
    assert (out.batch["responses"][0, k + 1 :] == rollout.pad_token_id).all()
    assert (out.batch["rollout_log_probs"][0, k + 1 :] == 0).all()
    assert out.batch["attention_mask"][0, -len(free):].tolist() == out.batch["response_mask"][0].tolist()


def _stop_point(tokenizer, response: list[int]) -> tuple[int, str] | None:
    """A step k >= 2 that adds clean text, and the shortest stop string ending there (None if none)."""
    texts = [tokenizer.decode(response[:k], skip_special_tokens=True) for k in range(len(response) + 1)]
    for k in range(2, len(response) - 1):
        if len(texts[k + 1]) > len(texts[k]) and "\ufffd" not in texts[k + 1]:
            return k, next(texts[k + 1][-m:] for m in range(1, len(texts[k + 1]) + 1) if texts[k + 1][-m:] not in texts[k])
    return None


def test_stop_string_ends_response_mask_at_the_completing_token(rollout, tokenizer):
    prompts = make_prompts(tokenizer)
    free = rollout.generate(prompts, GREEDY).batch["responses"].tolist()
    row, (k, stop) = next((i, p) for i, p in enumerate(_stop_point(tokenizer, r) for r in free) if p is not None)
    out = rollout.generate(prompts[row], SamplingConfig(n=1, do_sample=False, stop=[stop]))
    assert out.batch["response_mask"][0].tolist() == [1] * (k + 1) + [0] * (len(free[row]) - k - 1)
    assert out.batch["responses"][0, : k + 1].tolist() == free[row][: k + 1]


def test_stop_token_id_ends_response_mask_at_that_token(rollout, tokenizer):
    prompts = make_prompts(tokenizer)
    free = rollout.generate(prompts, GREEDY).batch["responses"][0].tolist()
    k = next(i for i in range(1, len(free)) if free[i] not in free[:i])  # its first position: where the stop must end it
    out = rollout.generate(prompts[0:1], {"n": 1, "do_sample": False, "stop_token_ids": [free[k]]})
    assert out.batch["response_mask"][0].tolist() == [1] * (k + 1) + [0] * (len(free) - k - 1)
    assert out.batch["responses"][0, : k + 1].tolist() == free[: k + 1]


def test_n_samples_stay_grouped_with_their_uid(rollout, tokenizer):
    prompts = make_prompts(tokenizer, ground_truth=["x", "y", "z"])
    out = rollout.generate(prompts, SamplingConfig(n=3, temperature=1.0, seed=5))
    assert len(out) == 9
    assert list(out.non_tensor_batch["uid"]) == [f"uid-{i}" for i in range(3) for _ in range(3)]
    assert list(out.non_tensor_batch["ground_truth"]) == [g for g in "xyz" for _ in range(3)]
    for group in range(3):
        rows = out.batch["prompts"][3 * group : 3 * group + 3]
        assert (rows == prompts.batch["input_ids"][group]).all()
        samples = {tuple(r.tolist()) for r in out.batch["responses"][3 * group : 3 * group + 3]}
        assert len(samples) > 1  # the n samples are not copies of one sample


def test_seeded_sampling_reproduces_and_steps_differ(rollout, tokenizer):
    sampling = SamplingConfig(n=2, temperature=1.0, seed=123)
    prompts = make_prompts(tokenizer)
    prompts.meta_info["global_step"] = 4
    first, again = rollout.generate(prompts, sampling), rollout.generate(prompts, sampling)
    assert torch.equal(first.batch["responses"], again.batch["responses"])
    assert torch.equal(first.batch["rollout_log_probs"], again.batch["rollout_log_probs"])
    prompts.meta_info["global_step"] = 5
    later = rollout.generate(prompts, sampling)
    assert not torch.equal(first.batch["responses"], later.batch["responses"])


def test_seeded_sampling_reproduces_over_many_long_prompts(rollout, tokenizer):
    # ~13k prompt tokens: more than one vLLM scheduler step's token budget (chunked prefill would split them)
    generator = torch.Generator().manual_seed(0)
    rows = [torch.randint(3, 300, (int(n),), generator=generator).tolist() for n in torch.randint(250, 290, (48,))]
    prompts = make_prompts(tokenizer, token_lists=rows)
    sampling = SamplingConfig(n=1, temperature=1.0, seed=77)
    first, again = rollout.generate(prompts, sampling), rollout.generate(prompts, sampling)
    assert first.batch["response_mask"].sum() > 0
    assert torch.equal(first.batch["responses"], again.batch["responses"])


def test_too_long_prompt_errors_or_truncates_and_engine_survives(rollout, tokenizer, hf_model, monkeypatch):
    budget = rollout.max_model_len - 8
    long_prompt = make_prompts(tokenizer, token_lists=[[5] * 3, list(range(3, 3 + budget + 7))])
    with pytest.raises(PromptTooLongError, match=r"prompt row 1 has \d+ tokens.*truncate_left"):
        rollout.generate(long_prompt, GREEDY)
    assert rollout.generate(make_prompts(tokenizer), GREEDY).batch["response_mask"].sum() > 0  # still serving
    monkeypatch.setattr(rollout.config, "prompt_overflow", "truncate_left")
    out = rollout.generate(long_prompt, GREEDY)
    kept = out.batch["prompts"][1][out.batch["attention_mask"][1, : out.batch["prompts"].shape[1]].bool()]
    assert kept.tolist() == list(range(3, 3 + budget + 7))[-budget:]
    assert max_log_prob_error(hf_model, out) <= TOLERANCE


def test_empty_prompt_list_gives_empty_dataproto(rollout, tokenizer):
    out = rollout.generate(make_prompts(tokenizer)[0:0], SamplingConfig(n=4))
    assert len(out) == 0 and set(OUTPUT_TENSOR_KEYS) <= set(out.batch) and "uid" in out.non_tensor_batch


def test_weight_update_in_small_buckets_matches_new_weights(rollout, tokenizer, hf_model, monkeypatch):
    original = {k: v.clone() for k, v in hf_model.state_dict().items()}
    new = perturbed_state(hf_model)
    monkeypatch.setattr(rollout.config, "weight_sync_bucket_mb", 0.01)  # fused q/k/v and gate/up span buckets
    try:
        loaded = rollout.update_weights(new.items())
        assert loaded == sum(t.numel() * t.element_size() for t in new.values())
        stale_error = max_log_prob_error(hf_model, rollout.generate(make_prompts(tokenizer), GREEDY))
        hf_model.load_state_dict(new)
        assert max_log_prob_error(hf_model, rollout.generate(make_prompts(tokenizer), GREEDY)) <= TOLERANCE
        assert stale_error > 100 * TOLERANCE  # the check can tell old weights from new
    finally:
        rollout.update_weights(original.items())


def test_partial_or_unknown_sync_is_refused_until_a_full_sync(rollout, tokenizer, hf_model):
    original = {k: v.clone() for k, v in hf_model.state_dict().items()}
    new = perturbed_state(hf_model, seed=2)
    partial = [(k, v) for k, v in new.items() if "layers.1." not in k]
    with pytest.raises(WeightSyncError, match="stale"):
        rollout.update_weights(partial)
    with pytest.raises(WeightSyncError, match="failed part-way"):
        rollout.generate(make_prompts(tokenizer), GREEDY)
    with pytest.raises(WeightSyncError, match="does not have"):
        rollout.update_weights([*new.items(), ("model.layers.99.mlp.up_proj.weight", torch.zeros(1))])
    rollout.update_weights(original.items())
    assert max_log_prob_error(hf_model, rollout.generate(make_prompts(tokenizer), GREEDY)) <= TOLERANCE
