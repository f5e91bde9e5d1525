"""``asample`` bodies as the service reads them: prompt scoring options, their checks, and the prompt-score
arrays a response carries (``rlflow.service.sampling``)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from rlflow.protocol import DataProto
from rlflow.rollout.prompt_scores import PromptScores, scores_batch
from rlflow.service.sampling import (
    MAX_PROMPT_TOP_K,
    UNSUPPORTED_OPTIONS,
    SamplingRequest,
    SamplingRequestError,
    prompt_score_arrays,
)
from rlflow.service.wire import TOPK_SENTINEL_LOGPROB

PROMPT = [4, 8, 15, 16, 23]
VOCAB = 24  # the model's embedding rows: PROMPT's largest token is its last


def _body(**options) -> dict:
    return {"sampling_session_id": "s:sample:0", "prompt": {"chunks": [{"type": "encoded_text", "tokens": PROMPT}]},
            "num_samples": 1, "sampling_params": {"max_tokens": 1}, **options}


def _scores(top_k: int) -> DataProto:
    """A one-row batch of prompt scores, as a replica returns it."""
    scores = PromptScores(tuple(-0.5 * i for i in range(1, len(PROMPT))),
                          tuple((i, i + 1) for i in range(1, len(PROMPT))) if top_k else (),
                          tuple((-0.1, -0.2) for _ in range(1, len(PROMPT))) if top_k else ())
    return scores_batch(torch.ones(1, len(PROMPT), dtype=torch.long), [scores], top_k)


def test_compute_logprobs_body_scores_the_prompt_and_runs_alone():
    request = SamplingRequest.from_body(_body(prompt_logprobs=True))
    request.check(max_seq_len=64, vocab_size=VOCAB)
    assert request.scores_prompt and request.batch_key is None
    assert SamplingRequest.from_body(_body()).batch_key is not None  # a plain request may run batched
    log_probs, top = prompt_score_arrays(_scores(0), request)
    assert math.isnan(log_probs[0]) and log_probs[1:].tolist() == [-0.5, -1.0, -1.5, -2.0] and top is None


def test_last_n_leaves_the_earlier_positions_unscored_in_both_arrays():
    request = SamplingRequest.from_body(_body(prompt_logprobs=True, topk_prompt_logprobs=2, prompt_logprobs_last_n=2))
    request.check(max_seq_len=64, vocab_size=VOCAB)
    log_probs, top = prompt_score_arrays(_scores(2), request)
    assert np.isnan(log_probs[:3]).all() and log_probs[3:].tolist() == [-1.5, -2.0]
    assert (top.ids[:3] == 0).all() and (top.logprobs[:3] == TOPK_SENTINEL_LOGPROB).all()
    assert top.ids[3:].tolist() == [[3, 4], [4, 5]]
    top_only = SamplingRequest.from_body(_body(topk_prompt_logprobs=2))
    assert prompt_score_arrays(_scores(2), top_only)[0] is None  # top-k without prompt_logprobs: no log-prob array


@pytest.mark.parametrize("options,message", [
    ({"prompt_logprobs": True, "prompt_logprobs_last_n": len(PROMPT)}, "must be 1..4"),
    ({"prompt_logprobs_last_n": 2}, "needs prompt_logprobs"),
    ({"topk_prompt_logprobs": MAX_PROMPT_TOP_K + 1}, f"0..{MAX_PROMPT_TOP_K}"),
])
def test_scoring_options_out_of_range_are_one_line(options, message):
    with pytest.raises(SamplingRequestError, match=message):
        SamplingRequest.from_body(_body(**options)).check(max_seq_len=64, vocab_size=VOCAB)


def test_a_prompt_token_outside_the_vocabulary_is_one_line():
    with pytest.raises(SamplingRequestError, match="the prompt: token 23 at position 4 is outside the model's vocabulary 0..22"):
        SamplingRequest.from_body(_body()).check(max_seq_len=64, vocab_size=VOCAB - 1)


@pytest.mark.parametrize("option", sorted(UNSUPPORTED_OPTIONS))
def test_options_the_server_does_not_run_say_unsupported_and_why(option):
    with pytest.raises(SamplingRequestError, match=f"unsupported: {option} \\("):
        SamplingRequest.from_body(_body(**{option: 2}))
