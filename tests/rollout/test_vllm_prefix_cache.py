"""vLLM-only behaviour: the prefix cache after a weight sync, and what the engine leaves in its host process.

The prefix-cache test is the teeth of the sync check: the same comparison that passes after a
normal ``update_weights`` fails when the reset is skipped. With a 24-token prompt it also shows that
on CPU a prompt shorter than vLLM's default 128-token block is served from the prefix cache
(``vllm_cpu_compat``'s 16-token blocks): were it recomputed, the skipped reset would change nothing.
"""

from __future__ import annotations

import pytest
import torch
from rollout_testlib import make_prompts, max_log_prob_error, perturbed_state, rollout_config

from rlflow.config.schema import SamplingConfig
from rlflow.rollout import build_rollout

GREEDY = SamplingConfig(n=1, do_sample=False)


@pytest.fixture(scope="module")
def vllm_rollout(tiny_path):
    engine = build_rollout(rollout_config("vllm", prompt_length=300, response_length=8), tiny_path, "cpu")
    yield engine
    engine.shutdown()


@pytest.mark.parametrize("prompt_tokens", [280, 24], ids=["long-prompt", "short-prompt"])
def test_sync_without_prefix_cache_reset_serves_stale_log_probs(vllm_rollout, tokenizer, hf_model, monkeypatch,
                                                                 prompt_tokens):
    prompt = make_prompts(tokenizer, token_lists=[[(7 * i) % 300 + 3 for i in range(prompt_tokens)]])
    original = {k: v.clone() for k, v in hf_model.state_dict().items()}
    first, second = perturbed_state(hf_model, seed=4), perturbed_state(hf_model, seed=5)
    try:
        vllm_rollout.generate(prompt, GREEDY)  # fills the prefix cache with the original weights' KV
        vllm_rollout.update_weights(first.items())
        hf_model.load_state_dict(first)
        assert max_log_prob_error(hf_model, vllm_rollout.generate(prompt, GREEDY)) <= 1e-4

        monkeypatch.setattr(vllm_rollout._llm, "reset_prefix_cache", lambda *args, **kwargs: True)
        vllm_rollout.update_weights(second.items())
        hf_model.load_state_dict(second)
        assert max_log_prob_error(hf_model, vllm_rollout.generate(prompt, GREEDY)) > 1e-2  # stale prompt KV
        monkeypatch.undo()
        vllm_rollout._llm.reset_prefix_cache()
        assert max_log_prob_error(hf_model, vllm_rollout.generate(prompt, GREEDY)) <= 1e-4
    finally:
        vllm_rollout.update_weights(original.items())


def test_engine_leaves_thread_control_to_the_host_process(vllm_rollout):
    # vLLM's CPU worker swaps torch.set_num_threads for a no-op; the rollout must put it back
    assert torch.set_num_threads is torch._C.set_num_threads
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    assert torch.get_num_threads() == 2
    torch.set_num_threads(before)
