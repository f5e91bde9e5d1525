"""RL through Ray at the layouts beyond TP=2 x DP=1 (issue 44): megatron DP=2 x TP=2 and PP=2, torchtitan PP=2,
and a tensor-parallel rollout (two vLLM shards) on a split rollout pool.

Each run is ``main_ppo`` on the 4-layer tiny presets (``tiny-qwen3``, ``tiny-llama``: 4 layers split into 2
pipeline stages), 3 steps, colocated: mesh dispatch sends each data-parallel shard to its TP/PP group and
collects from one rank of it, and after every update the sharded weights are gathered and synced into the
vLLM replica of every process; at DP=2 x TP=2 the actor's AdamW state is sharded over data parallelism
(``use_distributed_optimizer``) and its sequence over the TP ranks (``sequence_parallel``; the reference without).
The sync is checked by the rollout's own log-probs of its sampled tokens against the trainer's
(``rollout/logprob_diff_max``), fp32 on both sides, on the steps after an update.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from conftest import base_overrides, read_jsonl, run_main_ppo

from rlflow.data.tasks.corpus import tokenizer_corpus
from rlflow.models.presets import build_preset

pytestmark = [pytest.mark.full, pytest.mark.timeout(1800)]
STEPS = 3
SYNC_MAX = 1e-5  # the bound: vLLM's log-prob of a sampled token vs the trainer's after a sync, fp32 on both sides
COMMON = ["rollout=vllm", "rollout.calculate_log_probs=true", f"trainer.total_training_steps={STEPS}",
          "trainer.resume_mode=disable", "actor.engine.optimizer.lr=1e-3", "data.val_files=[]"]


@pytest.fixture(scope="module")
def presets(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("presets")
    return {name: build_preset(root / name, tokenizer_corpus(), preset=name, seed=0) for name in ("tiny-qwen3", "tiny-llama")}


def megatron(role: str, tp: int = 1, pp: int = 1) -> list[str]:
    """``role`` on megatron at ``tp`` x ``pp`` (data parallel: the rest of the processes)."""
    return [f"{role}.engine=megatron", f"{role}.engine.tensor_model_parallel_size={tp}",
            f"{role}.engine.pipeline_model_parallel_size={pp}"]


def _run(model: Path, data: Path, run_dir: Path, extra: list[str]) -> list[dict]:
    result = run_main_ppo(base_overrides(model, data, run_dir) + COMMON + extra, timeout=1500)
    assert result.returncode == 0, result.stderr[-4000:]
    records = read_jsonl(run_dir / "metrics.jsonl")
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))
    print("grad norm, rollout vs trainer log-prob difference (max) per step:",
          [(r["actor/grad_norm"], r["rollout/logprob_diff_max"]) for r in records])
    assert all(r["actor/grad_norm"] > 0 and r["weight_sync/mb"] > 0 for r in records)
    assert all(r["rollout/logprob_diff_max"] <= SYNC_MAX for r in records[1:]), "a sync after an update is not exact"
    return records


def torchtitan(role: str, pp: int) -> list[str]:
    """``role`` on torchtitan with ``pp`` pipeline stages (torch's 1F1B schedule)."""
    return [f"{role}.engine=torchtitan", f"{role}.engine.pipeline_parallel_size={pp}"]


LAYOUTS = {  # name -> (preset, processes, overrides)
    "dp2xtp2": ("tiny-qwen3", 4, megatron("actor", tp=2) + megatron("ref", tp=2)
                + ["actor.engine.use_distributed_optimizer=true",  # AdamW's state sharded over the 2 DP ranks
                   "actor.engine.sequence_parallel=true"]),  # the actor's sequence split over its TP ranks
    "pp2": ("tiny-llama", 2, megatron("actor", pp=2) + megatron("ref", pp=2)),
    "torchtitan_pp2": ("tiny-llama", 2, torchtitan("actor", pp=2) + torchtitan("ref", pp=2)),
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_grpo_trains_and_syncs_exactly(layout, presets, addition_data, tmp_path):
    preset, procs, overrides = LAYOUTS[layout]
    _run(presets[preset], addition_data, tmp_path / "run", [
        f"trainer.n_procs_per_node={procs}", f"trainer.cpus_per_proc={2 / procs}", "algorithm=grpo",
        "actor.use_kl_loss=true", *overrides])


def test_ppo_with_a_pipeline_parallel_critic(presets, addition_data, tmp_path):
    records = _run(presets["tiny-llama"], addition_data, tmp_path / "run", [
        "trainer.n_procs_per_node=2", "trainer.cpus_per_proc=1", "algorithm=ppo", *megatron("actor", pp=2),
        *megatron("critic", pp=2), "critic.ppo_mini_batch_size=2", "critic.engine.optimizer.lr=1e-3"])
    assert all(math.isfinite(r["critic/grad_norm"]) and r["critic/grad_norm"] > 0 for r in records)
    assert records[0]["critic/vf_loss"] != records[-1]["critic/vf_loss"]


ROLLOUT_ACTORS = {  # name -> (processes, the actor's engine)
    "fsdp2": (1, []),
    "megatron_tp2": (2, megatron("actor", tp=2)),  # the trainer's TP=2 shards gathered, then split again by vLLM
}


@pytest.mark.parametrize("actor", list(ROLLOUT_ACTORS))
def test_grpo_with_a_tensor_parallel_rollout_syncs_exactly(actor, presets, addition_data, tmp_path):
    """Split placement with ``rollout.tensor_parallel_size=2``: one rollout worker whose vLLM engine runs its two
    shards in processes of their own (a CPU each; ``trainer.cpus_per_proc=0.5`` fits the run in two cores)."""
    procs, overrides = ROLLOUT_ACTORS[actor]
    _run(presets["tiny-qwen3"], addition_data, tmp_path / "run", [
        "trainer.placement=split", "rollout.num_replicas=1", "rollout.tensor_parallel_size=2",
        f"trainer.n_procs_per_node={procs}", "trainer.cpus_per_proc=0.5", "algorithm=grpo", *overrides])
    logs = "".join(path.read_text() for path in (tmp_path / "run" / "logs").glob("*.log"))
    assert "vLLM tensor-parallel ranks bound to cores 0|1" in logs  # the replica did start two shards
