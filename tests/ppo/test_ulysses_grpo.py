"""GRPO through Ray with Ulysses sequence parallelism (issue 44): the actor and the reference on fsdp2 at
``ulysses_sequence_parallel_size=2`` over the run's two worker processes (one SP group, one data-parallel rank).

Mesh dispatch gives both ranks of the SP group the whole batch and collects from the first; each rank runs half
of every micro-batch's tokens. After every update the weights are synced into vLLM, whose log-probs of its own
sampled tokens must equal the SP trainer's within 1e-5 (fp32 on both sides): a trainer forward that split or
gathered sequences wrongly would miss by far more. Two steps on the tiny preset (4 heads, 2 key/value heads).
"""

from __future__ import annotations

from conftest import base_overrides, read_jsonl, run_main_ppo

STEPS = 2
SYNC_MAX = 1e-5
SP2 = ["engine=fsdp2", "engine.ulysses_sequence_parallel_size=2", "engine.attn_implementation=sdpa_varlen",
       "engine.use_dynamic_bsz=true", "engine.max_token_len_per_micro_batch=64"]


def test_grpo_with_a_sequence_parallel_actor_and_reference(tiny_model, addition_data, tmp_path):
    run_dir = tmp_path / "run"
    result = run_main_ppo(base_overrides(tiny_model, addition_data, run_dir) + [
        "algorithm=grpo", "actor.use_kl_loss=true", "rollout=vllm", "rollout.calculate_log_probs=true",
        "trainer.n_procs_per_node=2", "trainer.cpus_per_proc=1", f"trainer.total_training_steps={STEPS}",
        "trainer.resume_mode=disable", "actor.engine.optimizer.lr=1e-3", "data.val_files=[]",
        *(f"{role}.{option}" for role in ("actor", "ref") for option in SP2)], timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    records = read_jsonl(run_dir / "metrics.jsonl")
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))
    assert all(r["actor/grad_norm"] > 0 and r["actor/kl_loss"] >= 0 for r in records)
    print("rollout vs trainer log-prob difference (max) per step:", [r["rollout/logprob_diff_max"] for r in records])
    assert all(r["rollout/logprob_diff_max"] <= SYNC_MAX for r in records)
