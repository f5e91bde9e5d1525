"""HF backend: ``logprobs_mode: raw_logprobs`` gives the raw model distribution, as vLLM's mode of that name."""

from __future__ import annotations

from rollout_testlib import make_prompts, max_log_prob_error, rollout_config

from rlflow.config.schema import SamplingConfig
from rlflow.rollout import build_rollout


def test_raw_logprobs_ignore_temperature(tiny_path, tokenizer, hf_model):
    with build_rollout(rollout_config("hf", logprobs_mode="raw_logprobs"), tiny_path, "cpu") as rollout:
        out = rollout.generate(make_prompts(tokenizer), SamplingConfig(n=2, temperature=0.6, top_k=10, seed=1))
    assert max_log_prob_error(hf_model, out, temperature=1.0) <= 1e-4
    assert max_log_prob_error(hf_model, out, temperature=0.6, top_k=10) > 1e-3
