"""``ActorRolloutRef``: actor, rollout replica and reference in one process (the colocated placement), on a real
engine and the HF rollout in this process. The rollout's log-probs of its own samples are the actor's; after
an update they are not until ``sync_weights``; the reference engine does not move; empty prompts give no samples.
A stand-in engine checks that the sync exports in the rollout's dtype."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from roles_testlib import StandInEngine, engine_params, role_config, token_batch

from rlflow.protocol import DataProto
from rlflow.roles.actor_rollout_ref import ActorRolloutRef
from rlflow.meta_info import OLD_LOG_PROBS_FROM_UPDATE

SAME_WEIGHTS = 1e-5  # HF generate (cached decoding) vs the engine's packed forward, fp32 (fsdp2: 5e-7 measured)


def greedy_prompts(vocab: int) -> DataProto:
    """The left-padded prompt half of a token batch, sampled greedily (the validation keys)."""
    data = token_batch(8, vocab)
    width = data.batch["input_ids"].shape[1] - data.batch["responses"].shape[1]
    keys = ("input_ids", "attention_mask", "position_ids")
    prompts = DataProto.from_dict({key: data.batch[key][:, :width] for key in keys})
    prompts.meta_info["validate"] = True
    return prompts


def rollout_vs_actor(worker: ActorRolloutRef, prompts: DataProto) -> tuple[DataProto, float]:
    """The rollout's samples, and the largest gap between their log-probs and the actor's of the same tokens."""
    samples = worker.generate_sequences(prompts)
    samples.meta_info["temperature"] = 1.0
    actor = worker.compute_log_prob(samples).batch["old_log_probs"]
    mask = samples.batch["response_mask"].bool()
    return samples, float((samples.batch["rollout_log_probs"] - actor)[mask].abs().max())


@pytest.mark.parametrize("engine", engine_params())
def test_the_rollout_follows_the_actor_only_through_sync_weights(models, engine, worker_env):
    config = role_config(models.causal, engine, "rollout.calculate_log_probs=true")  # the samples' own log-probs
    worker = ActorRolloutRef(config.actor, config.rollout, str(models.causal), config.ref)
    prompts = greedy_prompts(models.vocab)
    samples, gap = rollout_vs_actor(worker, prompts)
    assert gap < SAME_WEIGHTS
    reference = worker.compute_ref_log_prob(samples).batch["ref_log_prob"]

    samples.batch["advantages"] = torch.linspace(-1, 1, len(samples))[:, None] * samples.batch["response_mask"]
    samples.meta_info[OLD_LOG_PROBS_FROM_UPDATE.name] = True
    worker.forward_backward(samples)
    worker.optim_step()
    assert rollout_vs_actor(worker, prompts)[1] > 100 * SAME_WEIGHTS, "before the sync the rollout samples the old policy"
    sync = worker.sync_weights()
    assert sync["weight_sync/mb"] > 0
    assert rollout_vs_actor(worker, prompts)[1] < SAME_WEIGHTS
    torch.testing.assert_close(worker.compute_ref_log_prob(samples).batch["ref_log_prob"], reference, rtol=0, atol=0)

    no_samples = worker.generate_sequences(prompts[0:0])
    assert len(no_samples) == 0 and len(worker.compute_ref_log_prob(no_samples)) == 0


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_colocated_sync_exports_in_the_rollout_dtype(dtype):
    received = []
    role = SimpleNamespace(
        engine=StandInEngine(True),
        config=SimpleNamespace(dtype=dtype, lora_sync="merged", lora_rank=0),
        rollout=SimpleNamespace(update_weights=lambda tensors: received.extend(tensors) or 8),
    )
    ActorRolloutRef.sync_weights(role)
    assert role.engine.export_dtypes == [getattr(torch, dtype)]
    assert received[0][1].dtype == getattr(torch, dtype)
