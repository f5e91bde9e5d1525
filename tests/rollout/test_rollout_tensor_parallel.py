"""The vLLM rollout at ``tensor_parallel_size=2``: the model's two shards in vLLM's own processes (multiprocess
executor; on this one-NUMA-node CPU with each rank's core named by ``tensor_parallel_binding``: here "0|1").

Its greedy responses and log-probs are those of the one-process engine, and a weight sync (full HF-named tensors,
written once to shared memory and reloaded by each shard) reaches both shards: after it the log-probs are the HF
model's with the new weights. ``tiny-qwen3`` ties its LM head to the embedding, so the sync also shows the CPU
build's repack of tied layers reaching the shard processes.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil
import pytest
import torch
from rollout_testlib import make_prompts, max_log_prob_error, perturbed_state, rollout_config

from rlflow.config.schema import SamplingConfig
from rlflow.config.validation import ConfigError
from rlflow.data.tasks.corpus import tokenizer_corpus
from rlflow.models.hf_checkpoint import load_causal_lm
from rlflow.models.loading import load_tokenizer
from rlflow.models.presets import build_preset
from rlflow.rollout import build_rollout
from rlflow.rollout.tensor_parallel import (ABANDONED_AFTER_S, check_tensor_parallel_model,
                                            remove_abandoned_sync_folders, shared_weights_file)
from rlflow.rollout.vllm_cpu_compat import THREADS_BIND_ENV, tensor_parallel_binding

TOLERANCE = 1e-4  # fp32 engine vs fp32 HF forward (the tied-sync test's bound)
SHARD_AGREEMENT = 1e-5  # two shards vs one: the same fp32 math, summed in another order
GREEDY = SamplingConfig(n=1, do_sample=False)
pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def qwen3_path(tmp_path_factory):
    return build_preset(tmp_path_factory.mktemp("tp") / "tiny-qwen3", tokenizer_corpus(), preset="tiny-qwen3", seed=0)


def _greedy(path, prompts, size: int):
    rollout = build_rollout(rollout_config("vllm", prompt_length=64, response_length=8, tensor_parallel_size=size),
                            path, "cpu")
    return rollout, rollout.generate(prompts, GREEDY)


def _sync_files() -> set[str]:
    return {entry for entry in os.listdir("/dev/shm") if entry.startswith("rlflow-weights-")}


def test_two_shards_generate_as_one_and_take_a_weight_sync(qwen3_path, monkeypatch):
    monkeypatch.delenv(THREADS_BIND_ENV, raising=False)
    prompts = make_prompts(load_tokenizer(qwen3_path), token_lists=[[(7 * i + r) % 300 + 3 for i in range(12 + r)]
                                                                     for r in range(3)])
    single, expected = _greedy(qwen3_path, prompts, 1)
    single.shutdown()
    files_before = _sync_files()
    sharded, output = _greedy(qwen3_path, prompts, 2)
    shards = [child for child in psutil.Process().children(recursive=True) if child.name().startswith("VLLM::Worker_TP")]
    try:
        assert THREADS_BIND_ENV not in os.environ  # set for the shards' start only
        assert len(shards) == 2, "the two shards should run in processes of their own"
        assert sorted(shard.cpu_affinity() for shard in shards) == [[0], [1]]  # a core each on this 2-core box
        assert torch.equal(output.batch["responses"], expected.batch["responses"])
        difference = (output.batch["rollout_log_probs"] - expected.batch["rollout_log_probs"]).abs().max().item()
        assert difference <= SHARD_AGREEMENT, difference

        model = load_causal_lm(qwen3_path, dtype="float32").eval()
        model.load_state_dict(perturbed_state(model))
        stale_error = max_log_prob_error(model, sharded.generate(prompts, GREEDY))
        sharded.update_weights([(name, tensor.detach()) for name, tensor in model.named_parameters()])
        assert max_log_prob_error(model, sharded.generate(prompts, GREEDY)) <= TOLERANCE
        assert stale_error > 100 * TOLERANCE  # the check tells the old weights from the new
        assert _sync_files() == files_before  # the sync's file is gone
    finally:
        sharded.shutdown()
    psutil.wait_procs(shards, timeout=30)
    assert not [shard for shard in shards if shard.is_running() and shard.status() != psutil.STATUS_ZOMBIE]


def test_the_heads_must_split_over_the_shards(qwen3_path):
    check_tensor_parallel_model(2, qwen3_path)
    check_tensor_parallel_model(4, qwen3_path)  # 4 query heads; 2 key/value heads, each held by two ranks
    with pytest.raises(ConfigError, match="3 ranks cannot split the model's 4 attention heads and 2 key/value heads"):
        check_tensor_parallel_model(3, qwen3_path)


def test_the_thread_binding_gives_each_rank_its_cores(monkeypatch):
    monkeypatch.delenv(THREADS_BIND_ENV, raising=False)
    monkeypatch.setattr("rlflow.rollout.vllm_cpu_compat._numa_nodes", lambda: 1)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3, 4, 5, 6, 7})
    assert tensor_parallel_binding(2, replica_rank=0, threads=2) == "0,1|2,3"
    assert tensor_parallel_binding(2, replica_rank=1, threads=2) == "4,5|6,7"
    assert tensor_parallel_binding(2, replica_rank=2, threads=2) == "0,1|2,3"  # wraps
    assert tensor_parallel_binding(1, replica_rank=0, threads=1) is None
    monkeypatch.setenv(THREADS_BIND_ENV, "3|5")
    assert tensor_parallel_binding(2, replica_rank=0, threads=1) is None  # the user's: kept
    monkeypatch.delenv(THREADS_BIND_ENV)
    monkeypatch.setattr("rlflow.rollout.vllm_cpu_compat._numa_nodes", lambda: 2)
    assert tensor_parallel_binding(2, replica_rank=0, threads=1) is None  # vLLM's own: a node per rank


def test_the_shared_weights_file_holds_the_sync_and_is_removed_however_the_block_ends():
    tensors = [("a.weight", torch.arange(6.0).reshape(2, 3)), ("b.bias", torch.ones(4, dtype=torch.bfloat16))]
    with shared_weights_file(iter(tensors)) as path:
        from safetensors.torch import load_file

        assert path.startswith("/dev/shm/rlflow-weights-")
        loaded = load_file(path)
        assert all(torch.equal(loaded[name], tensor) for name, tensor in tensors)
    assert not os.path.exists(os.path.dirname(path))
    with pytest.raises(RuntimeError, match="the load failed"):
        with shared_weights_file(iter(tensors)) as path:
            raise RuntimeError("the load failed")
    assert not os.path.exists(os.path.dirname(path))


def test_a_sync_folder_left_by_a_killed_process_is_removed_and_nothing_else(tmp_path):
    finished = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead, alive = int(finished.stdout), os.getpid()
    old = time.time() - ABANDONED_AFTER_S - 60
    folders = {name: tmp_path / name for name in (f"rlflow-weights-{dead}-old", f"rlflow-weights-{dead}-new",
                                                  f"rlflow-weights-{alive}-old", "rlflow-weights-x1y2", "other-1-old")}
    for name, folder in folders.items():
        folder.mkdir()
        (folder / "weights.safetensors").write_bytes(b"x")
        if name.endswith("old"):
            os.utime(folder, (old, old))
    assert remove_abandoned_sync_folders(tmp_path) == [f"rlflow-weights-{dead}-old"]
    assert sorted(path.name for path in tmp_path.iterdir()) == sorted(set(folders) - {f"rlflow-weights-{dead}-old"})
    with shared_weights_file(iter([("a", torch.ones(2))])) as path:
        assert os.path.basename(os.path.dirname(path)).startswith(f"rlflow-weights-{alive}-")
