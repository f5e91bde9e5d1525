"""The KV cache sizing rule: kv_cache_space_gb GiB, or on a GPU gpu_memory_utilization of the free device memory
(refused on CPU, before Ray starts when the device is known). The GPU case is a unit test of the rule and of the
engine arguments the vLLM rollout builds from it (no GPU here: the device's free and total memory are given)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from one_line_errors import one_line_error
from rlflow.config import ConfigError
from rlflow.rollout.kv_cache import GiB, kv_cache_bytes, vllm_start_budget
from rlflow.rollout.vllm_rollout import VLLMRollout
from rlflow.trainer.entry_points import compose_ppo_config

FREE, TOTAL = 52 * GiB + 123_456, 141 * GiB  # an H200 with a colocated actor already loaded


def test_the_fraction_of_free_gpu_memory_sizes_the_cache_and_kv_cache_space_gb_is_not_used():
    assert kv_cache_bytes(1.0, 0.6, FREE) == int(0.6 * FREE)
    assert kv_cache_bytes(None, 0.25, FREE) == int(0.25 * FREE)
    assert kv_cache_bytes(0.5, None, FREE) == GiB // 2  # no fraction: GiB on a GPU as on the CPU
    assert kv_cache_bytes(2.0, None, None) == 2 * GiB


@pytest.mark.parametrize("space, fraction, message", [
    (1.0, 0.6, "this rollout runs on the CPU; leave it null there and size the cache with rollout.kv_cache_space_gb"),
    (None, None, "are both null"),
    (1.0, 1.5, "a fraction of free GPU memory in (0, 1], got 1.5"),
])
def test_what_the_rule_refuses(space, fraction, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        kv_cache_bytes(space, fraction, None if fraction == 0.6 else FREE)


def test_vllms_start_budget_is_the_share_free_now():
    assert vllm_start_budget(FREE, TOTAL) == 0.368  # 52.0001 / 141 = 0.36879..., rounded down
    assert vllm_start_budget(FREE, TOTAL) * TOTAL <= FREE


def test_the_vllm_rollout_hands_vllm_the_sized_cache_on_a_gpu(monkeypatch):
    """VLLMRollout._engine_kwargs on a CUDA device whose free/total memory are given (the rollout's own wiring)."""
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (FREE, TOTAL))
    rollout = object.__new__(VLLMRollout)
    rollout.config = SimpleNamespace(trust_remote_code=False, dtype="bfloat16", seed=0, max_num_seqs=8, enforce_eager=True,
                                     enable_prefix_caching=True, kv_cache_space_gb=1.0, gpu_memory_utilization=0.6,
                                     engine_kwargs={})
    rollout.__dict__.update(model_path="/m", replica_rank=0, max_model_len=64, logprobs_mode="processed_logprobs",
                            _sleep_enabled=True, _adapter=None, _on_cpu=False, device=torch.device("cuda", 0),
                            _shards=1)
    kwargs = rollout._engine_kwargs()
    assert kwargs["kv_cache_memory_bytes"] == int(0.6 * FREE) and kwargs["gpu_memory_utilization"] == 0.368


def test_config_loading_refuses_a_fraction_for_a_cpu_rollout_and_keeps_it_for_a_gpu_one():
    message = one_line_error(compose_ppo_config, ["trainer.device=cpu", "rollout.gpu_memory_utilization=0.6"], ConfigError)
    assert message.startswith("config key 'rollout.gpu_memory_utilization': it sizes the KV cache as a fraction of free GPU")
    assert "are both null" in one_line_error(compose_ppo_config, ["rollout.kv_cache_space_gb=null"], ConfigError)
    config = compose_ppo_config(["trainer.device=cuda", "rollout.gpu_memory_utilization=0.6"])
    assert config.rollout.gpu_memory_utilization == 0.6
