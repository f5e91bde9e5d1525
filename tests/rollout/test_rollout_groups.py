"""Rollout in Ray worker groups, end to end, in one Ray session.

* An FSDP2 actor (2 ranks) trains 3 optimizer steps, then syncs its weights both ways:
  colocated (each rank hosts a vLLM replica and loads the export in-process) and split (a
  separate one-replica rollout group reads the buckets from the Ray object store).
* The reference is a vLLM engine started afresh in this process from ``save_hf`` of the trained
  actor: every synced engine must give the same greedy tokens and log-probs (<= 1e-4).
* The 2 colocated replicas serve ``generate_sequences`` side by side: prompts balanced over them,
  results in input order, samples grouped by uid.
* Shutting a colocated engine down keeps the actor's process group (vLLM's own teardown would
  destroy it).
"""

from __future__ import annotations

import pytest
import ray.cloudpickle
import sync_workers
import torch
from rollout_testlib import make_prompts, max_log_prob_error, rollout_config
from sync_workers import TrainerWithRollout

from rlflow.config.schema import SamplingConfig
from rlflow.rollout import build_rollout
from rlflow.roles.rollout_worker import RolloutWorker
from rlflow.workers import RayWorkerGroup, ResourcePool, WorkerSpec

ray.cloudpickle.register_pickle_by_value(sync_workers)

ENGINE = {
    "name": "fsdp2",
    "device": "cpu",
    "optimizer": {"lr": 1e-2, "weight_decay": 0.0, "grad_clip": 1.0},
    "micro_batch_size": 2,
}
GREEDY = SamplingConfig(n=1, do_sample=False)
TEXTS = ["a", "12+30=", "The quick brown fox jumps over the lazy dog again and again.", "b c", "Hello world", "7*8=?"]
N = 2


def _group(worker, pool_name: str, size: int) -> RayWorkerGroup:
    pool = ResourcePool(procs_per_node=size, cpus_per_proc=0.5, device="cpu", name=pool_name)
    return RayWorkerGroup(pool, worker, name=pool_name)


@pytest.fixture(scope="module")
def runs(ray_session, tiny_path, tokenizer, tmp_path_factory):
    """Train, sync both placements, generate everywhere; the groups are closed before any assertion."""
    config = rollout_config("vllm", n=N, seed=9, val_kwargs=GREEDY)
    prompts = make_prompts(tokenizer, TEXTS, ground_truth=list("abcdef"))
    export_dir = tmp_path_factory.mktemp("exported") / "actor"
    actor = _group(WorkerSpec(TrainerWithRollout, ENGINE, str(tiny_path), config), "actor", 2)
    split = _group(WorkerSpec(RolloutWorker, config, str(tiny_path)), "rollout", 1)
    try:
        results = {"losses": actor.train(3)}
        actor.sleep()  # as the driver does before an update (free_cache_engine); on CPU the engine stays up
        actor.sync_in_process()
        results["sync_reports"] = split.update_weights(actor.publish(0.05)[0], 1)
        actor.save_hf(str(export_dir))
        validation = prompts.select(meta_info_keys=[])
        validation.meta_info["validate"] = True
        results["colocated"] = actor.generate_sequences(validation)
        results["colocated_sampled"] = actor.generate_sequences(prompts)
        results["split"] = split.generate_sequences(validation)
        results["all_reduce_after_shutdown"] = actor.shutdown_rollout_then_all_reduce()
    finally:
        actor.shutdown()
        split.shutdown()
    with build_rollout(config, export_dir, "cpu") as fresh:
        results["fresh"] = fresh.generate(prompts, GREEDY)
    with build_rollout(rollout_config("hf"), export_dir, "cpu") as hf:
        results["hf"] = hf.generate(prompts, GREEDY)
    results["export_dir"] = export_dir
    results["prompts"] = prompts
    return results


def _assert_same(got, want):
    assert torch.equal(got.batch["responses"], want.batch["responses"])
    assert torch.equal(got.batch["response_mask"], want.batch["response_mask"])
    diff = (got.batch["rollout_log_probs"] - want.batch["rollout_log_probs"]).abs().max().item()
    assert diff <= 1e-4, diff


def test_training_changed_the_weights(runs, hf_model):
    losses = runs["losses"][0]  # rank 0's view of the global loss; the same batch every step
    assert losses[0] > losses[1] > losses[2]
    assert max_log_prob_error(hf_model, runs["fresh"]) > 1e-2  # so a stale engine would be caught


def test_colocated_sync_equals_fresh_engine(runs):
    _assert_same(runs["colocated"], runs["fresh"])  # rows served by both replicas


def test_split_sync_equals_fresh_engine(runs):
    assert runs["sync_reports"][0]["weight_sync/mb"] > 0
    _assert_same(runs["split"], runs["fresh"])


def test_fresh_engine_matches_hf_forward_of_exported_weights(runs):
    from rlflow.models.loading import load_causal_lm

    exported = load_causal_lm(runs["export_dir"], dtype="float32").eval()
    assert max_log_prob_error(exported, runs["fresh"]) <= 1e-4
    assert torch.equal(runs["hf"].batch["responses"], runs["fresh"].batch["responses"])  # both backends agree


def test_replicas_return_input_order_with_grouped_samples(runs):
    prompts, greedy, sampled = runs["prompts"], runs["colocated"], runs["colocated_sampled"]
    assert list(greedy.non_tensor_batch["uid"]) == [f"uid-{i}" for i in range(len(TEXTS))]
    assert torch.equal(greedy.batch["prompts"], prompts.batch["input_ids"])
    assert greedy.meta_info["metrics"]["rollout/generated_tokens"] == float(greedy.batch["response_mask"].sum())
    assert len({tuple(r.tolist()) for r in sampled.batch["responses"]}) > len(TEXTS)  # samples differ
    assert list(sampled.non_tensor_batch["uid"]) == [f"uid-{i}" for i in range(len(TEXTS)) for _ in range(N)]
    assert list(sampled.non_tensor_batch["ground_truth"]) == [g for g in "abcdef" for _ in range(N)]
    assert torch.equal(sampled.batch["prompts"], prompts.batch["input_ids"].repeat_interleave(N, dim=0))


def test_engine_shutdown_keeps_the_actors_process_group(runs):
    assert runs["all_reduce_after_shutdown"] == [3.0, 3.0]  # 1 + 2 over the actor's 2 ranks
