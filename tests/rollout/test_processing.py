"""Shared rollout pieces without an engine: prompt fitting, response ends, output layout, sampling, seeds."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from rollout_testlib import make_prompts

from rlflow.config.schema import SamplingConfig
from rlflow.config.validation import ConfigError
from rlflow.protocol import DataProto
from rlflow.rollout.processing import (
    PromptTooLongError,
    ResponseEnd,
    build_rollout_output,
    fit_prompts,
    prompt_token_lists,
)
from rlflow.rollout.sampling import request_seed, resolve_sampling


def test_prompt_token_lists_strip_left_padding(tokenizer):
    prompts = make_prompts(tokenizer, token_lists=[[5, 6, 7], [9]])
    assert prompts.batch["input_ids"].tolist() == [[5, 6, 7], [0, 0, 9]]
    assert prompt_token_lists(prompts) == [[5, 6, 7], [9]]


def test_empty_prompt_row_is_refused(tokenizer):
    prompts = make_prompts(tokenizer, token_lists=[[5, 6], [7]])
    prompts.batch["attention_mask"][1] = 0
    with pytest.raises(ValueError, match=r"prompt rows \[1\] are empty"):
        prompt_token_lists(prompts)


def test_fit_prompts_error_names_row_and_fix():
    rows = [[1] * 4, [2] * 9, [3] * 12]
    with pytest.raises(PromptTooLongError, match=r"prompt row 1 has 9 tokens.*rollout.max_model_len=12.*truncate_left"):
        fit_prompts(rows, max_new_tokens=4, max_model_len=12, policy="error")


def test_fit_prompts_truncate_left_keeps_the_end():
    rows = [[1, 2, 3], list(range(100, 112))]
    fitted = fit_prompts(rows, max_new_tokens=4, max_model_len=10, policy="truncate_left")
    assert fitted == [[1, 2, 3], list(range(106, 112))]


def test_fit_prompts_rejects_unknown_policy_and_no_room():
    with pytest.raises(ValueError, match="prompt_overflow must be one of"):
        fit_prompts([[1]], 2, 10, "drop")
    with pytest.raises(PromptTooLongError, match="leaves no room"):
        fit_prompts([[1]], 10, 10, "truncate_left")


def _encode(tokenizer, text):
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def test_response_end_eos_and_stop_strings(tokenizer):
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    head, tail = _encode(tokenizer, "the answer is 42"), _encode(tokenizer, " and then more words follow")
    end = ResponseEnd(frozenset({eos}), ("is 42",), tokenizer)
    assert end.length(head + tail) == len(head)  # the token completing the stop string is kept
    assert end.length(head[:2] + [eos] + tail) == 3  # an earlier EOS wins, and is kept
    no_stop = ResponseEnd(frozenset({eos}), (), tokenizer)
    assert no_stop.length(head + [eos] + tail) == len(head) + 1
    assert no_stop.length(head + tail) == len(head + tail) and no_stop.end(head + tail) is None


def test_build_output_layout_groups_and_padding(tokenizer):
    prompts = make_prompts(tokenizer, token_lists=[[11, 12, 13], [21]], ground_truth=["a", "b"])
    prompts.meta_info["global_step"] = 3
    sampling = resolve_sampling(SamplingConfig(n=2, max_new_tokens=4), default_max_new_tokens=99)
    responses = [[1, 2], [3, 4, 5, 6], [7], [8, 9, 10]]
    log_probs = [[-0.5, -1.0], [-1, -2, -3, -4], [-0.25], [-1, -1, -1]]
    out = build_rollout_output(prompts, [[11, 12, 13], [21]], responses, log_probs, sampling, pad_token_id=0)
    assert len(out) == 4
    assert list(out.non_tensor_batch["uid"]) == ["uid-0", "uid-0", "uid-1", "uid-1"]
    assert list(out.non_tensor_batch["ground_truth"]) == ["a", "a", "b", "b"]
    assert out.meta_info["global_step"] == 3
    assert out.batch["prompts"].tolist() == [[11, 12, 13]] * 2 + [[0, 0, 21]] * 2
    assert out.batch["responses"].tolist() == [[1, 2, 0, 0], [3, 4, 5, 6], [7, 0, 0, 0], [8, 9, 10, 0]]
    assert out.batch["response_mask"].tolist() == [[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0], [1, 1, 1, 0]]
    assert out.batch["rollout_log_probs"][0].tolist() == [-0.5, -1.0, 0.0, 0.0]
    assert torch.equal(out.batch["input_ids"], torch.cat([out.batch["prompts"], out.batch["responses"]], 1))
    assert out.batch["attention_mask"][2].tolist() == [0, 0, 1, 1, 0, 0, 0]
    assert out.batch["position_ids"][0].tolist() == [0, 1, 2, 3, 4, 5, 6]
    assert out.batch["position_ids"][2].tolist() == [0, 0, 0, 1, 2, 3, 4]


def test_build_output_for_no_prompts(tokenizer):
    prompts = make_prompts(tokenizer, token_lists=[[1, 2]])[0:0]
    sampling = resolve_sampling(SamplingConfig(n=3, max_new_tokens=5), default_max_new_tokens=5)
    out = build_rollout_output(prompts, [], [], [], sampling, pad_token_id=0)
    assert isinstance(out, DataProto) and len(out) == 0
    assert out.batch["responses"].shape == (0, 5) and out.batch["input_ids"].shape == (0, 7)
    assert "uid" in out.non_tensor_batch


def test_resolve_sampling_greedy_lengths_and_errors():
    greedy = resolve_sampling(SamplingConfig(do_sample=True, temperature=0.0), default_max_new_tokens=7)
    assert greedy.greedy and greedy.max_new_tokens == 7
    assert resolve_sampling(SamplingConfig(do_sample=False, temperature=0.9), 7).greedy
    sampled = resolve_sampling({"n": 3, "temperature": 0.7, "top_k": 5, "max_new_tokens": 2, "stop": ["x"]}, 7)
    assert (sampled.n, sampled.greedy, sampled.temperature, sampled.top_k, sampled.max_new_tokens, sampled.stop) == (
        3, False, 0.7, 5, 2, ("x",)
    )
    with pytest.raises(ConfigError, match="top_k"):
        resolve_sampling(SamplingConfig(top_k=0), 7)
    with pytest.raises(ConfigError, match="top_p"):
        resolve_sampling(SamplingConfig(top_p=0.0), 7)


def test_request_seed_is_stable_and_distinct():
    seeds = {request_seed(0, step, replica, row, sample) for step in range(3) for replica in range(2)
             for row in range(4) for sample in range(4)}
    assert len(seeds) == 3 * 2 * 4 * 4
    assert request_seed(5, 1, 2) == request_seed(5, 1, 2) and 0 <= request_seed(5, 1, 2) < 2**31


def test_seed_parts_are_not_interchangeable():
    assert request_seed(0, 1, 2) != request_seed(0, 2, 1)
    assert np.unique([request_seed(s) for s in range(100)]).size == 100
