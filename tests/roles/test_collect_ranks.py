"""Ranks that are not collect ranks of their engine (``mesh.is_collect`` false: a non-last pipeline stage, a
tensor-parallel rank other than 0) return an empty batch from every role's forward method, and the
response helpers slice the engine's per-token outputs to the response columns: unit tests with stand-in
engines, then (``make test-full``) every built-in engine with a tensor-parallel layout on 2 real ranks,
where rank 1 returns nothing and the worker group hands both ranks rank 0's rows, the HF model's outputs."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.multiprocessing as mp
from engine_lists import BUILTIN_ENGINES, builtin_engines_with
from roles_testlib import (ATOL, ENGINE_MOUNTS, RESPONSE, ROWS, StandInEngine, hf_response_log_probs, hf_token_scores, prompt_lengths,
                           rl_batch, role_config, token_batch)

from rlflow.engines.base import Capability
from rlflow.protocol import DataProto
from rlflow.roles.actor import Actor
from rlflow.roles.actor_rollout_ref import ActorRolloutRef
from rlflow.roles.critic import Critic
from rlflow.roles.engine_role import response_log_probs
from rlflow.roles.reference import Reference
from rlflow.roles.reward_model import RewardModel
from rlflow.workers.local_group import LocalWorkerGroup
from rlflow.workers.worker import ENV_DEVICE, find_free_port


@pytest.mark.parametrize(
    "call",
    [
        lambda role, data: Actor.compute_log_prob(role, data),
        lambda role, data: Critic.compute_values(role, data),
        lambda role, data: RewardModel.compute_rm_score(role, data),
        lambda role, data: ActorRolloutRef.compute_ref_log_prob(role, data),
    ],
    ids=["actor", "critic", "reward_model", "reference"],
)
def test_roles_return_an_empty_batch_on_ranks_that_do_not_collect(call):
    data = rl_batch()
    collecting = SimpleNamespace(engine=StandInEngine(True), ref_engine=StandInEngine(True))
    silent = SimpleNamespace(engine=StandInEngine(False), ref_engine=StandInEngine(False))
    assert len(call(collecting, data)) == ROWS
    empty = call(silent, data)
    assert isinstance(empty, DataProto) and len(empty) == 0 and not empty.batch


def test_response_log_probs_are_the_response_columns():
    out = response_log_probs(StandInEngine(True), rl_batch(), temperature=1.0, with_entropy=True)
    assert out.batch["log_probs"].shape == (ROWS, RESPONSE)
    assert response_log_probs(StandInEngine(False), rl_batch(), 1.0, True) is None


# engine -> the option that makes 2 ranks one replica (tensor parallel), so rank 1 is not a collect rank
TENSOR_PARALLEL_OPTIONS = {"torchtitan": "tensor_parallel_size", "megatron": "tensor_model_parallel_size"}
TP_ENGINES = [engine for engine in TENSOR_PARALLEL_OPTIONS if engine in BUILTIN_ENGINES]


def roles_on_two_ranks(rank: int, port: int, engine: str, models: SimpleNamespace, out: Path) -> None:
    """On each of 2 ranks (a worker group's environment): every forward role at tensor parallel size 2, called
    directly and through the group; saves this rank's view to ``out/rank<r>.pt``."""
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port), **{ENV_DEVICE: "cpu"})
    torch.set_num_threads(1)
    option = TENSOR_PARALLEL_OPTIONS[engine]
    config = role_config(models.causal, engine, *[f"{mount}.engine.{option}=2" for mount in ENGINE_MOUNTS])
    roles = {"actor": (Actor(config.actor, str(models.causal)), "compute_log_prob"),
             "reference": (Reference(config.ref, str(models.causal)), "compute_ref_log_prob")}
    if engine in builtin_engines_with(Capability.VALUE_MODEL):
        roles["critic"] = (Critic(config.critic, str(models.value)), "compute_values")
        roles["reward_model"] = (RewardModel(config.reward.reward_model, str(models.value)), "compute_rm_score")
    data = token_batch(9, models.vocab)
    seen = {}
    for name, (role, method) in roles.items():
        direct = getattr(role, method)(data)
        group = LocalWorkerGroup(role)
        seen[name] = {"is_collect": role.engine.mesh.is_collect, "direct": dict(direct.batch),
                      "group": dict(getattr(group, method)(data).batch), "empty": len(getattr(group, method)(data[0:0]))}
    torch.save(seen, out / f"rank{rank}.pt")


@pytest.mark.full
@pytest.mark.parametrize("engine", TP_ENGINES)
def test_at_tensor_parallel_size_2_only_rank_0_returns_rows_and_the_group_gets_the_hf_outputs(
        engine, models, hf_causal, hf_value, tmp_path):
    mp.start_processes(roles_on_two_ranks, args=(find_free_port(), engine, models, tmp_path), nprocs=2, start_method="spawn")
    ranks = [torch.load(tmp_path / f"rank{rank}.pt", weights_only=False) for rank in range(2)]
    data = token_batch(9, models.vocab)
    mask = data.batch["response_mask"].bool()
    log_probs, _ = hf_response_log_probs(hf_causal, data, 1.0)
    for name, seen in ranks[0].items():
        assert seen["is_collect"] and not ranks[1][name]["is_collect"], f"{name}: rank 0 collects, rank 1 does not"
        assert ranks[1][name]["direct"] == {}, f"{name}: the non-collect rank returned {list(ranks[1][name]['direct'])}"
        assert all(len(value) == len(data) for value in seen["direct"].values())
        for view in ranks:
            assert view[name]["empty"] == 0
            for key, value in view[name]["group"].items():
                torch.testing.assert_close(value, seen["direct"][key], rtol=0, atol=0)
    for name, key in (("actor", "old_log_probs"), ("reference", "ref_log_prob")):
        torch.testing.assert_close(ranks[0][name]["group"][key][mask], log_probs[mask], atol=ATOL, rtol=0)
    if "critic" in ranks[0]:
        scores = hf_token_scores(hf_value, data)
        for row, prompt_length in enumerate(prompt_lengths(data)):
            length = int(mask[row].sum())
            expected = scores[row][prompt_length - 1 : prompt_length + length - 1]
            torch.testing.assert_close(ranks[0]["critic"]["group"]["values"][row, :length], expected, atol=ATOL, rtol=0)
