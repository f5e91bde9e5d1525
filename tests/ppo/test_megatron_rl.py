"""RL through Ray on the megatron engine at tensor parallel size 2 (issue 14).

* GRPO with the actor and the reference on megatron: two worker processes form one data-parallel group
  of two TP ranks, so mesh dispatch sends each mini-batch to both and collects from TP rank 0; vLLM
  samples, the TP-sharded weights are gathered and synced into it after every update, and the
  train/inference log-prob mismatch stays at fp32 noise;
* PPO with the critic on megatron too (a value head on the GPTModel, trained on GAE returns).

The learning test (from the demo's SFT warm start, the demo's margin) is in tests/demo/test_grpo_learns.py.
"""

from __future__ import annotations

import math

import pytest
from conftest import base_overrides, read_jsonl, run_main_ppo
from transformers import AutoModelForCausalLM

pytestmark = pytest.mark.timeout(900)
MISMATCH_MEAN = 1e-4  # vLLM's sampling log-probs vs the trainer's, fp32 on both sides: the bound
TP2 = ["trainer.n_procs_per_node=2", "actor.engine=megatron", "actor.engine.tensor_model_parallel_size=2",
       "actor.engine.optimizer.lr=1e-3", "trainer.total_training_steps=2", "trainer.resume_mode=disable", "rollout=vllm"]


def _run(tiny_model, addition_data, run_dir, extra: list[str], metric: str) -> list[dict]:
    """``main_ppo`` at TP=2 with ``extra`` overrides; the metrics records that have ``metric``."""
    result = run_main_ppo(base_overrides(tiny_model, addition_data, run_dir) + TP2 + extra)
    assert result.returncode == 0, result.stderr[-4000:]
    records = [r for r in read_jsonl(run_dir / "metrics.jsonl") if metric in r]
    assert len(records) == 2, f"{len(records)} steps logged {metric}"
    return records


def test_grpo_with_megatron_at_tp2_trains_and_syncs(tiny_model, addition_data, tmp_path):
    run_dir = tmp_path / "run"
    grpo = ["algorithm=grpo", "ref.engine=megatron", "ref.engine.tensor_model_parallel_size=2", "actor.use_kl_loss=true",
            "rollout.calculate_log_probs=true"]
    records = _run(tiny_model, addition_data, run_dir, grpo, "actor/grad_norm")
    assert all(r["actor/grad_norm"] > 0 for r in records)
    print("vLLM vs trainer log-prob difference (mean, max) per step:",
          [(r["rollout/logprob_diff_mean"], r["rollout/logprob_diff_max"]) for r in records])
    assert all(r["weight_sync/mb"] > 0 and r["rollout/logprob_diff_mean"] <= MISMATCH_MEAN for r in records)
    AutoModelForCausalLM.from_pretrained(run_dir / "hf")


@pytest.mark.full  # make test: megatron's GRPO at TP2 here, and the critic on FSDP2 (tests/ppo/test_driver.py)
def test_ppo_with_the_critic_on_megatron_too(tiny_model, addition_data, tmp_path):
    ppo = ["algorithm=ppo", "critic.engine=megatron", "critic.engine.tensor_model_parallel_size=2",
           "critic.ppo_mini_batch_size=2", "critic.engine.optimizer.lr=1e-3"]
    records = _run(tiny_model, addition_data, tmp_path / "run", ppo, "critic/grad_norm")
    print("critic, actor grad norms per step:", [(r["critic/grad_norm"], r["actor/grad_norm"]) for r in records])
    assert all(math.isfinite(r["critic/grad_norm"]) and r["critic/grad_norm"] > 0 and not r["critic/skipped"] for r in records)
    assert all(r["actor/grad_norm"] > 0 for r in records)
    assert records[0]["critic/vf_loss"] != records[1]["critic/vf_loss"]
