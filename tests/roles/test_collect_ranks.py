"""Ranks that are not collect ranks of their engine (``mesh.is_collect`` false: a non-last pipeline stage, a
tensor-parallel rank other than 0) return an empty batch from every role's forward method, and the
response helpers slice the engine's per-token outputs to the response columns. Stand-in engines:
these are unit tests of the roles around an engine."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from roles_testlib import RESPONSE, ROWS, StandInEngine, rl_batch

from rlflow.protocol import DataProto
from rlflow.roles.actor import Actor
from rlflow.roles.actor_rollout_ref import ActorRolloutRef
from rlflow.roles.critic import Critic
from rlflow.roles.engine_role import response_log_probs
from rlflow.roles.reward_model import RewardModel


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
